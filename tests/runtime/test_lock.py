"""One run per output directory (issue 32, row 7): a live owner refuses a second run in one
line; a lock left by a dead process is taken over with a warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from fedbayes_flwr.runtime import lock as L

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import run_simulation  # noqa: E402

HOLD = """
import sys, time
from fedbayes_flwr.runtime.lock import output_dir_lock
with output_dir_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def _holder(out):
    """A separate process holding ``out``'s lock (a run in progress)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_on_a_live_runs_directory_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    proc = _holder(out)
    try:
        code = run_simulation.main(["--engine", "in-process", "--algorithm", "pvi", "--model",
                                    "linear-regression", "--dataset", "synthetic",
                                    "--num-rounds", "1", "--quiet", "--output-dir", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert f"in use by the run of PID {proc.pid}" in err[0]
        assert sorted(os.listdir(out)) == [L.FILE]  # nothing written by the refused run
        import fedbayes_flwr

        with pytest.raises(L.OutputDirBusy, match=f"PID {proc.pid}"):
            fedbayes_flwr.fit({"algorithm": "pvi", "model": "linear-regression",
                               "dataset": "synthetic", "output-dir": str(out)}, progress=False)
    finally:
        proc.kill()
        proc.wait()


def test_a_dead_owners_lock_is_taken_over_with_a_warning(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a PID that is gone
    (tmp_path / L.FILE).write_text(json.dumps({"pid": proc.pid, "start_ticks": 1,
                                               "host": os.uname().nodename,
                                               "started": time.time()}))
    with pytest.warns(UserWarning, match=f"taking over the lock of PID {proc.pid}"):
        with L.output_dir_lock(str(tmp_path)):
            with open(tmp_path / L.FILE) as f:
                assert json.load(f)["pid"] == os.getpid()
    assert not (tmp_path / L.FILE).exists()  # released at the end


def test_a_reused_pid_does_not_hold_the_directory(tmp_path):
    """The lock names a live PID (this process's parent) but another start time: stale."""
    (tmp_path / L.FILE).write_text(json.dumps({"pid": os.getppid(), "start_ticks": -5,
                                               "host": os.uname().nodename, "started": 0}))
    with pytest.warns(UserWarning, match="no longer running"):
        with L.output_dir_lock(str(tmp_path)):
            pass


def test_the_lock_is_released_when_the_run_fails(tmp_path):
    with pytest.raises(RuntimeError):
        with L.output_dir_lock(str(tmp_path)):
            raise RuntimeError("boom")
    assert not (tmp_path / L.FILE).exists()
    with L.output_dir_lock(str(tmp_path)):  # and can be taken again at once
        with pytest.raises(L.OutputDirBusy, match="this process"):
            with L.output_dir_lock(str(tmp_path)):
                pass
