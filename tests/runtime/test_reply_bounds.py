"""Reply bounds (issue 32, row 12): a finite, well-formed but absurd reply (``huge``: every float
array times 1e100) is refused by the family's ``check`` with the field and the bound it breaks,
and the run then equals the run in which that reply is refused structurally (``garbage``, the
existing fault): the same rejection path, so the server states agree exactly. Honest replies stay
inside the bounds (the families' own acceptance tests, and the clean runs here, record no
rejection)."""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes_flwr.algorithms import bounds
from fedbayes_flwr.algorithms.base import Rejection, Round, failure_policy, round_seed
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.tree import leaves
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from fedbayes_flwr.runtime.steps import client_work, judge

GM = {"model": "gaussian-mean", "dataset": "synthetic", "synthetic-dim": 2, "synthetic-size": 40,
      "num-clients": 3, "partition": "iid", "seed": 1, "num-rounds": 3}
# one cheap setup per family (PVI in both covariance layouts); the field the huge reply is
# refused on (PVI: delta.eta2 for the precision's growth or delta.eta1 for the mean's move,
# whichever the scaled delta breaks first)
FAMILIES = {
    "pvi-diag": ({**GM, "algorithm": "pvi", "pvi.covariance": "diag"}, "delta"),
    "pvi-full": ({**GM, "algorithm": "pvi", "pvi.covariance": "full"}, "delta"),
    "amps": ({"algorithm": "amps", "model": "gmm", "dataset": "amps-mixture", "num-clients": 3,
              "partition": "iid", "amps.restarts": 1, "amps.max-iter": 5, "num-rounds": 1},
             "posterior"),
    "dsvgd": ({**GM, "algorithm": "dsvgd", "dsvgd.num-particles": 4,
               "dsvgd.local-iterations": 3, "dsvgd.distillation-iterations": 3}, "particles"),
    "dsgld": ({**GM, "algorithm": "dsgld", "sgld.num-chains": 3, "sgld.steps-per-round": 3},
              "chains"),
    "fedavg": ({**GM, "model": "linear-regression", "algorithm": "fedavg",
                "fedavg.local-steps": 3}, "theta"),
    "pdmc-bps": ({**GM, "algorithm": "pdmc-bps", "pdmc.num-chains": 3, "num-rounds": 4,
                  "pdmc.preconditioner": "none"}, "velocity"),
    # with the preconditioner the first exchanges are the Laplace fit's (U_m, gradient, Hessian)
    "pdmc-laplace": ({**GM, "algorithm": "pdmc", "pdmc.num-chains": 3, "num-rounds": 4,
                      "pdmc.preconditioner": "dense"}, "grad"),
    "dhmc": ({**GM, "model": "linear-regression", "algorithm": "dhmc", "dhmc.num-chains": 3,
              "dhmc.warmup": 2, "dhmc.iterations": 4, "dhmc.mixing-rounds": 2}, "w"),
}


def _run(keys, fault=""):
    exp = build_experiment(parse_run_config({**keys, "inject-fault": fault}))
    rows = list(iterate_in_process(exp))
    refused = [r for _, _, log in rows for r in log.rejected]
    return exp, rows[-1][1], refused, sum(log.retried for _, _, log in rows)


def _clients_at(keys, number):
    exp = build_experiment(parse_run_config(keys))
    return [log.clients for u, _, log in iterate_in_process(exp) if u == number][0]


def _same(a_state, b_state):
    for (name, a), (_, b) in zip(leaves(a_state), leaves(b_state), strict=True):
        if name != "started":  # PDMC's wall-clock start
            np.testing.assert_equal(a, b, err_msg=name)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_huge_reply_is_refused_like_a_garbage_one(family):
    keys, field = FAMILIES[family]
    number = 1 if family == "amps" else 2  # AMPS has one round
    exp, clean_state, clean_rejected, clean_retried = _run(keys)
    assert (clean_rejected, clean_retried) == ([], 0)  # honest replies are inside the bounds
    # a partition asked at update `number` (DSVGD and SGLD ask one per update; the samplers
    # ask every worker at every exchange)
    reject = failure_policy(exp.bundle, exp.setup.config) == "reject"
    target = (_clients_at(keys, number)[0] if reject else 1)
    where = f"{number}:{target}"
    exp, huge_state, huge_rejected, huge_retried = _run(keys, f"huge@{where}")
    _, garbage_state, garbage_rejected, garbage_retried = _run(keys, f"garbage@{where}")
    if reject:  # recorded, run goes on
        assert [r.partition_id for r in huge_rejected] == [target], huge_rejected
        (refusal,) = huge_rejected
        assert refusal.field.startswith(field) and "limit" in refusal.reason, refusal
        assert [r.partition_id for r in garbage_rejected] == [target]
    else:  # retry-stop samplers: the row counts the retry (the re-sent request succeeds)
        assert (huge_retried, garbage_retried, huge_rejected) == (1, 1, [])
    _same(huge_state, garbage_state)
    # power: the accepted huge reply would have changed the run (clean differs from refused)
    if reject:
        with pytest.raises(AssertionError):
            _same(clean_state, garbage_state)
    # the first reply of a run, judged directly: the bound names the field (retry families
    # too, whose retried rejection the history row only counts)
    server = exp.bundle.init_server(exp.setup)
    rnd = Round(1, 0, round_seed(exp.config.seed, exp.bundle.name, 1, 0),
                frozenset(range(exp.num_clients)), True)
    pid, request = sorted(exp.bundle.requests(server, exp.setup, rnd).items())[0]
    exp = build_experiment(parse_run_config({**keys, "inject-fault": f"huge@1:{pid}"}))
    _, reply = client_work(exp, exp.bundle.init_client(exp.setup, pid), pid, request, 1)
    judged = judge(exp.bundle, exp.setup, exp.actions, server, pid, request.action, reply)
    assert isinstance(judged, Rejection) and judged.field.startswith(field), judged
    assert "limit" in judged.reason


def test_pvi_bound_keeps_a_first_round_factor_far_above_the_prior():
    """The first PVI update from a vague prior is legitimate however much the data outweigh it,
    up to float64's resolution: 2**50-fold precision growth passes, 2**53-fold is refused."""
    prior = G.from_moments(np.zeros(2), np.ones(2))
    for grow, ok in ((2.0**50, True), (2.0**53, False)):
        new = G.from_moments(np.array([3.0, -3.0]), np.full(2, 1.0 / grow))
        assert (bounds.gaussian_step_error(prior, new) is None) == ok
        full = G.from_moments(np.array([3.0, -3.0]), np.diag(np.full(2, 1.0 / grow)))
        assert (bounds.gaussian_step_error(G.from_moments(np.zeros(2), np.eye(2)), full)
                is None) == ok
