r"""Decentralized Metropolis-adjusted HMC with gradient tracking: the agents' maths (numpy).

Notation: ``m`` agents on a connected graph with a symmetric doubly-stochastic mixing matrix
``W`` (:mod:`fedbayes_flwr.algorithms.decentralized.graphs`), ``s`` mixing rounds per phase, step
``epsilon``, unit mass (or an agreed mass matrix ``M``: :mod:`fedbayes_flwr.algorithms.dhmc.mass`;
then ``p ~ N(0, M)``, every ``epsilon p`` below is ``epsilon M^{-1} p`` and ``|p|^2 / 2`` is
``p^T M^{-1} p / 2``: a linear change of coordinates, so every identity below holds unchanged).
Agent ``i`` holds ``U_i(w) = -log p(D_i | w) - log p_0(w) / m`` (the prior split evenly, so
``U = sum_i U_i`` counts it once), its parameter copy ``w_i``, the gradient tracker ``y_i``
(an estimate of the AVERAGE ``(1/m) sum_j grad U_j``; the network gradient is ``m y_i``) with
its pending correction ``e_i`` (zero but after a rejection), the energy tracker ``aleph_i``
(the average local energy remainder, below) and the last local quantities it contributed
(``g_last_i = grad U_i`` at its current ``w_i``, ``c_last_i``). Everything is vectorised over
``K`` independent chains (leading axes ``(..., K, d)``).

**Invariant** (after every iteration, whatever the agents decided, tested to rounding):
``sum_i (y_i + e_i) = sum_i grad U_i(w_i)``: the trackers describe the positions the chains are
at, never a rejected proposal.

**One iteration** (velocity Verlet, one leapfrog step; ``p`` and the uniform ``u`` are SHARED:
every agent draws them from the same seed, keyed on the run seed and the iteration):

1. *begin*: ``p_half = p - (epsilon / 2) m y_i``, ``Delta_i = epsilon p_half``,
   ``z_i = w_i + Delta_i``; the local energy change along the step,

       taylor (the paper):  c_i = g_last_i . Delta_i + (1/2) Delta_i^T H_i(w_i) Delta_i,
       exact:               c_i = U_i(z_i) - U_i(w_i),

   split as ``c_i = g_last_i . Delta_i + r_i``: broadcast ``z_i`` and
   ``a_i = aleph_i + r_i - r_last_i`` (only the remainder ``r_i`` past first order is gossiped).
2. ``s`` mixing rounds: ``z <- W z``, ``a <- W a`` (the new ``aleph'``).
3. *track*: ``b_i = y_i + e_i + grad U_i(z'_i) - g_last_i``; broadcast ``b_i`` and ``y_i``;
   ``s`` rounds give ``y'_i = (W^s b)_i`` (the tracker of the proposal) and ``(W^s y)_i``
   (the tracker of the kept positions). The increment is added ONCE, then mixed.
4. *finish*: ``p' = p_half - (epsilon / 2) m y'_i`` and the energy change

       Delta H_i = m aleph'_i + m y_i . Delta_i + |p'|^2 / 2 - |p|^2 / 2,

   accepted when ``log u < -Delta H_i``. Accepted: ``w_i = z'_i``, ``y_i = y'_i``, ``e_i = 0``,
   ``g_last_i = grad U_i(z'_i)``. Rejected: the agent keeps ``w_i`` and ``g_last_i``, takes
   ``y_i = (W^s y)_i`` and books ``e_i = y'_i - (grad U_i(z'_i) - g_last_i) - (W^s y)_i``
   (what its own increment left in the network sum; it travels in the next ``b``). Either way
   ``aleph_i = aleph'_i``, ``r_last_i = r_i``. This keeps the invariant for ANY decisions at
   no extra exchange: ``2 s`` exchanges per iteration (plus the diameter ``D`` when the
   decisions are agreed by flooding). The alternative, recomputing the trackers at the kept
   positions (the reference code's order), costs ``s`` more exchanges per iteration.

   Before issue 27 a rejecting agent took ``(W^s y)_i`` with no correction: exact when all
   agents decide alike, but with local decisions each disagreement dropped the increment its
   neighbours had already mixed in, and the tracked sum drifted (the tracker error grew to
   the size of the local gradients; ``dmala`` at one mixing round was 1.5 posterior sd off).

**Energy tracking.** The network's first-order term ``sum_j g_last_j . Delta_j`` is what the
gradient tracker already estimates, ``m y_i . Delta_i`` (exact in the invariant's sum at
consensus), so only the remainder ``r`` (second order, ``O(epsilon^2)``) goes through the energy
tracker. With one mixing round the energy tracker's error is proportional to its increments:
gossiping the whole ``c`` (``O(epsilon)``, as before issue 27) left the agents' ``Delta H_i``
far apart (local decisions disagreed in 48% of chain-iterations on a sorted ring of 5 at step
0.02; 11% with the remainder).

**Why this Metropolis term.** With ``Delta = epsilon p - (epsilon^2 / 2) g`` (``g = grad U(w)``)
the exact energy change of one leapfrog step is ``U(w + Delta) - U(w) + |p'|^2/2 - |p|^2/2``.
With consensus (all ``w_i`` equal, trackers at their averages) ``m aleph' + m y . Delta =
sum_i c_i`` and ``m y' = grad U(z)``: the ``taylor`` term is the second-order expansion
``g . Delta + Delta^T H Delta / 2`` of ``U(w + Delta) - U(w)`` (exact for a quadratic ``U``;
its error is the third-order remainder, ``O(|Delta|^3) = O(epsilon^3)``), the kinetic part is
exact, so ``Delta H`` is exact on Gaussian targets (tested) and the test is the standard HMC
test; ``exact`` uses the local potential differences themselves. Away from consensus the
agents' ``Delta H_i`` differ slightly and they may disagree (the shared ``u`` makes that rare;
the rate is reported).

**Several leapfrog steps** (``L > 1``, exact energy): the trajectory repeats phases 2-3 at each
position, ``z_l`` mixed, the tracker carried along it (``b_l = y_{l-1} + grad U_i(z_l') -
grad U_i(z_{l-1}')``, mixed) and :func:`advance` taking the full momentum step; the kept
tracker ``W^{sL} y`` is mixed alongside; the energy change ``c_i = U_i(z_L) - U_i(w_i)`` (split
along ``D_i = z_L - w_i``) enters the energy tracker with the last position. Cost: ``2 s L``
exchanges per iteration (plus ``D``). Measured (``benchmarks/dhmc/exchanges.py``): with few
rounds on a ring or path the agents' trajectories drift apart and ``L = 3`` breaks down
(acceptance below 0.3, or divergence); it needs ``mixing-rounds = auto``.

``integrator = "euler"`` is the paper's single symplectic-Euler step ("decentralized MALA"):
``p_half = p - epsilon m y_i``, ``Delta = epsilon p_half``. The map ``(w, p) -> (w + Delta,
p_half - epsilon m y')`` (a full momentum step back at the proposal) followed by a momentum
flip is an involution and preserves volume, so with that ``p'`` in the kinetic term the test
is an exact Metropolis-Hastings correction of the paper's proposal (it is MALA's acceptance
ratio for the proposal ``N(w - epsilon^2 grad U, epsilon^2 I)``). Before issue 27 the kinetic
term used ``p_half``, which does not correct the proposal's doubled drift: its chains targeted
about ``exp(-2 U)`` (variance ratio 0.5, as the reference code's dMALA).

**Warm-up.** For the first ``warmup`` iterations the test is off (every proposal accepted, the
paper's MH burn-in) and the shared step size is adapted by dual averaging on the agents' mean
acceptance probability (:class:`DualAveraging`; the server does it and sends ``epsilon``).

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Algorithm 1 (gradient tracking, multiple mixing
rounds, the Taylor-approximated Metropolis step); Nedic, Olshevsky & Shi (2017), "Achieving
geometric convergence for distributed optimization over time-varying graphs" (gradient
tracking); Neal (2011), "MCMC using Hamiltonian dynamics" (leapfrog, acceptance);
Hoffman & Gelman (2014), "The No-U-Turn Sampler", Algorithm 5 (dual averaging).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

INTEGRATORS = ("leapfrog", "euler")
ENERGIES = ("taylor", "exact")


class LocalPotential:
    """``U_i = U_lik + U_prior / m`` from a likelihood potential and the prior's."""

    def __init__(self, likelihood, prior, num_agents: int):
        self.lik, self.prior, self.share = likelihood, prior, 1.0 / num_agents
        self.dim = likelihood.dim

    def grad(self, x):
        return self.lik.grad(x) + self.share * self.prior.grad(x)

    def value(self, x):
        return self.lik.value(x) + self.share * self.prior.value(x)

    def hess_quad(self, x, v):
        return self.lik.hess_quad(x, v) + self.share * self.prior.hess_quad(x, v)


class AgentState(NamedTuple):
    """One agent's iterate for ``K`` chains, and what it carries between the phases."""

    w: np.ndarray
    y: np.ndarray
    g_last: np.ndarray
    aleph: np.ndarray
    c_last: np.ndarray
    p: np.ndarray
    p_half: np.ndarray
    c: np.ndarray
    grad_z: np.ndarray
    lin: np.ndarray
    e: np.ndarray


def init_agent(potential, w0: np.ndarray) -> AgentState:
    """Start at ``w0 (K, d)`` (the same at every agent): ``y = g_last = grad U_i(w0)``."""
    g = potential.grad(w0)
    k, d = w0.shape
    zeros = np.zeros(k)
    return AgentState(w0.copy(), g.copy(), g, zeros, zeros.copy(), np.zeros((k, d)),
                      np.zeros((k, d)), zeros.copy(), np.zeros((k, d)), zeros.copy(), np.zeros((k, d)))


def velocity(p: np.ndarray, inv_mass=None) -> np.ndarray:
    """``M^{-1} p`` for momenta ``p (K, d)``: ``p`` itself for unit mass (``inv_mass`` None),
    ``p * M^{-1}`` for a diagonal ``(d,)``, ``p M^{-1}`` for a dense ``(d, d)`` (symmetric)."""
    if inv_mass is None:
        return p
    return p * inv_mass if inv_mass.ndim == 1 else p @ inv_mass


def kinetic(p: np.ndarray, inv_mass=None) -> np.ndarray:
    """``p^T M^{-1} p / 2`` per chain."""
    return 0.5 * np.sum(p * velocity(p, inv_mass), axis=-1)


def momentum(xi: np.ndarray, factor=None) -> np.ndarray:
    """``p ~ N(0, M)`` from the shared standard normals ``xi (K, d)``: ``xi`` for unit mass,
    ``xi / sqrt(M^{-1})`` (diagonal; ``factor`` = ``1 / sqrt(M^{-1})``), ``C^{-T} xi`` with
    ``M^{-1} = C C^T`` (dense; ``factor`` = ``C``), so ``Cov p = C^{-T} C^{-1} = M``
    (:func:`fedbayes_flwr.algorithms.dhmc.mass.factor`)."""
    if factor is None:
        return xi
    if factor.ndim == 1:
        return xi * factor
    from scipy.linalg import solve_triangular

    return solve_triangular(factor, xi.T, trans="T", lower=True).T


def begin(state: AgentState, potential, p: np.ndarray, epsilon, num_agents: int,
          integrator: str = "leapfrog", energy: str = "taylor", inv_mass=None):
    """Phase 1: the proposal step. Returns ``(state, z, a)`` (``z``, ``a`` to broadcast).
    ``p`` is the momentum (``N(0, M)``: :func:`momentum`), ``inv_mass`` ``M^{-1}`` (None:
    unit mass); the position moves by ``epsilon M^{-1} p_half``."""
    eps = np.asarray(epsilon, dtype=np.float64).reshape(-1, 1) if np.ndim(epsilon) else epsilon
    g = num_agents * state.y
    if integrator == "euler":
        p_half = p - eps * g
    else:
        p_half = p - 0.5 * eps * g
    delta = eps * velocity(p_half, inv_mass)
    z = state.w + delta
    if energy == "exact":
        c = potential.value(z) - potential.value(state.w)
    else:
        c = np.sum(state.g_last * delta, axis=-1) + 0.5 * potential.hess_quad(state.w, delta)
    c, lin = _split_energy(state, c, delta, num_agents)
    a = state.aleph + c - state.c_last
    return state._replace(p=p, p_half=p_half, c=c, lin=lin), z, a


def _split_energy(state: AgentState, c, displacement, num_agents: int):
    """``(r, lin)``: the local energy change's remainder past first order,
    ``r = c - g_last . D``, which the energy tracker carries, and this agent's estimate of the
    network's first-order term ``sum_j g_last_j . D_j`` from its gradient tracker,
    ``lin = m y . D`` (``D`` the displacement; module docstring, "Energy tracking")."""
    r = c - np.sum(state.g_last * displacement, axis=-1)
    return r, num_agents * np.sum(state.y * displacement, axis=-1)


def track(state: AgentState, potential, z_mixed: np.ndarray, y=None, g_last=None):
    """Phase 2: the gradient at the mixed proposal and the tracker's increment
    ``b = y + grad U_i(z') - g_last`` (defaults: the iteration's ``y`` and ``g_last``; along a
    multi-step trajectory, the tracker and local gradient of the previous position). Returns
    ``(state, b)`` (``b`` to broadcast and mix)."""
    grad_z = potential.grad(z_mixed)
    y = state.y + state.e if y is None else y
    g_last = state.g_last if g_last is None else g_last
    return state._replace(grad_z=grad_z), y + grad_z - g_last


def advance(state: AgentState, potential, z_mixed: np.ndarray, y_mixed: np.ndarray, epsilon,
            num_agents: int, last: bool, inv_mass=None):
    """An inner step of an ``L``-step leapfrog trajectory (``L > 1``): the full momentum step
    with the tracked network gradient at the mixed position, ``p_half <- p_half - epsilon m y'``,
    and the next position ``z = z' + epsilon M^{-1} p_half``; at the last position (``last``) the local
    energy change ``c = U_i(z_L) - U_i(w_i)`` (exact energy). Returns ``(state, z)``; the
    caller broadcasts ``z`` with ``aleph`` (inner steps: pure mixing, the trackers' averages
    unchanged) or ``aleph + c - c_last`` (the last)."""
    eps = np.asarray(epsilon, dtype=np.float64).reshape(-1, 1) if np.ndim(epsilon) else epsilon
    p_half = state.p_half - eps * num_agents * y_mixed
    z = z_mixed + eps * velocity(p_half, inv_mass)
    if not last:
        return state._replace(p_half=p_half), z
    c, lin = _split_energy(state, potential.value(z) - potential.value(state.w), z - state.w,
                           num_agents)
    return state._replace(p_half=p_half, c=c, lin=lin), z


class Outcome(NamedTuple):
    """Per chain: the energy change, acceptance probability and decision."""

    delta_h: np.ndarray
    accept_prob: np.ndarray
    accepted: np.ndarray


def decide(state: AgentState, aleph_mixed, y_mixed, log_u: np.ndarray, epsilon,
           num_agents: int, integrator: str = "leapfrog", metropolis: bool = True,
           inv_mass=None) -> Outcome:
    """Phase 3a: this agent's energy change (kinetic part ``p^T M^{-1} p / 2``), acceptance
    probability and decision."""
    eps = np.asarray(epsilon, dtype=np.float64).reshape(-1, 1) if np.ndim(epsilon) else epsilon
    if integrator == "euler":  # the reverse momentum of the involution (module docstring)
        p_new = state.p_half - eps * num_agents * y_mixed
    else:
        p_new = state.p_half - 0.5 * eps * num_agents * y_mixed
    if inv_mass is None:  # unit mass (kept as it was: bitwise the same runs)
        change = 0.5 * np.sum(p_new**2, axis=-1) - 0.5 * np.sum(state.p**2, axis=-1)
    else:
        change = kinetic(p_new, inv_mass) - kinetic(state.p, inv_mass)
    delta_h = num_agents * aleph_mixed + state.lin + change
    with np.errstate(over="ignore", invalid="ignore"):
        prob = np.where(np.isfinite(delta_h), np.minimum(1.0, np.exp(-delta_h)), 0.0)
    accepted = (log_u < -delta_h) if metropolis else np.ones_like(delta_h, dtype=bool)
    return Outcome(delta_h, prob, accepted)


def apply(state: AgentState, z_mixed, aleph_mixed, y_mixed, y_kept, accepted) -> AgentState:
    """Phase 3b: move to the proposal where ``accepted``; keep the iterate otherwise.

    ``y_mixed = W^s (y + e + grad U_i(z') - g_last)`` is the tracker of the proposal and
    ``y_kept = W^s y`` the tracker mixed at the kept positions. After a move the agent takes
    ``y = y_mixed``, ``e = 0``, ``g_last = grad U_i(z')``. After a rejection it takes
    ``y = y_kept`` (a tracker of the position it stays at) and books what its own increment
    left in the network sum as the pending correction ``e = y_mixed - (grad U_i(z') - g_last)
    - y_kept``, which enters its next broadcast ``b`` (mixed before anyone uses it). So
    ``sum_i (y_i + e_i) = sum_i grad U_i(w_i)`` exactly after every iteration, for ANY pattern
    of decisions (agreed: the ``e_i`` sum to zero; local: they carry the increments the
    rejecting agents' neighbours had already mixed in), with no exchange beyond the tracking
    phase (tested to rounding; the former rule, ``y = W^s y`` and no correction, broke it
    whenever agents disagreed)."""
    keep = np.asarray(accepted)[..., None]
    pending = y_mixed - (state.grad_z - state.g_last) - y_kept
    return state._replace(w=np.where(keep, z_mixed, state.w),
                          y=np.where(keep, y_mixed, y_kept),
                          e=np.where(keep, 0.0, pending),
                          g_last=np.where(keep, state.grad_z, state.g_last),
                          aleph=aleph_mixed, c_last=state.c)


def finish(state: AgentState, z_mixed, aleph_mixed, y_mixed, y_kept, log_u: np.ndarray, epsilon,
           num_agents: int, integrator: str = "leapfrog", metropolis: bool = True,
           inv_mass=None):
    """Phase 3 with this agent's own decision: ``(state, outcome)``."""
    out = decide(state, aleph_mixed, y_mixed, log_u, epsilon, num_agents, integrator,
                 metropolis, inv_mass)
    return apply(state, z_mixed, aleph_mixed, y_mixed, y_kept, out.accepted), out


def shared_draws(rng: np.random.Generator, k: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """The iteration's momentum ``p (K, d)`` and ``log u (K,)``, identical at every agent."""
    p = rng.standard_normal((k, d))
    return p, np.log(rng.random(k))


class DualAveraging(NamedTuple):
    """Dual-averaging state for the shared step size (Hoffman & Gelman 2014, Algorithm 5)."""

    log_eps: float
    log_eps_bar: float
    h_bar: float
    mu: float
    count: int


def dual_averaging_init(epsilon0: float) -> DualAveraging:
    """Start at ``epsilon0`` and shrink towards it (``mu = log epsilon0``, not Hoffman &
    Gelman's ``log 10 epsilon0``: with the Metropolis test off during the warm-up an unstable
    step would carry the chains away instead of being rejected)."""
    return DualAveraging(float(np.log(epsilon0)), float(np.log(epsilon0)), 0.0,
                         float(np.log(epsilon0)), 0)


def dual_averaging_step(state: DualAveraging, accept_prob: float, target: float = 0.6,
                        gamma: float = 0.05, t0: float = 10.0, kappa: float = 0.75
                        ) -> DualAveraging:
    """One update towards mean acceptance probability ``target`` (growth capped at 1.5x per
    iteration)."""
    t = state.count + 1
    h_bar = (1 - 1 / (t + t0)) * state.h_bar + (target - accept_prob) / (t + t0)
    # at most a factor 1.5 up per iteration (the test is off: a step too large is not rejected)
    log_eps = min(state.mu - np.sqrt(t) / gamma * h_bar, state.log_eps + np.log(1.5))
    weight = t ** (-kappa)
    log_eps_bar = weight * log_eps + (1 - weight) * state.log_eps_bar
    return DualAveraging(float(log_eps), float(log_eps_bar), float(h_bar), state.mu, t)


def consensus_error(w: np.ndarray, posterior_var: np.ndarray | None = None) -> float:
    """Mean over chains and coordinates of the agents' variance around their average
    (``w (m, K, d)``), relative to ``posterior_var (d,)`` when given."""
    spread = np.var(w, axis=0)  # (K, d)
    if posterior_var is not None:
        spread = spread / posterior_var
    return float(np.mean(spread))
