r"""The AR(1) model with Student-t noise as a PDMC potential: gradient and rate bounds.

Model (the seed paper's AR(1) example): ``Y_i = c + x Y_{i-1} + eps_i`` with ``eps_i`` i.i.d.
standard Student-t with ``nu`` degrees of freedom (unit scale). A worker holds trajectories
``(y_0, ..., y_K)``, conditioned on their first value ``y_0``; with ``theta = (c, x)``,
``z_i = (1, y_{i-1})`` and ``r_i = y_i - z_i . theta`` (every step ``i`` of every trajectory),

``U(theta) = -sum_i log t_nu(r_i) = sum_i [(nu + 1) / 2 log(1 + r_i^2 / nu)] - n log C_nu``,

``grad U = -sum_i psi(r_i) z_i``, ``H = sum_i psi'(r_i) z_i z_i^T`` with the Student-t score
``psi(r) = (nu + 1) r / (nu + r^2)``.

**Bounds.** ``psi`` is bounded, ``|psi(r)| <= (nu + 1) / (2 sqrt(nu))`` (at ``r = +-sqrt(nu)``),
and so is its derivative ``psi'(r) = (nu + 1) (nu - r^2) / (nu + r^2)^2``, which lies in
``[-(nu + 1) / (8 nu), (nu + 1) / nu]`` (maximum at ``r = 0``, minimum at ``r^2 = 3 nu``). The
Hessian is NOT positive semi-definite (``psi' < 0`` for ``|r| > sqrt(nu)``: ``U`` is not convex),
so the bounds are stated for what the sampler needs (:mod:`.sampler`: the rate along ``x + v s``
is ``(a + b s)^+``-dominated when ``b`` bounds the derivative of ``v_i d_i U`` or of
``v . grad U`` FROM ABOVE):

* Zig-Zag, ``hess_abs``: ``|H_jk| <= sum_i |psi'(r_i)| |z_ij z_ik| <= L sum_i |z_ij z_ik| = C_jk``
  with ``L = (nu + 1) / nu``; then ``d/ds v_j d_j U(x + v s) = v_j sum_k H_jk v_k
  <= sum_k C_jk |v_k|``, the slope the sampler uses.
* BPS, ``hess_bound``: ``v^T H v = sum_i psi'(r_i) (z_i . v)^2 <= L sum_i (z_i . v)^2
  = v^T B v`` with ``B = L sum_i z_i z_i^T`` (positive semi-definite); only the upper bound
  ``psi' <= L`` is used, the negative part of ``psi'`` only makes the bound looser.

These affine (Hessian) bounds are the ones the sampler's interface takes. The alternative, the
bounded score, gives the constant rate bound
``|d_j U| <= (nu + 1) / (2 sqrt(nu)) sum_i |z_ij|`` (:attr:`StudentTAR1.grad_abs_bound`, kept for
reference and tested); it needs no slope but is a global bound, not one started from the current
rate, so near the posterior mode, where the rate is a small fraction of it, most of its candidates
would be rejected.

References
----------
The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov Processes",
the AR(1) example with Student-t noise of its numerical section (its appendix's Zig-Zag details
are not in the text this library was built from); Bierkens, Fearnhead & Roberts (2019),
Section 3 (affine bounds, thinning).
"""

from __future__ import annotations

from math import lgamma, log, pi, sqrt

import numpy as np

from fedbayes_flwr.inference.potentials import Potential


def student_t_log_norm(nu: float) -> float:
    """``log C_nu = log Gamma((nu + 1) / 2) - log Gamma(nu / 2) - log(nu pi) / 2``, the log of the
    standard Student-t density at 0."""
    return lgamma(0.5 * (nu + 1.0)) - lgamma(0.5 * nu) - 0.5 * log(nu * pi)


class StudentTAR1(Potential):
    """``U(c, x) = -sum log t_nu(y_i - c - x y_{i-1})`` over the steps of the rows (module docstring).

    Parameters
    ----------
    rows : numpy.ndarray
        ``(n, K + 1)`` trajectories ``(y_0, ..., y_K)``, one per row (``K >= 1``); ``(0, K + 1)``
        for an empty shard (``U = 0``).
    nu : float
        Degrees of freedom, ``> 0``.

    Attributes
    ----------
    hess_bound : numpy.ndarray
        ``B = ((nu + 1) / nu) sum_i z_i z_i^T`` (BPS).
    hess_abs : numpy.ndarray
        ``C = ((nu + 1) / nu) sum_i |z_i| |z_i|^T`` (Zig-Zag).
    grad_abs_bound : numpy.ndarray
        ``(2,)``, ``|d_j U| <= (nu + 1) / (2 sqrt(nu)) sum_i |z_ij|`` (the bounded-score bound;
        not used by the sampler).
    """

    dim = 2
    quadratic = False

    def __init__(self, rows, nu: float):
        rows = np.asarray(rows, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] < 2:
            raise ValueError(f"rows must have shape (n, K + 1) with K >= 1, got {rows.shape}")
        if not nu > 0:
            raise ValueError(f"nu must be > 0, got {nu}")
        self.nu = float(nu)
        self.prev = np.ascontiguousarray(rows[:, :-1]).reshape(-1)  # y_{i-1}
        self.next = np.ascontiguousarray(rows[:, 1:]).reshape(-1)  # y_i
        z = np.stack([np.ones_like(self.prev), self.prev], axis=1)  # (n K, 2)
        lip = (self.nu + 1.0) / self.nu
        self.hess_bound = lip * z.T @ z
        self.hess_abs = lip * np.abs(z).T @ np.abs(z)
        self.grad_abs_bound = (self.nu + 1.0) / (2.0 * sqrt(self.nu)) * np.abs(z).sum(axis=0)

    def _residuals(self, theta: np.ndarray) -> np.ndarray:
        theta = np.asarray(theta, dtype=np.float64)
        return self.next[None, :] - theta[:, :1] - theta[:, 1:2] * self.prev[None, :]

    def grad(self, x):
        """``-sum_i psi(r_i) (1, y_{i-1})`` at each row of ``x (K, 2)``."""
        r = self._residuals(x)
        psi = (self.nu + 1.0) * r / (self.nu + r * r)
        return -np.stack([psi.sum(axis=1), psi @ self.prev], axis=1)

    def hess_quad(self, x, v):
        """``v^T H v = sum_i psi'(r_i) (v_c + v_x y_{i-1})^2`` with
        ``psi'(r) = (nu + 1) (nu - r^2) / (nu + r^2)^2`` (can be negative)."""
        r = self._residuals(x)
        dpsi = (self.nu + 1.0) * (self.nu - r * r) / (self.nu + r * r) ** 2
        zv = v[:, :1] + v[:, 1:2] * self.prev[None, :]
        return np.sum(dpsi * zv * zv, axis=1)

    def value(self, x):
        """``U`` at each row of ``x (K, 2)``, normalising constant included (``-log`` likelihood)."""
        r = self._residuals(x)
        return (0.5 * (self.nu + 1.0) * np.log1p(r * r / self.nu).sum(axis=1)
                - self.prev.size * student_t_log_norm(self.nu))
