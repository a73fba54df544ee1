"""Synthetic data of the finite latent feature model (Campbell & How 2014, Section 3.3).

``K`` binary feature vectors ``f_k in {0, 1}^D`` (entries fair coin flips; a draw with an all-zero
vector or two identical vectors is redrawn, since neither could be recovered), inclusion
probabilities ``pi_k ~ U(0, 1)``, and ``n`` observations

    z_nk ~ Bernoulli(pi_k),    y_n = sum_k z_nk f_k + eps_n,    eps_n ~ N(0, sigma^2 I).

The paper's synthetic set: ``K = 5``, ``D = 10``, ``sigma^2 = 0.04``, 1300 observations of which 300
are held out (the caller splits).

References
----------
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", Section 3.3 (the synthetic
latent feature data); Griffiths & Ghahramani (2005), "Infinite latent feature models and the Indian
buffet process", Section 2 (the finite model).
"""

from __future__ import annotations

import numpy as np

__all__ = ["make_latent_features"]


def make_latent_features(rng: np.random.Generator, num_obs: int = 1300, num_features: int = 5,
                         dim: int = 10, noise_var: float = 0.04
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw a latent feature data set (module docstring).

    Parameters
    ----------
    rng : numpy.random.Generator
        The only source of randomness.
    num_obs, num_features, dim : int
        ``n`` observations, ``K`` features, dimension ``D``.
    noise_var : float
        ``sigma^2``, the observation noise variance.

    Returns
    -------
    x : ndarray, shape (num_obs, dim)
        The observations ``y_n``.
    features : ndarray, shape (num_features, dim)
        The binary features ``f_k`` (float 0/1).
    probs : ndarray, shape (num_features,)
        The inclusion probabilities ``pi_k ~ U(0, 1)``.

    References
    ----------
    Campbell & How (2014), "Approximate Decentralized Bayesian Inference", Section 3.3.
    """
    if num_obs < 1 or num_features < 1 or dim < 1:
        raise ValueError(f"num_obs, num_features and dim must be >= 1, got "
                         f"{num_obs}, {num_features}, {dim}")
    if not noise_var > 0:
        raise ValueError(f"noise_var must be > 0, got {noise_var}")
    if num_features > 2**dim - 1:
        raise ValueError(f"{num_features} distinct non-zero binary features need dim >= "
                         f"{int(np.ceil(np.log2(num_features + 1)))}, got {dim}")
    while True:
        features = rng.integers(0, 2, size=(num_features, dim)).astype(np.float64)
        distinct = len(np.unique(features, axis=0)) == num_features
        if distinct and np.all(features.sum(axis=1) > 0):
            break
    probs = rng.uniform(0.0, 1.0, size=num_features)
    z = (rng.random((num_obs, num_features)) < probs).astype(np.float64)
    x = z @ features + np.sqrt(noise_var) * rng.standard_normal((num_obs, dim))
    return x, features, probs
