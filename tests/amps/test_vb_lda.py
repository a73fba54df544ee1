"""LDA by mean-field CAVI (:mod:`fedbayes_flwr.inference.vb.lda`), its corpus generator and the streaming
schemes (:mod:`fedbayes_flwr.algorithms.amps.streaming`): exactness of the ELBO, monotone sweeps, recovery,
valid contributions, held-out scoring, streaming priors, and the SDA-Bayes / AMPS identities."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import digamma, gammaln, logsumexp

from fedbayes_flwr.algorithms.amps import merge as amps
from fedbayes_flwr.algorithms.amps import streaming
from fedbayes_flwr.data.lda_corpus import make_corpus
from fedbayes_flwr.inference import expfam
from fedbayes_flwr.inference.vb.base import FitResult
from fedbayes_flwr.inference.vb.lda import LDA, LDAParams, split_tokens

K, V = 3, 30


@pytest.fixture(scope="module")
def corpus():
    """200 training and 50 test documents of 60 words, 3 topics over 30 words (eta = 0.1: each
    topic puts most of its mass on a handful of words, so the topics are well separated)."""
    counts, topics = make_corpus(np.random.default_rng(0), 250, V, K, 60)
    return counts[:200], counts[200:], topics


@pytest.fixture(scope="module")
def model():
    return LDA(K, V)


@pytest.fixture(scope="module")
def fitted(model, corpus):
    x, _, _ = corpus
    return model.fit(x, model.prior(), np.random.default_rng(0), restarts=3)


# ---------------------------------------------------------------------------- the ELBO
def reference_sweeps(x, eta, alpha, lam, passes, sweeps):
    """Textbook CAVI with an explicit ``phi (D, V, K)`` (Blei et al. 2003, eqs. 6-7 and Section
    5.4) and the ELBO as ``E[log p] - E[log q]`` term by term (Appendix A.3), for comparison."""
    k = lam.shape[0]
    gamma = alpha + np.repeat(x.sum(axis=1, keepdims=True) / k, k, axis=1)
    lambdas, elbos = [], []
    for _ in range(sweeps):
        elog_beta = digamma(lam) - digamma(lam.sum(axis=1, keepdims=True))
        for _ in range(passes):
            elog_theta = digamma(gamma) - digamma(gamma.sum(axis=1, keepdims=True))
            log_phi = elog_theta[:, None, :] + elog_beta.T[None]
            log_phi -= logsumexp(log_phi, axis=2, keepdims=True)
            phi = np.exp(log_phi)
            gamma = alpha + np.einsum("dv,dvk->dk", x, phi)
        lam = eta + np.einsum("dv,dvk->kv", x, phi)
        elog_theta = digamma(gamma) - digamma(gamma.sum(axis=1, keepdims=True))
        elog_beta = digamma(lam) - digamma(lam.sum(axis=1, keepdims=True))
        e_log_p = (np.sum(x[:, :, None] * phi * (elog_theta[:, None, :] + elog_beta.T[None]))
                   + x.shape[0] * (gammaln(k * alpha) - k * gammaln(alpha))
                   + np.sum((alpha - 1) * elog_theta)
                   + np.sum(gammaln(eta.sum(axis=1)) - gammaln(eta).sum(axis=1))
                   + np.sum((eta - 1) * elog_beta))
        e_log_q = (np.sum(x[:, :, None] * phi * log_phi)
                   + np.sum(gammaln(gamma.sum(axis=1)) - gammaln(gamma).sum(axis=1))
                   + np.sum((gamma - 1) * elog_theta)
                   + np.sum(gammaln(lam.sum(axis=1)) - gammaln(lam).sum(axis=1))
                   + np.sum((lam - 1) * elog_beta))
        lambdas.append(lam)
        elbos.append(e_log_p - e_log_q)
    return lambdas, elbos


def test_elbo_and_updates_match_textbook_cavi(corpus):
    """Same start, same number of E-step passes (inner_tol tiny, so every document makes all
    of them): the phi-free implementation's topics and exact ELBO equal the textbook ones after
    each of three sweeps, to rounding (1e-9 relative)."""
    x = corpus[0][:40]
    model = LDA(K, V, inner_tol=1e-300, inner_max_iter=4)
    eta = model.prior().topics.alpha
    start = model._initial_topics(x, eta, np.random.default_rng(3))
    lam_ref, elbo_ref = reference_sweeps(x, eta, model.doc_concentration, start, 4, 3)
    for sweeps in (1, 2, 3):
        lam, elbo, *_ = model._cavi(x, eta, start.copy(), 0.0, sweeps)
        np.testing.assert_allclose(lam, lam_ref[sweeps - 1], rtol=1e-9)
        assert elbo == pytest.approx(elbo_ref[sweeps - 1], rel=1e-9)


def test_elbo_never_decreases(model, corpus):
    """Every sweep is coordinate ascent (warm-started gamma), so the ELBO trace is
    non-decreasing; 1e-9 relative slack for the rounding of sums of ~1e4 nats."""
    x = corpus[0]
    for seed in range(3):
        result, trace = model.fit_trace(x, model.prior(), np.random.default_rng(seed), tol=1e-10)
        assert len(trace) == result.iterations >= 5
        assert np.all(np.diff(trace) >= -1e-9 * np.abs(trace[1:]))
        assert result.elbo == trace[-1]


def test_elbo_is_the_best_mean_field_elbo_below_log_evidence():
    """On a corpus small enough to sum over every topic assignment (5 tokens, 2 topics), the
    CAVI ELBO equals the best mean-field ELBO found independently, and is below the exact log
    evidence ``log sum_z p(w, z)`` (Dirichlet-multinomial integrals) by the exact minimal KL.

    The independent optimum: for fixed token responsibilities ``phi`` the optimal Dirichlet
    factors are closed form and the ELBO collapses to (``B`` the multivariate Beta function)
    ``sum_d log B(alpha + n_d)/B(alpha) + sum_k log B(eta + m_k)/B(eta) + sum_n H(phi_n)``,
    ``n_dk = sum_{n in d} phi_nk`` and ``m_kw = sum_{n: w_n = w} phi_nk``
    (``max_q E_q log f - E_q log q = log int f``). It is maximised over one free logit per token
    (per-token, a family at least as large as CAVI's per-(d, w) one) by BFGS from 4 random starts.
    """
    from itertools import product

    from scipy.optimize import minimize
    from scipy.special import expit

    x = np.array([[2.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    alpha, eta = 0.5, 0.7
    model = LDA(2, 3, doc_concentration=alpha, topic_concentration=eta)
    result = model.fit(x, model.prior(), np.random.default_rng(0), tol=1e-12)
    tokens = [(d, w) for d in range(2) for w in range(3) for _ in range(int(x[d, w]))]
    doc_of = np.eye(2)[[d for d, _ in tokens]]  # (tokens, D) one-hot
    word_of = np.eye(3)[[w for _, w in tokens]]  # (tokens, V) one-hot

    def log_b(a):
        return np.sum(gammaln(a), axis=-1) - gammaln(np.sum(a, axis=-1))

    terms = []
    for z in product(range(2), repeat=len(tokens)):
        doc_topic, topic_word = np.zeros((2, 2)), np.zeros((2, 3))
        for (d, w), k in zip(tokens, z, strict=True):
            doc_topic[d, k] += 1
            topic_word[k, w] += 1
        terms.append(np.sum(log_b(alpha + doc_topic) - log_b(np.full(2, alpha)))
                     + np.sum(log_b(eta + topic_word) - log_b(np.full(3, eta))))
    log_evidence = logsumexp(terms)

    def collapsed_elbo(logits):
        p1 = expit(logits)
        phi = np.stack([1 - p1, p1], axis=1)  # (tokens, K)
        n_dk, m_kw = doc_of.T @ phi, phi.T @ word_of
        entropy = -np.sum(phi * np.log(np.clip(phi, 1e-300, None)))
        return (np.sum(log_b(alpha + n_dk) - log_b(np.full(2, alpha)))
                + np.sum(log_b(eta + m_kw) - log_b(np.full(3, eta))) + entropy)

    rng = np.random.default_rng(1)
    best = max(-minimize(lambda v: -collapsed_elbo(v), rng.normal(0, 3, len(tokens)),
                         method="BFGS", options={"gtol": 1e-9}).fun
               for _ in range(4))
    assert result.converged
    min_kl = log_evidence - best  # the exact KL(q* || p(z, theta, beta | w)) of the best q*
    print(f"log evidence {log_evidence:.6f}, best mean-field ELBO {best:.6f}, "
          f"CAVI {result.elbo:.6f} (off by {result.elbo - best:.1e}), min KL {min_kl:.4f}, "
          f"uniform phi {collapsed_elbo(np.zeros(len(tokens))):.6f}")
    assert 0 < min_kl  # mean field cannot be exact here: the posterior couples z and theta
    # Tolerance 1e-8 nats: CAVI stops on a 1e-12 relative change of a ~7-nat objective
    # (~1e-11 nats), BFGS on a gradient below 1e-9 (distance to the optimum ~ g^2 / (2 lambda),
    # far below 1e-11); measured |CAVI - best| ~ 1e-13. Power: the ELBO at the uniform phi
    # (every token 50/50) is 1.5 nats below the optimum, and a CAVI run stopped after two sweeps
    # is more than 1e-8 below it: both fail the same assertion (checked below).
    assert abs(result.elbo - best) <= 1e-8, (result.elbo, best)
    assert result.elbo <= log_evidence + 1e-10
    uniform = collapsed_elbo(np.zeros(len(tokens)))
    early = model.fit(x, model.prior(), np.random.default_rng(0), max_iter=2).elbo
    assert not abs(uniform - best) <= 1e-8 and not abs(early - best) <= 1e-8, (uniform, early)


# ---------------------------------------------------------------------------- the fit
def test_recovers_separated_topics(model, corpus, fitted):
    """About 4,000 tokens per topic: the sampling error of an estimated topic is about
    sqrt(sum_w p(1 - p) / 4000) ~ 0.014 in 2-norm, while a missed or merged topic is off by a
    topic's norm (~0.4); 0.05 per topic separates the two."""
    errors, _ = amps.matched_error(model.component_means(fitted.params), corpus[2])
    assert np.all(errors < 0.05), errors
    assert fitted.converged
    assert len(fitted.elbos) == 3 and fitted.elbo == max(fitted.elbos)


def test_only_topics_leave_the_fit(model, corpus, fitted):
    """Document proportions and assignments stay local: the result is K x V whatever the
    number of documents, and the model keeps no state from a fit."""
    assert isinstance(fitted, FitResult)
    assert isinstance(fitted.params, LDAParams) and fitted.params._fields == ("topics",)
    assert isinstance(fitted.params.topics, expfam.Dirichlet)
    assert fitted.params.topics.alpha.shape == (K, V)
    state = dict(vars(model))
    small = model.fit(corpus[0][:7], model.prior(), np.random.default_rng(1))
    assert small.params.topics.alpha.shape == (K, V)
    assert vars(model) == state
    assert all(np.ndim(v) == 0 for v in fitted[1:4])


def test_posterior_minus_prior_is_a_valid_contribution(model, corpus, fitted):
    """``lambda - eta = sum_d n_dw phi_dwk >= 0`` and, since ``sum_k phi_dwk = 1``, its total is
    the corpus's token count (to rounding)."""
    prior = model.prior()
    diff = fitted.params.topics.alpha - prior.topics.alpha
    assert diff.min() >= 0
    assert amps.contribution_error(prior, fitted.params) is None
    np.testing.assert_allclose(diff.sum(axis=0), corpus[0].sum(axis=0), rtol=1e-9)


def test_heldout_beats_prior(model, corpus, fitted):
    """The prior's topic means are uniform (log(1/30) = -3.40 per word); the fitted topics
    predict held-out words much better, and not better than the true topics (sampling noise
    margin 0.05 nats)."""
    x_test, truth = corpus[1], corpus[2]
    prior_score = model.heldout_loglik(model.prior(), x_test)
    assert prior_score == pytest.approx(-np.log(V), rel=1e-12)
    score = model.heldout_loglik(fitted.params, x_test)
    true_score = model.heldout_loglik(LDAParams(expfam.Dirichlet(truth * 1e8)), x_test)
    assert score > prior_score + 0.5
    assert score < true_score + 0.05
    assert model.heldout_loglik(fitted.params, x_test, seed=0) == score  # the split is seeded


def test_split_tokens():
    counts = np.array([[5, 3, 2] * 10, [1] + [0] * 29, [2] + [0] * 29, [0] * 30])
    observed, held = split_tokens(counts, seed=4)
    assert np.all(observed >= 0) and np.all(held >= 0)
    np.testing.assert_array_equal(observed + held, counts)
    np.testing.assert_array_equal(held.sum(axis=1), [10, 0, 1, 0])  # 10% of 100; >= 1; none
    again = split_tokens(counts, seed=4)
    np.testing.assert_array_equal(again[1], held)


def test_streaming_prior_is_honoured(model, corpus):
    """Fitting batch 2 with batch 1's posterior as prior: the contribution is valid and counts
    batch 2's tokens only, the topics keep the prior's order, and the result differs from a fit
    from the default prior."""
    x = corpus[0]
    first = model.fit(x[:100], model.prior(), np.random.default_rng(0), restarts=2).params
    second = model.fit(x[100:], first, np.random.default_rng(1)).params
    diff = second.topics.alpha - first.topics.alpha
    assert diff.min() >= 0
    np.testing.assert_allclose(diff.sum(axis=0), x[100:].sum(axis=0), rtol=1e-9)
    _, perm = amps.matched_error(model.component_means(second), model.component_means(first))
    np.testing.assert_array_equal(perm, np.arange(K))
    fresh = model.fit(x[100:], model.prior(), np.random.default_rng(1)).params
    assert not np.allclose(fresh.topics.alpha, second.topics.alpha)


def test_bad_input_is_rejected(model, corpus):
    x, prior, rng = corpus[0], model.prior(), np.random.default_rng(0)
    with pytest.raises(ValueError, match="counts must be"):
        model.fit(x[:, :-1], prior, rng)
    with pytest.raises(ValueError, match="non-negative"):
        model.fit(-x, prior, rng)
    with pytest.raises(ValueError, match="topics must be"):
        model.fit(x, LDAParams(expfam.Dirichlet(np.ones((K + 1, V)))), rng)
    with pytest.raises(ValueError, match="alpha must be > 0"):
        model.fit(x, LDAParams(expfam.Dirichlet(np.zeros((K, V)))), rng)
    with pytest.raises(ValueError, match="integer"):
        model.heldout_loglik(prior, x + 0.5)


def test_make_corpus():
    counts, topics = make_corpus(np.random.default_rng(5), 40, 50, 4, 30)
    assert counts.shape == (40, 50) and counts.dtype == np.float64
    assert topics.shape == (4, 50)
    np.testing.assert_array_equal(counts.sum(axis=1), 30)
    np.testing.assert_allclose(topics.sum(axis=1), 1.0)
    again, _ = make_corpus(np.random.default_rng(5), 40, 50, 4, 30)
    np.testing.assert_array_equal(again, counts)


# ---------------------------------------------------------------------------- streaming
def test_one_agent_one_batch_is_a_plain_fit(model, corpus):
    x = corpus[0][:60]
    plain = model.fit(x, model.prior(), np.random.default_rng(7)).params.topics.alpha
    for scheme in (streaming.sda_bayes, streaming.amps_batches):
        result = scheme(model, model.prior(), [[x]], np.random.default_rng(7))
        np.testing.assert_array_equal(result.params.topics.alpha, plain)
        assert result.fit_seconds.shape == (1, 1) and result.seconds >= 0


def test_sda_bayes_is_sequential_then_naive(model, corpus):
    """One agent: sequential Bayesian updating; two agents, one step: the naive merge of two
    fits from the prior (same fits: the rng is used in the same order)."""
    x, prior = corpus[0], model.prior()
    a, b = x[:50], x[50:100]
    rng = np.random.default_rng(2)
    first = model.fit(a, prior, rng).params
    second = model.fit(b, first, rng).params
    result = streaming.sda_bayes(model, prior, [[a, b]], np.random.default_rng(2))
    np.testing.assert_allclose(result.params.topics.alpha, second.topics.alpha, rtol=1e-12)

    rng = np.random.default_rng(2)
    fits = [model.fit(part, prior, rng).params for part in (a, b)]
    naive = amps.merge(prior, fits, None, model.symmetric)
    result = streaming.sda_bayes(model, prior, [[a], [b]], np.random.default_rng(2))
    np.testing.assert_allclose(result.params.topics.alpha, naive.topics.alpha, rtol=1e-12)
    assert result.agents == () and result.alignments == ()


def test_amps_batches_relationships(model, corpus):
    """2 agents x 1 batch is the AMPS merge of the two fits; 1 agent x 2 batches merges the
    same fits the same way; the merged contribution always totals the corpus's tokens; AMPS's
    objective is at least the naive merge's."""
    x, prior = corpus[0], model.prior()
    a, b = x[:100], x[100:]
    rng = np.random.default_rng(4)
    fits = [model.fit(part, prior, rng).params for part in (a, b)]
    al = amps.align(prior, fits, symmetric=model.symmetric)
    expected = amps.merge(prior, fits, al.perms, model.symmetric)
    across = streaming.amps_batches(model, prior, [[a], [b]], np.random.default_rng(4))
    within = streaming.amps_batches(model, prior, [[a, b]], np.random.default_rng(4))
    for result in (across, within):
        np.testing.assert_allclose(result.params.topics.alpha, expected.topics.alpha, rtol=1e-12)
        np.testing.assert_allclose((result.params.topics.alpha - prior.topics.alpha).sum(0),
                                   x.sum(axis=0), rtol=1e-9)
        assert len(result.alignments) == 1
        assert result.alignments[0].objective >= result.alignments[0].naive_objective
    assert len(across.agents) == 2 and len(within.agents) == 1
    assert across.fit_seconds.shape == (2, 1) and within.fit_seconds.shape == (1, 2)
    naive = streaming.amps_batches(model, prior, [[a], [b]], np.random.default_rng(4),
                                   search=None)
    np.testing.assert_allclose(naive.params.topics.alpha,
                               amps.merge(prior, fits, None, model.symmetric).topics.alpha)
    assert naive.alignments == ()


def test_ragged_agents_and_bad_batches(model, corpus):
    x, prior = corpus[0], model.prior()
    result = streaming.sda_bayes(model, prior, [[x[:30], x[30:60]], [x[60:90]]],
                                 np.random.default_rng(0), max_iter=20)
    assert np.isnan(result.fit_seconds[1, 1]) and np.isfinite(result.fit_seconds[0, 1])
    np.testing.assert_allclose((result.params.topics.alpha - prior.topics.alpha).sum(0),
                               x[:90].sum(axis=0), rtol=1e-9)
    with pytest.raises(ValueError, match="at least one"):
        streaming.sda_bayes(model, prior, [[x], []], np.random.default_rng(0))
    with pytest.raises(ValueError, match="unknown AMPS search"):
        streaming.amps_batches(model, prior, [[x]], np.random.default_rng(0), search="greedy")
