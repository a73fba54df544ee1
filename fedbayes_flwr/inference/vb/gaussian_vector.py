"""The vector models (one Gaussian over a parameter vector) as AMPS clients: no label symmetry.

``gaussian-mean``, ``linear-regression`` and ``logistic-regression`` have one full-covariance
Gaussian posterior :class:`~fedbayes_flwr.inference.expfam.FullGaussian` ``(h, prec)`` over ``theta``
(``h = prec @ mean``; in :mod:`fedbayes_flwr.inference.gaussian` terms ``eta1 = h``, ``eta2 = -prec / 2``).
Nothing is symmetric, so AMPS is the naive merge ``(1 - N) lambda_0 + sum_i lambda_i``.

Local fits: the conjugate models' exact posterior ``lambda_0 + (likelihood factor of the
client's rows)``, so the merge is the exact pooled posterior (Campbell & How 2014, Figure 1);
logistic regression's full-covariance Gaussian VI optimum
(:func:`fedbayes_flwr.inference.vi.solve_local` with the prior as cavity), whose merge approximates
global VI.

References
----------
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", eq. (3) and the Gaussian
example of Section 2; Broderick et al. (2013), "Streaming Variational Bayes", eq. (2).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedbayes_flwr.inference import expfam
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.inference.vb.base import FitResult, VBModel


class VectorParams(NamedTuple):
    """One Gaussian over the whole parameter vector."""

    theta: expfam.FullGaussian


def to_params(nat: NaturalGaussian) -> VectorParams:
    """A :class:`NaturalGaussian` (full or diagonal) as :class:`VectorParams`."""
    prec = G.precision(nat)
    if nat.is_diag:
        prec = np.diag(prec)
    return VectorParams(expfam.FullGaussian(np.asarray(nat.eta1, np.float64).copy(), prec))


def to_natural(params: VectorParams) -> NaturalGaussian:
    return G.make(params.theta.h, -0.5 * params.theta.prec)


class GaussianVector(VBModel):
    """A :class:`fedbayes_flwr.models.Model` with a Gaussian posterior over ``theta``.

    Parameters
    ----------
    model : fedbayes_flwr.models.Model
        Conjugate (``likelihood_factor``) or with a deterministic expected log-likelihood
        (logistic regression).
    prior : NaturalGaussian
        The model's prior (made full-covariance here).
    """

    symmetric = ()
    num_components = 1
    needs_targets = True

    def __init__(self, model, prior: NaturalGaussian):
        self.model, self.name = model, model.name
        self._prior = to_params(prior)
        if not (model.conjugate or model.deterministic_expectations):
            raise ValueError(f"model {model.name!r}: AMPS needs a closed-form or deterministic "
                             f"local posterior (gaussian-mean, linear-regression, "
                             f"logistic-regression)")

    def prior(self) -> VectorParams:
        return self._prior

    def fit(self, x, prior: VectorParams, rng=None, *, y=None, restarts: int = 1,
            tol: float = 1e-6, max_iter: int = 500) -> FitResult:
        """The exact posterior (conjugate models) or the local VI optimum (others)."""
        from fedbayes_flwr.inference.vi import solve_local

        nat = to_natural(prior)
        factor = self.model.likelihood_factor(x, y)
        if factor is not None:
            post = G.add(nat, G.like(nat, factor))
            return FitResult(to_params(post), float("nan"), 1, True, ())
        post = solve_local(self.model, x, y, nat, nat, diag=False, tol=min(tol, 1e-8))
        return FitResult(to_params(post), float("nan"), 1, True, ())

    def heldout_loglik(self, params: VectorParams, x_test, seed: int = 0) -> float:
        raise NotImplementedError("vector models report the Model's own test metrics")

    def component_means(self, params: VectorParams) -> np.ndarray:
        return expfam.mean(params.theta)[None]
