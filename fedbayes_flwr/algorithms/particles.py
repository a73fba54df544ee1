"""Pieces the particle and point-estimate families share (DSVGD, SGLD, FedAvg): seeded draws
from the prior's Gaussian, the projection into a bounded prior's support, the prior's score and
a mini-batch likelihood gradient for a batch of parameter vectors.

References
----------
Kassab & Simeone (2022), "Federated Generalized Bayesian Learning via Distributed Stein
Variational Gradient Descent", Section 7 (mini-batches rescaled by ``n_k / B``).
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.seeds import derive_seed, numpy_rng


def project(x: np.ndarray, setup) -> np.ndarray:
    """``x`` clipped into the model's bounded ``support`` (unchanged without one)."""
    support = getattr(setup.model, "support", None)
    return x if support is None else np.clip(x, support[0], support[1])


def prior_draws(setup, stream: str, count: int) -> np.ndarray:
    """``(count, d)`` draws from the prior's Gaussian (the model's stand-in for a non-Gaussian
    prior) from the seed ``(run seed, stream)``, projected into a bounded support; the same on
    the server and every client."""
    rng = numpy_rng(derive_seed(setup.run_seed, stream, 0, -1))
    mean, cov = G.to_moments(setup.prior)
    z = rng.standard_normal((count, setup.prior.dim))
    if np.ndim(cov) == 1:
        draws = mean + np.sqrt(cov) * z
    else:
        draws = mean + z @ np.linalg.cholesky(cov).T
    return project(draws, setup)


def prior_score(setup, x: np.ndarray) -> np.ndarray:
    """``grad log p0`` at each row of ``x`` (the model's own prior where it is not Gaussian)."""
    if getattr(setup.model, "gaussian_prior", True):
        prior = setup.prior
        if prior.is_diag:
            return prior.eta1 + 2.0 * prior.eta2 * x
        return prior.eta1 + 2.0 * x @ prior.eta2
    return setup.model.log_prior_and_grad(x, setup.prior)[1]


def minibatch_grad(rng: np.random.Generator, x: np.ndarray, data, setup, batch: int,
                   factor: float = 1.0) -> np.ndarray:
    """Gradient of ``factor * (n / B) * sum_{i in batch} log p(y_i | theta)`` at each row of
    ``x`` (``(S, P)``), one batch of ``B`` rows drawn without replacement from ``rng`` for every
    row; ``batch = 0`` or ``B >= n``: all rows, scaled by ``factor``."""
    n = data.x.shape[0]
    if batch and batch < n:
        idx = rng.choice(n, size=batch, replace=False)
        xb, yb, scale = data.x[idx], None if data.y is None else data.y[idx], factor * n / batch
    else:
        xb, yb, scale = data.x, data.y, float(factor)
    return setup.model.log_density_and_grad(x, xb, yb, prior=None, data_scale=scale)[1]


#: Default particle numbers of the reference code per model family (``num-particles = 0``);
#: linear models take 20, not the reference's 6 (see :class:`fedbayes_flwr.algorithms.dsvgd.DSVGDConfig`).
AUTO_PARTICLES = {"mixture-1d": 200, "bnn": 20, "other": 20}


# ---------------------------------------------------------------------------- settings by model
def model_family(model) -> str:
    """``mixture-1d``, ``bnn`` or ``other``: the model families whose defaults differ."""
    name = getattr(model, "name", "")
    if name == "mixture-1d":
        return "mixture-1d"
    return "bnn" if name.startswith("bnn-") else "other"
