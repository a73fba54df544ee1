"""Decentralized MH-HMC at the paper's communication budget (issue 27): trackers under rejection.

The gradient tracker's invariant ``sum_i y_i = sum_i grad U_i(w_i)`` (each agent's tracker
describes the network gradient at the current positions) must hold after every iteration,
whatever the agents decide: checked to rounding for every integrator, energy and decision rule,
and shown to fail under the former rule (``y = W^s y`` after a rejection) once agents disagree.
Then ``dmala`` and ``dhmc`` at ONE mixing round per phase on a ring match the exact posterior of
a heterogeneous (label-sorted) linear-regression split through the in-process engine.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes_flwr.algorithms.decentralized import graphs as gossip
from fedbayes_flwr.algorithms.decentralized import mixing as mixmat
from fedbayes_flwr.algorithms.dhmc import agents as H
from fedbayes_flwr.inference import potentials as P
from fedbayes_flwr.inference.posterior import SamplePosterior
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment


def _sorted_split(m=5, n=200, d=3, seed=0):
    """Linear regression, rows sorted by the first covariate (shifted along it): every agent
    sees a different slice of the design, so the local gradients differ widely."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    x[:, 0] += np.linspace(-2.0, 2.0, n)
    x = x[np.argsort(x[:, 0])]
    y = x @ rng.standard_normal(d) + rng.standard_normal(n)
    prior = P.gaussian_prior_potential(d, 1.0)
    cov = np.linalg.inv(x.T @ x + np.eye(d))
    pots = [H.LocalPotential(P.linear_regression_potential(x[i], y[i], 1.0), prior, m)
            for i in np.array_split(np.arange(n), m)]
    return pots, cov @ x.T @ y, np.sqrt(np.diag(cov))


def _iterate(problem, mixing, iterations, eps, integrator, energy, decision, steps, legacy=False):
    """``iterations`` iterations of the agents' functions (one mixing round per phase, as the
    bundle sequences them, :mod:`fedbayes_flwr.algorithms.dhmc.bundle`); ``legacy``: after a
    rejection the agent takes ``(W y)_i`` (the rule before issue 27). Returns the largest
    ``|sum_i y_i - sum_i grad U_i(w_i)|`` relative to ``max |grad U_i|``, the rejection rate
    and the disagreement rate."""
    pots, mean, sd = problem
    m, k, d = len(pots), 4, pots[0].dim
    w0 = mean + sd * np.random.default_rng(3).standard_normal((k, d))  # in the posterior's bulk
    states = [H.init_agent(pot, w0) for pot in pots]
    worst, rejected, disagreed = 0.0, [], []
    for it in range(iterations):
        p, log_u = H.shared_draws(np.random.default_rng([1, it]), k, d)
        y_old = np.stack([s.y for s in states])
        begun = [H.begin(s, pot, p, eps, m, integrator, energy)
                 for s, pot in zip(states, pots, strict=True)]
        states = [b[0] for b in begun]
        z = mixing @ np.stack([b[1] for b in begun]).reshape(m, -1)
        if steps > 1:  # the energy enters with the trajectory's last position (the bundle's)
            a = mixing @ np.stack([s.aleph for s in states])
        else:
            a = mixing @ np.stack([b[2] for b in begun])
        z = z.reshape(m, k, d)
        y_prev = g_prev = None
        for leap in range(1, steps + 1):
            tracked = [H.track(s, pot, z[i], None if y_prev is None else y_prev[i],
                               None if g_prev is None else g_prev[i])
                       for i, (s, pot) in enumerate(zip(states, pots, strict=True))]
            states = [t[0] for t in tracked]
            y_mix = np.einsum("ij,jkd->ikd", mixing, np.stack([t[1] for t in tracked]))
            if leap < steps:
                last = leap + 1 == steps
                adv = [H.advance(s, pot, z[i], y_mix[i], eps, m, last)
                       for i, (s, pot) in enumerate(zip(states, pots, strict=True))]
                states = [q[0] for q in adv]
                extra = np.stack([s.c - s.c_last if last else np.zeros(k) for s in states])
                a = mixing @ (a + extra)
                z = np.einsum("ij,jkd->ikd", mixing, np.stack([q[1] for q in adv]))
                y_prev, g_prev = y_mix, np.stack([s.grad_z for s in states])
        outs = [H.decide(s, a[i], y_mix[i], log_u, eps, m, integrator)
                for i, s in enumerate(states)]
        own = np.stack([o.accepted for o in outs])
        final = own if decision == "local" else np.broadcast_to(own.all(0), own.shape)
        kept = np.einsum("ij,jkd->ikd", np.linalg.matrix_power(mixing, steps), y_old)
        states = [H.apply(s, z[i], a[i], y_mix[i], kept[i], final[i])
                  for i, s in enumerate(states)]
        if legacy:
            states = [s._replace(e=np.zeros_like(s.e)) for s in states]
        gap = (np.sum([s.y + s.e for s in states], 0)
               - np.sum([s.g_last for s in states], 0))
        scale = np.max(np.abs([s.g_last for s in states]))
        worst = max(worst, float(np.max(np.abs(gap)) / scale))
        rejected.append(1.0 - final.mean())
        disagreed.append(np.mean(own.any(0) & ~own.all(0)))
    return worst, float(np.mean(rejected)), float(np.mean(disagreed))


INTEGRATORS = [("euler", "taylor", 1), ("euler", "exact", 1), ("leapfrog", "taylor", 1),
               ("leapfrog", "exact", 1), ("leapfrog", "exact", 3)]


@pytest.mark.parametrize("decision", ["agree", "local"])
@pytest.mark.parametrize("integrator,energy,steps", INTEGRATORS)
def test_tracker_describes_the_current_positions_after_any_decision(integrator, energy, steps,
                                                                    decision):
    """One mixing round on a ring of 5, a step that rejects often: after every iteration
    ``sum_i (y_i + e_i) = sum_i grad U_i(w_i)`` (tracker plus pending correction) to rounding
    (1e-12 relative: a few hundred additions of doubles); the run must have rejected (and,
    with local decisions, disagreed) for the check to mean anything."""
    problem = _sorted_split()
    mixing = mixmat.metropolis_weights(gossip.ring(5))
    worst, rejected, disagreed = _iterate(problem, mixing, 40, 0.04, integrator, energy, decision,
                                          steps)
    assert rejected > 0.05, rejected
    assert decision == "agree" or disagreed > 0.05, disagreed
    assert worst < 1e-12, worst


@pytest.mark.parametrize("integrator,energy,steps", INTEGRATORS)
def test_former_tracking_breaks_the_invariant_when_agents_disagree(integrator, energy, steps):
    """The mutant: the rule before issue 27 (a rejecting agent takes ``(W y)_i`` and books no
    correction, dropping the increment its neighbours already mixed in) leaves the tracked sum
    off by more than 1% of the largest local gradient with local decisions: the check above
    detects it."""
    problem = _sorted_split()
    mixing = mixmat.metropolis_weights(gossip.ring(5))
    worst, _, disagreed = _iterate(problem, mixing, 40, 0.04, integrator, energy, "local", steps,
                                   legacy=True)
    assert disagreed > 0.05
    assert worst > 1e-2, worst


# --------------------------------------------------------- the exact posterior at one round
ONE_ROUND = {"model": "linear-regression", "dataset": "synthetic", "synthetic-dim": 3,
             "synthetic-size": 250, "num-clients": 5, "partition": "pathological",
             "dhmc.graph": "ring", "prior-scale": 1.0, "dhmc.mixing-rounds": 1,
             "dhmc.adapt": False, "dhmc.step-size": 0.03, "dhmc.warmup": 150,
             "dhmc.warmup-metropolis": False, "dhmc.iterations": 450}
MEAN_TOL, STD_TOL = 0.3, 0.25  # the bar: posterior sd, relative std
# 4 MCSE fit inside those when the ESS across chains is at least (4 / 0.3)^2 = 178 (the mean's
# MCSE is sd / sqrt(ESS)); then the std's relative MCSE, about 1 / sqrt(2 ESS) = 0.053, times 4
# is 0.21 < 0.25: a correct sampler passes with probability > 99.99% per coordinate.
MIN_ESS = (4 / MEAN_TOL) ** 2


def _exact(keys):
    from fedbayes_flwr.inference import gaussian as G
    from fedbayes_flwr.models import exact_posterior

    exp = build_experiment(parse_run_config({**keys, "output-dir": "unused"}))
    post = exact_posterior(exp.model, exp.prior, exp.dataset.x_train, exp.dataset.y_train)
    mean, cov = G.to_moments(post)
    return mean, np.sqrt(np.diag(cov))


def _matches(chains, mean, sd) -> bool:
    flat = chains.reshape(-1, chains.shape[-1])
    return bool(np.all(np.abs(flat.mean(0) - mean) <= MEAN_TOL * sd)
                and np.all(np.abs(flat.std(0) / sd - 1) <= STD_TOL))


@pytest.mark.parametrize("algorithm", ["dmala", "dhmc"])
def test_one_mixing_round_matches_the_exact_posterior(tmp_path, algorithm):
    """``dhmc.mixing-rounds=1`` on a ring of 5, label-sorted rows (``pathological``): every
    pooled mean within 0.3 posterior sd and every std within 25% of the conjugate posterior's
    (tolerances: ``MIN_ESS`` above); power: the same check refuses a target whose mean is
    0.6 sd off or whose sd is 1.5 times larger."""
    keys = {**ONE_ROUND, "algorithm": algorithm, "output-dir": str(tmp_path)}
    result = run_in_process(parse_run_config(keys), progress=False)
    mean, sd = _exact(keys)
    chains = np.load(tmp_path / "posterior.npz")["chains"]
    ess = SamplePosterior(chains).ess()
    assert np.all(ess >= MIN_ESS), ess  # else the tolerances are not 4 MCSE
    flat = chains.reshape(-1, chains.shape[-1])
    row = result["history"][-1]
    assert _matches(chains, mean, sd), ((flat.mean(0) - mean) / sd, flat.std(0) / sd, row)
    assert not _matches(chains, mean + 0.6 * sd, sd)
    assert not _matches(chains, mean, 1.5 * sd)


def test_begin_takes_one_step_size_per_chain():
    # K = 3 chains with their own steps (0.1, 0.2, 0.4), d = 2, one agent, unit mass:
    # leapfrog's first half, written out: p_half = p - eps/2 grad U(w0) = p - eps/2 w0,
    # z = w0 + eps p_half (each chain's eps on its row); Taylor energy change
    # c = grad U(w0) . D + D^T H D / 2 with D = z - w0. (Mutant: the per-chain vector left
    # unshaped, (3,) against (3, 2), which cannot broadcast.)
    w0 = np.array([[1.0, -1.0], [0.5, 2.0], [-1.5, 0.0]])
    p = np.array([[0.3, 0.1], [-0.2, 0.4], [1.0, -1.0]])
    eps = np.array([0.1, 0.2, 0.4])
    pot = P.gaussian_prior_potential(2, 1.0)  # U = |w|^2 / 2: gradient w, H = I
    state, z, _ = H.begin(H.init_agent(pot, w0), pot, p, eps, 1, "leapfrog", "taylor")
    p_half = p - 0.5 * eps[:, None] * w0
    np.testing.assert_allclose(state.p_half, p_half, rtol=1e-15)
    np.testing.assert_allclose(z, w0 + eps[:, None] * p_half, rtol=1e-15)
    disp = z - w0
    # c = r + lin, r = c - g_last . D (the remainder) and lin = m y . D (one agent: y = g_last)
    np.testing.assert_allclose(state.c + state.lin,
                               np.sum(w0 * disp, axis=1) + 0.5 * np.sum(disp**2, axis=1),
                               rtol=1e-12)


def test_advance_is_the_full_leapfrog_step_written_out():
    # An inner leapfrog step (Neal 2011, eq. 5.18-5.20, with the tracked network gradient
    # m y' standing in for grad U): p_half' = p_half - eps m y', z = z' + eps p_half' (unit
    # mass); at the last step the energy change c = U(z) - U(w) splits into r + lin with
    # lin = m y . D, D = z - w. m = 2 agents, eps = 0.3 (mutant eps // m = 0 leaves p_half).
    w0 = np.array([[1.0, -1.0], [0.5, 2.0]])
    pot = P.gaussian_prior_potential(2, 1.0)  # U = |w|^2 / 2
    state = H.init_agent(pot, w0)._replace(p_half=np.array([[0.2, -0.1], [0.0, 0.5]]))
    z_mixed = np.array([[1.1, -0.9], [0.4, 2.2]])
    y_mixed = np.array([[0.5, 0.25], [-1.0, 0.0]])
    eps, m = 0.3, 2
    new, z = H.advance(state, pot, z_mixed, y_mixed, eps, m, last=True)
    p_half = state.p_half - eps * m * y_mixed
    np.testing.assert_allclose(new.p_half, p_half, rtol=1e-15)
    np.testing.assert_allclose(z, z_mixed + eps * p_half, rtol=1e-15)
    disp = z - w0
    np.testing.assert_allclose(new.lin, m * np.sum(state.y * disp, axis=1), rtol=1e-12)
    np.testing.assert_allclose(new.c + np.sum(state.g_last * disp, axis=1),
                               0.5 * np.sum(z**2, axis=1) - 0.5 * np.sum(w0**2, axis=1),
                               rtol=1e-12)


def test_dual_averaging_step_is_hoffman_and_gelmans_update():
    # Hoffman & Gelman (2014), Algorithm 5 / eq. (6), written out (mu = log eps0, not
    # log 10 eps0: dual_averaging_init's documented choice), gamma 0.05, t0 10, kappa 0.75,
    # growth capped at 1.5x per iteration. Two steps from eps0 = 0.1: acceptance 0.9 (the
    # step may grow: capped) then 0.2 (it shrinks: uncapped).
    eps0, target, gamma, t0, kappa = 0.1, 0.6, 0.05, 10.0, 0.75
    mu = np.log(eps0)
    log_eps, log_bar, h = mu, mu, 0.0
    state = H.dual_averaging_init(eps0)
    for t, accept in ((1, 0.9), (2, 0.2)):
        h = (1 - 1 / (t + t0)) * h + (target - accept) / (t + t0)
        log_eps = min(mu - np.sqrt(t) / gamma * h, log_eps + np.log(1.5))
        log_bar = t ** -kappa * log_eps + (1 - t ** -kappa) * log_bar
        state = H.dual_averaging_step(state, accept)
        assert state.count == t
        np.testing.assert_allclose([state.log_eps, state.log_eps_bar, state.h_bar],
                                   [log_eps, log_bar, h], rtol=1e-13)
    # the first step was capped (log eps0 + log 1.5), the second was not
    assert np.isclose(H.dual_averaging_step(H.dual_averaging_init(eps0), 0.9).log_eps,
                      mu + np.log(1.5), rtol=1e-13)


def test_simulate_refuses_several_leapfrog_steps_without_the_exact_energy():
    # L > 1 needs the leapfrog integrator and the exact energy (simulate's docstring); L = 2
    # is the smallest such case (mutant `> 1` -> `> 2` lets it through; `!= "exact"` ->
    # `<= "exact"` lets "taylor" through, since "taylor" > "exact")
    from fedbayes_flwr.algorithms.dhmc.loop import simulate

    pots, mean, _ = _sorted_split()
    mixing = mixmat.metropolis_weights(gossip.ring(5))
    w0 = np.broadcast_to(mean, (2, 3)).copy()
    for integrator, energy in (("leapfrog", "taylor"), ("euler", "exact")):
        with pytest.raises(ValueError, match="2 leapfrog steps need integrator 'leapfrog'"):
            simulate(pots, mixing, w0, 0.05, 1, integrator=integrator, energy=energy,
                     leapfrog_steps=2)


class _Counting:
    """Counts the batch gradient and energy calls made on a potential."""

    def __init__(self, pot):
        self.pot, self.grads, self.values = pot, 0, 0
        self.dim = pot.dim

    def grad(self, w):
        self.grads += 1
        return self.pot.grad(w)

    def value(self, w):
        self.values += 1
        return self.pot.value(w)

    def hess_quad(self, w, d):
        return self.pot.hess_quad(w, d)


@pytest.mark.parametrize("energy,steps", [("taylor", 1), ("exact", 1), ("exact", 3)])
def test_simulate_counts_every_gradient_it_evaluates(energy, steps):
    # grad_evals per agent: the batch gradients each agent computes (the start, then one per
    # trajectory position: L per iteration), counted here by a wrapper, plus one energy
    # evaluation per iteration with the exact energy (U at the proposal; U at the current
    # position is the one of the previous iteration's proposal or start). Mutant: the start's
    # gradient not counted (`evals = 1` -> `0`).
    from fedbayes_flwr.algorithms.dhmc.loop import simulate

    pots, mean, _ = _sorted_split()
    counted = [_Counting(p) for p in pots]
    mixing = mixmat.metropolis_weights(gossip.ring(5))
    w0 = np.broadcast_to(mean, (2, 3)).copy()
    iterations = 4
    run = simulate(counted, mixing, w0, 0.02, iterations, adapt=False, energy=energy,
                   leapfrog_steps=steps)
    assert counted[0].grads == 1 + steps * iterations
    assert run.grad_evals == counted[0].grads + (iterations if energy == "exact" else 0)


def test_agreed_decisions_move_every_agent_or_none():
    # decision 'agreed': a chain moves at an agent only if every agent accepted, so in every
    # kept iteration and chain either all 5 agents' positions changed or none did; 'local'
    # (each agent its own decision) breaks this when agents disagree (the reported
    # disagreement > 0). The mutant `decision == "local"` -> `is not "local"` swaps the two.
    from fedbayes_flwr.algorithms.dhmc.loop import simulate

    pots, mean, sd = _sorted_split()
    mixing = mixmat.metropolis_weights(gossip.ring(5))
    w0 = mean + sd * np.random.default_rng(3).standard_normal((4, 3))

    def all_or_none(run):
        moved = np.any(np.diff(run.samples, axis=2) != 0, axis=-1)  # (m, K, T - 1)
        return bool(np.all(moved.all(axis=0) | ~moved.any(axis=0)))

    import warnings

    with warnings.catch_warnings():  # a normal run raises no numpy warning
        warnings.simplefilter("error", RuntimeWarning)
        local = simulate(pots, mixing, w0, 0.08, 60, adapt=False, decision="local")
        agreed = simulate(pots, mixing, w0, 0.08, 60, adapt=False, decision="agreed")
    assert local.disagreement > 0  # the agents do disagree here
    assert all_or_none(agreed) and not all_or_none(local)
