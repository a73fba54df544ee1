"""``eval-every`` records every k-th server update (and always the last): the same metrics and
posteriors as recording every update, at a fraction of the evaluation and I/O."""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process, run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment

CASES = {
    "synchronous-logistic": {"model": "logistic-regression", "dataset": "synthetic",
                             "pvi.damping": 0.5},
    "sequential-linear": {"model": "linear-regression", "dataset": "synthetic",
                          "pvi.schedule": "sequential", "pvi.damping": 0.5},
    "asynchronous-linear": {"model": "linear-regression", "dataset": "synthetic",
                            "pvi.schedule": "asynchronous", "pvi.damping": 0.5,
                            "stragglers": "1"},
}
NOT_COMPARED = ("bytes_down", "bytes_up", "elapsed_s", "clients")


@pytest.mark.parametrize("case", sorted(CASES))
def test_eval_every_5_equals_eval_every_1_at_those_updates(tmp_path, case):
    keys = {**CASES[case], "num-clients": 4, "num-rounds": 20, "seed": 2}
    every = {k: run_in_process(parse_run_config({**keys, "eval-every": k,
                                                 "output-dir": str(tmp_path / str(k))}),
                               progress=False) for k in (1, 5)}
    assert [h["round"] for h in every[1]["history"]] == list(range(1, 21))
    assert [h["round"] for h in every[5]["history"]] == [5, 10, 15, 20]
    for row in every[5]["history"]:
        twin = every[1]["history"][row["round"] - 1]
        assert ({k: v for k, v in row.items() if k not in NOT_COMPARED}
                == {k: v for k, v in twin.items() if k not in NOT_COMPARED})
    # the posteriors are bit-identical at the recorded updates
    states = {k: {u: s for u, s, _ in iterate_in_process(build_experiment(parse_run_config(
        {**keys, "eval-every": k})))} for k in (1, 5)}
    assert sorted(states[5]) == [5, 10, 15, 20]
    for update, state in states[5].items():
        np.testing.assert_array_equal(state.posterior.eta1, states[1][update].posterior.eta1)
        np.testing.assert_array_equal(state.posterior.eta2, states[1][update].posterior.eta2)
    # ... and the run moved between records (the comparison has power)
    assert not np.array_equal(states[5][5].posterior.eta1, states[5][20].posterior.eta1)


def test_last_update_is_always_recorded(tmp_path):
    # client-held factors (guard off): the free-energy query is the recorder's alone. With the
    # server's step rule (the default) the candidate search runs every round, whatever eval-every.
    legacy = {"model": "linear-regression", "dataset": "synthetic", "num-clients": 3,
              "num-rounds": 7, "pvi.damping": 1.0, "pvi.guard": False}
    result = run_in_process(parse_run_config({**legacy, "eval-every": 5,
                                              "output-dir": str(tmp_path)}), progress=False)
    assert [h["round"] for h in result["history"]] == [5, 7]
    # the free-energy query runs only before a record, so fewer bytes cross than recording each
    one = run_in_process(parse_run_config({**legacy, "output-dir": str(tmp_path / "one")}),
                         progress=False)
    train_up = sum(h["bytes_up"] for h in one["history"])
    assert result["history"][0]["bytes_up"] + result["history"][1]["bytes_up"] < train_up
