"""``run_simulation.py --compare`` and ``fedbayes_flwr.compare`` (issue 28).

Done-when 1: on a label-skewed logistic problem the command's own NUTS reference agrees with a
NUTS reference computed outside it, and its per-algorithm figures equal those recomputed from
each algorithm's ``posterior.npz``. Done-when 2: a conjugate case uses the exact posterior and
reports PVI's error at rounding level; a refused algorithm is recorded with its reason and the
exit code is 0 when another ran.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from scipy.stats import wasserstein_distance

import fedbayes_flwr
import run_simulation
from fedbayes_flwr.comparison import algorithm_config, resolve_algorithms
from fedbayes_flwr.comparison.table import markdown_table, sort_rows
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.evaluation.sample_quality import W1_SEED
from fedbayes_flwr.inference.posterior import load_posterior
from tests.models.test_likelihood_reference import make_data, nuts

PLUGIN = "tests.helpers.user_models"


def _json(path) -> dict:
    with open(path) as f:
        return json.load(f)


# --- cheap: names, section keys, the table -------------------------------------------------------
def test_resolve_algorithms_names_all_and_refuses_unknown_or_repeated():
    from fedbayes_flwr.algorithms import registry

    assert resolve_algorithms("all") == list(registry.names())
    assert resolve_algorithms("pvi, dhmc") == ["pvi", "dhmc"]
    for bad, words in (("pvi,nope", "unknown algorithm 'nope'"), ("pvi,pvi", "twice"),
                       (",", "at least one")):
        with pytest.raises(ConfigError, match=words):
            resolve_algorithms(bad)


def test_section_keys_go_to_their_own_algorithms_only():
    values = {"num-rounds": 3, "pvi.damping": 0.5, "dhmc.iterations": 100, "seed": 1}
    assert algorithm_config(values, "global-vi") == {"num-rounds": 3, "pvi.damping": 0.5,
                                                      "seed": 1, "algorithm": "global-vi"}
    assert algorithm_config(values, "dmala") == {"num-rounds": 3, "dhmc.iterations": 100,
                                                  "seed": 1, "algorithm": "dmala"}
    # a key whose prefix is no section stays, so that the run config names it as unknown
    assert algorithm_config({"nope.x": 1}, "pvi")["nope.x"] == 1


def test_table_is_sorted_by_posterior_error_with_refusals_last():
    rows = [{"algorithm": "b", "w1": 0.5, "outcome": "completed"},
            {"algorithm": "r", "outcome": "refused", "reason": "no"},
            {"algorithm": "a", "w1": 0.1, "outcome": "completed"},
            {"algorithm": "n", "mean_error": None, "test_nll": 0.3, "outcome": "completed"}]
    assert [r["algorithm"] for r in sort_rows(rows)] == ["a", "b", "n", "r"]
    table = markdown_table(rows).splitlines()
    assert table[0].startswith("| algorithm | W1 (ref sd) |") and len(table) == 6


def test_cli_refuses_compare_with_algorithm_and_reference_without_compare(capsys):
    assert run_simulation.main(["--compare", "pvi", "--algorithm", "pvi"]) == 2
    assert "drop --algorithm" in capsys.readouterr().err
    assert run_simulation.main(["--reference", "exact"]) == 2
    assert "--reference goes with --compare" in capsys.readouterr().err
    assert run_simulation.main(["--compare", "pvi,zz"]) == 2
    assert "unknown algorithm 'zz'" in capsys.readouterr().err


# --- done-when 2 ---------------------------------------------------------------------------------
def test_conjugate_compare_uses_the_exact_posterior_and_pvi_is_exact(tmp_path, capsys):
    out = tmp_path / "cmp"
    code = run_simulation.main(["--engine", "in-process", "--quiet", "--compare", "pvi,amps",
                                "--model", "linear-regression", "--dataset", "synthetic",
                                "--num-clients", "3", "--num-rounds", "2",
                                "--output-dir", str(out)])
    assert code == 0, capsys.readouterr().err[-2000:]
    doc = _json(out / "compare.json")
    ref = doc["reference"]
    assert ref["kind"] == "exact" and "ess_min" not in ref["diagnostics"]  # no sampling
    # the exact posterior, recomputed here from the pooled rows: N(0, I) prior, noise 1,
    # no intercept (fedbayes_flwr.models.linear): S = (X'X + I)^-1, m = S X'y
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.experiment import build_experiment

    exp = build_experiment(parse_run_config({**doc["run_config"], "algorithm": "pvi"}))
    x, y = exp.dataset.x_train, exp.dataset.y_train
    cov = np.linalg.inv(x.T @ x + np.eye(x.shape[1]))
    np.testing.assert_allclose(ref["mean"], cov @ x.T @ y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ref["std"], np.sqrt(np.diag(cov)), rtol=1e-10)
    rows = {r["algorithm"]: r for r in doc["algorithms"]}
    # PVI with the conjugate local solver is exact after one round: rounding level (1e-14 sd
    # measured; 1e-9 leaves room for the solver's float64 linear algebra)
    assert rows["pvi"]["mean_error"] < 1e-9
    assert abs(rows["pvi"]["std_ratio_min"] - 1) < 1e-9 and abs(rows["pvi"]["std_ratio_max"] - 1) < 1e-9
    assert (out / "compare.md").read_text().count("| pvi |") == 1
    assert (out / "compare.png").stat().st_size > 0 and (out / "pvi" / "result.json").exists()
    assert "results in" in capsys.readouterr().out


def test_a_refused_algorithm_is_recorded_and_the_exit_code_is_still_0(tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["--engine", "in-process", "--quiet", "--compare", "pdmc,pvi", "--model",
            "user-logistic", "--dataset", "synthetic", "--num-clients", "2", "--num-rounds", "1",
            "--reference", "none", "--run-config",
            f"model-modules='{PLUGIN}' pvi.local-steps=100 pdmc.bounds='exact'", "--output-dir",
            str(out)]
    assert run_simulation.main(argv) == 0, capsys.readouterr().err[-2000:]
    rows = {r["algorithm"]: r for r in _json(out / "compare.json")["algorithms"]}
    assert rows["pvi"]["outcome"] == "completed" and rows["pvi"]["test_accuracy"] > 0.5
    assert rows["pdmc"]["outcome"] == "refused"
    assert rows["pdmc"]["reason"].startswith("model: PDMC needs rate bounds")
    assert "pdmc: refused: model: PDMC needs rate bounds" in (out / "compare.md").read_text()
    # only refusals: nothing can run, a bad input (exit 2) with every reason
    capsys.readouterr()
    assert run_simulation.main([*argv[:4], "pdmc", *argv[5:-1], str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: no algorithm of --compare accepts this run config: pdmc: model: PDMC needs")
    assert not (tmp_path / "none").exists()


# --- done-when 1 ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_reference_agrees_with_an_outside_nuts_and_figures_recompute(tmp_path, request):
    cache = str(request.config.cache.mkdir("fedbayes_reference"))
    data = make_data("logistic-regression")
    # outside the command: 8 chains x 600 draws after 300 warm-up (the model tests' reference)
    outside = nuts("logistic-regression", data, cache)
    config = {"model": "logistic-regression", "data": data, "num-clients": 3,
              "partition": "dirichlet", "partition-alpha": 0.3, "seed": 3, "num-rounds": 3,
              "output-dir": str(tmp_path / "cmp"), "pvi.local-steps": 200,
              "dhmc.num-chains": 4, "dhmc.warmup": 50, "dhmc.iterations": 100}
    cmp = fedbayes_flwr.compare(config, "pvi,dhmc", progress=False, cache_dir=cache)
    assert cmp.reference.kind == "nuts" and cmp.reference.diagnostics["converged"]
    assert cmp.ran == 2
    # agreement of two independent NUTS references: each mean's Monte-Carlo error is
    # sd / sqrt(ESS) (ESS >= 3,000 each: 0.018 sd), so their difference has sd 0.026 and 0.05 is
    # 2 of those; each sd's relative error is 1 / sqrt(2 ESS) (0.013), the difference's 0.018,
    # and 5 % is 2.7 of those
    assert np.min(outside.ess) >= 3000 and cmp.reference.diagnostics["ess_min"] >= 3000
    out_draws = outside.draws
    out_mean, out_std = out_draws.mean(axis=0), out_draws.std(axis=0, ddof=1)
    assert np.all(np.abs(cmp.reference.mean - out_mean) / out_std <= 0.05), (
        cmp.reference.mean, out_mean)
    assert np.all(np.abs(cmp.reference.std / out_std - 1) <= 0.05), (cmp.reference.std, out_std)
    # every figure recomputed from the files: reference.npz and each posterior.npz
    with np.load(tmp_path / "cmp" / "reference.npz") as saved:
        draws = saved["draws"]
    mean, std = draws.mean(axis=0), draws.std(axis=0, ddof=1)
    doc = _json(tmp_path / "cmp" / "compare.json")
    for row in doc["algorithms"]:
        folder = tmp_path / "cmp" / row["algorithm"]
        post = load_posterior(folder / "posterior.npz")
        np.testing.assert_allclose(row["mean_error"], np.max(np.abs(post.mean() - mean) / std),
                                   rtol=1e-12)
        ratio = post.std() / std
        np.testing.assert_allclose([row["std_ratio_min"], row["std_ratio_max"]],
                                   [ratio.min(), ratio.max()], rtol=1e-12)
        sample = np.asarray(post.sample(W1_SEED, draws.shape[0]))
        w1 = max(wasserstein_distance(sample[:, j], draws[:, j]) / std[j]
                 for j in range(draws.shape[1]))
        np.testing.assert_allclose(row["w1"], w1, rtol=1e-9)
        result = _json(folder / "result.json")
        assert row["test_accuracy"] == result["final"]["test_accuracy"]
        assert row["bytes"] == sum(h["bytes_down"] + h["bytes_up"] for h in result["history"])
        assert row["outcome"] == result["outcome"] and os.path.isfile(folder / "metrics.png")


# --- the Simulation Engine: the same figures as in-process ----------------------------------------
@pytest.mark.flower
@pytest.mark.deployment  # starts Ray twice in one process: with the process tests (.ci/run)
def test_compare_through_the_simulation_engine_equals_in_process(tmp_path):
    import subprocess
    import sys

    docs = {}
    for engine in ("simulation", "in-process"):
        out = tmp_path / engine
        argv = [sys.executable, "run_simulation.py", "--engine", engine, "--quiet", "--compare",
                "pvi,amps", "--model", "linear-regression", "--dataset", "synthetic",
                "--num-clients", "2", "--num-rounds", "2", "--output-dir", str(out)]
        proc = subprocess.run(argv, cwd=run_simulation.__file__.rsplit("/", 1)[0],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        docs[engine] = _json(out / "compare.json")
        assert docs[engine]["run_config"]["num-clients"] == 2
    sim, local = (docs[e]["algorithms"] for e in ("simulation", "in-process"))
    assert [r["algorithm"] for r in sim] == [r["algorithm"] for r in local] == ["pvi", "amps"]
    for a, b in zip(sim, local, strict=True):
        assert a["outcome"] == b["outcome"] == "completed"
        for key in ("mean_error", "std_ratio_min", "std_ratio_max", "w1", "test_rmse", "bytes"):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-9, atol=1e-12, err_msg=key)
        post_sim = load_posterior(tmp_path / "simulation" / a["algorithm"] / "posterior.npz")
        post_loc = load_posterior(tmp_path / "in-process" / b["algorithm"] / "posterior.npz")
        np.testing.assert_allclose(post_sim.mean(), post_loc.mean(), rtol=1e-12, atol=1e-14)
