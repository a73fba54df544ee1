"""Gaussian VI for logistic regression computed independently of the library (numpy only).

For ``q = N(m, S)`` and a row ``x`` (the design adds a trailing 1 for the intercept) the
activation is ``a = x . theta ~ N(x . m, x^T S x)``, so every expectation the ELBO and its
stationarity conditions need is one-dimensional, computed with ``order``-point Gauss-Hermite
quadrature (probabilists' form):

    E_q[log p(y | theta)] = sum_i E[log sigmoid(s_i a_i)],   s_i = 2 y_i - 1,
    grad_m = sum_i x_i E[y_i - sigmoid(a_i)],   E[-Hessian] = sum_i x_i x_i^T E[sigmoid'(a_i)].

At a stationary point of ``E_q[log p(y | theta)] - KL(q || r)`` over Gaussians (Opper & Archambeau
2009, eqs. 6-7; full or diagonal covariance):

    Lambda_q = Lambda_r + E_q[-Hessian]   (its diagonal, for a mean-field q),
    Lambda_r (m - m_r) = grad_m.

The library maximises a different objective when it integrates with a fixed rule: its
``order``-point sum ``sum_j w_j log sigmoid(s (mu + sd z_j))`` differentiated exactly (automatic
differentiation), whose stationary point is not the one above evaluated with the same rule (the
identities ``dE/dmu = E[f']``, ``dE/dv = E[f''] / 2`` hold for the integral, not for the sum).
:func:`quadrature_optimum` solves that discrete problem: it matches the library's local optimum
to the library's solver tolerance, where :func:`optimum` at 64 points differs by ~1e-3.
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial.hermite_e import hermegauss


def design(x):
    x = np.asarray(x, dtype=np.float64)
    return np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)


def moments(nat):
    """``(m, S, Lambda)`` of a natural Gaussian (``eta2 = -Lambda / 2``; 1-d ``eta2``: diagonal)."""
    eta1, eta2 = np.asarray(nat.eta1), np.asarray(nat.eta2)
    precision = np.diag(-2.0 * eta2) if eta2.ndim == 1 else -2.0 * eta2
    cov = np.linalg.inv(precision)
    return cov @ eta1, cov, precision


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _log_sigmoid(z):
    return -np.logaddexp(0.0, -z)


def activation_expectations(m, cov, x, y, order=80):
    """Per row: ``E[log sigmoid(s a)]``, ``E[y - sigmoid(a)]``, ``E[sigmoid'(a)]``."""
    z = design(x)
    mean = z @ m
    sd = np.sqrt(np.einsum("ij,jk,ik->i", z, cov, z))
    nodes, weights = hermegauss(order)
    weights = weights / np.sqrt(2 * np.pi)
    a = mean[:, None] + sd[:, None] * nodes[None, :]
    sign = 2.0 * np.asarray(y, dtype=np.float64) - 1.0
    s = _sigmoid(a)
    return (_log_sigmoid(sign[:, None] * a) @ weights, (np.asarray(y)[:, None] - s) @ weights,
            (s * (1 - s)) @ weights)


def expected_log_likelihood(nat, x, y, order=80) -> float:
    m, cov, _ = moments(nat)
    return float(np.sum(activation_expectations(m, cov, x, y, order)[0]))


def kl(q, p) -> float:
    (m, s, _), (m0, s0, p0) = moments(q), moments(p)
    d = len(m)
    return float(0.5 * (np.trace(p0 @ s) + (m0 - m) @ p0 @ (m0 - m) - d
                        + np.linalg.slogdet(s0)[1] - np.linalg.slogdet(s)[1]))


def elbo(q, prior, x, y, order=80) -> float:
    return expected_log_likelihood(q, x, y, order) - kl(q, prior)


def stationarity(q, reference, x, y, order=80):
    """Relative residuals ``(mean, precision)`` of the stationarity conditions of
    ``E_q[log p(y)] - KL(q || reference)`` at ``q`` (``reference`` may be a cavity), each
    divided by the size of the likelihood's term (``|grad_m|`` at the reference's mean, and
    ``|E_q[-Hessian]|``), so 1 means "off by the whole data term"."""
    m, cov, lam = moments(q)
    mr, _, lam_r = moments(reference)
    _, resid, curv = activation_expectations(m, cov, x, y, order)
    z = design(x)
    grad = z.T @ resid
    hess = (z * curv[:, None]).T @ z
    diag = np.asarray(q.eta2).ndim == 1
    if diag:
        hess = np.diag(np.diag(hess))
    mean_res = np.linalg.norm(lam_r @ (m - mr) - grad) / np.linalg.norm(
        z.T @ activation_expectations(mr, cov, x, y, order)[1])
    prec_res = np.linalg.norm(lam - lam_r - hess) / np.linalg.norm(hess)
    return float(mean_res), float(prec_res)


def optimum(reference, x, y, iterations=200, damping=0.5, order=80):
    """The maximiser of ``E_q[log p(y)] - KL(q || reference)`` over full-covariance Gaussians
    (or diagonal ones, when ``reference`` is diagonal), by damped natural-gradient fixed-point
    iterations (Khan & Rue 2023, eq. 7; Opper & Archambeau 2009) from the reference: returns the
    natural parameters ``(eta1, eta2)`` of the form ``reference`` uses, as a tuple."""
    from types import SimpleNamespace

    mr, _, lam_r = moments(reference)
    diag = np.asarray(reference.eta2).ndim == 1
    m, lam = mr.copy(), lam_r.copy()
    z = design(x)
    for _ in range(iterations):
        cov = np.linalg.inv(lam)
        _, resid, curv = activation_expectations(m, cov, x, y, order)
        hess = (z * curv[:, None]).T @ z
        if diag:
            hess = np.diag(np.diag(hess))
        lam_new = lam_r + hess
        lam = (1 - damping) * lam + damping * lam_new
        m = m + damping * np.linalg.solve(lam, z.T @ resid - lam_r @ (m - mr))
    eta2 = -0.5 * (np.diag(lam) if diag else lam)
    return SimpleNamespace(eta1=lam @ m, eta2=eta2)


def quadrature_gradient(m, cov, x, y, order=64):
    """``(dQ/dm, dQ/dS)`` of the ``order``-point Gauss-Hermite sum
    ``Q(m, S) = sum_i sum_j w_j log sigmoid(s_i (mu_i + sd_i z_j))``, ``mu_i = x_i . m``,
    ``sd_i^2 = x_i^T S x_i`` (the design adds the intercept's 1), differentiated exactly:

        dQ/dm = sum_i x_i g_i,          g_i = sum_j w_j s_i sigmoid(-s_i a_ij),
        dQ/dS = sum_i x_i x_i^T h_i,    h_i = sum_j w_j s_i sigmoid(-s_i a_ij) z_j / (2 sd_i)."""
    z = design(x)
    nodes, weights = hermegauss(order)
    weights = weights / np.sqrt(2 * np.pi)
    sign = 2.0 * np.asarray(y, dtype=np.float64) - 1.0
    mu, sd = z @ m, np.sqrt(np.einsum("ij,jk,ik->i", z, cov, z))
    a = mu[:, None] + sd[:, None] * nodes[None, :]
    d1 = sign[:, None] * _sigmoid(-sign[:, None] * a)  # d log sigmoid(s a) / da
    g, h = d1 @ weights, (d1 * nodes[None, :]) @ weights / (2 * sd)
    return z.T @ g, (z * h[:, None]).T @ z


def quadrature_optimum(reference, x, y, order=64, iterations=200, damping=0.5):
    """The maximiser over full-covariance Gaussians of ``Q(q) - KL(q || reference)``, ``Q`` the
    ``order``-point Gauss-Hermite sum itself (:func:`quadrature_gradient`), by damped
    fixed-point iterations on its exact stationarity conditions
    ``Lambda_q = Lambda_r - 2 dQ/dS`` and ``Lambda_r (m - m_r) = dQ/dm``.

    Returns ``(q, residual)``: ``q`` with ``eta1, eta2`` (full), ``residual`` the larger of the
    last undamped mean step (relative to ``m``'s max-norm) and precision change (relative to
    ``Lambda``'s max-norm)."""
    from types import SimpleNamespace

    mr, _, lam_r = moments(reference)
    m, lam = mr.copy(), lam_r.copy()
    for _ in range(iterations):
        grad_m, grad_s = quadrature_gradient(m, np.linalg.inv(lam), x, y, order)
        lam_new = lam_r - 2 * grad_s
        step = np.linalg.solve(lam, grad_m - lam_r @ (m - mr))
        residual = max(np.abs(step).max() / max(np.abs(m).max(), 1e-300),
                       np.abs(lam_new - lam).max() / np.abs(lam).max())
        lam = (1 - damping) * lam + damping * lam_new
        m = m + damping * step
    return SimpleNamespace(eta1=lam @ m, eta2=-0.5 * lam), float(residual)
