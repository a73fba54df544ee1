"""Synchronous PVI without hand-tuned damping: ``pvi.damping = "auto"`` (the server's step rule on
the global free energy), Anderson acceleration, and the divergence guard (issue 13).

Maths checked here: on conjugate models with a full covariance the undamped step is exact, so
``auto`` must take ``s = 1`` exactly and be exact after one round; the step rule never lets the
free energy fall (beyond its relative tolerance); a diverging run (damping 1, breast-cancer,
Dirichlet 0.1) is caught and recorded; Anderson's per-client combination reproduces the global
extrapolation exactly (``q_AA = p x prod_k t_k^AA``), and on a linear fixed-point map it is exact
after ``dim + 1`` iterates (Walker & Ni 2011: Anderson with full memory is GMRES on linear maps).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes_flwr import models
from fedbayes_flwr.algorithms import commit
from fedbayes_flwr.algorithms.pvi import bundle as pvi
from fedbayes_flwr.algorithms.pvi import client as pvi_client
from fedbayes_flwr.algorithms.pvi import messages as pvi_messages
from fedbayes_flwr.algorithms.pvi import server as pvi_server
from fedbayes_flwr.algorithms.pvi import step as S
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.runtime.config import ConfigError, parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process, run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from tests.helpers import logistic_vi

CONJUGATE = [("gaussian-mean", "synthetic"), ("linear-regression", "synthetic"),
             ("linear-regression", "diabetes")]
LOGISTIC = {"model": "logistic-regression", "dataset": "breast-cancer", "num-clients": 10,
            "partition": "dirichlet", "partition-alpha": 0.1, "pvi.covariance": "diag", "seed": 0}


def _exp(**keys):
    return build_experiment(parse_run_config(keys))


def _exact(exp):
    return models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train, exp.dataset.y_train)


def _rel_errors(nat, exact):
    m, c = G.to_moments(nat)
    me, ce = G.to_moments(exact)
    c = np.diag(c) if c.ndim == 1 else c  # a mean-field q against any reference: full matrices
    ce = np.diag(ce) if ce.ndim == 1 else ce
    return (np.linalg.norm(m - me) / np.linalg.norm(me), np.linalg.norm(c - ce) / np.linalg.norm(ce))


def _monotone(values, tolerance=1e-6):
    """The step rule's guarantee: F never falls by more than tol * max(1, |F|) (the default)."""
    return all(b >= a - tolerance * max(1.0, abs(a)) for a, b in zip(values, values[1:], strict=False))


def test_auto_is_the_default_and_parses():
    config = parse_run_config({})
    assert config.section.damping == "auto" and config.section.server_held
    assert parse_run_config({"pvi.damping": "0.25"}).section.damping == 0.25
    assert parse_run_config({"pvi.damping": 0.5}).section.damping == 0.5
    # a number first, then auto again over it (the declared kind decides the coercion)
    base = parse_run_config({"pvi.damping": 0.5})
    assert parse_run_config({"pvi.damping": "auto"}, base=base).section.damping == "auto"


@pytest.mark.parametrize("keys, match", [
    ({"pvi.damping": "fast"}, "pvi.damping: expected 'auto' or a number"),
    ({"pvi.damping": 1.5}, "pvi.damping: must be in"),
    ({"pvi.acceleration": "nesterov"}, "unknown acceleration"),
    ({"pvi.acceleration": "anderson", "pvi.schedule": "sequential"}, "synchronous schedule"),
    ({"pvi.acceleration": "anderson", "pvi.damping": 0.5, "pvi.guard": False}, "step rule"),
    ({"pvi.line-search-steps": 0}, "line-search-steps"),
    ({"pvi.max-backtracks": 0}, "max-backtracks"),
    ({"pvi.guard-tolerance": -1}, "guard-tolerance"),
])
def test_bad_settings_name_the_key(keys, match):
    with pytest.raises(ConfigError, match=match):
        parse_run_config(keys)


@pytest.mark.parametrize("model, dataset", CONJUGATE)
def test_auto_takes_the_unit_step_and_is_exact_after_one_round(model, dataset):
    exp = _exp(model=model, dataset=dataset, **{"num-clients": 10, "partition": "dirichlet",
                                                 "partition-alpha": 0.3, "seed": 3,
                                                 "synthetic-size": 300})
    # s = 1 is the first candidate, exactly (not 1 - eps): conjugate models stay exact
    assert S.step_sizes(exp.setup.config.first_step, 4, 0)[0] == 1.0
    (_, state, log), = iterate_in_process(exp, num_rounds=1)
    assert log.diagnostics["pvi_step"] == 1.0 and "pvi_guard" not in log.diagnostics
    err_mean, err_cov = _rel_errors(state.posterior, _exact(exp))
    assert err_mean <= 1e-5 and err_cov <= 1e-5  # as damping 1 (tests/pvi/test_pvi_exact.py)
    # every client's server-held factor is its exact likelihood factor
    total = G.add(exp.prior, pvi.NaturalGaussian(state.factors.eta1.sum(0),
                                                 state.factors.eta2.sum(0)))
    np.testing.assert_allclose(total.eta2, state.posterior.eta2, rtol=1e-12, atol=1e-12)


def test_mean_field_linear_regression_climbs_to_the_mean_field_optimum():
    """Mean-field linear regression is not exact in one round (the mean-field optimum couples the
    coordinates through the data): plain ``auto`` climbs monotonically but slowly (the fixed
    point iteration contracts like coordinate ascent on correlated features: 0.08 nats short of
    the optimum after 40 rounds here), and Anderson acceleration reaches the global mean-field
    optimum to rounding in under 40 rounds (the problem is linear in natural parameters)."""
    keys = {"model": "linear-regression", "dataset": "diabetes", "num-clients": 5,
            "partition": "dirichlet", "partition-alpha": 0.3, "pvi.covariance": "diag", "seed": 1}
    reference = list(iterate_in_process(_exp(**{**keys, "num-clients": 1}, algorithm="global-vi"),
                                        num_rounds=1))
    ref, ref_value = reference[-1][1].posterior, reference[-1][2].log_marginal_likelihood
    plain = list(iterate_in_process(_exp(**keys), num_rounds=40))
    accelerated = list(iterate_in_process(_exp(**keys, **{"pvi.acceleration": "anderson"}),
                                          num_rounds=40))
    for logs in (plain, accelerated):
        assert _monotone([log.log_marginal_likelihood for _, _, log in logs])
        assert _rel_errors(logs[0][1].posterior, ref)[0] > 1e-2  # not exact after one round
        # the free energy is a lower bound at the optimum's value (rounding: 1e-9 relative)
        assert all(log.log_marginal_likelihood <= ref_value + 1e-9 * abs(ref_value)
                   for _, _, log in logs)
    assert ref_value - plain[-1][2].log_marginal_likelihood > 1e-2  # plain: still climbing
    last = _rel_errors(accelerated[-1][1].posterior, ref)
    assert last[0] < 1e-6 and last[1] < 1e-6


@pytest.mark.slow
def test_auto_and_anderson_on_breast_cancer_dirichlet_01():
    """Acceptance 2 on seed 0: the free energy never falls, nothing diverges, and the rounds to
    the global mean-field optimum (means within 0.1 posterior sd, stds within 10%) are at most
    0.75x (auto) and 0.5x (auto + Anderson) those of fixed damping 0.5."""
    reference = list(iterate_in_process(_exp(**LOGISTIC, algorithm="global-vi"), num_rounds=1))
    m0, v0 = G.to_moments(reference[-1][1].posterior)
    s0 = np.sqrt(v0)

    def rounds(**extra):
        values = []
        for update, state, log in iterate_in_process(_exp(**LOGISTIC, **extra), num_rounds=60):
            values.append(log.log_marginal_likelihood)
            m, v = G.to_moments(state.posterior)
            if np.max(np.abs(m - m0) / s0) < 0.1 and np.max(np.abs(np.sqrt(v) / s0 - 1)) < 0.1:
                return update, values
        return None, values

    fixed, fixed_values = rounds(**{"pvi.damping": 0.5, "pvi.guard": False})
    auto, auto_values = rounds()
    accelerated, acc_values = rounds(**{"pvi.acceleration": "anderson"})
    assert fixed is not None and auto is not None and accelerated is not None
    assert _monotone(auto_values) and _monotone(acc_values)
    assert auto <= 0.75 * fixed
    assert accelerated <= 0.5 * fixed


def test_guard_catches_a_forced_divergence_and_records_it(tmp_path):
    """Damping 1 on breast-cancer / Dirichlet 0.1 diverges without the guard (the free energy
    falls from -77.6 to -194 in round 2); with it the step backs off and the row says so.

    The unguarded free energies are checked first: the client-held free energy is the ELBO of
    that round's q (q = p prod t_k), computed here without the library (numpy
    ``tests.helpers.logistic_vi.elbo``: Gauss-Hermite on each activation minus the closed-form
    KL) with the library's 64-point rule, so the two agree to float round-off: rtol 1e-12
    (sums of ~400 terms of size ~1: ~1e-14; measured 2e-16). Power: the 200-point value differs
    by 1.6e-7 and 3.1e-7 relative, and fails the same check. The divergence the guard must
    catch is then the very property the guarded run keeps: the unguarded sequence breaks
    ``_monotone`` (a fall by more than 1e-6 max(1, |F|), the step rule's tolerance)."""
    keys = {**LOGISTIC, "pvi.damping": 1.0, "num-rounds": 2, "output-dir": str(tmp_path / "g")}
    guarded = run_in_process(parse_run_config(keys), progress=False)
    unguarded = _exp(**{**keys, "pvi.guard": False})
    x, y = unguarded.dataset.x_train, unguarded.dataset.y_train
    free = []
    for _, state, log in iterate_in_process(unguarded):
        elbo = logistic_vi.elbo(state.posterior, unguarded.prior, x, y, order=64)
        np.testing.assert_allclose(log.log_marginal_likelihood, elbo, rtol=1e-12, atol=0)
        finer = logistic_vi.elbo(state.posterior, unguarded.prior, x, y, order=200)
        assert abs(log.log_marginal_likelihood - finer) > 1e-12 * abs(finer)  # power
        free.append(elbo)
    assert not _monotone(free), free  # the divergence is real (measured -77.6 -> -194)
    rows = guarded["history"]
    assert _monotone([h["log_marginal_likelihood"] for h in rows])
    caught = [h for h in rows if "pvi_guard" in h.get("diagnostics", {})]
    assert caught and caught[0]["diagnostics"]["pvi_step"] < 1.0
    assert "would lower the free energy" in caught[0]["diagnostics"]["pvi_guard"]


def test_guard_rolls_a_round_back_when_no_step_is_left():
    """With one candidate step and one search exchange, a round whose step lowers the free
    energy is rolled back: the posterior stays where it was and the row says why."""
    exp = _exp(**LOGISTIC, **{"pvi.damping": 1.0, "pvi.line-search-steps": 1,
                              "pvi.max-backtracks": 1})
    logs = list(iterate_in_process(exp, num_rounds=2))
    (_, first, _), (_, second, log) = logs
    assert "round rolled back" in log.diagnostics["pvi_guard"] and log.diagnostics["pvi_step"] == 0
    np.testing.assert_array_equal(second.posterior.eta1, first.posterior.eta1)
    np.testing.assert_array_equal(second.factors.eta2, first.factors.eta2)
    assert log.clients == ()


def test_asynchronous_auto_converges_to_the_exact_posterior_of_a_conjugate_model():
    """Asynchronous ``auto`` (server-held factors, step ``1 / sqrt(1 + staleness)``): on a
    conjugate model every undamped change is ``exact_k - t_k``, so each visit moves a factor a
    fraction ``s`` of the way and the posterior converges to the exact one."""
    exp = _exp(model="linear-regression", dataset="synthetic", **{
        "num-clients": 4, "pvi.schedule": "asynchronous", "seed": 2})
    assert exp.setup.config.server_held
    # 4 equal clients: staleness 3 after the first pass, s = 1/2, so each visit halves a factor's
    # error; 1e-8 needs ~27 visits per client (~110 updates); 150 leaves margin
    logs = list(iterate_in_process(exp, num_rounds=150))
    exact = _exact(exp)
    errors = [max(_rel_errors(state.posterior, exact)) for _, state, _ in logs]
    steps = [log.diagnostics["pvi_step"] for _, _, log in logs]
    assert steps[0] == 1.0 and min(steps) < 1.0  # a fresh reply takes the full step
    assert errors[-1] <= 1e-8 and errors[len(errors) // 2] > errors[-1]


def test_server_held_clients_keep_nothing():
    """A client's reply depends only on the request (the server holds t_k): a fresh client
    state gives the same reply as a used one, so a restarted device cannot double-count."""
    exp = _exp(model="linear-regression", dataset="synthetic", **{"num-clients": 3})
    state = exp.bundle.init_server(exp.setup)
    request = exp.bundle.requests(state, exp.setup, _round(1))[0]
    assert request.action == pvi.STEP
    assert exp.bundle.init_client(exp.setup, 0).nothing.size == 0  # nothing to keep or restore
    used = commit.propose(pvi_client.init_client(exp.setup.prior),  # a stale client-held state
                              G.make(np.ones(exp.setup.prior.dim), exp.setup.prior.eta2), 7)
    data = exp.client_data(0)
    fresh_reply = exp.bundle.client_step(np.zeros(2, np.int32), exp.bundle.init_client(exp.setup, 0),
                                         request, data, exp.setup)[1]
    used_reply = exp.bundle.client_step(np.zeros(2, np.int32), used, request, data, exp.setup)[1]
    np.testing.assert_array_equal(fresh_reply.delta.eta1, used_reply.delta.eta1)


def _round(number):
    from fedbayes_flwr.algorithms.base import Round

    return Round(number, 0, np.zeros(2, np.int32), frozenset(), True)


def test_a_rejected_reply_leaves_the_server_state_alone():
    """A NaN delta is rejected; that client's server-held factor stays where it was and the
    others' move (the transport's rejection, then the search's step)."""
    exp = _exp(model="linear-regression", dataset="synthetic",
               **{"num-clients": 4, "inject-fault": "nan@1:2"})
    (_, state, log), = iterate_in_process(exp, num_rounds=1)
    assert [r.partition_id for r in log.rejected] == [2] and 2 not in log.clients
    np.testing.assert_array_equal(state.factors.eta1[2], 0.0)
    assert np.all(np.abs(state.factors.eta1[[0, 1, 3]]).sum(axis=1) > 0)


def test_anderson_per_client_combination_matches_the_global_one():
    rng = np.random.default_rng(0)
    m, d, memory = 3, 4, 3
    history = S.init_history(pvi.NaturalGaussian(np.zeros((m, d)), np.zeros((m, d))), memory)
    for _ in range(4):
        factors = pvi.NaturalGaussian(rng.normal(size=(m, d)), rng.normal(size=(m, d)))
        deltas = pvi.NaturalGaussian(rng.normal(size=(m, d)), rng.normal(size=(m, d)))
        history = S.push(history, factors, deltas)
    out = S.anderson(history)
    # global type-II Anderson on the summed iterates / residuals
    x = S.flat(history.factors, 2).sum(1)
    f = S.flat(history.deltas, 2).sum(1)
    d_x, d_f = np.diff(x, axis=0).T, np.diff(f, axis=0).T
    gamma = np.linalg.lstsq(d_f, f[-1], rcond=None)[0]
    expected = x[-1] + f[-1] - (d_x + d_f) @ gamma
    np.testing.assert_allclose(S.flat(out, 1).sum(0), expected, rtol=1e-6, atol=1e-8)
    assert S.anderson(S.init_history(out, 2)) is None  # no difference yet: no extrapolation


def test_anderson_is_exact_on_a_linear_fixed_point_map():
    """g(x) = A x + b with ||A|| < 1: Anderson with memory >= dim reaches the fixed point after
    dim + 1 residuals (GMRES equivalence), up to rounding."""
    rng = np.random.default_rng(1)
    dim = 4
    a = rng.normal(size=(dim, dim))
    a *= 0.9 / np.linalg.norm(a, 2)
    b = rng.normal(size=dim)
    fixed = np.linalg.solve(np.eye(dim) - a, b)
    history = S.init_history(pvi.NaturalGaussian(np.zeros((1, dim)), np.zeros((1, 0))), dim)
    x = np.zeros(dim)
    for _ in range(dim + 1):
        f = a @ x + b - x
        history = S.push(history, pvi.NaturalGaussian(x[None], np.zeros((1, 0))),
                         pvi.NaturalGaussian(f[None], np.zeros((1, 0))))
        out = S.anderson(history, ridge=0.0)
        x = x + f if out is None else out.eta1[0]
    np.testing.assert_allclose(x, fixed, rtol=1e-8, atol=1e-8)


def test_step_rules_pick_among_the_acceptable_candidates():
    values = np.array([-np.inf, 10.0, 12.0, 11.0])  # steps 1, 1/2, 1/4, 1/8; step 1 improper
    assert S.choose(9.0, values, 1e-6) == 1  # largest acceptable: backtracking from the first
    assert S.choose(9.0, values, 1e-6, "best") == 2  # highest free energy
    assert S.choose(13.0, values, 1e-6) is None  # every candidate falls: roll back
    # the tolerance is relative: a fall of 1e-7 * |F| is rounding, 1e-5 * |F| is not
    assert S.choose(-1000.0, np.array([-1000.0001]), 1e-6) == 0
    assert S.choose(-1000.0, np.array([-1000.01]), 1e-6) is None


def test_safe_rule_keeps_a_margin_and_a_sufficient_increase():
    """``safe``: the best acceptable step that passes Armijo's test (with the chord slope of the
    smallest step) and whose double is acceptable. Profiles F(s) - F(0) measured on the digits
    BNN (steps 1, 1/2, 1/4, 1/8): a cliff after 1/2, a flat top, and a linear rise."""
    steps = np.array([1.0, 0.5, 0.25, 0.125])
    cliff = np.array([-226.0, 823.0, 511.0, 252.0])  # best takes 1/2, at the cliff's edge
    assert S.choose(0.0, cliff, 1e-6, "best") == 1
    assert S.choose(0.0, cliff, 1e-6, "safe", steps) == 2  # 1/4: its double is acceptable
    # flat top: 1 and 1/2 give less than half the slope of 1/8 (831 / (1/8) = 6648 per unit)
    flat = np.array([1768.0, 1641.0, 1256.0, 831.0])
    assert S.choose(0.0, flat, 1e-6, "safe", steps) == 2
    assert S.choose(0.0, flat, 1e-6, "safe", steps, unit_if_best=True) == 0  # exact F: take 1
    linear = np.array([2675.0, 1453.0, 753.0, 386.0])
    assert S.choose(0.0, linear, 1e-6, "safe", steps) == 0
    # a later exchange's first candidate has no acceptable double: it cannot qualify
    assert S.choose(0.0, np.array([5.0, 1.0]), 1e-6, "safe", np.array([0.0625, 0.03125]),
                    first_has_margin=False) == 1
    assert S.choose(0.0, np.array([-5.0, -1.0]), 1e-6, "safe", np.array([0.5, 0.25])) is None


@pytest.mark.parametrize("model, dataset", CONJUGATE[:2])
def test_safe_rule_keeps_conjugate_models_exact_after_one_round(model, dataset):
    exp = _exp(model=model, dataset=dataset, **{"num-clients": 10, "partition": "dirichlet",
                                                 "partition-alpha": 0.3, "seed": 3,
                                                 "synthetic-size": 300, "pvi.step-rule": "safe"})
    (_, state, log), = iterate_in_process(exp, num_rounds=1)
    assert log.diagnostics["pvi_step"] == 1.0
    err_mean, err_cov = _rel_errors(state.posterior, _exact(exp))
    assert err_mean <= 1e-5 and err_cov <= 1e-5  # as damping 1 (tests/pvi/test_pvi_exact.py)


def test_step_memory_starts_each_search_at_most_twice_the_last_step():
    """``step-memory``: round 1 tries the unit step exactly (conjugate models stay exact); later
    rounds start at ``min(first step, 2 * last step)``; without it every round starts at 1."""
    exp = _exp(**LOGISTIC, **{"pvi.step-memory": True})
    config = exp.setup.config
    state = exp.bundle.init_server(exp.setup)
    assert pvi_server.round_first_step(state, config) == 1.0
    assert pvi_server.round_first_step(state._replace(last_step=0.125), config) == 0.25
    assert pvi_server.round_first_step(state._replace(last_step=0.75), config) == 1.0
    plain = _exp(**LOGISTIC, **{"pvi.step-memory": False}).setup.config
    assert pvi_server.round_first_step(state._replace(last_step=0.125), plain) == 1.0
    steps = []
    for _, st, log in iterate_in_process(exp, num_rounds=3):
        steps.append(log.diagnostics["pvi_step"])
        assert st.last_step == steps[-1]
    for before, after in zip(steps, steps[1:], strict=False):
        assert after <= 2 * before  # the trust region grows by at most a factor 2


def _search_with(state, config, num_clients, free_energies, exact=False):
    """Run ``search_step`` on ``state`` with replies whose expected log-likelihoods give the
    candidates exactly the free energies ``free_energies`` (one client carries them all)."""
    cands = pvi_server.candidates(state, config)
    kls = np.array([S.kl(G.make(cands.posteriors.eta1[j], cands.posteriors.eta2[j]), state.prior)
                    for j in range(len(cands.steps))])
    ell = np.asarray(free_energies, dtype=np.float64) + kls
    replies = [(k, pvi_messages.CandidateReply(ell if k == 0 else np.zeros_like(ell)))
               for k in range(num_clients)]
    return pvi_server.search_step(state, replies, config, num_clients, exact_free_energy=exact)


def test_nonmonotone_fallback_takes_the_last_step_above_the_window_minimum():
    """``nonmonotone = W``: when no first-exchange candidate keeps the free energy, the largest
    candidate at most the last step whose free energy is at least the lowest of the last ``W``
    rounds' is taken (Grippo et al. 1986); otherwise the monotone search goes on unchanged."""
    exp = _exp(**LOGISTIC, **{"pvi.step-memory": True, "pvi.nonmonotone": 3,
                              "pvi.step-rule": "largest"})
    config, m = exp.setup.config, exp.num_clients
    rows = list(iterate_in_process(exp, num_rounds=4))
    state = rows[-1][1]
    # logistic regression never needs it: the window only records the free energies
    assert state.recent == tuple(r[2].metrics["log_marginal_likelihood"] for r in rows[-3:])
    deltas = G.scale(state.factors, 0.1)  # any deltas: the free energies are set by hand
    state = state._replace(deltas=deltas, received=np.ones(m, bool), phase=pvi_messages.PHASE_SEARCH,
                           last_step=0.25, recent=(-30.0, -20.0, -10.0))
    steps = pvi_server.candidates(state, config).steps  # 0, then 0.5, 0.25, 0.125, 0.0625
    np.testing.assert_array_equal(steps[1:], [0.5, 0.25, 0.125, 0.0625])
    # all fall below F(0) = -10; 0.5 is above the floor -30 but larger than the last step
    new, info = _search_with(state, config, m, [-10.0, -25.0, -29.0, -12.0, -11.0])
    assert info.diagnostics["pvi_step"] == 0.25 and "non-monotone" in info.diagnostics["pvi_guard"]
    assert new.free_energy == -29.0 and new.recent == (-20.0, -10.0, -29.0)
    assert new.last_step == 0.25
    # nothing at or below the last step clears the floor: the monotone backtracking goes on
    new, info = _search_with(state, config, m, [-10.0, -25.0, -31.0, -32.0, -40.0])
    assert new.search == 1 and "pvi_step" not in info.diagnostics
    # an acceptable candidate: the ordinary rule, no fallback
    new, info = _search_with(state, config, m, [-10.0, -25.0, -9.0, -8.0, -11.0])
    assert info.diagnostics["pvi_step"] == 0.25 and new.free_energy == -9.0
    # off (nonmonotone = 0): a failed first exchange backtracks
    plain = _exp(**LOGISTIC, **{"pvi.step-memory": True, "pvi.nonmonotone": 0,
                                "pvi.step-rule": "largest"}).setup.config
    new, _ = _search_with(state, plain, m, [-10.0, -25.0, -29.0, -12.0, -11.0])
    assert new.search == 1
    # a numeric damping with the guard: the guard stays strict (no fallback, plain backtracking)
    guard = _exp(**LOGISTIC, **{"pvi.damping": 0.5, "pvi.guard": True,
                                "pvi.nonmonotone": 3}).setup.config
    assert guard.step_rule == "auto" and pvi_server.nonmonotone_index(
        state, guard, np.array([-25.0, -29.0, -12.0, -11.0]), steps[1:]) is None
    with pytest.raises(ConfigError, match="pvi.nonmonotone"):
        parse_run_config({**LOGISTIC, "pvi.nonmonotone": -1})


def test_step_rule_auto_is_largest_for_exact_models_and_safe_for_monte_carlo_ones():
    """``step-rule = auto`` (the default) takes ``largest`` when the free energy is exact and
    ``safe`` when it is a Monte-Carlo estimate: on the same candidate free energies (the
    ``choose`` docstring's cliff profile) they pick 1/2 and 1/4."""
    exp = _exp(**LOGISTIC)
    config, m = exp.setup.config, exp.num_clients
    assert config.step_rule == "auto" and config.step_memory and config.nonmonotone == 5
    state = list(iterate_in_process(exp, num_rounds=1))[-1][1]
    state = state._replace(deltas=G.scale(state.factors, 0.1), received=np.ones(m, bool),
                           phase=pvi_messages.PHASE_SEARCH, last_step=1.0)
    cliff = [0.0, -226.0, 823.0, 511.0, 252.0]  # F(0), then s = 1, 1/2, 1/4, 1/8
    for exact, want in ((True, 0.5), (False, 0.25)):
        _, info = _search_with(state, config, m, cliff, exact=exact)
        assert info.diagnostics["pvi_step"] == want


def test_auto_or_number_coerces_what_toml_and_the_cli_give():
    """The shared coercion of "auto or a number" keys (``pvi.damping``, ``dhmc.mixing-rounds``):
    numbers as text become numbers of the key's kind; anything else is left for ``validate``."""
    from fedbayes_flwr.algorithms.base import auto_or_number

    assert auto_or_number("auto", float) == "auto"
    assert auto_or_number("0.25", float) == 0.25 and auto_or_number(1, float) == 1.0
    assert isinstance(auto_or_number(1, float), float)
    assert auto_or_number("10", int) == 10 and isinstance(auto_or_number(10.0, int), int)
    assert auto_or_number("10.5", int) == 10.5  # not an int: validate() names it
    assert auto_or_number("soon", float) == "soon" and auto_or_number(True, int) is True
    with pytest.raises(ConfigError, match="dhmc.mixing-rounds"):
        parse_run_config({"algorithm": "dhmc", "dhmc.mixing-rounds": "10.5"})
    assert parse_run_config({"algorithm": "dhmc", "dhmc.mixing-rounds": "7"}).section.mixing_rounds == 7


# ---- proximal local solves (pvi.proximal) ----------------------------------------------------


def test_tempered_model_scales_every_likelihood_and_nothing_else():
    import tensorflow as tf

    from fedbayes_flwr.algorithms.pvi.tempered import Tempered, tempered

    exp = _exp(model="linear-regression", dataset="synthetic", **{"num-clients": 2})
    model, x, y = exp.model, exp.dataset.x_train, exp.dataset.y_train
    hot = tempered(model, 0.25)
    assert tempered(model, 0.25) is hot and tempered(model, 1.0) is model  # one object per power
    theta = tf.constant(np.random.default_rng(0).normal(size=(3, x.shape[1])))
    xt, yt = tf.constant(x), tf.constant(y)
    np.testing.assert_allclose(hot.log_likelihood_tf(theta, xt, yt).numpy(),
                               0.25 * model.log_likelihood_tf(theta, xt, yt).numpy(), rtol=1e-14)
    np.testing.assert_allclose(hot.log_likelihood_rows_tf(theta, xt, yt).numpy(),
                               0.25 * model.log_likelihood_rows_tf(theta, xt, yt).numpy(),
                               rtol=1e-14)
    m1, m2 = tf.constant(np.ones(x.shape[1])), tf.constant(2.0 * np.eye(x.shape[1]))
    np.testing.assert_allclose(hot.expected_log_likelihood_tf(m1, m2, xt, yt).numpy(),
                               0.25 * model.expected_log_likelihood_tf(m1, m2, xt, yt).numpy(),
                               rtol=1e-14)
    factor, cold = hot.likelihood_factor(x, y), model.likelihood_factor(x, y)
    np.testing.assert_allclose(factor.eta2, 0.25 * cold.eta2, rtol=1e-14)
    assert hot.param_dim(x.shape[1]) == model.param_dim(x.shape[1])  # the rest is the model's
    bnn = _exp(model="bnn-classifier", dataset="digits", **{"num-clients": 2}).model
    assert not hasattr(tempered(bnn, 0.5), "expected_log_likelihood_tf")  # absent stays absent
    with pytest.raises(ValueError, match="power must be > 0"):
        Tempered(model, 0.0)


def test_proximal_change_is_the_plain_change_scaled_on_conjugate_models():
    """Full-covariance conjugate model: the proximal local optimum is ``a q_k + (1 - a) q`` in
    natural parameters (``a = 1 / (1 + beta)``), so the change is exactly ``a`` times the plain
    one."""
    exp = _exp(model="linear-regression", dataset="synthetic",
               **{"num-clients": 4, "partition": "dirichlet", "partition-alpha": 0.3, "seed": 2,
                  "pvi.damping": 0.5})  # a numeric damping: q is not yet the posterior
    (_, state, _), = iterate_in_process(exp, num_rounds=1)
    config = exp.setup.config
    for pid in range(exp.num_clients):
        d = exp.client_data(pid)
        plain = pvi_client.undamped_change(np.array([1, 2]), pvi_messages.StepMessage(
            state.posterior, pvi_server.factor_of(state, pid), 2), exp.model, d.x, d.y, config).delta
        assert np.abs(plain.eta1).max() > 1e-3  # not yet at the fixed point
        for beta in (0.5, 1.0, 7.0):
            change = pvi_client.undamped_change(np.array([1, 2]), pvi_messages.StepMessage(
                state.posterior, pvi_server.factor_of(state, pid), 2, beta), exp.model, d.x, d.y,
                config).delta
            np.testing.assert_allclose(change.eta1, plain.eta1 / (1 + beta), rtol=1e-9,
                                       atol=1e-12)
            np.testing.assert_allclose(change.eta2, plain.eta2 / (1 + beta), rtol=1e-9,
                                       atol=1e-12)


def test_proximal_change_tends_to_the_local_natural_gradient():
    """Logistic regression (not conjugate; the deterministic local solver): ``(1 + beta)`` times
    the proximal change tends to the local natural gradient ``q_cav + dE_q[log p(y_k)]/dmu - q``
    at rate ``1 / beta`` (the proximal solution's expansion), so the clients' changes add up to
    a multiple of the global natural gradient."""
    from fedbayes_flwr.inference.vi import expected_ll_grad

    exp = _exp(**LOGISTIC)
    (_, state, _), = iterate_in_process(exp, num_rounds=1)
    config, q = exp.setup.config, state.posterior
    for pid in (0, 3):
        d = exp.client_data(pid)
        factor = pvi_server.factor_of(state, pid)
        g1, g2 = expected_ll_grad(np.array([0, 0]), exp.model, d.x, d.y, q)
        cavity = G.sub(q, factor)
        natgrad = np.concatenate([cavity.eta1 + g1 - q.eta1, cavity.eta2 + g2 - q.eta2])
        errors = []
        for beta in (100.0, 1000.0):
            change = pvi_client.undamped_change(np.array([0, 0]),
                                                pvi_messages.StepMessage(q, factor, 2, beta),
                                                exp.model, d.x, d.y, config).delta
            scaled = (1 + beta) * np.concatenate([change.eta1, change.eta2])
            errors.append(np.linalg.norm(scaled - natgrad) / np.linalg.norm(natgrad))
        # O(1/beta): the error falls about tenfold from beta = 100 to 1000 (measured 2.6e-3 ->
        # 2.7e-4 and 6.3e-4 -> 8.8e-5; a factor 5 allows for the solver's tolerance)
        assert errors[1] < 1e-3 and errors[1] < errors[0] / 5, errors


def test_fixed_proximal_weight_travels_to_the_clients_and_halves_each_conjugate_step():
    """``proximal = 1`` on a full-covariance conjugate model: every round's change is half the
    exact one and ``s = 1`` keeps the free energy, so after ``r`` rounds the natural parameters
    are ``exact + (prior - exact) / 2^r`` (the weight reached the clients' local solves)."""
    exp = _exp(model="gaussian-mean", dataset="synthetic",
               **{"num-clients": 5, "seed": 1, "pvi.proximal": 1.0})
    exact = _exact(exp)
    logs = list(iterate_in_process(exp, num_rounds=3))
    for r, (_, state, log) in enumerate(logs, start=1):
        assert log.diagnostics["pvi_step"] == 1.0 and log.diagnostics["pvi_proximal"] == 1.0
        for got, want, start in ((state.posterior.eta1, exact.eta1, exp.prior.eta1),
                                 (state.posterior.eta2, exact.eta2, exp.prior.eta2)):
            np.testing.assert_allclose(got, want + (start - want) / 2**r, rtol=1e-9)


def test_adaptive_proximal_weight_grows_on_a_stalled_round_only():
    """``proximal = auto`` (with ``damping = auto``): 1 from round 1 for Monte-Carlo models, 0
    for exact ones; after a round whose first search exchange finds no step keeping the free
    energy ``max(1, 2 beta)`` up to ``PROXIMAL_MAX``; a round whose step keeps the free energy
    leaves it alone; with a numeric damping it stays 0."""
    exp = _exp(**LOGISTIC, **{"pvi.nonmonotone": 3, "pvi.step-rule": "largest"})
    config, m = exp.setup.config, exp.num_clients
    assert config.proximal == "auto" and config.adaptive_proximal
    state = list(iterate_in_process(exp, num_rounds=2))[-1][1]
    assert state.proximal == 0.0  # logistic regression never stalls here
    state = state._replace(deltas=G.scale(state.factors, 0.1), received=np.ones(m, bool),
                           phase=pvi_messages.PHASE_SEARCH, last_step=0.25, recent=(-30.0, -10.0))
    falls, keeps = [-10.0, -25.0, -29.0, -12.0, -11.0], [-10.0, -9.0, -9.5, -9.8, -9.9]
    new, info = _search_with(state, config, m, falls)
    assert new.proximal == 1.0 and info.diagnostics["pvi_proximal_next"] == 1.0
    assert "pvi_proximal" not in info.diagnostics  # this round's deltas were plain
    assert "non-monotone" in info.diagnostics["pvi_guard"]  # the round itself is unchanged
    for before, after in ((1.0, 2.0), (4.0, 8.0), (pvi_server.PROXIMAL_MAX, pvi_server.PROXIMAL_MAX)):
        new, info = _search_with(state._replace(proximal=before), config, m, falls)
        assert new.proximal == after and info.diagnostics["pvi_proximal"] == before
    new, _ = _search_with(state._replace(proximal=2.0), config, m, keeps)
    assert new.proximal == 2.0
    # round 1: 1 for a model whose local solves are Monte Carlo (a BNN), 0 for exact ones
    bnn = {"model": "bnn-classifier", "dataset": "digits", "num-clients": 2}
    for keys, beta in (({}, 1.0), ({"pvi.damping": 0.5}, 0.0), ({"pvi.proximal": 0.0}, 0.0),
                       ({"pvi.proximal": 2.5}, 2.5)):
        b = _exp(**bnn, **keys)
        assert b.bundle.init_server(b.setup).proximal == beta, keys
    assert exp.bundle.init_server(exp.setup).proximal == 0.0
    for keys in ({"pvi.damping": 0.5}, {"pvi.proximal": 0.0}, {"pvi.proximal": 3.0}):
        fixed = _exp(**LOGISTIC, **keys).setup.config
        assert not fixed.adaptive_proximal
        start = fixed.first_proximal()
        new, _ = _search_with(state._replace(proximal=start), fixed, m, falls)
        assert new.proximal == start


@pytest.mark.parametrize("keys, match", [
    ({"pvi.proximal": -1}, "pvi.proximal: expected 'auto' or a number >= 0"),
    ({"pvi.proximal": "lots"}, "pvi.proximal: expected 'auto'"),
    ({"pvi.proximal": 1, "pvi.schedule": "sequential"}, "pvi.proximal: a proximal weight needs"),
    ({"pvi.proximal": 1, "pvi.damping": 0.5, "pvi.guard": False}, "pvi.proximal: a proximal"),
])
def test_bad_proximal_settings_name_the_key(keys, match):
    with pytest.raises(ConfigError, match=match):
        parse_run_config(keys)
    assert parse_run_config({"pvi.proximal": "2"}).section.proximal == 2.0
    assert parse_run_config({}).section.proximal == "auto"


def test_a_strategy_without_a_model_searches_like_an_exact_model():
    """``PVIStrategy(prior, num_clients)`` reused in another Flower app has no model: the server
    must still start and search (the settings of models with exact expectations: ``largest``
    rule, ``beta = 0``), not fail on the missing model."""
    exp = _exp(**LOGISTIC)
    bare = exp.setup._replace(model=None)
    assert pvi._init_server(bare).proximal == 0.0
    state = list(iterate_in_process(exp, num_rounds=1))[-1][1]
    m = exp.num_clients
    state = state._replace(deltas=G.scale(state.factors, 0.1), received=np.ones(m, bool),
                           phase=pvi_messages.PHASE_SEARCH, last_step=1.0)
    cands = pvi_server.candidates(state, bare.config)
    kls = np.array([S.kl(G.make(cands.posteriors.eta1[j], cands.posteriors.eta2[j]), state.prior)
                    for j in range(len(cands.steps))])
    cliff = np.array([0.0, -226.0, 823.0, 511.0, 252.0]) + kls  # the exact-model choice: 1/2
    replies = [(k, pvi_messages.CandidateReply(cliff if k == 0 else np.zeros_like(cliff)))
               for k in range(m)]
    _, info = pvi._server_step(state, replies, bare, None)
    assert info.diagnostics["pvi_step"] == 0.5
