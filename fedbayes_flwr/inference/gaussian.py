"""Gaussian exponential-family algebra in natural parameters.

A Gaussian ``N(mean, cov)`` over a parameter vector of length ``d`` is held as
:class:`NaturalGaussian` ``(eta1, eta2)`` with sufficient statistics ``T(theta) = (theta, theta theta^T)``:

* ``eta1 = Lambda @ mean`` (the precision-adjusted mean),
* ``eta2 = -Lambda / 2`` where ``Lambda = cov^-1`` is the precision.

Full covariance keeps ``eta2`` as a ``(d, d)`` matrix; mean-field (diagonal) keeps its diagonal
as a ``(d,)`` vector (``T = (theta, theta**2)``). Approximate-likelihood factors ``t_k`` live in the
same space and need not be normalisable (their precision may be zero or indefinite); only a
posterior (prior x product of factors) must have a positive-definite precision.

Products and quotients of Gaussians are sums and differences of natural parameters. Everything here
is float64 numpy: the algebra is exact and tiny, and TensorFlow is used where gradients are needed
(:mod:`fedbayes_flwr.inference.vi`).

References
----------
Ashman et al. (2022), "Partitioned Variational Inference: A Framework for Probabilistic Federated
Learning", Section 2 (q = p x prod t_m in natural parameters) and eq. (3) (factor update by division).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class NaturalGaussian(NamedTuple):
    """Natural parameters of a (possibly unnormalised) Gaussian factor.

    Attributes
    ----------
    eta1 : numpy.ndarray
        ``(d,)`` float64, precision times mean.
    eta2 : numpy.ndarray
        ``(d, d)`` (full) or ``(d,)`` (diagonal) float64, minus half the precision.
    """

    eta1: np.ndarray
    eta2: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.eta1.shape[0])

    @property
    def is_diag(self) -> bool:
        return self.eta2.ndim == 1


def _f64(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=np.float64))


def make(eta1, eta2) -> NaturalGaussian:
    """Build a :class:`NaturalGaussian` after checking shapes (dtype coerced to float64)."""
    eta1, eta2 = _f64(eta1), _f64(eta2)
    d = eta1.shape[0] if eta1.ndim == 1 else -1
    if eta1.ndim != 1 or eta2.shape not in ((d,), (d, d)):
        raise ValueError(f"natural parameters need eta1 (d,) and eta2 (d,) or (d, d); "
                         f"got {eta1.shape} and {eta2.shape}")
    return NaturalGaussian(eta1, eta2)


def zeros(dim: int, diag: bool) -> NaturalGaussian:
    """The flat factor ``t(theta) = 1`` (natural parameters zero)."""
    return NaturalGaussian(np.zeros(dim), np.zeros(dim) if diag else np.zeros((dim, dim)))


def from_moments(mean, cov) -> NaturalGaussian:
    """Natural parameters of ``N(mean, cov)``; ``cov`` is ``(d, d)`` or a ``(d,)`` vector of variances."""
    mean, cov = _f64(mean), _f64(cov)
    if cov.ndim == 1:
        prec = 1.0 / cov
        return NaturalGaussian(prec * mean, -0.5 * prec)
    prec = np.linalg.inv(cov)
    prec = 0.5 * (prec + prec.T)
    return NaturalGaussian(prec @ mean, -0.5 * prec)


def precision(nat: NaturalGaussian) -> np.ndarray:
    """The precision ``-2 eta2`` (a vector for diagonal factors)."""
    return -2.0 * nat.eta2


def is_proper(nat: NaturalGaussian) -> bool:
    """Whether the precision is finite and positive definite (the factor is a normalisable Gaussian)."""
    prec = precision(nat)
    if not (np.all(np.isfinite(prec)) and np.all(np.isfinite(nat.eta1))):
        return False
    if nat.is_diag:
        return bool(np.all(prec > 0.0))
    try:
        np.linalg.cholesky(prec)
    except np.linalg.LinAlgError:
        return False
    return True


def check_proper(nat: NaturalGaussian, what: str = "posterior") -> None:
    """Raise ``ValueError`` naming ``what`` unless the precision is positive definite."""
    if not is_proper(nat):
        raise ValueError(f"{what}: precision (-2 * eta2) is not positive definite")


def to_moments(nat: NaturalGaussian) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(mean, cov)``; ``cov`` is a vector of variances for diagonal factors."""
    check_proper(nat, "to_moments")
    prec = precision(nat)
    if nat.is_diag:
        cov = 1.0 / prec
        return cov * nat.eta1, cov
    chol = np.linalg.cholesky(prec)
    eye = np.eye(nat.dim)
    chol_inv = np.linalg.solve(chol, eye)
    cov = chol_inv.T @ chol_inv
    mean = cov @ nat.eta1
    return mean, 0.5 * (cov + cov.T)


def full_cov(nat: NaturalGaussian) -> np.ndarray:
    """The ``(d, d)`` covariance matrix, diagonal factors included."""
    _, cov = to_moments(nat)
    return np.diag(cov) if nat.is_diag else cov


def std(nat: NaturalGaussian) -> np.ndarray:
    """Marginal standard deviations."""
    _, cov = to_moments(nat)
    return np.sqrt(cov if nat.is_diag else np.diag(cov))


def add(a: NaturalGaussian, b: NaturalGaussian) -> NaturalGaussian:
    """Product of factors: natural parameters add."""
    return NaturalGaussian(a.eta1 + b.eta1, a.eta2 + b.eta2)


def sub(a: NaturalGaussian, b: NaturalGaussian) -> NaturalGaussian:
    """Quotient of factors ``a / b``: natural parameters subtract."""
    return NaturalGaussian(a.eta1 - b.eta1, a.eta2 - b.eta2)


def scale(a: NaturalGaussian, rho: float) -> NaturalGaussian:
    """The power ``a ** rho`` (natural parameters times ``rho``), used for damping."""
    return NaturalGaussian(rho * a.eta1, rho * a.eta2)


def to_diag(nat: NaturalGaussian) -> NaturalGaussian:
    """Mean-field projection ``argmin_{q diagonal} KL(q || p)`` of a proper Gaussian ``p``.

    For a Gaussian target the optimum keeps the mean and the diagonal of the precision.
    """
    if nat.is_diag:
        return nat
    mean, _ = to_moments(nat)
    prec_diag = np.diag(precision(nat)).copy()
    return NaturalGaussian(prec_diag * mean, -0.5 * prec_diag)


def log_partition(nat: NaturalGaussian) -> float:
    """Log normaliser ``A(eta) = 1/2 mean^T Lambda mean - 1/2 log|Lambda| + d/2 log(2 pi)``."""
    mean, _ = to_moments(nat)
    prec = precision(nat)
    if nat.is_diag:
        logdet = float(np.sum(np.log(prec)))
    else:
        logdet = 2.0 * float(np.sum(np.log(np.diag(np.linalg.cholesky(prec)))))
    return float(0.5 * mean @ nat.eta1 - 0.5 * logdet + 0.5 * nat.dim * np.log(2.0 * np.pi))


def expected_dot(factor: NaturalGaussian, q: NaturalGaussian) -> float:
    """``E_q[eta_factor . T(theta)] = eta1 . m + tr(eta2 (S + m m^T))`` for a proper ``q``."""
    mean, cov = to_moments(q)
    if factor.is_diag:
        second = (np.diag(cov) if not q.is_diag else cov) + mean**2
        return float(factor.eta1 @ mean + factor.eta2 @ second)
    second = (np.diag(cov) if q.is_diag else cov) + np.outer(mean, mean)
    return float(factor.eta1 @ mean + np.sum(factor.eta2 * second))


def like(template: NaturalGaussian, nat: NaturalGaussian) -> NaturalGaussian:
    """Cast ``nat`` to the covariance structure of ``template`` (diagonal or full)."""
    if template.is_diag == nat.is_diag:
        return nat
    if template.is_diag:
        return NaturalGaussian(nat.eta1, np.diag(nat.eta2).copy())
    return NaturalGaussian(nat.eta1, np.diag(nat.eta2))


def to_tfp(nat: NaturalGaussian):
    """A TFP distribution (``MultivariateNormalTriL`` or ``MultivariateNormalDiag``) over float64."""
    import tensorflow_probability as tfp

    mean, cov = to_moments(nat)
    tfd = tfp.distributions
    if nat.is_diag:
        return tfd.MultivariateNormalDiag(loc=mean, scale_diag=np.sqrt(cov))
    return tfd.MultivariateNormalTriL(loc=mean, scale_tril=np.linalg.cholesky(cov))
