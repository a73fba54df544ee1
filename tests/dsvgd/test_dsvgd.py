"""DSVGD's bundle: exactness against centralised SVGD and U-DSVGD, P-DSVGD's one-client case,
client memory, rejected replies, and accuracy on a conjugate model (seed 001)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedbayes_flwr import codec, models
from fedbayes_flwr.algorithms.base import client_seed
from fedbayes_flwr.algorithms.dsvgd import bundle as D
from fedbayes_flwr.algorithms.dsvgd.svgd import svgd
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.tree import payload_nbytes
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process
from fedbayes_flwr.runtime.experiment import build_experiment

SMALL = {"model": "gaussian-mean", "dataset": "synthetic", "synthetic-dim": 2,
         "local-iterations": 40, "distillation-iterations": 40, "batch-size": 0}


def _experiment(**values):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_experiment(parse_run_config({**SMALL, **values}))


def _states(exp, rounds=None):
    return [state for _, state, _ in iterate_in_process(exp, rounds)]


def _particles(exp, rounds=None):
    return [s.particles for s in _states(exp, rounds)]


def test_one_client_one_round_is_centralised_svgd():
    """First round: q^(0) = t_k^(0) = KDE(theta^(0)), so the cavity scores cancel exactly and the
    target is p0 exp(-L); with the paper's settings (``dsvgd-paper``: Euclidean kernel, constant
    rate) the bundle must equal a plain SVGD loop on it to rounding, and with the defaults
    (Mahalanobis metric, scaled step) the svgd baseline's first round."""
    exp = _experiment(algorithm="dsvgd-paper", **{"num-clients": 1, "num-rounds": 1})
    (got,) = _particles(exp)
    setup, data = exp.setup, exp.client_data(0)
    x0 = D.initial_particles(setup)
    prior = setup.prior
    lr, eps = D.step_settings(setup, x0)

    def score(x):  # the exact Gaussian prior score plus the full-batch likelihood score
        lik = setup.model.log_density_and_grad(x, data.x, None, prior=None)[1]
        return prior.eta1 + 2.0 * prior.eta2 * x + lik

    want = svgd(x0, score, setup.config.local_iterations, lr, eps)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # and the svgd baseline's first round is the same loop
    (base,) = _particles(_experiment(algorithm="svgd-paper", **{"num-rounds": 1}))
    np.testing.assert_allclose(base, want, rtol=0, atol=1e-6)
    # the defaults: one client's first round is the svgd baseline's first round
    (got,) = _particles(_experiment(algorithm="dsvgd", **{"num-clients": 1, "num-rounds": 1}))
    (base,) = _particles(_experiment(algorithm="svgd", **{"num-rounds": 1}))
    np.testing.assert_allclose(got, base, rtol=0, atol=1e-9)


def test_first_pass_dsvgd_equals_u_dsvgd_then_they_differ():
    """Over the first pass every factor is still t_k^(0) in both variants (test: to 1e-12);
    on second visits the distilled and the exact factors differ."""
    common = {"num-clients": 3, "num-rounds": 5, "partition": "dirichlet",
              "partition-alpha": 0.5}
    a = _particles(_experiment(algorithm="dsvgd", **common))
    b = _particles(_experiment(algorithm="u-dsvgd", **common))
    for i in range(3):
        np.testing.assert_allclose(a[i], b[i], rtol=0, atol=1e-12)
    assert np.max(np.abs(a[4] - b[4])) > 1e-6


def test_p_dsvgd_with_one_client_per_round_is_dsvgd():
    """P-DSVGD's server takes the single upload itself: clients-per-round 1 = DSVGD exactly, and
    with every client each round the server merge moves the particles."""
    common = {"num-clients": 3, "num-rounds": 3}
    a = _particles(_experiment(algorithm="dsvgd", **common))
    b = _particles(_experiment(algorithm="dsvgd", **common, **{"clients-per-round": 1}))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    # the server merge itself is checked against its closed-form target in
    # tests/dsvgd/test_dsvgd_mutants.py; its accuracy against the exact posterior below


# --- against the exact posterior: W1 of each marginal against N exact draws -------------------

_U = (np.arange(20_000) + 0.5) / 20_000  # quantile grid (midpoints) for W1 to a normal


def _w1_to_standard_normal(z) -> np.ndarray:
    """W1 between each column's empirical law and N(0, 1): ``int_0^1 |F_n^-1(u) - Phi^-1(u)| du``
    on a 20 000-point grid (quadrature error < 1e-3 sd)."""
    from scipy.stats import norm

    z = np.sort(np.atleast_2d(z), axis=0)
    n = z.shape[0]
    return np.mean(np.abs(z[np.minimum((_U * n).astype(int), n - 1)] - norm.ppf(_U)[:, None]), axis=0)


def _w1_bound(n, d, alpha=1e-3, reps=2000) -> float:
    """The ``1 - alpha / d`` quantile of W1(N iid exact draws, exact) per standardised marginal
    (simulated, fixed seed), so N exact draws pass all ``d`` marginals with probability
    ``>= 1 - alpha``: for N = 50 and d = 2, 0.50 posterior sd."""
    draws = np.random.default_rng(12345).standard_normal((n, reps))
    return float(np.quantile(_w1_to_standard_normal(draws), 1 - alpha / d))


def _check_exact(particles, exp, shift=0.0):
    exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train, None)
    mean, cov = G.to_moments(exact)
    sd = np.sqrt(np.diag(cov))
    w1 = _w1_to_standard_normal((particles - mean) / sd + shift)
    bound = _w1_bound(particles.shape[0], particles.shape[1])
    assert np.all(w1 <= bound), (f"W1 / posterior sd {np.round(w1, 3)} above {bound:.3f} (N exact "
                                 f"draws); mean error / sd {np.round((particles.mean(0) - mean) / sd, 3)}, "
                                 f"std ratio {np.round(particles.std(0, ddof=1) / sd, 3)}")


EXACT = {"num-clients": 3, "partition": "iid", "num-particles": 50, "seed": 0}


def test_svgd_baseline_matches_the_exact_posterior():
    """Centralised SVGD, N = 50, 2 x 150 iterations on gaussian-mean (d = 2): every marginal as
    close to the exact posterior as N exact draws (W1 bound above, 0.50 sd; measured mean error
    0.01 sd, std ratio 0.91-0.97). Power: the same particles shifted by 0.6 posterior sd fail."""
    exp = _experiment(algorithm="svgd", **{**EXACT, "num-rounds": 2, "local-iterations": 150})
    particles = _particles(exp)[-1]
    _check_exact(particles, exp)
    with pytest.raises(AssertionError, match="W1"):
        _check_exact(particles, exp, shift=0.6)


def test_dsvgd_matches_the_exact_posterior():
    """DSVGD itself against the exact posterior, the same bar as centralised SVGD above (issue
    26: failed with the paper's settings, W1 1.96 / 1.21 sd; passes with the settings that
    ``auto`` picks from d = 3 on, pinned here since d = 2 gets the paper's)."""
    exp = _experiment(algorithm="dsvgd", **{**EXACT, "num-rounds": 6, "local-iterations": 50,
                                            "distillation-iterations": 50,
                                            "kernel": "mahalanobis", "svgd-bandwidth": "median",
                                            "step": "scaled"})
    _check_exact(_particles(exp)[-1], exp)


def test_p_dsvgd_one_round_matches_the_exact_posterior():
    """Round 1 from prior particles: every client's target is ``p0 l_k`` (the cavity cancels), so
    the merge target ``p0^(1 - S) prod_k p0 l_k`` is the exact posterior (Kassab & Simeone 2022,
    Section 6), up to the KDE and SVGD errors that the bar allows for."""
    exp = _experiment(algorithm="p-dsvgd", **{**EXACT, "num-rounds": 1, "local-iterations": 50})
    assert exp.setup.config.clients_per_round == 3
    _check_exact(_particles(exp)[-1], exp)


def test_memory_constant_for_dsvgd_and_grows_2nd_per_visit_for_u_dsvgd():
    """K = 2, 10 rounds: DSVGD's client factor never changes size; U-DSVGD's grows by exactly
    2 N d 8 bytes per visit (the client's new and received particle sets). What a node stores
    holds the committed factor and the pending one (commit on acknowledgement), so its record
    grows by twice that."""
    from flwr.common import RecordDict

    for algorithm, growth in (("dsvgd", 0), ("u-dsvgd", 1)):
        exp = _experiment(algorithm=algorithm, **{"num-clients": 2, "local-iterations": 5,
                                                  "distillation-iterations": 5})
        setup = exp.setup
        n, d = D.num_particles(setup), setup.prior.dim
        state = exp.bundle.init_client(setup, 0)
        server = exp.bundle.init_server(setup)
        sizes = []
        for number in range(1, 11):
            rnd_requests = D.schedule(setup, number)
            if 0 not in rnd_requests:
                continue
            request = D.Request(D.TRAIN, D.Down(server.particles, number,
                                                number - 2 if number > 1 else -1))
            seed = client_seed(setup.run_seed, "dsvgd", "train", number, 0)
            state, reply, _ = exp.bundle.client_step(seed, state, request, exp.client_data(0),
                                                     setup)
            # what the node stores (and reloads, shape-free) in context.state
            records = RecordDict()
            codec.save_state(records, "dsvgd", state)
            loaded = codec.load_state(records, "dsvgd", exp.bundle.client_state_template(setup))
            np.testing.assert_array_equal(loaded.pending.numerators, state.pending.numerators)
            sizes.append((payload_nbytes(state.pending), codec.received_nbytes(records)))
        assert len(sizes) == 5
        factor, stored = np.diff(np.array(sizes), axis=0).T
        assert np.all(factor == growth * 2 * n * d * 8), (algorithm, sizes)
        assert np.all(stored == 2 * factor), (algorithm, sizes)


def test_bad_replies_are_rejected_and_leave_state_untouched():
    """Wrong shape and NaN particles: rejected with the partition and field named, the global
    particles unchanged, the client's factor not committed (the next request says so)."""
    from fedbayes_flwr.runtime.steps import judge

    exp = _experiment(algorithm="dsvgd", **{"num-clients": 2})
    setup, bundle = exp.setup, exp.bundle
    server = bundle.init_server(setup)
    good = D.Up(server.particles + 0.1, 1)
    bad_shape = D.Up(server.particles[:-1], 1)
    bad_nan = D.Up(np.where(np.arange(server.particles.size).reshape(server.particles.shape)
                            == 0, np.nan, server.particles), 1)
    for reply, field in ((bad_shape, "particles"), (bad_nan, "particles")):
        verdict = judge(bundle, setup, exp.actions, server, 1, "train", reply)
        assert verdict.partition_id == 1 and verdict.field == field, verdict
        new, info = bundle.server_step(server, [(1, verdict)], setup, None)
        np.testing.assert_array_equal(new.particles, server.particles)
        assert new.accepted_round[1] == -1 and info.rejected == (verdict,)
    assert judge(bundle, setup, exp.actions, server, 1, "train", good) is good


@pytest.mark.slow
def test_u_dsvgd_gaussian_mean_ten_non_iid_clients_three_passes():
    """U-DSVGD, N = 50, 10 Dirichlet(0.5) clients, 3 passes, seeds 0-4, against the exact
    posterior. Tolerances from the Monte-Carlo error of N exact draws: the particle mean of N
    exact draws is off by |Z| / sqrt(N) posterior sd (median 0.674 / sqrt(50) = 0.095), the
    sample std ratio has sd 1 / sqrt(2 (N - 1)) = 0.10. Bar: the median over the 10
    seed-coordinates within twice the first and three times the second. (The issue's bar, every
    coordinate within 0.3 sd and 25% for every seed, is met by 2 of 5 seeds, and by 3 of 5 for
    centralised SVGD; DSVGD's distilled factors miss it: benchmarks/dsvgd/dsvgd_gaussian_mean.py and
    the README table.)"""
    n = 50
    errors, ratios = [], []
    for seed in range(5):
        exp = _experiment(algorithm="u-dsvgd", **{
            "num-clients": 10, "num-rounds": 30, "partition": "dirichlet",
            "partition-alpha": 0.5, "local-iterations": 200, "distillation-iterations": 200,
            "batch-size": 100, "num-particles": n, "seed": seed})
        particles = _particles(exp)[-1]
        exact = models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train, None)
        mean, cov = G.to_moments(exact)
        sd = np.sqrt(np.diag(cov))
        errors += list(np.abs(particles.mean(0) - mean) / sd)
        ratios += list(particles.std(0, ddof=1) / sd)
    assert np.median(errors) <= 2 * 0.6745 / np.sqrt(n), errors
    assert abs(np.median(ratios) - 1) <= 3 / np.sqrt(2 * (n - 1)), ratios


def _best_gaussian_kl(rows) -> float:
    """The smallest KL(q || q_opt) any Gaussian q (truncated to [-6, 6]) reaches: a floor for
    PVI and global VI, whose q is Gaussian."""
    from scipy.optimize import minimize
    from scipy.stats import norm

    from fedbayes_flwr.models import mixture

    grid = mixture.mixture_1d_grid()

    def kl(p):
        return mixture.mixture_1d_kl(norm.logpdf(grid, p[0], np.exp(p[1])), rows, grid)

    return min(minimize(kl, [m, np.log(s)], method="Nelder-Mead").fun
               for m in (-3.0, 0.0, 2.5) for s in (1.0, 2.5))


@pytest.mark.slow
def test_mixture_1d_u_dsvgd_near_svgd_and_below_every_gaussian():
    """The paper's toy (N = 200, 10 rounds): U-DSVGD's KL within 0.05 nats of centralised
    SVGD's and below the best KL any Gaussian q reaches (so below PVI and global VI whatever
    their optimiser). Measured: benchmarks/dsvgd/dsvgd_mixture_1d.py."""
    finals = {}
    for algorithm in ("u-dsvgd", "svgd"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exp = build_experiment(parse_run_config({
                "algorithm": algorithm, "model": "mixture-1d", "dataset": "mixture-1d",
                "num-clients": 2, "num-rounds": 10, "prior-scale": float(np.sqrt(12.0))}))
        state = _states(exp)[-1]
        metrics, _ = exp.model.metrics(exp.bundle.posterior(state, exp.setup),
                                       exp.dataset.x_test, None)
        finals[algorithm] = metrics["kl"]
    floor = _best_gaussian_kl(exp.dataset.x_test)
    assert finals["u-dsvgd"] <= finals["svgd"] + 0.05, finals
    assert finals["u-dsvgd"] < floor, (finals, floor)
