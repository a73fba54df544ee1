"""A bad reply is rejected, counted, and leaves the posterior as if that reply never came."""

import numpy as np
import pytest

from fedbayes_flwr.algorithms import commit
from fedbayes_flwr.runtime.config import ConfigError, parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process
from fedbayes_flwr.runtime.experiment import build_experiment

BASE = {"model": "logistic-regression", "num-clients": 4, "num-rounds": 3, "local-steps": 60,
        "partition-alpha": 0.5, "seed": 1}


def _run(**kw):
    rounds = list(iterate_in_process(build_experiment(parse_run_config({**BASE, **kw}))))
    return rounds[-1][1].posterior, [log for _, _, log in rounds]


@pytest.mark.parametrize("kind", ["nan", "negative-precision"])
def test_bad_reply_equals_missing_reply(kind):
    bad, logs = _run(**{"inject-fault": f"{kind}@2:1"})
    dropped, _ = _run(**{"inject-fault": "drop@2:1"})
    clean, _ = _run()
    assert [len(log.rejected) for log in logs] == [0, 1, 0]
    rejection = logs[1].rejected[0]
    assert rejection.partition_id == 1
    assert rejection.field == ("delta.eta1" if kind == "nan" else "delta.eta2")
    assert logs[1].clients == (0, 2, 3)
    np.testing.assert_array_equal(bad.eta1, dropped.eta1)
    np.testing.assert_array_equal(bad.eta2, dropped.eta2)
    # the check has power: the clean run differs
    assert np.max(np.abs(clean.eta1 - bad.eta1)) > 1e-3


def test_rejected_client_keeps_its_old_factor():
    """After a rejection the client's pending factor is dropped (server and client agree)."""
    from fedbayes_flwr.inference import gaussian as G

    exp = build_experiment(parse_run_config({**BASE, "model": "linear-regression",
                                             "dataset": "synthetic", "damping": 1.0,
                                             "guard": False,  # client-held factors
                                             "inject-fault": "nan@1:2"}))
    logs = list(iterate_in_process(exp, num_rounds=2))
    # round 2 lets client 2 add its (exact) factor once: the posterior is exact, not double-counted
    from fedbayes_flwr import models

    exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train, exp.dataset.y_train)
    np.testing.assert_allclose(logs[-1][1].posterior.eta2, exact.eta2, rtol=1e-10)
    np.testing.assert_allclose(G.to_moments(logs[-1][1].posterior)[0], G.to_moments(exact)[0],
                               rtol=1e-8)
    assert logs[0][2].rejected[0].partition_id == 2 and not logs[1][2].rejected
    assert list(logs[0][1].accepted_round) == [1, 1, commit.NO_ROUND, 1]


def test_fault_spec_is_validated():
    with pytest.raises(ConfigError, match="KIND@ROUND:PARTITION"):
        parse_run_config({"inject-fault": "nan"})
    with pytest.raises(ConfigError, match="inject-fault kind"):
        parse_run_config({"inject-fault": "boom@1:1"})


@pytest.mark.parametrize("schedule", ["synchronous", "sequential", "asynchronous"])
@pytest.mark.parametrize("kind", ["garbage", "nan", "error"])
def test_every_one_shot_fault_fires_once_on_every_schedule(schedule, kind):
    """``KIND@2:0`` hits partition 0's first train request at or after update 2, once, whatever
    the schedule (a sequential or asynchronous one does not ask partition 0 at update 2 itself;
    an asynchronous run with ``garbage@2:0`` used to record no rejection) (issue 32, row 11)."""
    keys = {"algorithm": "pvi", "model": "linear-regression", "dataset": "synthetic",
            "num-clients": 3, "num-rounds": 12, "seed": 0, "pvi.schedule": schedule,
            "straggler-factor": 2.0,
            # asynchronous: partition 0 is slow, so update 2 is another partition's
            "stragglers": "0" if schedule == "asynchronous" else "",
            "inject-fault": f"{kind}@2:0"}
    rounds = list(iterate_in_process(build_experiment(parse_run_config(keys))))
    rejected = [r for _, _, log in rounds for r in log.rejected]
    assert [r.partition_id for r in rejected] == [0], rejected
