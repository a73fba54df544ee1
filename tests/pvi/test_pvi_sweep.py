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
