"""The DP-FedAvg baselines of ``benchmarks/dp/`` (issue 29): clipping bounds, accountants against
Flower's own, calibrated runs that never report more than their target, and a tiny sweep.

Everything is cheap (two rounds of three local steps, four clients, breast-cancer logistic
regression: each record-level client is one noise calibration); the
Simulation Engine check is the benchmark's ``--flower-check`` (it needs Ray: seconds become a
minute), recorded in ``benchmarks/results/dp/dp_sweep.json``.
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import pytest

DP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "benchmarks", "dp")
sys.path.insert(0, DP_DIR)
sys.path.insert(0, os.path.dirname(DP_DIR))

import dp_fedavg  # noqa: E402

DELTA = 1e-5
TINY = dp_fedavg.Problem(
    "tiny", {"model": "logistic-regression", "dataset": "breast-cancer", "partition": "dirichlet",
             "partition-alpha": 0.5, "num-clients": 4},
    rounds=2, local_steps=3, learning_rate=0.05, lot_size=32, record_clip=1.0, client_clip=1.0)


def test_clip_rows_bounds_every_norm_and_keeps_short_rows():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(200, 31)) * rng.uniform(0.01, 3.0, size=(200, 1))
    clipped = dp_fedavg.clip_rows(g, 1.0)
    norms, before = np.linalg.norm(clipped, axis=1), np.linalg.norm(g, axis=1)
    assert np.all(norms <= 1.0 * (1 + 1e-12))
    short = before <= 1.0
    assert short.any() and (~short).any()  # both cases exercised
    np.testing.assert_array_equal(clipped[short], g[short])
    np.testing.assert_allclose(norms[~short], 1.0, rtol=1e-12)
    # direction kept: clipped rows are positive multiples of the originals
    np.testing.assert_allclose(clipped[~short] * before[~short, None], g[~short], rtol=1e-12)


def test_client_level_epsilon_equals_flowers_own_accountant():
    """Flower's ``RdpAccountant`` (no amplification, add-or-remove-one) wraps the same
    ``dp_accounting`` RDP: composing the same rounds gives the same epsilon (to float
    round-off: the same computation)."""
    from flwr.supercore.privacy_accounting import (
        GaussianPrivacyEvent,
        NeighboringRelation,
        PrivacyConfig,
        SamplingMethod,
    )
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    sigma, rounds = 1.7, 7
    acc = RdpAccountant(PrivacyConfig(DELTA, 10, NeighboringRelation.ADD_OR_REMOVE_ONE,
                                      SamplingMethod.NO_AMPLIFICATION))
    for _ in range(rounds):
        acc.compose(GaussianPrivacyEvent(sigma, 10, 10))
    ours = dp_fedavg.epsilon_of(dp_fedavg.client_level_event(sigma, rounds), DELTA)
    assert ours == pytest.approx(acc.get_privacy_spent().epsilon, rel=1e-12)


@pytest.mark.parametrize("variant", dp_fedavg.VARIANTS)
def test_calibrated_run_never_reports_more_than_its_target(variant):
    target = 1.0
    out = dp_fedavg.RUNNERS[variant](TINY, 0, target, DELTA)
    spent = [h["dp_epsilon"] for h in out.history]
    assert all(s <= target for s in spent), spent
    assert spent == sorted(spent)  # composition only adds
    assert out.epsilon == spent[-1] <= target
    # calibrated, not merely safe: a 1 % smaller noise multiplier would overspend
    sigmas = (out.noise_multiplier if isinstance(out.noise_multiplier, list)
              else [out.noise_multiplier])
    exp = dp_fedavg.experiment(TINY, 0)
    worst = []
    for pid, sigma in enumerate(sigmas):
        if variant == "client-level":
            event = dp_fedavg.client_level_event(0.99 * sigma, TINY.rounds)
        else:
            n = len(exp.partitions[pid])
            event = dp_fedavg.record_level_event(0.99 * sigma, dp_fedavg.lot(TINY, n) / n,
                                                 TINY.rounds * TINY.local_steps)
        orders = None if variant == "client-level" else dp_fedavg.RECORD_ORDERS
        worst.append(dp_fedavg.epsilon_of(event, DELTA, orders))
    assert min(worst) > target
    assert all(math.isfinite(v) for v in out.metrics.values())


def test_quick_sweep_writes_fedavg_rows_within_target(tmp_path):
    import dp_sweep

    rc = dp_sweep.main(["--quick", "--problems", "breast-cancer-logistic", "--methods",
                        "dp-fedavg-client", "--epsilons", "2,inf", "--local-steps", "2",
                        "--work-dir", str(tmp_path)])
    assert rc == 0
    with open(tmp_path / "results" / "dp_sweep.json") as f:
        doc = json.load(f)
    rows = doc["summary"]["breast-cancer-logistic"]["dp-fedavg-client"]
    assert set(rows) == {"2", "inf"}
    assert rows["2"]["all_within_target"] and rows["2"]["dp_epsilon_max"] <= 2.0
    assert "client" in doc["guarantees"]["dp-fedavg-client"]
    assert (tmp_path / "results" / "dp_sweep.png").is_file()


def test_docs_tables_are_rendered_from_the_committed_json():
    """docs/benchmarks-dp.md's results section is what ``dp_sweep.py --write-docs`` renders from
    ``benchmarks/results/dp/dp_sweep.json``; that JSON is a full run (not ``--quick``) in which
    every finished DP run stayed within its target epsilon."""
    import dp_sweep

    with open(os.path.join(dp_sweep.common.ROOT, "benchmarks", "results", "dp", "dp_sweep.json")) as f:
        doc = json.load(f)
    with open(dp_sweep.DOCS_PAGE) as f:
        page = f.read()
    section = page.split(dp_sweep.START, 1)[1].split(dp_sweep.END, 1)[0]
    assert dp_sweep.START + section + dp_sweep.END == dp_sweep.render_docs(doc)
    assert not doc["quick"]
    runs = [r for by_method in doc["runs"].values() for by_eps in by_method.values()
            for by_seed in by_eps.values() for r in by_seed.values() if "metrics" in r]
    assert runs and all(r["within_target"] for r in runs)
