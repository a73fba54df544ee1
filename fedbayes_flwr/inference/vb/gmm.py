"""Gaussian mixture with known variance: mean-field coordinate ascent.

Model (Campbell & How 2014, Sections 2-3.1): ``K`` components in ``R^D``,

    pi ~ Dirichlet(alpha_0),   mu_k ~ N(m_0, s_0^2 I),   z_n ~ Cat(pi),
    x_n | z_n = k ~ N(mu_k, sigma^2 I)        (sigma^2 known).

Mean field ``q(pi) q(mu) prod_n q(z_n)`` with ``q(pi) = Dirichlet(alpha)`` (:class:`Weights`),
``q(mu_k) = N(h_k / prec_k, diag(1 / prec_k))`` (:class:`Gaussian`, both natural parameters) and
``q(z_n) = Cat(r_n)``. Coordinate ascent (Bishop 2006, Section 10.2, with known variance):

* ``log r_nk = E[log pi_k] - sum_d ((x_nd - m_kd)^2 + v_kd) / (2 sigma^2) + const`` with
  ``E[log pi_k] = digamma(alpha_k) - digamma(sum alpha)``, ``m = h / prec``, ``v = 1 / prec``;
* ``alpha_k = alpha_0k + sum_n r_nk``;
* ``prec_kd = prec_0kd + sum_n r_nk / sigma^2`` and ``h_kd = h_0kd + sum_n r_nk x_nd / sigma^2``.

So ``alpha - alpha_0`` (expected counts) and ``prec - prec_0`` are non-negative: a valid
likelihood contribution. The prior may be any valid posterior of the model (streaming).

ELBO ``= sum_nk r_nk (E[log pi_k] + E[log N(x_n | mu_k, sigma^2 I)]) - sum_nk r_nk log r_nk
- KL(q(pi) || p(pi)) - sum_k KL(q(mu_k) || p(mu_k))``, with
``E[log N] = -D log(2 pi sigma^2) / 2 - sum_d ((x_nd - m_kd)^2 + v_kd) / (2 sigma^2)``. A sweep
is the ``r`` step then the global step; a restart stops when the relative ELBO change
``|dL| / max(1, |L|)`` falls below ``tol``.

**Initialisation** (symmetry breaking; uniform responsibilities would give every component the
same update): each restart draws ``K`` data rows without replacement (with, when ``n < K``), puts
the means there plus ``N(0, (s_0 / 10)^2)`` jitter at the prior's variance, and starts with an
``r`` step. ``restarts`` fits keep the best ELBO.

**Predictive** (held-out log-likelihood): under ``q`` the predictive density of a new point is
exactly ``sum_k E[pi_k] N(x | m_k, (sigma^2 + v_k) I)`` (``pi`` and ``mu`` independent in ``q``).

References
----------
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", Section 3.1 (the mixture
example and its AMPS objective); Bishop (2006), "Pattern Recognition and Machine Learning",
Section 10.2 (variational mixture of Gaussians).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import digamma, gammaln, logsumexp

from fedbayes_flwr.inference import expfam
from fedbayes_flwr.inference.vb.base import FitResult, VBModel


class GMMParams(NamedTuple):
    """The global posterior: component means (coupled with) the mixture weights."""

    means: expfam.Gaussian
    weights: expfam.Weights


def dirichlet_kl(alpha: np.ndarray, alpha0: np.ndarray) -> float:
    """``KL(Dir(alpha) || Dir(alpha0))`` over the last axis, summed."""
    a, a0 = np.atleast_2d(alpha), np.atleast_2d(alpha0)
    s, s0 = a.sum(-1), a0.sum(-1)
    out = (gammaln(s) - gammaln(a).sum(-1) - gammaln(s0) + gammaln(a0).sum(-1)
           + ((a - a0) * (digamma(a) - digamma(s)[:, None])).sum(-1))
    return float(out.sum())


def gaussian_kl(mean, var, mean0, var0) -> float:
    """``KL(N(mean, var) || N(mean0, var0))`` of independent coordinates, summed."""
    return float(0.5 * np.sum(np.log(var0 / var) + (var + (mean - mean0) ** 2) / var0 - 1.0))


class GMM(VBModel):
    """Gaussian mixture with known isotropic variance (module docstring).

    Parameters
    ----------
    num_components : int
        ``K``.
    dim : int
        ``D``.
    noise_var : float
        ``sigma^2``, the known within-component variance (the paper: 0.09).
    prior_var : float
        ``s_0^2`` of the means' prior ``N(0, s_0^2 I)`` (the paper: 2).
    concentration : float
        ``alpha_0`` of the weights' symmetric Dirichlet (the paper: 1).
    """

    name = "gmm"
    symmetric = ("means", "weights")

    def __init__(self, num_components: int, dim: int, noise_var: float, prior_var: float = 2.0,
                 concentration: float = 1.0):
        for label, value in (("num_components", num_components), ("dim", dim)):
            if int(value) < 1:
                raise ValueError(f"{label} must be >= 1, got {value}")
        for label, value in (("noise_var", noise_var), ("prior_var", prior_var),
                             ("concentration", concentration)):
            if not float(value) > 0:
                raise ValueError(f"{label} must be > 0, got {value}")
        self.num_components, self.dim = int(num_components), int(dim)
        self.noise_var, self.prior_var = float(noise_var), float(prior_var)
        self.concentration = float(concentration)

    def prior(self) -> GMMParams:
        k, d = self.num_components, self.dim
        return GMMParams(expfam.Gaussian(np.zeros((k, d)), np.full((k, d), 1.0 / self.prior_var)),
                         expfam.Weights(np.full(k, self.concentration)))

    # ------------------------------------------------------------------ coordinate ascent
    def _sq(self, x, m, v) -> np.ndarray:
        """``sum_d ((x_nd - m_kd)^2 + v_kd)``, shape ``(n, K)``."""
        return ((x[:, None, :] - m[None]) ** 2).sum(-1) + v.sum(-1)[None]

    def _r_step(self, x, params: GMMParams):
        m, v = expfam.mean(params.means), 1.0 / params.means.prec
        logits = expfam.expected_log(params.weights)[None] - self._sq(x, m, v) / (2 * self.noise_var)
        return np.exp(logits - logsumexp(logits, axis=1, keepdims=True))

    def _global_step(self, x, r, prior: GMMParams) -> GMMParams:
        counts = r.sum(0)
        prec = prior.means.prec + counts[:, None] / self.noise_var
        h = prior.means.h + (r.T @ x) / self.noise_var
        return GMMParams(expfam.Gaussian(h, prec), expfam.Weights(prior.weights.alpha + counts))

    def elbo(self, x, r, params: GMMParams, prior: GMMParams) -> float:
        m, v = expfam.mean(params.means), 1.0 / params.means.prec
        e_log_pi = expfam.expected_log(params.weights)
        e_log_lik = (-0.5 * self.dim * np.log(2 * np.pi * self.noise_var)
                     - self._sq(x, m, v) / (2 * self.noise_var))
        with np.errstate(divide="ignore", invalid="ignore"):
            entropy = -np.sum(np.where(r > 0, r * np.log(r), 0.0))
        return float(np.sum(r * (e_log_pi[None] + e_log_lik)) + entropy
                     - dirichlet_kl(params.weights.alpha, prior.weights.alpha)
                     - gaussian_kl(m, v, expfam.mean(prior.means), 1.0 / prior.means.prec))

    def _init(self, x, prior: GMMParams, rng) -> GMMParams:
        n, k = x.shape[0], self.num_components
        rows = rng.choice(n, size=k, replace=n < k)
        sd0 = np.sqrt(1.0 / prior.means.prec)
        means = x[rows] + 0.1 * sd0 * rng.standard_normal((k, self.dim))
        return GMMParams(expfam.Gaussian(means * prior.means.prec, prior.means.prec.copy()),
                         prior.weights)

    def fit(self, x, prior: GMMParams, rng, *, restarts: int = 1, tol: float = 1e-6,
            max_iter: int = 500) -> FitResult:
        x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        if x.shape[1] != self.dim:
            raise ValueError(f"gmm: data have {x.shape[1]} columns, the model {self.dim}")
        best, elbos = None, []
        for _ in range(max(1, int(restarts))):
            params, last, it, converged = self._init(x, prior, rng), -np.inf, 0, False
            for it in range(1, max_iter + 1):  # noqa: B007 (iterations reported)
                r = self._r_step(x, params)
                params = self._global_step(x, r, prior)
                value = self.elbo(x, self._r_step(x, params), params, prior)
                if abs(value - last) <= tol * max(1.0, abs(value)):
                    converged = True
                    break
                last = value
            elbos.append(value)
            if best is None or value > best.elbo:
                best = FitResult(params, value, it, converged)
        return best._replace(elbos=tuple(elbos))

    # ------------------------------------------------------------------ evaluation
    def log_predictive(self, params: GMMParams, x) -> np.ndarray:
        """``log sum_k E[pi_k] N(x_n | m_k, (sigma^2 + v_k) I)`` for each row, shape ``(n,)``."""
        x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        m, v = expfam.mean(params.means), self.noise_var + 1.0 / params.means.prec
        log_w = np.log(expfam.mean(params.weights))
        comp = -0.5 * (np.log(2 * np.pi * v).sum(-1)[None]
                       + (((x[:, None, :] - m[None]) ** 2) / v[None]).sum(-1))
        return logsumexp(log_w[None] + comp, axis=1)

    def heldout_loglik(self, params: GMMParams, x_test, seed: int = 0) -> float:
        """Mean log predictive density per held-out point (exact under ``q``)."""
        return float(np.mean(self.log_predictive(params, x_test)))

    def component_means(self, params: GMMParams) -> np.ndarray:
        return expfam.mean(params.means)
