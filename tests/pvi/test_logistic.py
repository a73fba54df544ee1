"""PVI on breast-cancer logistic regression approaches global VI (acceptance: 10 clients,
Dirichlet 0.5, 10 rounds). The benchmark (benchmarks/pvi/pvi_vs_global_vi.py) reports the gap, which
is well inside 1%; this test uses a 3% bound to leave room for Monte-Carlo optimiser noise across
platforms (seed-to-seed spread of global VI's test NLL is ~0.5%, measured in the benchmark)."""

import pytest

from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process

KEYS = {"model": "logistic-regression", "dataset": "breast-cancer", "num-clients": 10,
        "partition": "dirichlet", "partition-alpha": 0.5, "num-rounds": 10, "seed": 0}


@pytest.fixture(scope="module")
def global_vi(tmp_path_factory):
    out = tmp_path_factory.mktemp("gvi")
    pooled = {k: v for k, v in KEYS.items() if k != "num-clients"}  # global-vi pools the data
    return run_in_process(parse_run_config({**pooled, "algorithm": "global-vi",
                                            "output-dir": str(out)}), progress=False)


def test_synchronous_pvi_reaches_global_vi_nll(global_vi, tmp_path):
    result = run_in_process(parse_run_config({**KEYS, "output-dir": str(tmp_path)}),
                            progress=False)
    reference = global_vi["final"]["test_nll"]
    assert result["final"]["test_nll"] <= 1.03 * reference
    assert result["final"]["test_accuracy"] >= global_vi["final"]["test_accuracy"] - 0.02
    assert all(h["rejected_replies"] == 0 for h in result["history"])
    # the free energy (a lower bound on log p(y)) approaches global VI's optimum
    assert result["final"]["log_marginal_likelihood"] == pytest.approx(
        global_vi["final"]["log_marginal_likelihood"], abs=1.0)
    # and PVI improves on its first round
    assert result["final"]["test_nll"] < result["history"][0]["test_nll"]
