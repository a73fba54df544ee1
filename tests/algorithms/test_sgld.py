"""SGLD and DSGLD (the DSVGD paper's Monte Carlo baselines, seed 001): the chains' law against the
exact unadjusted-Langevin recursion and the exact posterior, exactness against a hand-written
loop, DSGLD's one-chain schedule and its K n_k / B rescaling, rejected replies, stateless
clients, config errors, and both names end to end."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedbayes_flwr import codec, models
from fedbayes_flwr.algorithms import sgld as S
from fedbayes_flwr.algorithms.base import Round, client_seed, round_seed
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process, run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from fedbayes_flwr.runtime.steps import judge
from fedbayes_flwr.seeds import numpy_rng

SMALL = {"model": "gaussian-mean", "dataset": "synthetic", "synthetic-dim": 2,
         "steps-per-round": 20, "batch-size": 0, "seed": 5}


def _experiment(**values):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_experiment(parse_run_config({**SMALL, **values}))


def _states(exp, rounds=None):
    return [(state, log) for _, state, log in iterate_in_process(exp, rounds)]


def _exact(exp):
    """Mean and per-coordinate variance and precision of the exact (diagonal) posterior."""
    mean, cov = G.to_moments(models.exact_posterior(exp.model, exp.prior, exp.dataset.x_train,
                                                    None))
    var = np.diag(cov) if np.ndim(cov) == 2 else np.asarray(cov)
    if np.ndim(cov) == 2:
        assert np.allclose(cov, np.diag(var))  # gaussian-mean's posterior is isotropic
    return mean, var


def test_constant_step_chains_follow_the_langevin_recursion_and_the_posterior():
    """Full batch, constant step eps (step-decay 0) on a Gaussian posterior N(m, v): the update is
    the linear recursion x' = m + A (x - m) + sqrt(eps) z, A = 1 - eps / (2 v), so from the prior
    N(0, v0) after T steps every chain is exactly N(m (1 - A^T), A^2T v0 + eps (1 - A^2T) /
    (1 - A^2)), whose limit N(m, v / (1 - eps / (4 v))) is ULA's O(eps) bias. With C = 1000
    chains the sample mean is within 4 sd / sqrt(C) of that mean, the sample variance within
    4 sqrt(2 / (C - 1)) of that variance (relative). A small step (eps / v = 0.05) then agrees
    with the exact posterior within the same Monte Carlo bounds plus ULA's 1.3 % variance bias;
    a large one (eps / v = 1) must show the predicted 4/3 inflation (power)."""
    chains, rounds, steps = 1000, 3, 200
    probe = _experiment(algorithm="sgld", **{"num-chains": chains})
    m, v = _exact(probe)
    prior_cov = G.to_moments(probe.prior)[1]
    v0 = np.diag(prior_cov) if np.ndim(prior_cov) == 2 else prior_cov
    vmin = float(np.min(v))
    rel_se = 4 * np.sqrt(2 / (chains - 1))
    for ratio in (0.05, 1.0):
        eps = ratio * vmin
        exp = _experiment(algorithm="sgld", **{"num-chains": chains, "num-rounds": rounds,
                                               "steps-per-round": steps, "step-decay": 0.0,
                                               "step-scale": eps})
        x = _states(exp)[-1][0].chains
        a, t = 1 - eps / (2 * v), rounds * steps
        mean_t = m * (1 - a**t)
        var_t = a ** (2 * t) * v0 + eps * (1 - a ** (2 * t)) / (1 - a**2)
        var_inf = v / (1 - eps / (4 * v))
        np.testing.assert_allclose(var_inf, eps / (1 - a**2), rtol=1e-12)  # the algebra
        se = np.sqrt(var_t / chains)
        assert np.all(np.abs(x.mean(0) - mean_t) < 4 * se), (ratio, x.mean(0), mean_t, se)
        assert np.all(np.abs(x.var(0, ddof=1) / var_t - 1) < rel_se), (ratio, x.var(0), var_t)
        if ratio < 0.1:  # against the exact posterior: Monte Carlo error + ULA bias + transient
            bias = var_inf / v - 1
            assert np.all(bias < 0.02) and np.max(np.abs(a**t)) < 1e-6
            assert np.all(np.abs(x.mean(0) - m) < 4 * se + np.abs(m) * np.abs(a**t))
            assert np.all(np.abs(x.var(0, ddof=1) / v - 1) < rel_se + bias)
        else:  # power: the 4/3 inflation is resolved, so the variance is not the posterior's
            np.testing.assert_allclose(var_inf / v, 4 / 3, rtol=1e-2)
            assert np.all(x.var(0, ddof=1) / v - 1 > rel_se)


def test_two_rounds_equal_a_hand_written_sgld_loop(monkeypatch):
    """Mini-batches, the decaying step with each chain's counter carried over rounds, the prior
    draws: the bundle equals Welling & Teh's update written out with gaussian-mean's analytic
    gradients (prior N(0, I), noise 1) on the seeds the engine handed the client (recorded as
    it hands them out, so the expectation does not recompute them with the library's seed
    functions; that they differ across partitions and rounds is tests/algorithms/test_seeds.py)."""
    from fedbayes_flwr.runtime import steps as engine_steps

    handed = {}
    original = engine_steps.client_seed

    def recording(run_seed, bundle, action, number, partition_id, attempt=0):
        handed[number] = original(run_seed, bundle, action, number, partition_id, attempt)
        return handed[number]

    exp = _experiment(algorithm="sgld", **{"num-chains": 7, "num-rounds": 2, "batch-size": 30,
                                           "step-scale": 0.003, "step-decay": 0.55})
    x = exp.bundle.init_server(exp.setup).chains  # the starting draws (their law: test above)
    monkeypatch.setattr(engine_steps, "client_seed", recording)
    got = _states(exp)
    cfg, X = exp.setup.config, exp.dataset.x_train
    n, (a, b, g), steps = X.shape[0], (cfg.step_scale, cfg.step_offset, cfg.step_decay), \
        cfg.steps_per_round
    assert sorted(handed) == [1, 2]
    for number in (1, 2):
        rng = numpy_rng(handed[number])
        for j in range(steps):
            eps = a * (b + (number - 1) * steps + j) ** -g
            rows = X[rng.choice(n, size=30, replace=False)]
            lik = (n / 30) * (rows.sum(0)[None, :] - 30 * x)  # sum_i (x_i - theta) / 1^2
            x = x + 0.5 * eps * (-x + lik) + np.sqrt(eps) * rng.standard_normal(x.shape)
        state, log = got[number - 1]
        np.testing.assert_allclose(state.chains, x, rtol=0, atol=1e-10)
        np.testing.assert_array_equal(state.steps, np.full(7, number * steps))
        assert log.clients == (0,) and state.server_round == number
        assert log.diagnostics["step_size"] == pytest.approx(a * (b + number * steps - 1) ** -g)


def test_dsgld_moves_one_chain_per_round_at_the_scheduled_client():
    """Round r moves chain (r - 1) mod C only, at the client drawn from the server seed, and
    advances its counter alone; one step of it is the update with the likelihood gradient
    rescaled by K n_k / B (here full batches: K)."""
    k, c, rounds = 3, 4, 7
    exp = _experiment(algorithm="dsgld", **{"num-clients": k, "num-chains": c,
                                            "num-rounds": rounds})
    setup = exp.setup
    assert setup.config.variant == "dsgld" and setup.num_clients == k
    prev = exp.bundle.init_server(setup)
    clients = []
    for number, (state, log) in enumerate(_states(exp), start=1):
        chain, client = S.scheduled(setup, number)
        assert chain == (number - 1) % c and log.clients == (client,)
        clients.append(client)
        changed = np.flatnonzero(np.any(state.chains != prev.chains, axis=1))
        assert changed.tolist() == [chain]
        want_steps = prev.steps.copy()
        want_steps[chain] += setup.config.steps_per_round
        np.testing.assert_array_equal(state.steps, want_steps)
        prev = state
    assert len(set(clients)) > 1  # the schedule draws clients, it does not fix one
    # one step at the round-1 client, by hand: gradient of the full local batch times K
    one = _experiment(algorithm="dsgld", **{"num-clients": k, "num-chains": c, "num-rounds": 1,
                                            "steps-per-round": 1, "step-scale": 0.002})
    (state, _), = _states(one)
    chain, client = S.scheduled(one.setup, 1)
    x0 = S.initial_chains(one.setup)[chain]
    rows = one.client_data(client).x
    eps = 0.002 * 0.5 ** -0.55
    z = numpy_rng(client_seed(one.config.seed, "sgld", "train", 1, client)).standard_normal((1, 2))
    want = x0 + 0.5 * eps * (-x0 + k * (rows - x0).sum(0)) + np.sqrt(eps) * z[0]
    np.testing.assert_allclose(state.chains[chain], want, rtol=0, atol=1e-12)


def test_dsgld_with_one_client_and_one_chain_is_sgld():
    """K = 1, C = 1: DSGLD moves the only chain at the only client with scale n / B each round,
    which is SGLD exactly (same seeds)."""
    common = {"num-chains": 1, "num-rounds": 3, "batch-size": 40}
    a = [s.chains for s, _ in _states(_experiment(algorithm="sgld", **common))]
    b = [s.chains for s, _ in _states(_experiment(algorithm="dsgld", **common,
                                                  **{"num-clients": 1}))]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("algorithm", ["sgld", "dsgld"])
def test_bad_replies_are_rejected_and_leave_state_untouched(algorithm):
    """Wrong shape, NaN and a stale round: rejected by the generic validation (or the bundle's
    check) with the field named; the chains and their counters unchanged."""
    exp = _experiment(algorithm=algorithm, **{"num-clients": 2, "num-chains": 5})
    setup, bundle = exp.setup, exp.bundle
    server = bundle.init_server(setup)
    rnd = Round(1, 0, round_seed(0, "sgld", 1, 0), frozenset({0, 1}), True)
    (pid, request), = bundle.requests(server, setup, rnd).items()
    m = 5 if algorithm == "sgld" else 1
    assert request.message.chains.shape == (m, 2)
    base = request.message.chains
    good = S.Up(base + 0.1, 1)
    nan = base.copy()
    nan[0, 0] = np.nan
    for reply, field in ((S.Up(base[:-1], 1), "chains"), (S.Up(nan, 1), "chains"),
                         (S.Up(base + 0.1, 2), "request_round")):
        verdict = judge(bundle, setup, exp.actions, server, pid, "train", reply)
        assert verdict.partition_id == pid and verdict.field == field, verdict
        new, info = bundle.server_step(server, [(pid, verdict)], setup, rnd)
        np.testing.assert_array_equal(new.chains, server.chains)
        np.testing.assert_array_equal(new.steps, server.steps)
        assert info.rejected == (verdict,) and info.accepted == () and info.updates == 1
    assert judge(bundle, setup, exp.actions, server, pid, "train", good) is good
    new, info = bundle.server_step(server, [(pid, good)], setup, rnd)
    assert info.accepted == (pid,) and np.sum(np.any(new.chains != server.chains, axis=1)) == m


def test_bounded_support_and_stateless_clients():
    """mixture-1d: chains are clipped into [-6, 6] and a reply outside is rejected; the (empty)
    client state survives a node's record."""
    from flwr.common import RecordDict

    exp = _experiment(algorithm="dsgld", model="mixture-1d", dataset="mixture-1d",
                      **{"num-clients": 2, "num-rounds": 1, "step-scale": 50.0,
                         "step-decay": 0.0})
    setup, bundle = exp.setup, exp.bundle
    assert S.num_chains(setup) == 200  # by model, as DSVGD's particles
    (state, _), = _states(exp)
    assert np.all(np.abs(state.chains) <= 6) and np.any(np.abs(state.chains) == 6)
    server = bundle.init_server(setup)
    outside = S.Up(np.full((1, 1), 7.0), 1)
    verdict = judge(bundle, setup, exp.actions, server, 0, "train", outside)
    assert verdict.field == "chains" and "support" in verdict.reason
    records = RecordDict()
    client = bundle.init_client(setup, 0)
    codec.save_state(records, "sgld", client)
    loaded = codec.load_state(records, "sgld", bundle.client_state_template(setup))
    assert isinstance(loaded, S.ClientState) and loaded.empty.shape == (0,)


@pytest.mark.parametrize("values, key", [
    ({"sgld.variant": "hmc"}, "sgld.variant"),
    ({"sgld.num-chains": -1}, "sgld.num-chains"),
    ({"sgld.steps-per-round": 0}, "sgld.steps-per-round"),
    ({"sgld.step-scale": 0.0}, "sgld.step-scale"),
    ({"sgld.step-offset": 0.0}, "sgld.step-offset"),
    ({"sgld.step-decay": 1.5}, "sgld.step-decay"),
    ({"batch-size": -2}, "sgld.batch-size"),
])
def test_config_errors_name_the_key(values, key):
    with pytest.raises(ConfigError) as err:
        parse_run_config({"algorithm": "dsgld", **values})
    assert str(err.value).startswith(f"{key}:") and "\n" not in str(err.value)


def test_presets():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sgld = parse_run_config({"algorithm": "sgld", "num-clients": 5})
    dsgld = parse_run_config({"algorithm": "dsgld", "num-clients": 5})
    assert sgld.num_clients == 1 and sgld.section.variant == "sgld"
    assert dsgld.num_clients == 5 and dsgld.section.variant == "dsgld"
    assert sgld.bundle_name == dsgld.bundle_name == "sgld"


@pytest.mark.parametrize("algorithm", ["sgld", "dsgld"])
def test_both_names_run_end_to_end_and_save_the_chains_they_ran(tmp_path, algorithm):
    """The CLI's engine on breast-cancer: both names complete, and ``posterior.npz`` holds
    exactly the chains the bundle's own steps produce for that config (``iterate_in_process``,
    compared bit for bit: what a user loads is what was sampled; the chains' law is the first
    test's)."""
    out = tmp_path / algorithm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = parse_run_config({
            "algorithm": algorithm, "model": "logistic-regression", "dataset": "breast-cancer",
            "num-rounds": 2, "sgld.num-chains": 6, "sgld.steps-per-round": 20,
            "output-dir": str(out)})
    result = run_in_process(config, progress=False)
    assert result["outcome"] == "completed" and [h["round"] for h in result["history"]] == [1, 2]
    with np.load(out / "posterior.npz") as post:
        samples = post["samples"]
    final = _states(build_experiment(config))[-1][0].chains
    assert samples.shape == final.shape == (6, 31)
    np.testing.assert_array_equal(samples, final)
