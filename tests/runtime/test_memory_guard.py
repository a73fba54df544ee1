"""The memory guard (issue 32, row 6): a run whose large arrays cannot fit is refused before
anything is allocated, with the estimate, the available memory and the alternative in one line
(exit 2 from the CLI, ConfigError from the Python API); the progress display shows a first line
as the run starts."""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes_flwr.errors import ConfigError

WIDE = 200_000  # features: a full d x d covariance is d^2 x 8 bytes = 298 GiB per copy


@pytest.fixture(scope="module")
def wide_npz(tmp_path_factory):
    path = tmp_path_factory.mktemp("wide") / "wide.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.normal(size=(12, WIDE)), y_train=rng.integers(0, 2, 12),
             x_test=rng.normal(size=(3, WIDE)), y_test=rng.integers(0, 2, 3))
    return str(path)


def test_cli_refuses_a_full_covariance_that_cannot_fit(wide_npz, tmp_path, capsys):
    """Today's main tries to allocate the 298 GiB prior covariance (numpy MemoryError)."""
    import run_simulation

    out = tmp_path / "out"
    code = run_simulation.main(["--engine", "in-process", "--num-rounds", "2", "--num-clients",
                                "3", "--seed", "0", "--output-dir", str(out), "--quiet",
                                "--run-config", f"data='{wide_npz}' model='logistic-regression' "
                                                "pvi.covariance='full'"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    (line,) = [ln for ln in err if ln.startswith("error:")]
    assert line == err[-1]
    # the estimate: (3 K + 6) d^2 x 8 bytes, d = 200001 (the bias), K = 3: 4.37 TiB
    assert "memory: pvi needs about 4.37 TiB" in line and "d = 200001" in line, line
    assert "is available (MemAvailable)" in line and "pvi.covariance=diag" in line, line
    assert not out.exists() or not any(out.iterdir())


def test_api_fit_refuses_it_too(wide_npz, tmp_path):
    import fedbayes_flwr

    with pytest.raises(ConfigError, match=r"memory: pvi needs about 4\.37 TiB .* is "
                                          r"available .*use pvi\.covariance=diag"):
        fedbayes_flwr.fit({"data": wide_npz, "model": "logistic-regression",
                           "pvi.covariance": "full", "num-clients": 3, "num-rounds": 2,
                           "output-dir": str(tmp_path / "api")}, progress=False)


def test_dsvgd_with_many_particles_is_refused_naming_the_particles(monkeypatch):
    from fedbayes_flwr.runtime import memory
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.experiment import build_experiment

    monkeypatch.setattr(memory, "available_bytes", lambda: 2**30)  # 1 GiB
    keys = {"algorithm": "dsvgd", "model": "gaussian-mean", "dataset": "synthetic",
            "synthetic-dim": 1000, "synthetic-size": 30, "num-clients": 3,
            "dsvgd.num-particles": 20_000, "dsvgd.kernel": "isotropic"}
    # ((2 K + 6) N d + 4 N^2) x 8 bytes = (12 x 2e7 + 1.6e9) x 8 = 14.7 GB = 13.7 GiB
    with pytest.raises(ConfigError, match=r"memory: dsvgd needs about 13\.7 GiB \(\(2 K \+ 6\) "
                                          r"N d \+ 4 N\^2 float64s, K = 3, N = 20000, d = 1000\) "
                                          r"but 1 GiB is available .*dsvgd\.num-particles"):
        build_experiment(parse_run_config(keys))
    # the default kernel at d = 1000 is the whitened one: 3 (K + 2) d^2 = 1.5e7 float64s more
    # (0.12 GB: 13.8 GiB), and the alternative names the isotropic kernel
    with pytest.raises(ConfigError, match=r"memory: dsvgd needs about 13\.8 GiB .* \+ 3 \(K \+ 2\) "
                                          r"d\^2 \(kernel mahalanobis\) .*dsvgd\.kernel='isotropic'"):
        build_experiment(parse_run_config({**keys, "dsvgd.kernel": "auto"}))
    # the same run with the memory it needs goes on
    monkeypatch.setattr(memory, "available_bytes", lambda: 2**40)
    assert build_experiment(parse_run_config(keys)).setup.prior.dim == 1000


def test_every_vector_family_states_its_estimate():
    """Each built-in bundle over one parameter vector has the hook, and the estimate follows
    its stated formula (PVI full: (3 K + 6) d^2 x 8 bytes; diagonal: d instead of d^2)."""
    from fedbayes_flwr.algorithms import registry
    from fedbayes_flwr.algorithms.base import Setup
    from fedbayes_flwr.models import make_model

    model = make_model("logistic-regression", 1.0, (), 2)
    for name, bundle in registry.bundles().items():
        if not bundle.init_server.__module__.startswith("fedbayes_flwr."):
            continue  # a plugin another test registered (tests/helpers/toy_algorithm.py)
        if bundle.structured_models:
            assert bundle.memory_estimate is None, name  # AMPS: structured mean-field blocks
            continue
        assert bundle.memory_estimate is not None, name
        estimate = bundle.memory_estimate(Setup(model, None, 4, 99, 0, bundle.config_class()))
        assert estimate.nbytes > 100 * 8 and estimate.alternative, (name, estimate)
    pvi = registry.get("pvi").bundle
    config = pvi.config_class(covariance="full")
    full = pvi.memory_estimate(Setup(model, None, 4, 99, 0, config))
    assert full.nbytes == (3 * 4 + 6) * 100**2 * 8
    diag = pvi.memory_estimate(Setup(model, None, 4, 99, 0, config.__class__(covariance="diag")))
    assert diag.nbytes == (3 * 4 + 6) * 100 * 8


def test_available_memory_reads_meminfo_with_a_fallback(tmp_path, monkeypatch):
    from fedbayes_flwr.runtime import memory

    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       16384 kB\nMemFree:  100 kB\nMemAvailable:    8192 kB\n")
    assert memory.available_bytes(str(info)) == 8192 * 1024
    pages = {"SC_AVPHYS_PAGES": 10, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(memory.os, "sysconf", pages.__getitem__)
    info.write_text("MemTotal:       16384 kB\n")  # an old kernel: no MemAvailable
    assert memory.available_bytes(str(info)) == 40960  # free pages x page size
    assert memory.available_bytes(str(tmp_path / "absent")) == 40960  # no /proc
    monkeypatch.setattr(memory.os, "sysconf", lambda name: (_ for _ in ()).throw(ValueError()))
    assert memory.available_bytes(str(tmp_path / "absent")) is None  # unknown: no check


def test_progress_shows_a_first_line_before_the_first_update(tmp_path, capsys):
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.engine import run_in_process

    run_in_process(parse_run_config({"algorithm": "pvi", "model": "linear-regression",
                                     "dataset": "synthetic", "num-clients": 3, "num-rounds": 1,
                                     "output-dir": str(tmp_path)}), progress=True)
    lines = capsys.readouterr().err.strip().splitlines()
    # synthetic linear regression: 3 features; PVI's estimate (3 K + 6) d^2 x 8 = 15 x 9 x 8 B
    assert lines[0] == "started: pvi, 3 clients, 3 parameters, 1 updates, about 1.05 KiB of arrays", lines
    assert lines[1].startswith("update 1: "), lines
