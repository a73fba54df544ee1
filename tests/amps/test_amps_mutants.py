"""AMPS merge/streaming checks aimed at the mutation sweep's survivors (issue 31).

Every expectation is computed independently (numpy closed forms, exact float64 integers,
brute force over the 3! permutations), never with the code under test's helpers.
"""

from __future__ import annotations

import itertools
import time
from typing import NamedTuple

import numpy as np
import pytest

from fedbayes_flwr.algorithms.amps import merge as amps
from fedbayes_flwr.algorithms.amps import streaming
from fedbayes_flwr.inference import expfam


class Post(NamedTuple):
    """A one-block posterior: K diagonal Gaussians on axis 0 (the symmetric block)."""

    mu: expfam.Gaussian


SYM = ("mu",)


def _gauss(h, prec):
    return Post(expfam.Gaussian(np.asarray(h, float), np.asarray(prec, float)))


def _j(prior, posts, perms):
    """J in numpy: A(h, p) = sum h^2 / (2 p) - 0.5 log p of (1 - N) prior + sum_i P_i post_i."""
    n = len(posts)
    h = (1 - n) * prior.mu.h + sum(p.mu.h[perm] for p, perm in zip(posts, perms, strict=True))
    pr = (1 - n) * prior.mu.prec + sum(p.mu.prec[perm] for p, perm in zip(posts, perms, strict=True))
    return float(np.sum(h**2 / (2 * pr) - 0.5 * np.log(pr)))


def _flat():
    """Two clients whose three components are identical: every swap's gain is exactly 0."""
    prior = _gauss(np.zeros((3, 1)), np.ones((3, 1)))
    post = _gauss(np.full((3, 1), 2.0), np.full((3, 1), 3.0))
    return prior, [post, post]


SWAP = "".join(["sw", "ap"])  # not interned: kills `search is "swap"`


def test_swap_search_counts_one_sweep_of_all_pairs():
    # zero gain everywhere: one pass (sweeps == 1) trying N * C(3, 2) = 6 swaps; bipartite would
    # report 2 evaluations, `sweeps += 0` 0 sweeps, `gain >= tol` with tol=0 max_sweeps sweeps
    prior, posts = _flat()
    found = amps.align(prior, posts, SYM, SWAP, tol=0.0, max_sweeps=5)
    assert (found.sweeps, found.evaluations) == (1, 6)


def test_bipartite_search_counts_one_sweep():
    # no gain: the first sweep ends the search (sweeps == 1, one assignment per client); the
    # `sweeps = -1` start gives 0, `value - start == tol*...` never breaks (max_sweeps = 5)
    prior, posts = _flat()
    found = amps.align(prior, posts, SYM, "bipartite", max_sweeps=5)
    assert (found.sweeps, found.evaluations) == (1, 2)


@pytest.mark.parametrize("search", ["bipartite", SWAP])
def test_zero_max_sweeps_runs_no_sweep(search):
    # `while sweeps < 0` never enters: the identity, 0 sweeps, 0 evaluations (`<=` runs one)
    prior, posts = _flat()
    found = amps.align(prior, posts, SYM, search, max_sweeps=0)
    assert (found.sweeps, found.evaluations) == (0, 0)


@pytest.mark.parametrize("seed", range(6))
def test_one_bipartite_sweep_reaches_brute_force_optimum_for_two_clients(seed):
    # N = 2: J depends only on the relative permutation, and client 1's assignment given client
    # 2 at the identity is the exact optimum over its 3! permutations (an LSAP is solved
    # exactly), so one sweep attains max_P J computed here in numpy by enumeration
    rng = np.random.default_rng(seed)
    prior = _gauss(np.zeros((3, 2)), np.ones((3, 2)))
    posts = [_gauss(rng.normal(0, 4, (3, 2)), 1 + rng.gamma(2.0, 2.0, (3, 2))) for _ in range(2)]
    best = max(_j(prior, posts, [np.arange(3), np.array(p)])
               for p in itertools.permutations(range(3)))
    found = amps.align(prior, posts, SYM, "bipartite", max_sweeps=1)
    # J ~ 1e2 here; float64 rounding of a few dozen terms is ~1e-12 relative
    assert found.objective == pytest.approx(best, rel=1e-10)
    assert _j(prior, posts, list(found.perms)) == pytest.approx(best, rel=1e-10)


# --------------------------------------------------------------- contribution checks
def test_contribution_error_tolerance_scales_with_prior():
    # prior precision 10: tolerance rtol * scale = 1e-9 * 10 = 1e-8 > 5e-9 (accepted);
    # rtol ** scale = 1e-90 would reject the -5e-9 rounding
    prior = _gauss(np.zeros((3, 1)), np.full((3, 1), 10.0))
    post = _gauss(np.zeros((3, 1)), np.full((3, 1), 10.0 - 5e-9))
    assert amps.contribution_error(prior, post) is None
    # power: a deficit of 2e-8 > 1e-8 is rejected
    bad = _gauss(np.zeros((3, 1)), np.full((3, 1), 10.0 - 2e-8))
    assert amps.contribution_error(prior, bad) is not None


def test_contribution_size_uses_posterior_minus_prior():
    # prior scale 1, one example: limit 2**52. post prec = 1 + 2**52 exactly (float64 integer),
    # so post - prior = 2**52 is at the limit (accepted); post + prior = 2**52 + 2 is not
    prior = _gauss(np.zeros((3, 1)), np.ones((3, 1)))
    post = _gauss(np.zeros((3, 1)), np.full((3, 1), 1.0 + 2.0**52))
    assert amps.contribution_size_error(prior, post, 1) is None


def test_contribution_size_scale_floor_is_one():
    # prior entries <= 1: scale max(1, 1) = 1, limit 2**52; a contribution of 1.5 * 2**52
    # (exact in float64) exceeds it (a floor of 2 would allow up to 2**53)
    prior = _gauss(np.zeros((3, 1)), np.ones((3, 1)))
    post = _gauss(np.zeros((3, 1)), np.full((3, 1), 1.0 + 1.5 * 2.0**52))
    assert amps.contribution_size_error(prior, post, 1) is not None


@pytest.mark.parametrize("shapes", [((3, 2), (3, 3)), ((3, 3), (3, 2)), ((2, 2), (3, 2)),
                                    ((3, 2), (2, 2))])
def test_matched_error_shape_mismatch_raises(shapes):
    with pytest.raises(ValueError, match="differ in shape"):
        amps.matched_error(np.zeros(shapes[0]), np.zeros(shapes[1]))


# --------------------------------------------------------------- streaming bookkeeping
class _Fit(NamedTuple):
    params: object


class _Model:
    """Returns the prior plus one unit of precision per row; no symmetry (naive merges)."""

    symmetric: tuple = ()

    def fit(self, x, prior, rng, restarts=1, tol=1e-6, max_iter=500):
        return _Fit(_gauss(prior.mu.h, prior.mu.prec + len(x)))


DELAY = 0.01


def _slow_merge(monkeypatch):
    real = streaming.amps.merge

    def slow(*args, **kwargs):
        time.sleep(DELAY)  # sleep lasts at least DELAY: merge times get a known lower bound
        return real(*args, **kwargs)

    monkeypatch.setattr(streaming.amps, "merge", slow)


def test_amps_batches_times_are_bounded_by_the_call(monkeypatch):
    _slow_merge(monkeypatch)
    prior = _gauss(np.zeros((2, 1)), np.ones((2, 1)))
    batches = [[np.zeros(3), np.zeros(2)], [np.zeros(4), np.zeros(1)]]
    t0 = time.perf_counter()
    out = streaming.amps_batches(_Model(), prior, batches, np.random.default_rng(0), search=None)
    wall = time.perf_counter() - t0
    fits = out.fit_seconds[np.isfinite(out.fit_seconds)]
    assert np.all(fits >= 0) and np.all(fits <= wall)
    # one agent merge (>= DELAY) plus the final merge (>= DELAY), both inside the call
    assert 2 * DELAY <= out.merge_seconds <= wall
    assert 0 <= out.local_seconds <= wall
    np.testing.assert_array_equal(out.params.mu.prec, 1 + 10.0)  # (1 - 4) + 4 + 10 rows


def test_sda_bayes_merge_time_is_bounded_by_the_call(monkeypatch):
    _slow_merge(monkeypatch)
    prior = _gauss(np.zeros((2, 1)), np.ones((2, 1)))
    batches = [[np.zeros(3), np.zeros(2)], [np.zeros(4)]]
    t0 = time.perf_counter()
    out = streaming.sda_bayes(_Model(), prior, batches, np.random.default_rng(0))
    wall = time.perf_counter() - t0
    assert 2 * DELAY <= out.merge_seconds <= wall  # two steps, one merge each
    assert 0 <= out.local_seconds <= wall
