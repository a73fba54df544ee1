r"""Latent Dirichlet allocation by batch mean-field coordinate ascent (the AMPS LDA experiment).

Model (Blei, Ng & Jordan 2003), ``K`` topics over a vocabulary of ``V`` words, documents
``d = 1..D`` given as a count matrix ``n (D, V)``::

    beta_k  ~ Dir(eta_k)          k = 1..K        (global: the topics, eta_k (V,) the prior)
    theta_d ~ Dir(alpha 1_K)      d = 1..D        (local: the document's topic proportions)
    z_dn    ~ Cat(theta_d),  w_dn ~ Cat(beta_{z_dn})

Mean field, in the notation of Hoffman, Blei & Bach (2010)::

    q(beta_k) = Dir(lambda_k),  q(theta_d) = Dir(gamma_d),  q(z_dn = k) = phi_dwk  (w = w_dn)

Coordinate ascent (CAVI; Blei et al. 2003, eqs. 6-7 and Section 5.4; Hoffman et al. 2010,
Section 2.1), with ``E[log theta_dk] = psi(gamma_dk) - psi(sum_j gamma_dj)`` and ``E[log beta_kw] =
psi(lambda_kw) - psi(sum_v lambda_kv)`` (:func:`fedbayes_flwr.inference.expfam.expected_log`)::

    E-step, per document, repeated until its mean |change of gamma_d| < inner_tol:
        phi_dwk   propto  exp(E[log theta_dk] + E[log beta_kw])
        gamma_dk  =  alpha + sum_w n_dw phi_dwk
    M-step:
        lambda_kw =  eta_kw + sum_d n_dw phi_dwk

``phi`` is never stored: ``phi_dwk = e^{E log theta_dk} e^{E log beta_kw} / Z_dw`` with
``Z_dw = sum_k e^{E log theta_dk} e^{E log beta_kw}``, so both sums above are matrix products
(``O(D V K)`` per E-step pass; Hoffman et al. 2010, Section 2.1). The E-step is vectorised over
documents; a document leaves the pass once it has converged (every pass is a coordinate update
of the documents still in it, so this keeps the ELBO monotone). ``gamma`` is warm-started from
the previous sweep, which makes the sweeps exact coordinate ascent: the ELBO never decreases.

ELBO at the state ``(phi, gamma, lambda)`` reached after an M-step, exact (Blei et al. 2003,
Appendix A.3; Hoffman et al. 2010, Section 2.1), with ``log B(a) = sum_i lgamma(a_i) -
lgamma(sum_i a_i)`` (the Dirichlet log-partition, :func:`fedbayes_flwr.inference.expfam.log_partition`)::

    L =  sum_{d,w,k} n_dw phi_dwk (E[log theta_dk] + E[log beta_kw] - log phi_dwk)
       + sum_d ( (alpha - gamma_d) . E[log theta_d] + log B(gamma_d) - log B(alpha 1_K) )
       + sum_k ( (eta_k - lambda_k) . E[log beta_k] + log B(lambda_k) - log B(eta_k) )

The first line is evaluated without ``phi``: writing ``log phi_dwk = a_dk + b_kw - log Z_dw``
(``a``, ``b`` the expectations ``phi`` was computed from), it equals
``sum_dw n_dw log Z_dw + sum_dk (gamma_dk - alpha)(E[log theta_dk] - a_dk) + sum_kw (lambda_kw -
eta_kw)(E[log beta_kw] - b_kw)``, since ``sum_w n_dw phi_dwk = gamma_dk - alpha`` and
``sum_d n_dw phi_dwk = lambda_kw - eta_kw``.

Initialisation (Campbell & How 2014, Section 3.2: "initialized using smoothed statistics from
randomly selected documents"; Blei's lda-c "seeded" start): topic ``k`` starts at ``lambda_k =
eta_k + n_{d_k} + 1``, the counts of ``seed_docs`` randomly chosen documents plus one pseudo-count
per word, which breaks the label symmetry; ``gamma_d = alpha + N_d / K``. The prior is in the
start, so a streaming prior (a merged posterior) keeps its topic order. Each restart draws new
seed documents; the restart with the best ELBO is kept. A restart stops when the ELBO's relative
change ``|L_t - L_{t-1}| / max(1, |L_t|)`` falls below ``tol`` or after ``max_iter`` sweeps.

Held-out log-likelihood (Wang, Paisley & Blei 2011, Section 4; Campbell & How 2014, Section
3.2): each test document's tokens are split at random into 90% observed and 10% held out (at
least one held out for documents of two tokens or more); ``gamma_d`` is fitted to the observed
tokens with the topics fixed at their posterior means ``beta = E[beta]`` (the E-step above with
``e^{E log beta_kw}`` replaced by ``beta_kw``), and the score is ``log sum_k theta_dk beta_kw``
with ``theta_d = gamma_d / sum_k gamma_dk``, averaged over all held-out tokens.

Only the topics' Dirichlets (:class:`LDAParams`) leave :meth:`LDA.fit`; ``gamma`` and ``phi``
stay local.

References
----------
Blei, Ng & Jordan (2003), "Latent Dirichlet Allocation", JMLR 3, Section 5.2 and Appendix A.3
(updates, eqs. 6-7 and Section 5.4 for the smoothed topics; the ELBO expanded in Appendix
A.3). Hoffman, Blei & Bach (2010), "Online Learning for Latent Dirichlet Allocation", Section
2.1 and Algorithm 1 (batch VB in lambda/gamma/phi notation, phi eliminated).
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", Section 3.2 (LDA with AMPS,
the symmetric topics, the initialisation). Wang, Paisley & Blei (2011), "Online Variational
Inference for the Hierarchical Dirichlet Process", Section 4 (the 90/10 held-out protocol).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import digamma, gammaln

from fedbayes_flwr.inference import expfam
from fedbayes_flwr.inference.vb.base import FitResult, VBModel

__all__ = ["LDA", "LDAParams"]

_TINY = np.finfo(np.float64).tiny


class LDAParams(NamedTuple):
    """LDA's global posterior: ``topics``, ``K`` Dirichlets over the vocabulary, ``alpha (K, V)``."""

    topics: expfam.Dirichlet


class LDA(VBModel):
    """Latent Dirichlet allocation with mean-field CAVI (module docstring for the maths).

    Parameters
    ----------
    num_topics : int
        ``K``, the number of topics.
    vocab_size : int
        ``V``, the vocabulary size (columns of the count matrices).
    doc_concentration : float, optional
        ``alpha``, the symmetric Dirichlet prior on each document's topic proportions. Default
        ``1 / K`` (Hoffman et al. 2010; gensim's ``"symmetric"``): total prior mass one, so a
        document leans towards a few topics whatever ``K`` is. It is a fixed hyperparameter, not
        part of the merged posterior.
    topic_concentration : float, optional
        ``eta``, the symmetric Dirichlet prior on each topic's word distribution (:meth:`prior`).
        Default ``0.1``: Campbell & How (2014) give no value; ``0.01`` (Hoffman et al. 2010,
        Wang et al. 2011) is meant for vocabularies of ~10^4 words, whereas for the small
        synthetic vocabularies here (``V`` ~ 100-500, documents of ~50-100 words) ``0.1`` is
        still sparse (a draw puts most of its mass on a few dozen words) and is the value
        :func:`fedbayes_flwr.data.lda_corpus.make_corpus` generates with by default, so the
        benchmark's model is well specified.
    seed_docs : int, optional
        Documents whose counts seed each topic at initialisation (lda-c's ``NUM_INIT``; one
        document keeps the seeds distinct).
    inner_tol : float, optional
        A document's E-step stops when the mean absolute change of ``gamma_d`` falls below it
        (Hoffman et al. 2010 use ``0.001``).
    inner_max_iter : int, optional
        Cap on E-step passes per sweep.

    References
    ----------
    Blei, Ng & Jordan (2003); Hoffman, Blei & Bach (2010); Campbell & How (2014), Section 3.2.
    """

    name = "lda"
    symmetric = ("topics",)

    def __init__(self, num_topics: int, vocab_size: int, doc_concentration: float | None = None,
                 topic_concentration: float = 0.1, *, seed_docs: int = 1,
                 inner_tol: float = 1e-3, inner_max_iter: int = 100):
        self.num_components = int(num_topics)
        self.vocab_size = int(vocab_size)
        if self.num_components < 1 or self.vocab_size < 2:
            raise ValueError(f"need num_topics >= 1 and vocab_size >= 2, got {num_topics}, "
                             f"{vocab_size}")
        self.doc_concentration = (1.0 / self.num_components if doc_concentration is None
                                  else float(doc_concentration))
        self.topic_concentration = float(topic_concentration)
        if not (self.doc_concentration > 0 and self.topic_concentration > 0):
            raise ValueError("doc_concentration and topic_concentration must be > 0, got "
                             f"{self.doc_concentration}, {self.topic_concentration}")
        self.seed_docs = int(seed_docs)
        self.inner_tol = float(inner_tol)
        self.inner_max_iter = int(inner_max_iter)
        if self.seed_docs < 1 or self.inner_max_iter < 1 or not self.inner_tol > 0:
            raise ValueError("seed_docs and inner_max_iter must be >= 1 and inner_tol > 0")

    @property
    def num_topics(self) -> int:
        return self.num_components

    def __repr__(self) -> str:
        return (f"LDA(num_topics={self.num_components}, vocab_size={self.vocab_size}, "
                f"doc_concentration={self.doc_concentration:g}, "
                f"topic_concentration={self.topic_concentration:g})")

    # ------------------------------------------------------------------ VBModel
    def prior(self) -> LDAParams:
        """``K`` topics ``Dir(eta 1_V)``: ``alpha = full((K, V), eta)``."""
        return LDAParams(expfam.Dirichlet(
            np.full((self.num_components, self.vocab_size), self.topic_concentration)))

    def component_means(self, params: LDAParams) -> np.ndarray:
        """``(K, V)`` topic means ``lambda_kw / sum_v lambda_kv``."""
        return expfam.mean(self._topics(params, "params"))

    def fit(self, x: np.ndarray, prior: LDAParams, rng: np.random.Generator, *,
            restarts: int = 1, tol: float = 1e-6, max_iter: int = 500) -> FitResult:
        """Batch mean-field CAVI from ``restarts`` seeded starts; the best ELBO's topics.

        Parameters
        ----------
        x : numpy.ndarray
            ``(D, V)`` word counts (non-negative; need not be integers).
        prior : LDAParams
            Any valid topic posterior ``Dir(eta) (K, V)``: the model's :meth:`prior` or, when
            streaming, a merged posterior.
        rng : numpy.random.Generator
            Draws the seed documents of every restart.
        restarts : int, optional
            Independent starts; the highest final ELBO wins.
        tol : float, optional
            Stop a restart when ``|L_t - L_{t-1}| / max(1, |L_t|) < tol``.
        max_iter : int, optional
            Cap on sweeps (E-step then M-step) per restart.

        Returns
        -------
        FitResult
            ``params = LDAParams(Dirichlet(lambda))`` with ``lambda = eta + sum_d n_dw phi_dwk``
            (so ``params - prior >= 0``), the best ELBO, its sweeps and convergence flag, and
            every restart's final ELBO.

        References
        ----------
        Blei, Ng & Jordan (2003), eqs. (6)-(7), Section 5.4 and Appendix A.3; Hoffman, Blei &
        Bach (2010), Section 2.1; Campbell & How (2014), Section 3.2 (initialisation).
        """
        x = self._counts(x)
        eta = self._topics(prior, "prior").alpha
        if restarts < 1 or max_iter < 1:
            raise ValueError(f"need restarts >= 1 and max_iter >= 1, got {restarts}, {max_iter}")
        best, elbos = None, []
        for _ in range(int(restarts)):
            run = self._cavi(x, eta, self._initial_topics(x, eta, rng), float(tol), int(max_iter))
            elbos.append(run[1])
            if best is None or run[1] > best[1]:
                best = run
        lam, elbo, sweeps, converged, _ = best
        return FitResult(LDAParams(expfam.Dirichlet(lam)), elbo, sweeps, converged, tuple(elbos))

    def fit_trace(self, x: np.ndarray, prior: LDAParams, rng: np.random.Generator, *,
                  tol: float = 1e-6, max_iter: int = 500) -> tuple[FitResult, np.ndarray]:
        """One restart of :meth:`fit` and its ELBO after every sweep (for checks and plots)."""
        x = self._counts(x)
        eta = self._topics(prior, "prior").alpha
        lam, elbo, sweeps, converged, trace = self._cavi(
            x, eta, self._initial_topics(x, eta, rng), float(tol), int(max_iter))
        return (FitResult(LDAParams(expfam.Dirichlet(lam)), elbo, sweeps, converged, (elbo,)),
                np.asarray(trace))

    def heldout_loglik(self, params: LDAParams, x_test: np.ndarray, seed: int = 0) -> float:
        """Per-word held-out log-likelihood, 90% observed / 10% held out per document.

        Parameters
        ----------
        params : LDAParams
            The topic posterior; its means ``beta`` are the fixed topics.
        x_test : numpy.ndarray
            ``(D, V)`` integer word counts of the test documents.
        seed : int, optional
            Seeds the split (``numpy.random.default_rng(seed)``), so every posterior scored with
            the same ``seed`` sees the same split.

        Returns
        -------
        float
            ``sum_{held-out tokens} log sum_k theta_dk beta_kw / #held-out tokens`` (nats per
            word), ``theta_d`` the normalised ``gamma_d`` fitted to the observed tokens.

        References
        ----------
        Wang, Paisley & Blei (2011), Section 4; Campbell & How (2014), Section 3.2.
        """
        beta = self.component_means(params)
        counts = self._counts(x_test)
        if not np.array_equal(counts, np.round(counts)):
            raise ValueError("x_test must hold integer word counts")
        observed, held = split_tokens(counts.astype(np.int64), seed)
        if held.sum() == 0:
            raise ValueError("no test document has two or more tokens to split")
        keep = held.sum(axis=1) > 0
        observed, held = observed[keep].astype(np.float64), held[keep].astype(np.float64)
        log_beta = np.log(np.maximum(beta, _TINY))
        shift = log_beta.max(axis=0)
        gamma, *_ = self._e_step(observed, self._initial_gamma(observed),
                                 np.exp(log_beta - shift))
        theta = gamma / gamma.sum(axis=1, keepdims=True)
        word_prob = theta @ beta
        mask = held > 0
        return float(np.sum(held[mask] * np.log(np.maximum(word_prob[mask], _TINY)))
                     / held.sum())

    # ------------------------------------------------------------------ checks
    def _counts(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.vocab_size:
            raise ValueError(f"counts must be (num_docs, {self.vocab_size}), got {x.shape}")
        if x.shape[0] == 0:
            raise ValueError("counts have no documents")
        if not np.all(np.isfinite(x)) or x.min() < 0:
            raise ValueError("counts must be finite and non-negative")
        return np.ascontiguousarray(x)

    def _topics(self, params, what: str) -> expfam.Dirichlet:
        topics = getattr(params, "topics", None)
        if not isinstance(topics, expfam.Dirichlet):
            raise TypeError(f"{what} must be LDAParams(topics=Dirichlet), got "
                            f"{type(params).__name__}")
        alpha = np.asarray(topics.alpha, dtype=np.float64)
        shape = (self.num_components, self.vocab_size)
        if alpha.shape != shape:
            raise ValueError(f"{what}: topics must be {shape}, got {alpha.shape}")
        reason = expfam.domain_error(expfam.Dirichlet(alpha), what)
        if reason:
            raise ValueError(reason)
        return expfam.Dirichlet(alpha)

    # ------------------------------------------------------------------ CAVI
    def _initial_topics(self, x: np.ndarray, eta: np.ndarray, rng: np.random.Generator):
        """``eta_k + (counts of seed_docs random documents) + 1`` per topic (module docstring)."""
        num_docs, k = x.shape[0], self.num_components
        picks = k * self.seed_docs
        docs = rng.choice(num_docs, size=picks, replace=picks > num_docs)
        seeds = x[docs].reshape(k, self.seed_docs, -1).sum(axis=1)
        return eta + seeds + 1.0

    def _initial_gamma(self, x: np.ndarray) -> np.ndarray:
        """``gamma_dk = alpha + N_d / K`` (Blei et al. 2003, Figure 6)."""
        k = self.num_components
        return np.repeat(self.doc_concentration + x.sum(axis=1, keepdims=True) / k, k, axis=1)

    def _e_step(self, x: np.ndarray, gamma: np.ndarray, exp_b: np.ndarray):
        """Alternate ``phi`` and ``gamma`` updates for every document until each converges.

        ``exp_b (K, V)`` is ``e^{E log beta}`` (or ``beta``) divided by its column maximum.
        Returns ``gamma``, and for each document the ``a = E[log theta]`` its last ``phi`` was
        computed from and that ``phi``'s normaliser ``sum_k e^{a_dk - max_k a_dk} exp_b_kw``.
        """
        alpha = self.doc_concentration
        num_docs = x.shape[0]
        elog_theta = np.empty_like(gamma)
        norms = np.empty_like(x)
        active = np.arange(num_docs)
        for _ in range(self.inner_max_iter):
            g = gamma[active]
            a = digamma(g) - digamma(g.sum(axis=1, keepdims=True))
            exp_a = np.exp(a - a.max(axis=1, keepdims=True))
            norm = np.maximum(exp_a @ exp_b, _TINY)
            new = alpha + exp_a * ((x[active] / norm) @ exp_b.T)
            change = np.mean(np.abs(new - g), axis=1)
            gamma[active] = new
            elog_theta[active] = a
            norms[active] = norm
            active = active[change >= self.inner_tol]
            if active.size == 0:
                break
        return gamma, elog_theta, norms

    def _cavi(self, x, eta, lam, tol, max_iter):
        """One restart: ``(lambda, elbo, sweeps, converged, elbo per sweep)``."""
        alpha, k = self.doc_concentration, self.num_components
        gamma = self._initial_gamma(x)
        elog_beta = expfam.expected_log(expfam.Dirichlet(lam))
        const_theta = x.shape[0] * (k * gammaln(alpha) - gammaln(k * alpha))
        log_b_eta = _log_b(eta)
        trace, elbo, converged, sweep = [], -np.inf, False, 0
        for sweep in range(1, max_iter + 1):  # noqa: B007 (sweep is returned)
            shift = elog_beta.max(axis=0)
            exp_b = np.exp(elog_beta - shift)
            gamma, a_used, norm = self._e_step(x, gamma, exp_b)
            # phi_dwk = e^{a_dk - max_k a_dk} exp_b_kw / norm_dw
            a_max = a_used.max(axis=1, keepdims=True)
            stats = exp_b * (np.exp(a_used - a_max).T @ (x / norm))
            new_lam = eta + stats
            new_elog_beta = expfam.expected_log(expfam.Dirichlet(new_lam))
            elog_theta = digamma(gamma) - digamma(gamma.sum(axis=1, keepdims=True))
            # sum n phi (E log theta + E log beta - log phi), phi eliminated (module docstring)
            z_term = (np.sum(x * (np.log(norm) + a_max + shift))
                      + np.sum((gamma - alpha) * (elog_theta - a_used))
                      + np.sum(stats * (new_elog_beta - elog_beta)))
            theta_term = (np.sum((alpha - gamma) * elog_theta) + np.sum(_log_b(gamma))
                          - const_theta)
            beta_term = (np.sum((eta - new_lam) * new_elog_beta) + np.sum(_log_b(new_lam))
                         - np.sum(log_b_eta))
            new_elbo = float(z_term + theta_term + beta_term)
            lam, elog_beta = new_lam, new_elog_beta
            trace.append(new_elbo)
            if abs(new_elbo - elbo) < tol * max(1.0, abs(new_elbo)):
                elbo, converged = new_elbo, True
                break
            elbo = new_elbo
        return lam, elbo, sweep, converged, trace


def _log_b(a: np.ndarray) -> np.ndarray:
    """``log B(a) = sum lgamma(a) - lgamma(sum a)`` over the last axis (Dirichlet log-partition)."""
    return np.sum(gammaln(a), axis=-1) - gammaln(np.sum(a, axis=-1))


def split_tokens(counts: np.ndarray, seed: int = 0,
                 fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Split each document's tokens at random into ``(observed, held out)`` count matrices.

    A document of ``N >= 2`` tokens holds out ``max(1, round(fraction N))`` of them, drawn
    without replacement (multivariate hypergeometric) with ``numpy.random.default_rng(seed)``;
    shorter documents hold out nothing.

    References
    ----------
    Wang, Paisley & Blei (2011), Section 4 (90% observed, 10% held out).
    """
    counts = np.asarray(counts, dtype=np.int64)
    rng = np.random.default_rng(seed)
    held = np.zeros_like(counts)
    lengths = counts.sum(axis=1)
    for d in np.flatnonzero(lengths >= 2):
        n_held = max(1, int(round(fraction * lengths[d])))
        held[d] = rng.multivariate_hypergeometric(counts[d], n_held)
    return counts - held, held
