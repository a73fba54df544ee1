"""DSVGD's divergence guard (issue 26): a step 1e3 times too large is rolled back and recorded in
the history row's diagnostics, or the run stops with one line; never ``completed`` with exploded
particles. And every row carries the particles' kernel Stein discrepancy to the target."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedbayes_flwr import models
from fedbayes_flwr.algorithms.dsvgd.svgd import SCALED_STEP, diverged, guarded_svgd, scaled_svgd
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process_with_posterior
from fedbayes_flwr.runtime.experiment import build_experiment

SMALL = {"model": "gaussian-mean", "dataset": "synthetic", "synthetic-dim": 2,
         "num-clients": 3, "partition": "iid", "seed": 0, "dsvgd.num-particles": 20,
         "dsvgd.local-iterations": 30, "dsvgd.distillation-iterations": 30,
         "dsvgd.batch-size": 0}
#: 1e3 times the default relative step (:data:`SCALED_STEP`).
HUGE = 1e3 * SCALED_STEP


def _run(tmp_path, algorithm, **extra):
    config = parse_run_config({**SMALL, "algorithm": algorithm, "num-rounds": 2,
                               "output-dir": str(tmp_path), **extra})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result, posterior = run_in_process_with_posterior(config, progress=False)
    exp = build_experiment(config)
    exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train, None)
    mean, cov = G.to_moments(exact)
    return result, posterior, mean, np.sqrt(np.diag(cov))


@pytest.mark.parametrize("algorithm", ["dsvgd", "u-dsvgd", "p-dsvgd"])
def test_a_step_1e3_too_large_is_rolled_back_or_stops(tmp_path, algorithm):
    result, posterior, mean, sd = _run(tmp_path, algorithm, **{"dsvgd.learning-rate": HUGE})
    if result["outcome"] == "stopped":
        assert "\n" not in result["reason"] and "diverged" in result["reason"], result["reason"]
        return
    assert result["outcome"] == "completed", result
    rows = result["history"]
    assert rows[0]["diagnostics"]["dsvgd_rollbacks"] >= 1, rows[0]
    # not exploded: the exact posterior sd is 0.1-0.2 here and the prior's 1; a cloud the guard
    # let through lies within 10 start spreads (GUARD_SPREAD) of where it began, the prior's
    # draws (|theta| < 4 with probability > 0.999 for 20 draws in 2-D), so |theta| < 50 holds for
    # any accepted cloud while an unguarded 1e3 step puts particles at |theta| ~ 1e2-1e3
    # (test below)
    x = posterior.samples
    assert np.all(np.isfinite(x)) and np.max(np.abs(x)) < 50, np.max(np.abs(x))
    assert all(np.isfinite(r["diagnostics"]["ksd"]) for r in rows)


def test_without_the_guard_the_same_step_explodes(tmp_path):
    """The failure the guard exists for (so the test above can fail): guard off, same step."""
    result, posterior, mean, sd = _run(tmp_path, "dsvgd", **{"dsvgd.learning-rate": HUGE,
                                                              "dsvgd.guard": False})
    assert result["outcome"] == "completed"
    assert np.max(np.abs(posterior.samples)) > 50


def test_defaults_record_ksd_and_no_rollback(tmp_path):
    result, posterior, mean, sd = _run(tmp_path, "p-dsvgd")
    rows = result["history"]
    assert [r["diagnostics"]["dsvgd_rollbacks"] for r in rows] == [0, 0]
    ksd = [r["diagnostics"]["ksd"] for r in rows]
    assert all(np.isfinite(k) and k > 0 for k in ksd), ksd


def test_guard_rolls_back_then_gives_up():
    """:func:`guarded_svgd` shrinks the step by 10 per rollback and reports an unrecovered loop
    with ``retries + 1`` reasons."""
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=(20, 2))

    def run(factor):
        return scaled_svgd(x0, lambda x: -x, 20, relative=HUGE * factor)

    x, report = guarded_svgd(run, x0, retries=3)
    assert 1 <= report.rollbacks <= 3 and report.step_factor == pytest.approx(0.1 ** report.rollbacks)
    assert diverged(x0, x) is None
    _, gave_up = guarded_svgd(lambda f: x0 * 1e6, x0, retries=2)
    assert len(gave_up.reasons) == 3 and gave_up.rollbacks == 2
    assert diverged(x0, np.full_like(x0, np.nan)) == "non-finite particles"
