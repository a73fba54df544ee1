"""``mnist-like``: MNIST-shaped data generated from a fixed seed (no download).

MNIST itself needs the network (``hub:mnist``); this set has its shape, so the cost of a round
at field scale can be measured offline: 60,000 training and 10,000 test rows of 28 x 28 = 784
pixels in [0, 1] (row-major, so ``x.reshape(-1, 28, 28)`` is the image), 10 classes.

How a row is made, from :data:`MNIST_LIKE_SEED`:

* a latent ``z ~ N(0, I_16)``;
* the image ``sigmoid(3 B z)``, where the 16 columns of ``B`` are the separable low-frequency
  cosines ``cos(pi f_r (r + 1/2) / 28) cos(pi f_c (c + 1/2) / 28)``, ``f_r, f_c`` in 0..3, each
  scaled to unit root-mean-square: smooth blobs, as handwritten strokes are smooth;
* the label from a fixed random *teacher* network on the latent, ``16 -> 32 (tanh) -> 10``,
  drawn from ``softmax(teacher(z) / 0.25)``, its output bias set so the ten classes are about
  equally frequent: a smooth decision function a 784-100-10 network can
  learn (the image determines ``z``: ``B`` has full column rank), with a little label noise so
  the Bayes error is not zero.

The split is fixed (the last 10,000 rows are the test set, as MNIST's own split), so
``test-fraction`` does not apply and results are comparable across run seeds.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr

from fedbayes_flwr.data.base import Dataset, f64, i64

__all__ = ["MNIST_LIKE_CLASSES", "MNIST_LIKE_SEED", "MNIST_LIKE_SHAPE", "MNIST_LIKE_SIZE",
           "MNIST_LIKE_TEST", "make_mnist_like"]

MNIST_LIKE_SEED = 1998
"""Fixed seed of the generator (the year of LeCun et al.'s MNIST paper): the same data every run."""

MNIST_LIKE_SHAPE = (28, 28)
"""Image shape; rows hold the ``28 * 28 = 784`` pixels row-major."""

MNIST_LIKE_SIZE = 70_000
"""Rows in all (train plus test), as MNIST."""

MNIST_LIKE_TEST = 10_000
"""Test rows (the last ones), as MNIST's test split."""

MNIST_LIKE_CLASSES = 10
"""Number of classes."""

_LATENT, _HIDDEN, _FREQ, _GAIN, _TEMPERATURE = 16, 32, 4, 3.0, 0.25


def _basis() -> np.ndarray:
    """The ``(784, 16)`` separable cosine basis, columns of unit root-mean-square."""
    rows, cols = MNIST_LIKE_SHAPE
    r = np.cos(np.pi * np.arange(_FREQ)[:, None] * (np.arange(rows)[None, :] + 0.5) / rows)
    c = np.cos(np.pi * np.arange(_FREQ)[:, None] * (np.arange(cols)[None, :] + 0.5) / cols)
    basis = np.einsum("fr,gc->rcfg", r, c).reshape(rows * cols, _FREQ * _FREQ)
    return basis / np.sqrt(np.mean(basis**2, axis=0, keepdims=True))


def _probabilities(z, w1, b1, w2, b2) -> np.ndarray:
    logits = (np.tanh(z @ w1 + b1) @ w2 + b2) / _TEMPERATURE
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def _balancing_bias(rng: np.random.Generator, w1, b1, w2) -> np.ndarray:
    """Output bias making the classes about equally frequent (fitted on 20,000 pilot latents)."""
    z = rng.standard_normal((20_000, _LATENT))
    b2 = np.zeros(MNIST_LIKE_CLASSES)
    for _ in range(50):  # b <- b - T log(freq / 0.1): a fixed point at equal frequencies
        freq = _probabilities(z, w1, b1, w2, b2).mean(axis=0)
        b2 = b2 - _TEMPERATURE * np.log(freq * MNIST_LIKE_CLASSES)
    return b2


def make_mnist_like(size: int = MNIST_LIKE_SIZE, test_rows: int = MNIST_LIKE_TEST) -> Dataset:
    """Generate ``mnist-like`` (see the module docstring).

    Parameters
    ----------
    size : int, optional
        Rows in all; the defaults are MNIST's 70,000. Fewer rows give a prefix of the same
        stream of latents (so a smaller set is the start of the larger one, before the split).
    test_rows : int, optional
        The last `test_rows` rows are the test set (default 10,000).

    Returns
    -------
    Dataset
        ``x`` float64 ``(n, 784)`` in [0, 1], ``y`` int64 in 0..9, ``holdout_rows`` 0.

    Raises
    ------
    ValueError
        Unless ``0 < test_rows < size``.
    """
    size, test_rows = int(size), int(test_rows)
    if not 0 < test_rows < size:
        raise ValueError(f"mnist-like needs 0 < test rows < rows, got {test_rows} of {size}")
    rng = np.random.default_rng(MNIST_LIKE_SEED)
    w1 = rng.standard_normal((_LATENT, _HIDDEN)) / np.sqrt(_LATENT) * 2.0
    b1 = 0.5 * rng.standard_normal(_HIDDEN)
    w2 = rng.standard_normal((_HIDDEN, MNIST_LIKE_CLASSES)) / np.sqrt(_HIDDEN) * 2.0
    b2 = _balancing_bias(np.random.default_rng([MNIST_LIKE_SEED, 1]), w1, b1, w2)
    draws = rng.standard_normal((size, _LATENT + 1))  # one row of draws per row: a prefix property
    z, u = draws[:, :_LATENT], ndtr(draws[:, _LATENT:])  # u ~ U(0, 1) for the label draw
    x = 1.0 / (1.0 + np.exp(-_GAIN / np.sqrt(_LATENT) * (z @ _basis().T)))
    cum = np.cumsum(_probabilities(z, w1, b1, w2, b2), axis=1)
    y = np.minimum((u > cum).sum(axis=1), MNIST_LIKE_CLASSES - 1)
    n = size - test_rows
    return Dataset(f64(x[:n]), i64(y[:n]), f64(x[n:]), i64(y[n:]), None, "mnist-like")
