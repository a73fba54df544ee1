"""Potentials ``U_m(x) = -log`` (a worker's likelihood, or the prior) for piecewise-deterministic
samplers: the gradient and the bounds that make event times simulable.

A sampler moving along ``x + v s`` needs, for each potential, an upper bound on its event rate
that it can invert. Everything here is numpy over a batch of ``K`` chains (``x`` of shape
``(K, d)``): at this size TensorFlow's per-call cost would dominate.

* :class:`Quadratic` ``U(x) = (x - c)^T H (x - c) / 2``: Gaussian likelihoods with known noise and
  Gaussian priors. Along a line ``d/ds U(x + v s) = v . g + s v^T H v``: the rates are affine
  in ``s`` and inverted exactly (no thinning).
* :class:`Logistic` ``U(x) = sum_n [log(1 + e^{xi_n . x}) - eta_n xi_n . x]``: the Hessian is
  ``sum_n s'(xi_n . x) xi_n xi_n^T`` with ``0 < s' <= 1/4``, so ``v^T H v <= v^T B v`` with
  ``B = (1/4) sum_n xi_n xi_n^T`` (BPS) and ``|H_ij| <= C_ij = (1/4) sum_n |xi_ni xi_nj|``
  (Zig-Zag, coordinate ``i``'s rate changes at most by ``sum_j C_ij |v_j|`` per unit time).
  These are the standard Zig-Zag logistic bounds (Bierkens, Fearnhead & Roberts 2019, Section 3).

References
----------
Bierkens, Fearnhead & Roberts (2019), "The Zig-Zag process and super-efficient sampling for
Bayesian analysis of big data", Sections 3.1-3.2 (affine bounds, logistic regression);
Bouchard-Cote, Vollmer & Doucet (2018), "The Bouncy Particle Sampler", Section 2.3.
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.inference import gaussian as G


class Potential:
    """A potential's gradient and line bounds (see the module docstring).

    Attributes
    ----------
    dim : int
    quadratic : bool
        True when the rates are exactly affine along lines (bounds are exact).
    hess_bound : numpy.ndarray
        ``(d, d)`` positive semi-definite ``B`` with ``v^T H(x) v <= v^T B v`` everywhere
        (equal to ``H`` for quadratics).
    hess_abs : numpy.ndarray
        ``(d, d)`` with ``|H_ij(x)| <= C_ij`` everywhere (Zig-Zag's bound).
    """

    dim = 0
    quadratic = False
    hess_bound: np.ndarray
    hess_abs: np.ndarray

    def grad(self, x: np.ndarray) -> np.ndarray:
        """``grad U`` at each row of ``x (K, d)``."""
        raise NotImplementedError

    def value(self, x: np.ndarray) -> np.ndarray:
        """``U`` at each row of ``x (K, d)`` (up to a constant)."""
        raise NotImplementedError

    def hess_quad(self, x: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``v^T (Hessian of U at x) v`` for each row pair, shape ``(K,)`` (decentralized HMC's
        second-order energy term)."""
        raise NotImplementedError


class Quadratic(Potential):
    """``U(x) = (x - c)^T H (x - c) / 2`` (``H`` symmetric positive semi-definite)."""

    quadratic = True

    def __init__(self, hessian, centre):
        self.hessian = np.atleast_2d(np.asarray(hessian, dtype=np.float64))
        self.centre = np.asarray(centre, dtype=np.float64)
        self.dim = int(self.centre.shape[0])
        self.hess_bound = self.hessian
        self.hess_abs = np.abs(self.hessian)

    def grad(self, x):
        return (x - self.centre) @ self.hessian.T

    def value(self, x):
        z = x - self.centre
        return 0.5 * np.einsum("ki,ij,kj->k", z, self.hessian, z)

    def hess_quad(self, x, v):
        return np.einsum("ki,ij,kj->k", v, self.hessian, v)


class Logistic(Potential):
    """Logistic regression's negative log-likelihood for inputs ``xi (n, d)`` (intercept column
    included by the caller) and labels ``eta`` in {0, 1}."""

    def __init__(self, xi, eta):
        self.xi = np.asarray(xi, dtype=np.float64)
        self.eta = np.asarray(eta, dtype=np.float64)
        self.dim = int(self.xi.shape[1])
        self.hess_bound = 0.25 * self.xi.T @ self.xi
        self.hess_abs = 0.25 * np.abs(self.xi).T @ np.abs(self.xi)

    def grad(self, x):
        z = x @ self.xi.T
        return (0.5 * (1.0 + np.tanh(0.5 * z)) - self.eta) @ self.xi

    def value(self, x):
        z = x @ self.xi.T
        return np.sum(np.logaddexp(0.0, z) - self.eta * z, axis=1)

    def hess_quad(self, x, v):
        s = 0.5 * (1.0 + np.tanh(0.5 * (x @ self.xi.T)))
        return np.sum(s * (1.0 - s) * (v @ self.xi.T) ** 2, axis=1)


class DiagonalGaussian:
    """``U_0(theta) = sum_j prec_j (theta_j - mean_j)^2 / 2``: a diagonal Gaussian prior as a
    potential in ``O(d)`` per row (a dense ``d x d`` Hessian, as
    :class:`fedbayes_flwr.inference.potentials.Quadratic` holds, is 450 MB and a ``d^2`` product per
    call for the 7,510 parameters of a 64-100-10 network).

    Parameters
    ----------
    precision : array_like
        ``(d,)`` (or a scalar with ``dim``): ``1 / prior variance`` per coordinate.
    mean : array_like, optional
        ``(d,)``; zero by default.
    dim : int, optional
        Needed when ``precision`` is a scalar.
    """

    def __init__(self, precision, mean=None, dim: int | None = None):
        prec = np.asarray(precision, dtype=np.float64)
        if prec.ndim == 0:
            if dim is None:
                raise ValueError("a scalar precision needs dim")
            prec = np.full(int(dim), float(prec))
        if prec.ndim != 1 or np.any(prec < 0) or not np.all(np.isfinite(prec)):
            raise ValueError("precision must be finite and >= 0, one per coordinate")
        self.precision = prec
        self.dim = int(prec.shape[0])
        self.mean = np.zeros(self.dim) if mean is None else np.asarray(mean, dtype=np.float64)
        if self.mean.shape != (self.dim,):
            raise ValueError(f"mean must have shape ({self.dim},), got {self.mean.shape}")

    def value(self, theta):
        return 0.5 * np.sum(self.precision * (theta - self.mean) ** 2, axis=-1)

    def grad(self, theta):
        return self.precision * (theta - self.mean)

    def hess_quad(self, theta, v):
        return np.sum(self.precision * v**2, axis=-1)


def gaussian_mean_potential(x_rows: np.ndarray, noise_var: float) -> Quadratic:
    """``sum_n |y_n - x|^2 / (2 alpha^2)`` up to a constant: ``H = (n / alpha^2) I``, ``c`` the
    rows' mean (an empty shard: ``H = 0``)."""
    x_rows = np.asarray(x_rows, dtype=np.float64)
    n, d = x_rows.shape
    centre = x_rows.mean(axis=0) if n else np.zeros(d)
    return Quadratic(np.eye(d) * n / noise_var, centre)


def linear_regression_potential(design: np.ndarray, y: np.ndarray,
                                noise_var: float) -> Quadratic:
    """``|y - X theta|^2 / (2 sigma^2)`` up to a constant: ``H = X^T X / sigma^2``, ``c`` a
    least-squares solution (any one: the potential is unchanged by the choice)."""
    design = np.asarray(design, dtype=np.float64)
    centre = np.linalg.lstsq(design, np.asarray(y, dtype=np.float64), rcond=None)[0]
    return Quadratic(design.T @ design / noise_var, centre)


def gaussian_prior_potential(dim: int, variance: float | None) -> Quadratic:
    """``|x|^2 / (2 s^2)`` (``variance`` None: the flat prior, ``U_0 = 0``)."""
    scale = 0.0 if variance is None else 1.0 / variance
    return Quadratic(np.eye(dim) * scale, np.zeros(dim))


def from_natural(natural, dense: bool = True):
    """A Gaussian (:class:`fedbayes_flwr.inference.gaussian.NaturalGaussian`, diagonal or full) as the
    quadratic potential ``(x - mean)^T prec (x - mean) / 2``: a :class:`Quadratic` (with the
    Hessian and rate bounds PDMC needs), or with ``dense=False`` a diagonal one as
    :class:`DiagonalGaussian` (``O(d)``; gradient samplers)."""
    if not dense and natural.is_diag:
        return DiagonalGaussian(G.precision(natural), G.to_moments(natural)[0])

    prec = G.precision(natural)
    prec = np.diag(prec) if natural.is_diag else prec
    return Quadratic(prec, G.to_moments(natural)[0])


_CACHE: dict = {}


def cached(key: tuple, data, build):
    """``build()`` once per ``key`` and content of ``data.x`` / ``data.y`` (a worker's rows),
    not once per event or iteration; the cache is cleared past 256 entries."""
    import hashlib

    digest = hashlib.blake2b(np.ascontiguousarray(data.x).tobytes(), digest_size=16)
    if data.y is not None:
        digest.update(np.ascontiguousarray(data.y).tobytes())
    full = (*key, data.x.shape, digest.hexdigest())
    if full not in _CACHE:
        if len(_CACHE) > 256:
            _CACHE.clear()
        _CACHE[full] = build()
    return _CACHE[full]
