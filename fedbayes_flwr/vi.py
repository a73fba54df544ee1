"""Gaussian variational inference against a (possibly improper) Gaussian effective prior.

Maximises the local free energy of PVI (Ashman et al. 2022, eq. 2)

    F(q) = E_q[log p(y_k | theta)] - KL(q || q_cav)   (up to the cavity's log normaliser)

over ``q = N(mu, L L^T)`` (full) or ``N(mu, diag(s^2))`` (mean-field). The cavity enters only
through ``E_q[eta_cav . T(theta)]`` which is closed form, so the cavity may be an unnormalisable
factor. The expected log-likelihood is a Monte-Carlo estimate with the reparameterisation trick
(Kingma & Welling 2014), optionally on mini-batches scaled by ``N / B``; the entropy and the
cavity term are exact. Optimised with Adam (Kingma & Ba 2015, Algorithm 1) inside one compiled
``tf.while_loop``; every random draw comes from stateless seeds, so a run is reproducible.

With ``M = 1`` and the prior as cavity, this *is* global VI.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from . import gaussian as G
from .gaussian import NaturalGaussian

_ADAM_B1, _ADAM_B2, _ADAM_EPS = 0.9, 0.999, 1e-8


class VIConfig(NamedTuple):
    """Local optimiser settings (run-config keys in brackets).

    Attributes
    ----------
    steps : int
        Adam steps per local optimisation (``local-steps``).
    learning_rate : float
        Adam step size (``learning-rate``); decays linearly to 10% over the steps, and the
        returned ``q`` averages the iterates of the second half (Polyak-Ruppert).
    mc_samples : int
        Monte-Carlo samples per step (``mc-samples``).
    batch_size : int
        Mini-batch size; 0 uses the full local data (``batch-size``).
    """

    steps: int = 1000
    learning_rate: float = 0.1
    mc_samples: int = 10
    batch_size: int = 0


def _softplus_inverse(x: np.ndarray) -> np.ndarray:
    return x + np.log(-np.expm1(-x))


def _unpack(raw_scale, diag: bool):
    if diag:
        return tf.nn.softplus(raw_scale)
    return tf.linalg.set_diag(tf.linalg.band_part(raw_scale, -1, 0),
                              tf.nn.softplus(tf.linalg.diag_part(raw_scale)))


def _objective(model, mu, raw_scale, eps, x, y, eta1, eta2, data_scale, diag):
    """Negative local free energy (its estimate), up to an additive constant."""
    scale = _unpack(raw_scale, diag)
    if diag:
        theta = mu[None, :] + eps * scale[None, :]
        second = scale**2 + mu**2
        cavity_term = tf.reduce_sum(eta1 * mu) + tf.reduce_sum(eta2 * second)
        entropy = tf.reduce_sum(tf.math.log(scale))
    else:
        theta = mu[None, :] + tf.linalg.matmul(eps, scale, transpose_b=True)
        second = tf.linalg.matmul(scale, scale, transpose_b=True) + mu[:, None] * mu[None, :]
        cavity_term = tf.reduce_sum(eta1 * mu) + tf.reduce_sum(eta2 * second)
        entropy = tf.reduce_sum(tf.math.log(tf.linalg.diag_part(scale)))
    ell = data_scale * tf.reduce_mean(model.log_likelihood_tf(theta, x, y))
    return -(ell + cavity_term + entropy)


def fit_gaussian(seed, model, x, y, cavity: NaturalGaussian, init: NaturalGaussian,
                 config: VIConfig) -> NaturalGaussian:
    """Maximise the local free energy; return the optimal ``q`` in natural parameters.

    Parameters
    ----------
    seed : array-like
        Stateless ``int32[2]`` seed.
    model : fedbayes_flwr.models.Model
        Supplies ``log_likelihood_tf``.
    x, y : numpy.ndarray
        Local data (``y`` may be ``None`` for models without targets).
    cavity : NaturalGaussian
        The effective prior ``q / t_k`` (may be improper).
    init : NaturalGaussian
        Proper starting point (PVI uses the current global posterior).
    config : VIConfig
        Optimiser settings.

    Returns
    -------
    NaturalGaussian
        The optimised ``q``, with the covariance structure of ``init``.

    References
    ----------
    Ashman et al. (2022), PVI, eq. (2) and Section 2.4 (Monte-Carlo VI with Adam).
    """
    diag = init.is_diag
    mean0, cov0 = G.to_moments(init)
    raw0 = _softplus_inverse(np.sqrt(cov0)) if diag else _raw_tril(np.linalg.cholesky(cov0))
    n = x.shape[0]
    batch = n if config.batch_size <= 0 else min(int(config.batch_size), n)
    y_t = tf.zeros([n], tf.float64) if y is None else tf.constant(y, tf.float64)
    mu, raw = _adam_loop(
        model, tf.constant(mean0), tf.constant(raw0), tf.constant(x, tf.float64), y_t,
        tf.constant(cavity.eta1), tf.constant(cavity.eta2), tf.constant(seed, tf.int32),
        int(config.steps), float(config.learning_rate), int(config.mc_samples), tf.constant(batch), batch < n,
        diag)
    scale = _unpack(raw, diag).numpy()
    cov = scale**2 if diag else scale @ scale.T
    return G.from_moments(mu.numpy(), cov)


def _raw_tril(chol: np.ndarray) -> np.ndarray:
    raw = np.tril(chol, -1)
    np.fill_diagonal(raw, _softplus_inverse(np.diag(chol)))
    return raw


@tf.function(reduce_retracing=True)
def _adam_loop(model, mu, raw, x, y, eta1, eta2, seed, steps, lr, mc, batch, minibatch, diag):
    n = tf.shape(x)[0]
    dim = tf.shape(mu)[0]
    data_scale = tf.cast(n, tf.float64) / tf.cast(batch, tf.float64)
    params = (mu, raw)
    m = tuple(tf.zeros_like(p) for p in params)
    v = tuple(tf.zeros_like(p) for p in params)
    avg = params
    for t in tf.range(steps):
        step_seed = tf.random.experimental.stateless_fold_in(seed, t)
        eps = tf.random.stateless_normal([mc, dim], seed=step_seed, dtype=tf.float64)
        xb, yb = x, y
        if minibatch:  # a Python bool: resolved when the loop is traced
            idx = tf.random.experimental.stateless_shuffle(
                tf.range(n), seed=tf.random.experimental.stateless_fold_in(step_seed, 1))[:batch]
            xb, yb = tf.gather(x, idx), tf.gather(y, idx)
        with tf.GradientTape() as tape:
            tape.watch(params)
            loss = _objective(model, params[0], params[1], eps, xb, yb, eta1, eta2, data_scale,
                              diag)
        grads = tape.gradient(loss, params)
        tf_ = tf.cast(t + 1, tf.float64)
        lr_t = lr * (1.0 - 0.9 * tf.cast(t, tf.float64) / tf.cast(steps, tf.float64))
        m = tuple(_ADAM_B1 * mi + (1 - _ADAM_B1) * g for mi, g in zip(m, grads, strict=True))
        v = tuple(_ADAM_B2 * vi + (1 - _ADAM_B2) * g**2 for vi, g in zip(v, grads, strict=True))
        params = tuple(
            p - lr_t * (mi / (1 - _ADAM_B1**tf_)) / (tf.sqrt(vi / (1 - _ADAM_B2**tf_)) + _ADAM_EPS)
            for p, mi, vi in zip(params, m, v, strict=True))
        # Polyak-Ruppert averaging of the second half of the iterates removes most MC noise.
        weight = tf.where(t >= steps // 2, 1.0 / tf.cast(t - steps // 2 + 1, tf.float64),
                          tf.constant(1.0, tf.float64))
        avg = tuple(a + weight * (p - a) for a, p in zip(avg, params, strict=True))
    return avg


def mean_params(q: NaturalGaussian) -> tuple[np.ndarray, np.ndarray]:
    """Mean parameters ``(E theta, E theta theta^T)`` (``E theta^2`` for a diagonal q)."""
    mean, cov = G.to_moments(q)
    return mean, (cov + mean**2) if q.is_diag else (cov + np.outer(mean, mean))


def expected_ll_grad(seed, model, x, y, q: NaturalGaussian, mc_samples: int = 10):
    """Gradient of ``E_q[log p(y | theta)]`` w.r.t. q's mean parameters: the natural-parameter
    "message" of the data (Khan & Lin 2017, eq. 7).

    Exact through the model's ``expected_log_likelihood_tf`` when it has one (conjugate models,
    Gauss-Hermite for logistic regression); otherwise a reparameterised Monte-Carlo estimate with
    ``mc_samples`` draws from the stateless ``seed``.
    """
    m1_np, m2_np = mean_params(q)
    m1, m2 = tf.constant(m1_np), tf.constant(m2_np)
    x_t = tf.constant(x, tf.float64)
    y_t = tf.zeros([x.shape[0]], tf.float64) if y is None else tf.constant(y, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch([m1, m2])
        if hasattr(model, "expected_log_likelihood_tf"):
            value = model.expected_log_likelihood_tf(m1, m2, x_t, y_t)
        else:
            eps = tf.random.stateless_normal([mc_samples, q.dim], seed=tf.constant(seed, tf.int32),
                                             dtype=tf.float64)
            if q.is_diag:
                theta = m1[None, :] + eps * tf.sqrt(m2 - m1**2)[None, :]
            else:
                chol = tf.linalg.cholesky(m2 - m1[:, None] * m1[None, :])
                theta = m1[None, :] + tf.linalg.matmul(eps, chol, transpose_b=True)
            value = tf.reduce_mean(model.log_likelihood_tf(theta, x_t, y_t))
    g1, g2 = (g.numpy() for g in tape.gradient(value, [m1, m2]))
    return g1, g2 if q.is_diag else 0.5 * (g2 + g2.T)


def natural_gradient_step(seed, model, x, y, cavity: NaturalGaussian, q: NaturalGaussian,
                          step: float, mc_samples: int = 10) -> NaturalGaussian:
    """One damped fixed-point (natural-gradient) update of the local free energy.

    ``eta <- (1 - step) eta + step (eta_cav + d E_q[log p(y_k | theta)] / d mu)`` where ``mu`` are
    q's mean parameters. The bracket is the fixed point of the local free energy; the difference
    ``eta_new - eta`` is ``step`` times its natural gradient. With ``step = 1`` a conjugate model
    reaches its local optimum in one update. The step is halved while the result is not a proper
    Gaussian.

    References
    ----------
    Ashman et al. (2022), PVI, Section 2.5 (fixed-point updates, eq. 9-10, and their damped form as
    natural-gradient ascent); Khan & Lin (2017), conjugate-computation VI.
    """
    g1, g2 = expected_ll_grad(seed, model, x, y, q, mc_samples)
    target = NaturalGaussian(cavity.eta1 + g1, cavity.eta2 + g2)
    for _ in range(30):
        new = G.add(G.scale(q, 1.0 - step), G.scale(target, step))
        if G.is_proper(new):
            return new
        step *= 0.5
    raise FloatingPointError("natural-gradient step cannot keep the posterior proper")


def fit_fixed_point(seed, model, x, y, cavity: NaturalGaussian, init: NaturalGaussian,
                    iterations: int, step: float, mc_samples: int = 10) -> NaturalGaussian:
    """Iterate :func:`natural_gradient_step` ``iterations`` times from ``init`` (a local optimiser).

    Fixed-point iterations have no Lyapunov function and can cycle (seen with ``step = 1`` on weak
    cavities): a :class:`FixedPointWarning` is issued when the last update still moved the mean by
    more than ``1e-4`` of its norm; a smaller ``local-damping`` then converges.
    """
    q = init
    for i in range(iterations):
        previous = q
        q = natural_gradient_step(tf.random.experimental.stateless_fold_in(
            tf.constant(seed, tf.int32), i).numpy(), model, x, y, cavity, q, step, mc_samples)
    m_new, m_old = G.to_moments(q)[0], G.to_moments(previous)[0]
    if iterations > 1 and np.linalg.norm(m_new - m_old) > 1e-4 * max(np.linalg.norm(m_new), 1.0):
        warnings.warn(f"fixed-point iterations did not converge in {iterations} iterations "
                      f"(last mean change {np.linalg.norm(m_new - m_old):.3g}); lower local-damping "
                      f"or raise fixed-point-iterations", FixedPointWarning, stacklevel=2)
    return q


class FixedPointWarning(RuntimeWarning):
    """Fixed-point local iterations ended without converging."""
