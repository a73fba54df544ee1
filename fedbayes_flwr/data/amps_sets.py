"""The AMPS paper's data sets, generated from the run seed (fresh data per seed, no download).

* ``"amps-mixture"``: the paper's Gaussian mixture (Campbell & How 2014, Section 3.1): means
  ``(1, -1, 3)``, weights ``(0.6, 0.3, 0.1)``, variance ``0.09``; 30 training points (10 agents x
  3 with ``partition = iid``) and 2,000 fresh held-out points. One column, no targets.
* ``"amps-gaussian"``: the paper's Gaussian example (Section 2): ``x ~ N(1, 1)``, 100 training
  points (10 agents x 10), 1,000 held-out points. One column, no targets.
* ``"lda-corpus"``: a synthetic LDA corpus (:func:`fedbayes_flwr.data.lda_corpus.make_corpus`):
  ``V = 100`` words, ``K = 10`` topics, 80 words per document, ``alpha = 1 / K``,
  ``eta = 0.1``; 1,000 training documents (50 agents x 20) and 200 held-out documents. Rows are
  word counts.
* ``"latent-features"``: the paper's synthetic latent-feature data (Section 3.3,
  :func:`fedbayes_flwr.data.latent_features.make_latent_features`): ``K = 5`` random binary
  features in ``D = 10`` dimensions, inclusion probabilities ``U(0, 1)``, variance ``0.04``;
  1,000 training and 300 held-out observations.

:func:`truth` returns the generating components of a set (for recovery errors).

References
----------
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", Sections 2, 3.1-3.3.
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.data.base import DataError, Dataset, f64
from fedbayes_flwr.data.latent_features import make_latent_features
from fedbayes_flwr.data.lda_corpus import make_corpus

__all__ = ["AMPS_SETS", "MIXTURE_MEANS", "MIXTURE_NOISE_VAR", "MIXTURE_WEIGHTS", "load_amps_set",
           "paper_mixture", "truth"]

MIXTURE_MEANS = np.array([[1.0], [-1.0], [3.0]])
MIXTURE_WEIGHTS = np.array([0.6, 0.3, 0.1])
MIXTURE_NOISE_VAR = 0.09
LDA_SHAPE = {"vocab_size": 100, "num_topics": 10, "doc_length": 80}
LDA_TRAIN, LDA_TEST = 1000, 200
LF_TRAIN, LF_TEST = 1000, 300

AMPS_SETS = ("amps-mixture", "amps-gaussian", "lda-corpus", "latent-features")


def paper_mixture(rng: np.random.Generator, n: int, means=MIXTURE_MEANS, weights=MIXTURE_WEIGHTS,
                  noise_var: float = MIXTURE_NOISE_VAR) -> np.ndarray:
    """``n`` points ``(n, D)`` of a Gaussian mixture (default: the paper's)."""
    means = np.asarray(means, dtype=np.float64)
    z = rng.choice(len(weights), size=n, p=weights)
    return means[z] + np.sqrt(noise_var) * rng.standard_normal((n, means.shape[1]))


def _generate(name: str, seed: int):
    """``(x_train, x_test, truth)`` of set ``name`` from ``seed``."""
    rng = np.random.default_rng([seed, AMPS_SETS.index(name)])
    if name == "amps-mixture":
        return paper_mixture(rng, 30), paper_mixture(rng, 2000), MIXTURE_MEANS
    if name == "amps-gaussian":
        x = 1.0 + rng.standard_normal((1100, 1))
        return x[:100], x[100:], np.array([[1.0]])
    if name == "lda-corpus":
        counts, topics = make_corpus(rng, LDA_TRAIN + LDA_TEST, **LDA_SHAPE)
        return counts[:LDA_TRAIN], counts[LDA_TRAIN:], topics
    x, features, _ = make_latent_features(rng, LF_TRAIN + LF_TEST)
    return x[:LF_TRAIN], x[LF_TRAIN:], features


def load_amps_set(name: str, target: str, seed: int) -> Dataset:
    """Generate AMPS data set ``name`` (see the module docstring) from ``seed``."""
    if name not in AMPS_SETS:
        raise DataError(f"unknown AMPS data set {name!r}; choose one of {', '.join(AMPS_SETS)}")
    if target != "none":
        raise DataError(f"dataset {name!r} has no targets (inputs only); this model needs "
                        f"{target} targets")
    x_train, x_test, _ = _generate(name, int(seed))
    return Dataset(f64(x_train), None, f64(x_test), None, None, name)


def truth(name: str, seed: int) -> np.ndarray:
    """The generating components ``(K, D)`` of set ``name`` at ``seed`` (means, topics,
    features)."""
    return _generate(name, int(seed))[2]
