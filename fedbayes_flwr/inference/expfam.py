"""Exponential-family blocks of mean-field posteriors: parameters, log-partitions, moments.

A mean-field posterior over a model's global parameters is a NamedTuple of *blocks*; each block is
one exponential family over ``K`` components stacked on axis 0 (mixture components, topics,
latent features). Every block is held in coordinates that are an affine image of its natural
parameters, so sums and differences of posteriors (Bayes' rule for conditionally independent data,
Campbell & How 2014, eq. 3) are elementwise sums and differences of these arrays with weights that
sum to one:

===================  =======================================  ======================================
block                arrays (axis 0 = component)              log-partition ``A`` (per component)
===================  =======================================  ======================================
:class:`Gaussian`    ``h (K, D)`` = prec x mean, ``prec``     ``sum_d h^2 / (2 prec) - log(prec) / 2``
                     ``(K, D)`` (diagonal precision)
:class:`IsoGaussian` ``h (K, D)``, ``prec (K,)`` (one        ``|h|^2 / (2 prec) - D log(prec) / 2``
                     precision per component)
:class:`Dirichlet`   ``alpha (K, V)``: ``K`` independent     ``sum_v lgamma(alpha) - lgamma(sum_v
                     Dirichlets over the last axis (topics)   alpha)``
:class:`Weights`     ``alpha (K,)``: ONE Dirichlet across    ``lgamma(alpha_k)``; the rest
                     the components (mixture weights)         ``-lgamma(sum_k alpha_k)`` does not
                                                              change under a permutation
:class:`Beta`        ``a (K,)``, ``b (K,)``                   ``lgamma(a) + lgamma(b) - lgamma(a+b)``
:class:`FullGaussian` ``h (P,)``, ``prec (P, P)``: one        ``h^T prec^-1 h / 2 - logdet(prec)/2``
                     Gaussian over a whole vector (no         (no components: all of it is "rest")
                     components)
===================  =======================================  ======================================

(Dirichlet and Beta natural parameters are ``alpha - 1``; since merging weights sum to one,
merging ``alpha`` or ``alpha - 1`` gives the same result.) :func:`log_partition` returns the
per-component terms and the permutation-invariant rest separately: the AMPS objective is additive
over components, which is what its bipartite matching needs.

References
----------
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", eqs. (3), (9)-(11) and the
objectives of Sections 3.1-3.3; Nielsen & Garcia (2011), "Statistical exponential families: a
digest with flash cards" (the log-partition functions).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Beta", "Dirichlet", "FullGaussian", "Gaussian", "IsoGaussian", "Weights",
           "blocks", "combine", "domain_error", "log_partition", "mean", "permute",
           "sample", "std", "total_log_partition"]


# scipy.special on first use: every deployed ClientApp (a new process per message) imports this
# module through the registry, and scipy.special costs ~0.5 s to import
def gammaln(x):
    from scipy.special import gammaln as f

    return f(x)


def digamma(x):
    from scipy.special import digamma as f

    return f(x)


class Gaussian(NamedTuple):
    """Diagonal Gaussians, one per component: ``h = prec * mean``, ``prec`` the precision."""

    h: np.ndarray
    prec: np.ndarray


class IsoGaussian(NamedTuple):
    """Isotropic Gaussians ``N(h / prec, I / prec)`` over ``R^D``: ``h (K, D)``, ``prec (K,)``."""

    h: np.ndarray
    prec: np.ndarray


class Dirichlet(NamedTuple):
    """``K`` independent Dirichlets over the last axis of ``alpha (K, V)`` (LDA's topics)."""

    alpha: np.ndarray


class Weights(NamedTuple):
    """One Dirichlet over the ``K`` components, ``alpha (K,)`` (mixture weights)."""

    alpha: np.ndarray


class Beta(NamedTuple):
    """``K`` independent Betas ``Beta(a_k, b_k)`` (latent-feature inclusion probabilities)."""

    a: np.ndarray
    b: np.ndarray


class FullGaussian(NamedTuple):
    """One Gaussian over a vector: ``h = prec @ mean (P,)``, ``prec (P, P)`` positive definite."""

    h: np.ndarray
    prec: np.ndarray


BLOCK_TYPES = (Gaussian, IsoGaussian, Dirichlet, Weights, Beta, FullGaussian)


def _is_block(x) -> bool:
    return isinstance(x, BLOCK_TYPES)


def blocks(params) -> dict[str, NamedTuple]:
    """``{field name: block}`` of a posterior NamedTuple (or ``{"": block}`` for a bare block)."""
    if _is_block(params):
        return {"": params}
    return {name: getattr(params, name) for name in params._fields}


def _map(fn, *params):
    """Apply ``fn`` to corresponding arrays of NamedTuples of blocks of identical structure."""
    first = params[0]
    if isinstance(first, np.ndarray) or np.isscalar(first):
        return fn(*params)
    return type(first)(*(_map(fn, *parts) for parts in zip(*params, strict=True)))


def combine(params: list, weights) -> NamedTuple:
    """``sum_i weights[i] * params[i]`` array by array (merging: weights ``(1 - N, 1, ..., 1)``)."""
    weights = [float(w) for w in weights]
    if len(weights) != len(params):
        raise ValueError(f"{len(params)} posteriors but {len(weights)} weights")
    return _map(lambda *arrays: sum(w * np.asarray(a, dtype=np.float64)
                                    for w, a in zip(weights, arrays, strict=True)), *params)


def permute(params, perm, symmetric: tuple[str, ...]):
    """Reorder axis 0 of the ``symmetric`` blocks by ``perm`` (coupled: the same ``perm`` for all):
    component ``k`` of the result is component ``perm[k]`` of ``params``."""
    perm = np.asarray(perm, dtype=np.int64)
    out = {}
    for name, block in blocks(params).items():
        out[name] = _map(lambda a: a[perm], block) if name in symmetric else block
    return type(params)(**out)


def log_partition(block) -> tuple[np.ndarray, float]:
    """``(per-component terms (K,), rest)`` of the block's log-partition ``A`` (module table).

    ``A = per.sum() + rest``; ``rest`` is unchanged by any permutation of the components.
    Outside the domain (a non-positive precision or concentration) the value is NaN.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        if isinstance(block, Gaussian):
            per = np.sum(block.h**2 / (2 * block.prec) - 0.5 * np.log(block.prec), axis=-1)
            return _nan_outside(per, block.prec), 0.0
        if isinstance(block, IsoGaussian):
            dim = block.h.shape[-1]
            per = np.sum(block.h**2, axis=-1) / (2 * block.prec) - 0.5 * dim * np.log(block.prec)
            return _nan_outside(per, block.prec), 0.0
        if isinstance(block, Dirichlet):
            per = np.sum(gammaln(block.alpha), axis=-1) - gammaln(np.sum(block.alpha, axis=-1))
            return _nan_outside(per, block.alpha), 0.0
        if isinstance(block, Weights):
            per = gammaln(block.alpha)
            rest = -float(gammaln(np.sum(block.alpha)))
            return _nan_outside(per, block.alpha), rest
        if isinstance(block, Beta):
            per = gammaln(block.a) + gammaln(block.b) - gammaln(block.a + block.b)
            return _nan_outside(_nan_outside(per, block.a), block.b), 0.0
        if isinstance(block, FullGaussian):
            sign, logdet = np.linalg.slogdet(block.prec)
            if sign <= 0:
                return np.zeros(0), float("nan")
            return np.zeros(0), float(0.5 * block.h @ np.linalg.solve(block.prec, block.h)
                                      - 0.5 * logdet)
    raise TypeError(f"not an exponential-family block: {type(block).__name__}")


def _nan_outside(values: np.ndarray, positive: np.ndarray) -> np.ndarray:
    bad = ~(np.asarray(positive) > 0)
    if bad.ndim > values.ndim:
        bad = bad.reshape(bad.shape[: values.ndim] + (-1,)).any(axis=-1)
    return np.where(bad, np.nan, values)


def total_log_partition(params) -> float:
    """``sum_j A_j(lambda_j)`` over every block: the AMPS objective ``J`` of a merged posterior
    (Campbell & How 2014, eq. 11). NaN when a block leaves its domain."""
    total = 0.0
    for block in blocks(params).values():
        per, rest = log_partition(block)
        total += float(np.sum(per)) + rest
    return total


def domain_error(block, what: str = "", atol: float = 0.0) -> str | None:
    """A one-line reason when ``block`` is outside its family's domain (``-atol`` allowed: the
    difference of two posteriors, a likelihood contribution, may be zero), else None."""
    label = f"{what}: " if what else ""
    checks = {Gaussian: ("prec",), IsoGaussian: ("prec",), Dirichlet: ("alpha",),
              Weights: ("alpha",), Beta: ("a", "b")}
    for field in checks.get(type(block), ()):
        a = np.asarray(getattr(block, field))
        if not np.all(np.isfinite(a)):
            return f"{label}{field} has non-finite entries"
        if a.size and _below(float(a.min()), atol):
            return (f"{label}{field} must be {'>= 0' if atol else '> 0'}, "
                    f"smallest {float(a.min()):.4g}")
    if isinstance(block, FullGaussian):
        if not (np.all(np.isfinite(block.h)) and np.all(np.isfinite(block.prec))):
            return f"{label}non-finite entries"
        sym = 0.5 * (block.prec + block.prec.T)
        low = float(np.linalg.eigvalsh(sym).min()) if sym.size else 0.0
        if _below(low, atol):
            kind = "positive semi-definite" if atol else "positive definite"
            return f"{label}precision must be {kind}, smallest eigenvalue {low:.4g}"
    return None


def _below(value: float, atol: float) -> bool:
    """Outside the domain: ``value < -atol`` when zero is allowed (``atol > 0``), else ``<= 0``."""
    return value < -atol if atol else value <= 0


# ---------------------------------------------------------------------------- moments
def mean(block) -> np.ndarray:
    """The block's mean (Gaussian means; Dirichlet, Weights and Beta probabilities)."""
    if isinstance(block, Gaussian):
        return block.h / block.prec
    if isinstance(block, IsoGaussian):
        return block.h / block.prec[:, None]
    if isinstance(block, Dirichlet):
        return block.alpha / block.alpha.sum(axis=-1, keepdims=True)
    if isinstance(block, Weights):
        return block.alpha / block.alpha.sum()
    if isinstance(block, Beta):
        return block.a / (block.a + block.b)
    if isinstance(block, FullGaussian):
        return np.linalg.solve(block.prec, block.h)
    raise TypeError(f"not an exponential-family block: {type(block).__name__}")


def std(block) -> np.ndarray:
    """Marginal standard deviations, the shape of :func:`mean`."""
    if isinstance(block, Gaussian):
        return 1.0 / np.sqrt(block.prec)
    if isinstance(block, IsoGaussian):
        return np.broadcast_to(1.0 / np.sqrt(block.prec)[:, None], block.h.shape).copy()
    if isinstance(block, Dirichlet | Weights):
        alpha = block.alpha
        total = alpha.sum(axis=-1, keepdims=True)
        m = alpha / total
        return np.sqrt(m * (1 - m) / (total + 1))
    if isinstance(block, Beta):
        total = block.a + block.b
        m = block.a / total
        return np.sqrt(m * (1 - m) / (total + 1))
    if isinstance(block, FullGaussian):
        return np.sqrt(np.diag(np.linalg.inv(block.prec)))
    raise TypeError(f"not an exponential-family block: {type(block).__name__}")


def sample(block, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` draws of the block, shape ``(n, *mean(block).shape)``."""
    if isinstance(block, Gaussian | IsoGaussian):
        m, s = mean(block), std(block)
        return m + s * rng.standard_normal((n, *m.shape))
    if isinstance(block, Dirichlet | Weights):
        g = rng.gamma(np.broadcast_to(block.alpha, (n, *block.alpha.shape)))
        return g / g.sum(axis=-1, keepdims=True)
    if isinstance(block, Beta):
        return rng.beta(np.broadcast_to(block.a, (n, *block.a.shape)), block.b)
    if isinstance(block, FullGaussian):
        cov = np.linalg.inv(block.prec)
        return rng.multivariate_normal(mean(block), 0.5 * (cov + cov.T), size=n)
    raise TypeError(f"not an exponential-family block: {type(block).__name__}")


def expected_log(block) -> np.ndarray:
    """``E[log p]`` of Dirichlet / Weights probabilities (``digamma(alpha) - digamma(sum)``)."""
    if isinstance(block, Dirichlet | Weights):
        return digamma(block.alpha) - digamma(block.alpha.sum(axis=-1, keepdims=True))
    raise TypeError(f"expected_log is for Dirichlet blocks, not {type(block).__name__}")


def expected_log_beta(block: Beta) -> tuple[np.ndarray, np.ndarray]:
    """``(E[log pi], E[log(1 - pi)])`` of Beta blocks."""
    total = digamma(block.a + block.b)
    return digamma(block.a) - total, digamma(block.b) - total
