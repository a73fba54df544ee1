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
    convex = False  # True when 0 <= H(x) everywhere (with H <= B: Preconditioned's second bound)
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

    def hessian_at(self, x: np.ndarray) -> tuple[np.ndarray, int]:
        """The ``(d, d)`` Hessian at one point ``x (d,)`` and its cost in gradient-equivalent
        evaluations: here by polarisation of :meth:`hess_quad` (exact, ``d (d + 1) / 2`` rows,
        ``H_ij = (q(e_i + e_j) - q(e_i) - q(e_j)) / 2``)."""
        d = self.dim
        i, j = np.triu_indices(d)
        eye = np.eye(d)
        rows = np.repeat(np.asarray(x, dtype=np.float64)[None], i.size, axis=0)
        q_pair = self.hess_quad(rows, eye[i] + eye[j])
        q_diag = self.hess_quad(rows[:d], eye)
        h = np.empty((d, d))
        h[i, j] = 0.5 * (q_pair - q_diag[i] - q_diag[j])
        h[j, i] = h[i, j]
        return h, int(i.size + d)

    def transformed_hess_abs(self, scale: np.ndarray) -> np.ndarray:
        """Zig-Zag's bound in the coordinates ``z`` of ``x = m + L z`` (``scale`` = ``L``,
        ``(d, d)``, or its diagonal ``(d,)``): ``C^z >= |L^T H(x) L|`` entrywise everywhere.

        ``|(L^T H L)_ij| = |sum_kl L_ki H_kl L_lj| <= sum_kl |L_ki| C_kl |L_lj|``, i.e.
        ``C^z = |L|^T C |L|`` (exact for a diagonal ``L``); subclasses with more structure give a
        tighter one."""
        if scale.ndim == 1:
            return scale[:, None] * self.hess_abs * scale[None, :]
        a = np.abs(scale)
        return a.T @ self.hess_abs @ a


class Quadratic(Potential):
    """``U(x) = (x - c)^T H (x - c) / 2 + b . x`` (``H`` symmetric positive semi-definite; the
    linear term ``b``, zero unless given, is what a re-centred split adds: :func:`tilt`)."""

    quadratic = True
    convex = True

    def __init__(self, hessian, centre, linear=None):
        self.hessian = np.atleast_2d(np.asarray(hessian, dtype=np.float64))
        self.centre = np.asarray(centre, dtype=np.float64)
        self.dim = int(self.centre.shape[0])
        self.hess_bound = self.hessian
        self.hess_abs = np.abs(self.hessian)
        self.linear = None if linear is None else np.asarray(linear, dtype=np.float64)

    def grad(self, x):
        g = (x - self.centre) @ self.hessian.T
        return g if self.linear is None else g + self.linear

    def value(self, x):
        z = x - self.centre
        out = 0.5 * np.einsum("ki,ij,kj->k", z, self.hessian, z)
        return out if self.linear is None else out + x @ self.linear

    def hess_quad(self, x, v):
        return np.einsum("ki,ij,kj->k", v, self.hessian, v)

    def hessian_at(self, x):
        return self.hessian, 1


class Logistic(Potential):
    """Logistic regression's negative log-likelihood for inputs ``xi (n, d)`` (intercept column
    included by the caller) and labels ``eta`` in {0, 1}."""

    convex = True

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

    def hessian_at(self, x):
        """``sum_n s'(xi_n . x) xi_n xi_n^T`` (``n d^2``: ``d`` gradients' worth)."""
        s = 0.5 * (1.0 + np.tanh(0.5 * (self.xi @ np.asarray(x, dtype=np.float64))))
        return (self.xi * (s * (1.0 - s))[:, None]).T @ self.xi, self.dim

    def transformed_hess_abs(self, scale):
        """``(1/4) |Xi L|^T |Xi L|``: ``(L^T H L)_ij = sum_n s'_n (L^T xi_n)_i (L^T xi_n)_j`` with
        ``0 < s'_n <= 1/4``, so each entry is at most ``(1/4) sum_n |(xi_n L)_i| |(xi_n L)_j|``
        (the standard logistic bound of the module docstring applied to the transformed
        features ``L^T xi_n``; never looser than ``|L|^T C |L|``, by the triangle inequality)."""
        a = np.abs(self.xi * scale[None, :] if scale.ndim == 1 else self.xi @ scale)
        return 0.25 * a.T @ a


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


class Preconditioned(Potential):
    r"""``U^z(z) = U(m + L z)``: a potential in the coordinates ``z`` of an invertible affine map
    ``x = m + L z`` (``L`` dense ``(d, d)``, or its diagonal ``(d,)``), with rate bounds that
    stay valid there.

    The Jacobian is constant, so a sampler of ``exp(-U^z)`` gives ``exp(-U)`` through the map.
    Chain rule: ``grad U^z(z) = L^T grad U(x)``, Hessian ``H^z(z) = L^T H(x) L``. The bounds:

    * BPS needs ``B^z`` with ``w^T H^z w <= w^T B^z w`` for every ``w``: put ``u = L w``,
      ``w^T L^T H L w = u^T H u <= u^T B u = w^T (L^T B L) w``, so ``B^z = L^T B L`` (positive
      semi-definite as ``B`` is);
    * Zig-Zag needs ``C^z_ij >= |H^z_ij(z)|`` everywhere: coordinate ``i``'s rate
      ``(w_i d_i U^z)^+`` along ``z + w s`` (``w`` in ``{-1, +1}^d``) has slope
      ``w_i sum_j H^z_ij w_j <= sum_j |H^z_ij|``, and :meth:`Potential.transformed_hess_abs`
      gives ``C^z`` (``|L|^T C |L|`` in general; the logistic potential's ``(1/4) |Xi L|^T |Xi
      L|``). For a convex ``U`` (``0 <= H <= B``: logistic regression) a second bound holds and
      the sampler takes the smaller (:attr:`cauchy_schwarz`): ``H^z`` is positive
      semi-definite, so by Cauchy-Schwarz in its inner product
      ``|e_i^T H^z w| <= sqrt(e_i^T H^z e_i) sqrt(w^T H^z w) <= sqrt(B^z_ii) sqrt(w^T B^z w)``.
      In whitened coordinates ``H^z`` is near the identity and the row sums of ``C^z`` count
      ``d`` entries of similar size, so this one is about ``sqrt(d)`` times smaller.

    A :class:`Quadratic` is mapped to a :class:`Quadratic` instead (:func:`precondition`): its
    rates stay exactly affine.

    References
    ----------
    Bertazzi & Bierkens (2022), "Adaptive schemes for piecewise deterministic Monte Carlo
    algorithms", Section 2 (Zig-Zag and BPS after a linear change of variables, the rates of
    the transformed target); Bierkens, Fearnhead & Roberts (2019), Section 3.1 (the affine
    Zig-Zag bounds, here with ``H^z`` for ``H``).
    """

    def __init__(self, base: Potential, shift, scale):
        self.base = base
        self.shift = np.asarray(shift, dtype=np.float64)
        self.scale = np.asarray(scale, dtype=np.float64)
        self.dim = base.dim
        self.quadratic = False
        self.convex = getattr(base, "convex", False)
        self.cauchy_schwarz = self.convex
        if getattr(base, "hess_bound", None) is None:  # no rate bounds (Metropolis-adjusted PDMC)
            return
        if self.scale.ndim == 1:
            self.hess_bound = self.scale[:, None] * base.hess_bound * self.scale[None, :]
        else:
            self.hess_bound = self.scale.T @ base.hess_bound @ self.scale
        self.hess_abs = base.transformed_hess_abs(self.scale)

    def to_model(self, z: np.ndarray) -> np.ndarray:
        """``m + L z`` for each row of ``z``."""
        return to_model(z, self.shift, self.scale)

    def _pull(self, g: np.ndarray) -> np.ndarray:
        return g * self.scale if self.scale.ndim == 1 else g @ self.scale

    def grad(self, z):
        return self._pull(self.base.grad(self.to_model(z)))

    def value(self, z):
        return self.base.value(self.to_model(z))

    def hess_quad(self, z, w):
        return self.base.hess_quad(self.to_model(z), to_model(w, 0.0, self.scale))


class Recentred(Potential):
    """``U(x) - grad U(x*) . x``: the same Hessian (so the same rate bounds), gradient zero at
    ``x*`` (:func:`recentre`)."""

    def __init__(self, base: Potential, point):
        self.base = base
        self.offset = base.grad(np.asarray(point, dtype=np.float64)[None])[0]
        self.dim = base.dim
        self.quadratic = getattr(base, "quadratic", False)
        self.convex = getattr(base, "convex", False)
        if getattr(base, "hess_bound", None) is not None:  # else no rate bounds (Metropolis)
            self.hess_bound = base.hess_bound
            self.hess_abs = base.hess_abs

    def grad(self, x):
        return self.base.grad(x) - self.offset

    def value(self, x):
        return self.base.value(x) - x @ self.offset

    def hess_quad(self, x, v):
        return self.base.hess_quad(x, v)

    def hessian_at(self, x):
        if hasattr(self.base, "hessian_at"):
            return self.base.hessian_at(x)
        return super().hessian_at(x)  # by polarisation of hess_quad

    def transformed_hess_abs(self, scale):
        return self.base.transformed_hess_abs(scale)


def recentre(potential, point):
    r"""A worker's share re-centred at ``x*``: ``U_m(x) - grad U_m(x*) . x``.

    Federated PDMC may split ``U = sum_m U_m`` any way (the superposition argument needs only
    ``sum_m lambda_m(x, v) - lambda_m(x, -v) = v . grad U``), and with label-skewed workers the
    split matters: near the mode each ``grad U_m`` is large while their sum is near zero, so
    ``sum_m (v_i d_i U_m)^+`` far exceeds ``(v_i d_i U)^+`` and the surplus events only reverse
    the chains (a diffusive walk). Subtracting ``grad U_m(x*) . x`` from each worker and adding
    ``sum_m grad U_m(x*) . x`` at the server (:func:`tilt` of the prior) leaves ``U`` unchanged
    and the Hessians, hence every rate bound, as they were, and makes every share's gradient
    zero at ``x*``: the control-variate idea of Bierkens, Fearnhead & Roberts (2019),
    Section 4, applied to the workers' split. A :class:`Quadratic` stays one.

    References
    ----------
    Bierkens, Fearnhead & Roberts (2019), "The Zig-Zag process and super-efficient sampling for
    Bayesian analysis of big data", Section 4 (control variates at a reference point ``x*``).
    """
    if isinstance(potential, Quadratic):
        offset = potential.grad(np.asarray(point, dtype=np.float64)[None])[0]
        return tilt(potential, -offset)
    return Recentred(potential, point)


def tilt(potential: Quadratic, b) -> Quadratic:
    """``U(x) + b . x`` for a :class:`Quadratic`."""
    b = np.asarray(b, dtype=np.float64)
    linear = b if potential.linear is None else potential.linear + b
    return Quadratic(potential.hessian, potential.centre, linear)


def to_model(z: np.ndarray, shift, scale: np.ndarray) -> np.ndarray:
    """``x = m + L z`` row by row (``L`` dense or its diagonal)."""
    return shift + (z * scale if scale.ndim == 1 else z @ scale.T)


def precondition(potential, shift, scale):
    """``U(m + L z)`` as a potential in ``z`` (:class:`Preconditioned`; a :class:`Quadratic`
    stays one: ``H^z = L^T H L``, centre ``L^{-1} (c - m)``). ``scale`` of size 0: no change."""
    scale = np.asarray(scale, dtype=np.float64)
    if scale.size == 0:
        return potential
    shift = np.asarray(shift, dtype=np.float64)
    if isinstance(potential, Quadratic):
        dense = np.diag(scale) if scale.ndim == 1 else scale
        hz = dense.T @ potential.hessian @ dense
        centre = np.linalg.solve(dense, potential.centre - shift)
        linear = None if potential.linear is None else potential.linear @ dense
        return Quadratic(0.5 * (hz + hz.T), centre, linear)
    return Preconditioned(potential, shift, scale)


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
