"""Synthetic corpora drawn from LDA's generative process (the AMPS LDA benchmark's data).

::

    beta_k  ~ Dir(eta 1_V)                   k = 1..K    (the true topics)
    theta_d ~ Dir(alpha 1_K)                 d = 1..D
    n_d     ~ Multinomial(L, theta_d^T beta) (the document's word counts, L words)

Recommended for the benchmark (``benchmarks/amps/amps_lda.py``): ``V = 100`` words, ``K = 10``
topics, ``L = 80`` words per document, ``alpha = 1 / K`` and ``eta = 0.1`` (the defaults of
:class:`fedbayes_flwr.inference.vb.lda.LDA`, so the fitted model is well specified), and 20 documents per
agent, i.e. ``D = 1000`` training documents for 50 agents (smaller splits for 5 and 10 agents
take the first ``20 N`` documents, or share the 1000), plus a few hundred test documents. With
``eta = 0.1`` and ``V = 100`` the topics are well separated (each puts most of its mass on a
few dozen words), so topic recovery is measurable; with ``alpha = 1 / K`` a document mixes
one to three topics, as in real corpora.

References
----------
Blei, Ng & Jordan (2003), "Latent Dirichlet Allocation", Section 3 (the generative process);
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", Section 3.2.
"""

from __future__ import annotations

import numpy as np

__all__ = ["make_corpus"]


def make_corpus(rng: np.random.Generator, num_docs: int, vocab_size: int = 100,
                num_topics: int = 10, doc_length: int = 80,
                doc_concentration: float | None = None,
                topic_concentration: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Draw topics and a corpus of word counts from LDA's generative process.

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of every draw (topics first, then documents).
    num_docs : int
        ``D``, documents.
    vocab_size : int, optional
        ``V``.
    num_topics : int, optional
        ``K``.
    doc_length : int, optional
        ``L``, words per document (every document has exactly ``L``).
    doc_concentration : float or None, optional
        ``alpha`` of ``theta_d ~ Dir(alpha 1_K)``; ``None`` means ``1 / K``.
    topic_concentration : float, optional
        ``eta`` of ``beta_k ~ Dir(eta 1_V)``.

    Returns
    -------
    counts : numpy.ndarray
        ``(D, V)`` float64 word counts (integers), each row summing to ``L``.
    topics : numpy.ndarray
        ``(K, V)`` the true topics (rows sum to one).

    References
    ----------
    Blei, Ng & Jordan (2003), Section 3.
    """
    num_docs, vocab_size, num_topics = int(num_docs), int(vocab_size), int(num_topics)
    doc_length = int(doc_length)
    alpha = 1.0 / num_topics if doc_concentration is None else float(doc_concentration)
    eta = float(topic_concentration)
    if min(num_docs, num_topics, doc_length) < 1 or vocab_size < 2:
        raise ValueError("need num_docs, num_topics, doc_length >= 1 and vocab_size >= 2")
    if not (alpha > 0 and eta > 0):
        raise ValueError(f"concentrations must be > 0, got {alpha}, {eta}")
    topics = _dirichlet(rng, eta, (num_topics, vocab_size))
    theta = _dirichlet(rng, alpha, (num_docs, num_topics))
    word_probs = theta @ topics
    word_probs /= word_probs.sum(axis=1, keepdims=True)
    counts = rng.multinomial(doc_length, word_probs).astype(np.float64)
    return counts, topics


def _dirichlet(rng: np.random.Generator, concentration: float, shape: tuple[int, int]):
    """Rows of symmetric Dirichlet draws (normalised gammas; a row that underflows entirely,
    possible for tiny concentrations, is redrawn as a one-hot at a uniform position)."""
    g = rng.standard_gamma(concentration, size=shape)
    total = g.sum(axis=1, keepdims=True)
    empty = total[:, 0] <= 0
    if np.any(empty):
        g[empty] = np.eye(shape[1])[rng.integers(shape[1], size=int(empty.sum()))]
        total = g.sum(axis=1, keepdims=True)
    return g / total
