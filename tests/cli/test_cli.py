"""Bad CLI input exits non-zero with one clear line; a good in-process run writes its files."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import run_simulation  # noqa: E402


def _npz(tmp_path, name="d.npz", **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return str(path)


def _bad_cases(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 3))
    y = (rng.uniform(size=20) > 0.5).astype(int)
    return [
        (["--algorithm", "nope"], "unknown algorithm 'nope'"),
        (["--model", "nope"], "unknown model 'nope'"),
        (["--dataset", "nope"], "unknown dataset 'nope'"),
        (["--dataset", "breast-cancer", "--model", "linear-regression"], "breast-cancer"),
        (["--data", _npz(tmp_path, "a.npz", y_train=y)], "x_train"),
        (["--data", _npz(tmp_path, "b.npz", x_train=x, y_train=y[:15])], "y_train"),
        (["--data", _npz(tmp_path, "c.npz", x_train=x, y_train=y + 2)], "0 or 1"),
        (["--data", _npz(tmp_path, "e.npz", x_train=x, y_train=y, x_test=x[:, :2], y_test=y)],
         "x_test"),
        (["--data", _npz(tmp_path, "f.npz", x_train=x, y_train=y), "--num-clients", "30"],
         "cannot split"),
        (["--data", str(tmp_path / "missing.npz")], "missing.npz"),
        (["--run-config", "damping=2.0"], "damping"),
        (["--run-config", "no-such-key=1"], "unknown run-config key 'no-such-key'"),
        (["--run-config", "schedule='weekly'"], "unknown schedule"),
        (["--run-config", "pvi.no-such-key=1"], "unknown run-config key 'pvi.no-such-key'"),
        (["--run-config", "nosuch.damping=1"], "unknown run-config key 'nosuch.damping'"),
        (["--run-config", "algorithm-modules='no.such.module'"], "cannot import 'no.such.module'"),
        (["--run-config", "model-modules='no.such.module'"],
         "model-modules: cannot import 'no.such.module'"),
    ]


@pytest.mark.filterwarnings("ignore::fedbayes_flwr.data.DataWarning")  # f.npz has no x_test
def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    for argv, expected in _bad_cases(tmp_path):
        code = run_simulation.main([*argv, "--output-dir", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip()
        assert code == 2, argv
        assert len(err.splitlines()) == 1, (argv, err)
        assert err.startswith("error: ") and expected in err, (argv, err)


def test_bad_input_through_the_real_process(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "run_simulation.py"),
                           "--model", "nope"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: model: unknown model 'nope'")


def test_in_process_run_writes_results(tmp_path):
    out = tmp_path / "run"
    code = run_simulation.main(["--engine", "in-process", "--model", "linear-regression",
                                "--dataset", "diabetes", "--num-clients", "4", "--num-rounds", "3",
                                "--output-dir", str(out), "--quiet",
                                "--run-config", "schedule='sequential' damping=1.0"])
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    assert result["run_config"]["pvi.schedule"] == "sequential"  # the bare key took its section
    assert result["outcome"] == "completed"
    assert [h["round"] for h in result["history"]] == [1, 2, 3]
    for key in ("test_rmse", "test_nll", "log_marginal_likelihood", "bytes_down", "bytes_up",
                "elapsed_s", "rejected_replies"):
        assert key in result["history"][0]
    assert result["final"]["round"] == 3
    post = np.load(out / result["posterior_file"])
    assert {"mean", "std", "cov"} <= set(post.files)
    assert (out / "metrics.png").stat().st_size > 1000


def test_posterior_file_for_classifier_has_reliability_plot(tmp_path):
    out = tmp_path / "clf"
    code = run_simulation.main(["--engine", "in-process", "--num-clients", "2", "--num-rounds", "1",
                                "--output-dir", str(out), "--quiet", "--run-config",
                                "local-steps=50"])
    assert code == 0
    assert (out / "reliability.png").exists()
    post = np.load(out / "posterior.npz")
    assert post["mean"].shape == post["std"].shape == (31,)  # 30 weights + intercept
    assert post["cov"].shape == (31, 31)


def test_pyproject_run_config_matches_library_defaults():
    """Flower passes every pyproject key to the apps: the common keys equal RunConfig's defaults
    and each ``[tool.flwr.app.config.<bundle>]`` section equals that bundle's config defaults,
    value for value, for every bundle in the registry (and no other section exists)."""
    import dataclasses
    import tomllib

    from fedbayes_flwr.algorithms import registry
    from fedbayes_flwr.runtime.config import RunConfig

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    sections = {k: declared.pop(k) for k in list(declared) if isinstance(declared[k], dict)}
    assert declared == RunConfig().to_run_config()
    # the built-in families (tests may register plugins of their own in this process)
    def builtin(module: str) -> bool:  # a family module or a module of a family's package
        return any(module == m or module.startswith(f"{m}.") for m in registry.BUILTIN_MODULES)

    bundles = {name: b for name, b in registry.bundles().items()
               if builtin(b.init_server.__module__)}
    assert set(sections) == set(bundles) and bundles
    for name, bundle in bundles.items():
        defaults = bundle.config_class()
        assert sections[name] == {f.name.replace("_", "-"): getattr(defaults, f.name)
                                  for f in dataclasses.fields(defaults)}


def test_dotted_and_bare_keys_resolve_to_the_algorithm_section():
    from fedbayes_flwr.runtime.config import ConfigError, parse_run_config

    dotted = parse_run_config({"pvi.damping": 0.25, "pvi.schedule": "sequential"})
    bare = parse_run_config({"damping": 0.25, "schedule": "sequential"})
    assert dotted == bare and dotted.section.damping == 0.25
    # a preset uses its bundle's section, and fixes the keys it defines
    bcm = parse_run_config({"algorithm": "bcm-split", "pvi.local-steps": 7})
    assert bcm.section.local_steps == 7 and bcm.section.cavity == "split-prior"
    assert bcm.num_rounds == 1
    for bad in ({"pvi.nope": 1}, {"nope": 1}, {"eval-every": 0}):
        try:
            parse_run_config(bad)
        except ConfigError as err:
            assert len(str(err).splitlines()) == 1 and next(iter(bad)) in str(err)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_dotted_key_on_the_command_line_and_time_limit(tmp_path):
    """``pvi.damping`` works in ``--run-config``; ``max-seconds`` ends the run at the first
    evaluation point past the limit with outcome ``time-limit`` (exit 0, files written)."""
    out = tmp_path / "tl"
    code = run_simulation.main(["--engine", "in-process", "--model", "linear-regression",
                                "--dataset", "synthetic", "--num-clients", "3",
                                "--num-rounds", "50", "--output-dir", str(out), "--quiet",
                                "--run-config", "pvi.damping=0.25 max-seconds=1e-9"])
    assert code == 0
    result = json.loads((out / "result.json").read_text())
    assert result["run_config"]["pvi.damping"] == 0.25
    assert result["outcome"] == "time-limit" and [h["round"] for h in result["history"]] == [1]


def test_rows_held_out_of_a_file_without_x_test_are_reported(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 3))
    path = _npz(tmp_path, "h.npz", x_train=x, y_train=x @ np.ones(3))
    out = tmp_path / "h"
    from fedbayes_flwr.data import DataWarning

    with pytest.warns(DataWarning, match="held out 10 of 50 rows"):
        code = run_simulation.main(["--engine", "in-process", "--model", "linear-regression",
                                    "--data", path, "--num-clients", "2", "--num-rounds", "1",
                                    "--output-dir", str(out), "--quiet"])
    assert code == 0
    assert json.loads((out / "result.json").read_text())["holdout_rows"] == 10


def test_holdout_warning_is_one_console_line(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 3))
    path = _npz(tmp_path, "w.npz", x_train=x, y_train=x @ np.ones(3))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "run_simulation.py"),
                           "--engine", "in-process", "--model", "linear-regression", "--data",
                           path, "--num-clients", "2", "--num-rounds", "1", "--quiet",
                           "--output-dir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning: data file")]
    assert len(lines) == 1 and "held out 10 of 50 rows" in lines[0]


def test_algorithm_choices_in_the_help_come_from_the_registry(capsys):
    from fedbayes_flwr.algorithms import registry

    with pytest.raises(SystemExit):
        run_simulation.parse_args(["--help"])
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines, also at hyphens
    assert all(name in out for name in registry.names()) and "global-vi-federated" in out


def test_model_choices_in_the_help_come_from_the_registry_and_plugins(capsys):
    from fedbayes_flwr.models import registry

    with pytest.raises(SystemExit):
        run_simulation.parse_args(["--run-config", "model-modules='tests.helpers.user_models'",
                                   "--help"])
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines, also at hyphens
    assert all(name in out for name in registry.ALL_MODELS) and "user-poisson" in out


def test_a_key_of_a_section_the_run_does_not_use_is_refused(capsys):
    """``--algorithm pvi --run-config dsvgd.num-particles=5`` would have no effect: refused,
    naming the section and its algorithms; the pyproject default of that key (what ``flwr run``
    passes for every section) stays accepted (issue 32, row 8)."""
    from fedbayes_flwr.runtime.config import ConfigError, parse_run_config

    with pytest.raises(ConfigError, match=r"section 'dsvgd' is not used by algorithm 'pvi' "
                                          r"\(it is used by dsvgd"):
        parse_run_config({"algorithm": "pvi", "dsvgd.num-particles": 5})
    default = parse_run_config({"algorithm": "dsvgd"}).section.num_particles
    assert parse_run_config({"algorithm": "pvi", "dsvgd.num-particles": default})
    code = run_simulation.main(["--engine", "in-process", "--algorithm", "pvi",
                                "--run-config", "dsvgd.num-particles=5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "section 'dsvgd' is not used" in err[0]


def test_list_names_every_registered_algorithm_model_and_dataset_with_one_line(capsys):
    from fedbayes_flwr.algorithms import registry
    from fedbayes_flwr.data import DATASETS
    from fedbayes_flwr.models import registry as model_registry

    code = run_simulation.main(["list", "--run-config", "model-modules='tests.helpers.user_models'"])
    out = capsys.readouterr().out
    assert code == 0
    rows = {}
    for line in out.splitlines():
        if line.startswith("  "):
            name, _, text = line.strip().partition("  ")
            rows[name] = text.strip()
    expected = [*registry.names(), *model_registry.ALL_MODELS, *DATASETS]
    assert set(expected) <= set(rows), set(expected) - set(rows)
    assert all(rows[name] for name in expected), [n for n in expected if not rows[n]]
    assert "plugin from tests.helpers.user_models" in rows["user-poisson"]
    assert [ln for ln in out.splitlines() if not ln.startswith("  ")] == [
        "algorithms:", "models:", "datasets:"]
    assert run_simulation.main(["list", "datasets"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "datasets:"


def test_list_with_a_bad_plugin_module_exits_2_with_one_line(capsys):
    code = run_simulation.main(["list", "--run-config", "algorithm-modules='no.such.module'"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "no.such.module" in err


def test_help_names_every_dataset(capsys):
    from fedbayes_flwr.data import DATASETS

    with pytest.raises(SystemExit):
        run_simulation.parse_args(["--help"])
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines, also at hyphens
    assert all(name in out for name in DATASETS) and "hub:<id>" in out and "list" in out


def test_missing_data_file_is_reported_before_tensorflow_or_flower_is_imported(tmp_path):
    """The cheap checks run first: the process that reports a missing --data file (or a bad
    key) has imported neither TensorFlow nor Flower (timing: benchmarks/flower/first_feedback.py)."""
    keys_only = _npz(tmp_path, "k.npz", x_train=np.zeros((4, 2)))  # no y_train for a classifier
    probe = ("import json, sys; sys.path.insert(0, {root!r}); import run_simulation; "
             "code = run_simulation.main({argv!r}); "
             "print(json.dumps([code, sorted({{m.split('.')[0] for m in sys.modules}} & "
             "{{'tensorflow', 'flwr', 'ray', 'tensorflow_probability'}})]))")
    for data, expected in ((str(tmp_path / "missing.npz"), "does not exist"),
                           (keys_only, "'y_train' is required")):
        argv = ["--data", data, "--output-dir", str(tmp_path / "out")]
        proc = subprocess.run([sys.executable, "-c", probe.format(root=ROOT, argv=argv)],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert json.loads(proc.stdout.strip().splitlines()[-1]) == [2, []], proc.stdout
        assert proc.stderr.strip().startswith("error: ") and expected in proc.stderr


def test_unwritable_output_dir_is_a_one_line_error(tmp_path, monkeypatch):
    from fedbayes_flwr.runtime.config import ConfigError

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: os.fspath(p) != str(locked)
                        and real_access(p, mode))  # root may write anywhere: pretend it may not
    with pytest.raises(ConfigError, match="is not writable"):
        run_simulation.check_output_dir(str(locked / "run"))
    run_simulation.check_output_dir(str(tmp_path / "fine" / "run"))
