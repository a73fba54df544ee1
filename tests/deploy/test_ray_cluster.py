"""The Simulation Engine attached to an existing Ray cluster (``run_simulation.py --ray-address``).

The cluster test starts its own head, ``ray start --head --block`` as a child process in its own
session, with a private ``--temp-dir`` (so its ``ray_current_cluster`` file, which a plain
``ray.init()`` on this machine would follow, is not the machine-wide ``/tmp/ray`` one) and every
port chosen here. It stops the head by PID, never with ``ray stop`` (which kills every Ray process
on the machine, other users' included). Every process the head starts inherits a marker variable
from its environment, so the test finds exactly its own processes in ``/proc`` and asserts that
none is left. ``RAY_ADDRESS`` is removed from every environment here, except where the test sets
it on purpose to an address where nothing listens, to show the default engine ignores it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.flower_utils import free_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import run_simulation  # noqa: E402
from fedbayes_flwr.deploy.watchdog import with_env  # noqa: E402

# The conjugate model, 3 clients, 2 rounds at the default damping: the posterior after round 2
# depends on both rounds' arithmetic, so equal posteriors mean the same computation.
ARGV = ["--model", "linear-regression", "--dataset", "diabetes", "--num-clients", "3",
        "--partition", "iid", "--num-rounds", "2", "--seed", "7", "--quiet",
        "--num-cpus-per-client", "1"]
HEAD_CPUS = 2  # the head declares 2 CPUs; 1 per client -> Flower builds exactly 2 actors


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", **extra})
    return env


class RayHead:
    """A private single-node Ray cluster: ``ray start --head --block`` as a child process."""

    def __init__(self, num_cpus: int):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.marker = f"FEDBAYES_TEST_RAY_HEAD={uuid.uuid4().hex}"
        # short path: Ray puts unix sockets under it (108-byte limit)
        self.temp_dir = tempfile.mkdtemp(prefix="rayh", dir="/tmp")
        self.log = Path(self.temp_dir) / "head.log"
        ray = Path(sys.executable).parent / "ray"
        name, value = self.marker.split("=")
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [str(ray), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
                 "--port", str(self.port), "--num-cpus", str(num_cpus),
                 "--include-dashboard", "false", "--disable-usage-stats",
                 "--ray-client-server-port", str(free_port()), "--temp-dir", self.temp_dir],
                env=_env(**{name: value}), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"ray start exited {self.proc.returncode}:\n"
                                     f"{self.log.read_text()[-3000:]}")
            try:
                run_simulation.check_ray_address(self.address, timeout=2.0)
                return
            except ValueError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no head at {self.address} after {timeout:g} s:\n"
                                         f"{self.log.read_text()[-3000:]}") from None
                time.sleep(0.5)

    def actor_logs(self) -> list[Path]:
        """The head's worker stdout files of ClientAppActor workers (Ray writes the actor's
        class name into the first lines of its worker's ``.out`` file)."""
        return [p for p in Path(self.temp_dir).glob("session_latest/logs/worker-*.out")
                if ":actor_name:ClientAppActor" in p.read_text(errors="replace")]

    def stop(self) -> list[int]:
        """Stop the head by PID (SIGTERM: ``ray start --block`` then stops its children), its
        process group as a fallback; return the PIDs of its processes still alive after that."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        deadline = time.monotonic() + 20  # raylet and GCS exit a moment after `ray start`
        while (left := sorted(with_env(self.marker))) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:  # clean up anyway; the caller fails the test on a non-empty list
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left


def _run_cli(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run_simulation.py"), *argv],
                          capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)


def test_backend_config_attaches_without_num_cpus_or_stays_local():
    cluster = run_simulation.ray_backend_config(0.5, 0.25, "10.0.0.5:6379")
    assert cluster["init_args"]["address"] == "10.0.0.5:6379"
    # Ray refuses num_cpus / num_gpus in ray.init when it attaches to a running cluster
    assert not {"num_cpus", "num_gpus"} & set(cluster["init_args"])
    assert cluster["client_resources"] == {"num_cpus": 0.5, "num_gpus": 0.25}
    # without an address: a private instance, whatever RAY_ADDRESS or /tmp/ray say
    assert run_simulation.ray_backend_config(1.0)["init_args"]["address"] == "local"


@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1:{port}", "nothing answers there"),
    ("ray://127.0.0.1:10001", "expected HOST:PORT"),
    ("127.0.0.1", "expected HOST:PORT"),
])
def test_unreachable_or_malformed_ray_address_is_one_line(tmp_path, capsys, address, expected):
    address = address.format(port=free_port())  # free: nothing listens there
    start = time.monotonic()
    code = run_simulation.main([*ARGV, "--output-dir", str(tmp_path), "--ray-address", address])
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and err.startswith("error: --ray-address"), err
    assert expected in err, err
    assert not (tmp_path / "result.json").exists()
    # a refused connection is reported at once; even a silent host costs at most
    # RAY_CONNECT_TIMEOUT_S, not Ray's minute of retries (the rest is TensorFlow's import)
    assert elapsed < 30 + run_simulation.RAY_CONNECT_TIMEOUT_S, elapsed


@pytest.mark.slow
@pytest.mark.flower
@pytest.mark.deployment
def test_ray_cluster_run_equals_default_simulation(tmp_path):
    head = RayHead(num_cpus=HEAD_CPUS)  # starts while the default run below computes
    try:
        # the default engine, with a stray RAY_ADDRESS where nothing listens: ignored, warned
        stray = f"127.0.0.1:{free_port()}"
        local = _run_cli([*ARGV, "--output-dir", str(tmp_path / "local")],
                         _env(RAY_ADDRESS=stray))
        assert local.returncode == 0, local.stderr[-4000:]
        assert f"warning: RAY_ADDRESS={stray} is ignored" in local.stderr

        head.wait_ready()
        cluster = _run_cli([*ARGV, "--output-dir", str(tmp_path / "cluster"),
                            "--ray-address", head.address], _env())
        assert cluster.returncode == 0, cluster.stderr[-4000:]
        # the clients ran in the head's workers: one actor per declared CPU
        assert len(head.actor_logs()) == HEAD_CPUS, head.actor_logs()
    finally:
        left = head.stop()
    assert left == [], f"processes of the Ray head still running: {left}"

    results = {name: json.loads((tmp_path / name / "result.json").read_text())
               for name in ("local", "cluster")}
    assert results["cluster"]["engine"] == "simulation"
    drop = ("elapsed_s",)
    assert ([{k: v for k, v in h.items() if k not in drop} for h in results["cluster"]["history"]]
            == [{k: v for k, v in h.items() if k not in drop} for h in results["local"]["history"]])
    local_post = np.load(tmp_path / "local" / "posterior.npz")
    cluster_post = np.load(tmp_path / "cluster" / "posterior.npz")
    for key in ("mean", "cov"):
        # the same float64 operations in the same (partition) order on the same machine: the
        # arrays agree to rounding; 1e-6 is the bar the engines are held to everywhere
        np.testing.assert_allclose(cluster_post[key], local_post[key], rtol=0, atol=1e-6)
