"""Scalar float fields of messages and stored states: NaN is never valid, +/-inf only where the
action allows it (issue 31, mutant M19c: NaN accepted in scalar float fields, and no hostile case
covered them: the hostile suite mutates arrays).

The fields are the real ones of the registered families: AMPS's reply ``elbo`` and
``fit_seconds``, decentralized HMC's request ``epsilon`` and the ``started`` clock that DHMC's and
PDMC's server states keep (checked when a state is restored).
"""

import math

import numpy as np
import pytest

from fedbayes_flwr.algorithms.base import Rejection
from fedbayes_flwr.runtime import steps
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import build_experiment
from fedbayes_flwr.runtime.validation import check_message
from tests.helpers import mutants

GM = {"model": "gaussian-mean", "dataset": "synthetic", "synthetic-dim": 2, "synthetic-size": 40,
      "num-clients": 3, "partition": "iid", "seed": 1}
SETUPS = {
    "amps": {"algorithm": "amps", "num-clients": 3, "partition": "iid", "amps.restarts": 1,
             "amps.max-iter": 5, "model": "gmm", "dataset": "amps-mixture"},
    "dhmc": {**GM, "model": "linear-regression", "algorithm": "dhmc", "dhmc.num-chains": 3,
             "dhmc.warmup": 2, "dhmc.iterations": 4, "dhmc.mixing-rounds": 2},
    "pdmc": {**GM, "algorithm": "pdmc", "pdmc.num-chains": 3},
}
BAD = [math.nan, math.inf, -math.inf]


def _template(family: str, where: str):
    exp = build_experiment(parse_run_config(SETUPS[family]))
    if where == "state":
        return exp.bundle.init_server(exp.setup)
    (spec,) = exp.actions.values() if family != "amps" else (exp.actions["train"],)
    return spec.request if where == "request" else spec.reply


CASES = [("amps", "reply", "elbo"), ("amps", "reply", "fit_seconds"),
         ("dhmc", "request", "epsilon"), ("dhmc", "state", "started"), ("pdmc", "state", "started")]


def _check_refused(family, where, field):
    template = _template(family, where)
    assert isinstance(getattr(template, field), float)
    assert check_message(template, template) is None  # the honest message passes
    for value in BAD:
        got = check_message(template, template._replace(**{field: value}))
        assert got == (field, "non-finite value"), f"{field} = {value} accepted: {got}"
    # +/-inf is a per-field licence; NaN stays refused under it
    assert check_message(template, template._replace(**{field: math.inf}), allow_inf={field}) is None
    assert check_message(template, template._replace(**{field: math.nan}),
                         allow_inf={field}) == (field, "non-finite value")


@pytest.mark.parametrize("family,where,field", CASES)
def test_non_finite_scalar_fields_are_refused(family, where, field):
    _check_refused(family, where, field)


def test_non_finite_scalar_mutant_fails(monkeypatch):
    mutants.apply(monkeypatch, "M19c")
    with pytest.raises(AssertionError, match="accepted"):
        _check_refused("amps", "reply", "elbo")


def test_amps_reply_with_nan_elbo_is_rejected_by_the_engines_judge():
    """Through the path both engines take (``steps.judge``): a Rejection naming the field."""
    exp = build_experiment(parse_run_config(SETUPS["amps"]))
    reply = exp.actions["train"].reply._replace(elbo=float("nan"))
    state = exp.bundle.init_server(exp.setup)
    got = steps.judge(exp.bundle, exp.setup, exp.actions, state, 1, "train", reply)
    assert isinstance(got, Rejection) and got.partition_id == 1
    assert (got.field, got.reason) == ("elbo", "non-finite value")
    assert np.isnan(reply.elbo)
