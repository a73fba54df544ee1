"""Tests that kill the survivors of the PVI family's mutation sweep
(``benchmarks/mutation/sweep.py --family pvi --sample 100 --seed 0``,
``benchmarks/results/mutation/pvi.json``); each names the mutant it kills."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedbayes_flwr.algorithms.pvi import client as C
from fedbayes_flwr.algorithms.pvi.config import PVIConfig
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference import vi


class _Model:
    """A model with no closed-form factor: only the dispatch of ``local_optimum`` is looked at."""

    def __init__(self, deterministic: bool):
        self.deterministic_expectations = deterministic

    def likelihood_factor(self, x, y):
        return None

    def local_init(self, init, d):
        return init


@pytest.mark.parametrize("optimiser, deterministic, chosen", [
    ("auto", True, "solve"), ("auto", False, "adam"), ("solve", False, "solve"),
    ("fixed-point", True, "fixed-point"), ("adam", True, "adam"),
])
def test_local_optimum_runs_the_configured_optimiser(monkeypatch, optimiser, deterministic,
                                                     chosen):
    """client.py local_optimum: ``"auto"`` is Newton's ``solve`` for a model with deterministic
    expectations, Adam otherwise; a named optimiser is that one (mutants: ``== "auto"`` ->
    ``is``, ``== "solve"`` -> ``not ==``, ...)."""
    calls = []
    monkeypatch.setattr(vi, "solve_local", lambda *a: calls.append("solve") or "q")
    monkeypatch.setattr(vi, "fit_fixed_point", lambda *a: calls.append("fixed-point") or "q")
    monkeypatch.setattr(vi, "fit_gaussian", lambda *a: calls.append("adam") or "q")
    config = dataclasses.replace(PVIConfig(), local_optimiser="".join(optimiser),  # not interned
                                 closed_form=False)
    q = G.from_moments(np.zeros(2), np.ones(2))
    assert C.local_optimum(0, _Model(deterministic), np.zeros((3, 2)), np.zeros(3), q, q,
                           config) == "q"
    assert calls == [chosen]


@pytest.mark.parametrize("beta", [0.0, 1.5, 3.0])
def test_proximal_undamped_change_is_the_closed_form(beta):
    """client.py undamped_change with ``proximal = beta`` on the Gaussian-mean model (unit noise:
    the factor of rows x is ``(sum x, -n/2 I)``): with ``a = 1 / (1 + beta)`` the local optimum
    is ``a (q_cav + beta q) + a t_lik`` (natural parameters), and the change is that minus
    ``q_cav`` minus ``t_k``, computed here on the arrays (mutants of ``1 / (1 + beta)``: the
    power ``1 ** ...`` or ``1 // beta``)."""
    from fedbayes_flwr.algorithms.pvi.messages import StepMessage
    from fedbayes_flwr.models import make_model

    model = make_model("gaussian-mean")
    x = np.array([[0.3, -1.2], [1.1, 0.4], [0.2, 0.9]])
    q = G.make(np.array([0.5, -0.2]), np.array([[-2.0, 0.3], [0.3, -1.5]]))
    t_k = G.make(np.array([0.2, 0.1]), np.array([[-0.6, 0.1], [0.1, -0.4]]))
    reply = C.undamped_change(0, StepMessage(q, t_k, 1, beta), model, x, None, PVIConfig())
    a = 1.0 / (1.0 + beta)
    cav1, cav2 = q.eta1 - t_k.eta1, q.eta2 - t_k.eta2
    new1 = a * (cav1 + beta * q.eta1) + a * x.sum(0)
    new2 = a * (cav2 + beta * q.eta2) + a * (-0.5 * 3 * np.eye(2))
    np.testing.assert_allclose(reply.delta.eta1, new1 - cav1 - t_k.eta1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(reply.delta.eta2, new2 - cav2 - t_k.eta2, rtol=0, atol=1e-12)
    assert reply.num_examples == 3


def test_server_helpers_are_their_closed_forms():
    """server.py: the default config (synchronous, damping auto, proximal auto) starts a
    deterministic model at beta = 0 (``monte_carlo=False`` -> ``True`` gave 1); ``broadcast``
    names round ``server_round + 1``; ``_with_factors`` is ``q`` times ``prod_k t_k' / t_k``
    (natural parameters: q + sum(new) - sum(old)); with step memory the first step is
    ``min(first-step, 2 * last)``."""
    from fedbayes_flwr.algorithms.pvi import server as SV

    prior = G.make(np.array([0.1, -0.3]), np.array([[-0.5, 0.0], [0.0, -0.5]]))
    config = PVIConfig()
    assert config.server_held and config.first_proximal(True) == 1.0
    state = SV.init_server(prior, 3, config)
    assert state.proximal == 0.0
    assert SV.init_server(prior, 3, config, monte_carlo=True).proximal == 1.0
    assert SV.broadcast(state._replace(server_round=4), 1).server_round == 5
    rng = np.random.default_rng(0)
    old = G.NaturalGaussian(rng.normal(size=(3, 2)), rng.normal(size=(3, 2, 2)))
    new = G.NaturalGaussian(rng.normal(size=(3, 2)), rng.normal(size=(3, 2, 2)))
    got = SV._with_factors(state._replace(factors=old), new)
    np.testing.assert_allclose(got.eta1, prior.eta1 + new.eta1.sum(0) - old.eta1.sum(0),
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.eta2, prior.eta2 + new.eta2.sum(0) - old.eta2.sum(0),
                               rtol=0, atol=1e-12)
    memory = dataclasses.replace(config, step_memory=True)
    assert memory.first_step == 1.0  # damping auto: rho = rho_s = 1
    assert SV.round_first_step(state._replace(last_step=0.3), memory) == pytest.approx(0.6)
    assert SV.round_first_step(state._replace(last_step=0.8), memory) == 1.0


def test_search_candidates_and_the_no_reply_round():
    """server.py candidates: candidate 0 is the current q with step 0 (``[0.0, *steps]`` ->
    ``[1.0, ...]``); with Anderson acceleration but no Anderson point (a later exchange of the
    round) the appended copy of q is flagged improper, so it is never chosen
    (``proper[-1] = False`` -> ``True``); search_step with no reply rolls back and counts the
    exchange it made (``search + 1`` -> ``search ** 1`` said 0)."""
    from fedbayes_flwr.algorithms.pvi import server as SV

    prior = G.make(np.array([0.1, -0.3]), np.array([[-0.5, 0.0], [0.0, -0.5]]))
    config = dataclasses.replace(PVIConfig(), acceleration="anderson")
    state = SV.init_server(prior, 2, config)
    cands = SV.candidates(state, config)
    assert cands.steps[0] == 0.0 and np.isnan(cands.steps[-1])
    np.testing.assert_array_equal(cands.posteriors.eta1[0], prior.eta1)
    later = SV.candidates(state._replace(search=1), config)
    assert later.anderson is None and not later.proper[-1] and later.proper[0]
    _, info = SV.search_step(state, [], config, 2)
    assert info.diagnostics["pvi_search_exchanges"] == 1
    assert "rolled back" in info.diagnostics["pvi_guard"]
