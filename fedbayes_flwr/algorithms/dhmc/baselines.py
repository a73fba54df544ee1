r"""Baselines for decentralized Metropolis-adjusted HMC: decentralized ULA and centralized HMC.

Both are numpy, vectorised over ``K`` independent chains (and, for the decentralized sampler,
stacked over the ``m`` agents), with the potentials of :mod:`fedbayes_flwr.algorithms.dhmc.agents` (agent
``i``
holds ``U_i = -log p(D_i | w) - log p_0(w) / m``, so ``U = sum_i U_i``; anything with ``grad``
and ``value`` on ``(K, d)`` batches). They are the two baselines of the seed paper's Section 4:
decentralized unadjusted Langevin (no Metropolis step, a decaying step) and HMC on the pooled
data.

**Decentralized ULA** (:func:`decentralized_ula`). Each iteration, every agent mixes its
neighbours' iterates (``s`` rounds of the symmetric doubly-stochastic ``W``, so ``W^s``) and
takes a Langevin step with its own full (not stochastic) local gradient:

    w_i <- sum_j (W^s)_ij w_j - h_t m grad U_i(w_i) + sqrt(2 h_t c) xi_i,

where ``m grad U_i`` is agent ``i``'s estimate of the network gradient ``grad U`` (exact when the
data are homogeneous). The network average then moves by
``w_bar <- w_bar - h_t sum_i grad U_i(w_i) + sqrt(2 h_t) xi_bar`` when the noise is scaled right,
i.e. it runs ULA with step ``h_t`` on ``U`` up to the consensus error. The noise (``noise``):

* ``"independent"`` (default, the literature's): every agent its own ``xi_i ~ N(0, I)`` and
  ``c = m``, so ``xi_bar`` has variance ``2 h_t`` (the mean of ``m`` independent draws has
  ``1/m`` of their variance). This is DE-SGLD (Gurbuzbalaban, Gao, Hu & Zhu 2021, full
  gradients) with its step ``eta = m h_t``: ``w_i <- sum_j W_ij w_j - eta grad U_i(w_i) +
  sqrt(2 eta) xi_i``. The independent noise itself drives the agents apart (a consensus error
  of order ``m h_t / (1 - lambda_2(W^s)^2)``, lambda the second-largest eigenvalue modulus).
* ``"shared"``: one draw per chain and iteration common to all agents (``c = 1``), as the
  momenta of :mod:`fedbayes_flwr.algorithms.dhmc.agents` are shared (every agent draws from the same
  seed); only
  the heterogeneity of the local gradients drives the agents apart.
* ``"reference"``: independent draws with ``c = 1``, as the seed paper's code
  (``decentralised_ULA`` of AdamCobb/dblmahmc, after Parayil, Bai, George & Gurram 2020,
  Algorithm 1, with ``N grad U_i`` and ``sqrt(2 alpha) v_i``). Its network average has noise of
  variance ``2 h_t / m``, so near consensus it samples ``exp(-m U)``: the agents' spread is
  about ``1/m`` of the posterior variance (measured in the benchmarks). Kept to compare with
  the paper's figures, not as a sampler of the posterior.

The step decays as in the reference code (``alpha_n = a / (n + b)^0.55``, ``b = 230``), written
so that the first step is ``step``: ``h_t = step (b / (b + t))^decay`` with ``b = offset``
(``decay = 0``: a constant step). Mixing is ``W^s`` (the same graph and weights as the
Metropolis-adjusted sampler) instead of the reference code's Laplacian consensus step with its
own slowly decaying weight ``beta_n = 0.48 / (n + 230)^0.01``: with a doubly-stochastic ``W`` the
network average is left unchanged by mixing, as it is by the Laplacian step.

**Centralized HMC** (:func:`centralized_hmc`). One leapfrog step per iteration with unit mass
(the Metropolis-adjusted Langevin algorithm in HMC form) on the pooled potential ``U``, the
exact energy change in the test, the step adapted by dual averaging during the warm-up
(:func:`fedbayes_flwr.algorithms.dhmc.agents.dual_averaging_init` / ``dual_averaging_step``, one shared
step for
all chains, on their mean acceptance probability). The momenta and uniforms come from
:func:`fedbayes_flwr.algorithms.dhmc.agents.shared_draws` keyed like
:func:`fedbayes_flwr.algorithms.dhmc.loop.simulate`
(``default_rng([seed, iteration])``): with the same seed, fixed step and no warm-up, the
decentralized sampler on a complete graph with exact averaging makes the same moves (tested).

**Cost.** Both count gradient evaluations per agent (decentralized) or of the pooled potential
(centralized), one per iteration plus one at the start, as
:func:`fedbayes_flwr.algorithms.dhmc.loop.simulate` does; across the network one iteration of either
decentralized sampler costs one full-data gradient, like one centralized iteration.

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Section 4 (the baselines: CentralizedHMC and
DecentralizedULA "as in [15]" with full gradients); Parayil, Bai, George & Gurram (2020), "A
Decentralized Approach to Bayesian Learning" / "Decentralized Langevin Dynamics for Bayesian
Learning", NeurIPS, Algorithm 1 (decaying steps, consensus on a graph); Kungurtsev (2020),
"Decentralized Langevin Dynamics"; Gurbuzbalaban, Gao, Hu & Zhu (2021), "Decentralized
Stochastic Gradient Langevin Dynamics and Hamiltonian Monte Carlo", JMLR 22 (DE-SGLD);
Roberts & Tweedie (1996), "Exponential convergence of Langevin distributions and their discrete
approximations" (ULA's bias, MALA); Neal (2011), "MCMC using Hamiltonian dynamics"; Hoffman &
Gelman (2014), "The No-U-Turn Sampler", Algorithm 5 (dual averaging).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms.dhmc import agents as dhmc

NOISES = ("independent", "shared", "reference")


class PooledPotential:
    """``U = sum_i U_i`` of the agents' potentials (the centralized target): ``grad``,
    ``value`` and ``hess_quad`` summed over the agents."""

    def __init__(self, potentials):
        self.parts = list(potentials)
        if not self.parts:
            raise ValueError("no potentials")
        self.dim = self.parts[0].dim

    def grad(self, x):
        return sum(p.grad(x) for p in self.parts)

    def value(self, x):
        return sum(p.value(x) for p in self.parts)

    def hess_quad(self, x, v):
        return sum(p.hess_quad(x, v) for p in self.parts)


class ULARun(NamedTuple):
    """``samples (m, K, T, d)`` per agent after the warm-up; the consensus error per kept
    iteration (relative to ``posterior_var`` if given); the steps ``h_t`` of every iteration
    (warm-up included); gradient evaluations per agent."""

    samples: np.ndarray
    consensus: np.ndarray
    steps: np.ndarray
    grad_evals: int


class HMCRun(NamedTuple):
    """``samples (K, T, d)`` after the warm-up; the acceptance rate after the warm-up; the step
    used after the warm-up; gradient evaluations of the pooled potential."""

    samples: np.ndarray
    accept_rate: float
    epsilon: float
    grad_evals: int


def ula_steps(step: float, total: int, decay: float = 0.55, offset: float = 230.0) -> np.ndarray:
    """``h_t = step (offset / (offset + t))^decay`` for ``t = 0 .. total - 1``."""
    t = np.arange(total, dtype=np.float64)
    return step * (offset / (offset + t)) ** decay


def decentralized_ula(potentials: list, mixing: np.ndarray, w0: np.ndarray, step: float,
                      iterations: int, rounds: int = 1, seed: int = 0, decay: float = 0.55,
                      offset: float = 230.0, noise: str = "independent", warmup: int = 0,
                      posterior_var=None) -> ULARun:
    r"""Decentralized unadjusted Langevin with full local gradients (module docstring).

    Parameters
    ----------
    potentials : list
        ``m`` agent potentials ``U_i`` (prior share included), each with ``grad`` on
        ``(K, d)`` batches.
    mixing : numpy.ndarray
        ``(m, m)`` symmetric doubly-stochastic mixing matrix
        (:mod:`fedbayes_flwr.algorithms.decentralized.graphs`).
    w0 : numpy.ndarray
        ``(K, d)`` start, the same at every agent.
    step : float
        The first step ``h_0`` (a Langevin step: MALA's ``epsilon^2 / 2``).
    iterations : int
        Kept iterations, after ``warmup`` discarded ones.
    rounds : int
        ``s``: mixing rounds per iteration (``W^s``).
    seed : int
        Iteration ``t`` draws its noise from ``default_rng([seed, t])``.
    decay, offset : float
        ``h_t = step (offset / (offset + t))^decay`` (``t`` counts the warm-up too); the
        reference code's ``0.55`` and ``230``; ``decay = 0`` keeps the step constant.
    noise : {"independent", "shared", "reference"}
        Per-agent draws scaled by ``sqrt(m)`` (DE-SGLD), one shared draw, or per-agent draws
        unscaled (the seed paper's code; samples ``exp(-m U)`` near consensus).
    warmup : int
        Iterations run first and discarded.
    posterior_var : array_like, optional
        ``(d,)``: the consensus error is reported relative to it.

    Returns
    -------
    ULARun

    References
    ----------
    Parayil, Bai, George & Gurram (2020), Algorithm 1; Gurbuzbalaban, Gao, Hu & Zhu (2021),
    DE-SGLD; the seed paper's reference code (``decentralised_ULA``).
    """
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    if iterations < 0 or warmup < 0 or rounds < 0:
        raise ValueError("iterations, warmup and rounds must be >= 0")
    m = len(potentials)
    w0 = np.asarray(w0, dtype=np.float64)
    k, d = w0.shape
    mix = np.linalg.matrix_power(np.asarray(mixing, dtype=np.float64), rounds)
    if mix.shape != (m, m):
        raise ValueError(f"mixing is {mix.shape} for {m} agents")
    scale = np.sqrt(m) if noise == "independent" else 1.0
    total = warmup + iterations
    steps = ula_steps(step, total, decay, offset)
    w = np.broadcast_to(w0, (m, k, d)).copy()
    kept, consensus = [], []
    for t in range(total):
        rng = np.random.default_rng([seed, t])
        xi = rng.standard_normal((k, d) if noise == "shared" else (m, k, d))
        grads = np.stack([pot.grad(w[i]) for i, pot in enumerate(potentials)])
        w = (np.tensordot(mix, w, axes=1) - steps[t] * m * grads
             + np.sqrt(2.0 * steps[t]) * scale * xi)
        if t >= warmup:
            kept.append(w)
            consensus.append(dhmc.consensus_error(w, posterior_var))
    samples = np.stack(kept, axis=2) if kept else np.zeros((m, k, 0, d))
    return ULARun(samples, np.asarray(consensus), steps, total)


def centralized_hmc(total_potential, w0: np.ndarray, step: float, iterations: int,
                    warmup: int = 0, seed: int = 0, adapt: bool = True,
                    target_accept: float = 0.6, warmup_metropolis: bool = True) -> HMCRun:
    r"""One-leapfrog-step HMC (MALA) on the pooled potential, vectorised over chains.

    Parameters
    ----------
    total_potential
        ``U`` with ``grad`` and ``value`` on ``(K, d)`` batches (e.g.
        :class:`PooledPotential` of the agents' potentials).
    w0 : numpy.ndarray
        ``(K, d)`` start.
    step : float
        The leapfrog step ``epsilon`` (the start of the adaptation when ``adapt``).
    iterations : int
        Kept iterations, after ``warmup``.
    warmup : int
        Iterations discarded; the step is adapted during them when ``adapt``.
    seed : int
        Iteration ``t`` draws ``p`` and ``log u`` by :func:`fedbayes_flwr.algorithms.dhmc.agents.shared_draws`
        from ``default_rng([seed, t])`` (as the decentralized sampler does).
    adapt : bool
        Dual averaging of the shared step on the chains' mean acceptance probability during the
        warm-up (:func:`fedbayes_flwr.algorithms.dhmc.agents.dual_averaging_step`; the averaged step
        afterwards).
    target_accept : float
        Dual averaging's target.
    warmup_metropolis : bool
        Keep the Metropolis test on during the warm-up (True, the usual HMC warm-up) or accept
        every proposal there (False, the seed paper's MH burn-in; ``warmup_metropolis`` of
        :func:`fedbayes_flwr.algorithms.dhmc.loop.simulate`).

    Returns
    -------
    HMCRun

    References
    ----------
    Neal (2011), "MCMC using Hamiltonian dynamics", Section 5.2 (one leapfrog step is the
    Langevin method); Hoffman & Gelman (2014), Algorithm 5.
    """
    w = np.array(w0, dtype=np.float64)
    k, d = w.shape
    u_w = total_potential.value(w)
    g_w = total_potential.grad(w)
    evals = 1
    da = dhmc.dual_averaging_init(step)
    eps = float(step)
    kept, accepts = [], []
    for it in range(warmup + iterations):
        rng = np.random.default_rng([seed, it])
        p, log_u = dhmc.shared_draws(rng, k, d)
        warm = it < warmup
        p_half = p - 0.5 * eps * g_w
        z = w + eps * p_half
        g_z = total_potential.grad(z)
        u_z = total_potential.value(z)
        evals += 1
        p_new = p_half - 0.5 * eps * g_z
        delta_h = u_z - u_w + 0.5 * np.sum(p_new**2, axis=-1) - 0.5 * np.sum(p**2, axis=-1)
        with np.errstate(over="ignore", invalid="ignore"):
            prob = np.where(np.isfinite(delta_h), np.minimum(1.0, np.exp(-delta_h)), 0.0)
        if warm and not warmup_metropolis:
            accepted = np.all(np.isfinite(z), axis=-1)
        else:
            accepted = log_u < -np.where(np.isfinite(delta_h), delta_h, np.inf)
        w = np.where(accepted[:, None], z, w)
        g_w = np.where(accepted[:, None], g_z, g_w)
        u_w = np.where(accepted, u_z, u_w)
        if warm:
            if adapt:
                da = dhmc.dual_averaging_step(da, float(np.mean(prob)), target_accept)
                eps = float(np.exp(da.log_eps if it < warmup - 1 else da.log_eps_bar))
            continue
        accepts.append(np.mean(accepted))
        kept.append(w)
    samples = np.stack(kept, axis=1) if kept else np.zeros((k, 0, d))
    return HMCRun(samples, float(np.mean(accepts)) if accepts else float("nan"), eps, evals)
