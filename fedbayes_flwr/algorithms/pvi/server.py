"""PVI's server side: the initial state, client selection, the update by accepted deltas, the
step search over candidate posteriors (one exchange, the divergence guard, Anderson, the
non-monotone window), the staleness-aware asynchronous step, the log marginal likelihood and the
prior's empirical-Bayes scale.

References
----------
Ashman et al. (2022), "Partitioned Variational Inference: A Framework for Probabilistic Federated
Learning", Algorithm 1 (server update), Section 2.2 (the sum of local free energies is the global
free energy), Section 2.4 (damping).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms import bounds, commit
from fedbayes_flwr.algorithms.base import Rejection, StepInfo
from fedbayes_flwr.algorithms.commit import NO_ROUND
from fedbayes_flwr.algorithms.pvi import step as S
from fedbayes_flwr.algorithms.pvi.config import SCHEDULES, PVIConfig
from fedbayes_flwr.algorithms.pvi.messages import (
    PHASE_SEARCH,
    PHASE_TRAIN,
    ClientMessage,
    ServerInfo,
    ServerMessage,
    ServerState,
)
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.seeds import derive_seed, numpy_rng


def _stacked_zeros(prior: NaturalGaussian, count: int) -> NaturalGaussian:
    return NaturalGaussian(np.zeros((count, *prior.eta1.shape)),
                           np.zeros((count, *prior.eta2.shape)))


def init_server(prior: NaturalGaussian, num_clients: int,
                config: PVIConfig | None = None, monte_carlo: bool = False) -> ServerState:
    """Start with ``q = prior`` and every ``t_k = 1`` (held by the server too when ``config``
    uses server-held factors; ``monte_carlo``: the model's local solves are Monte Carlo, which
    sets the first proximal weight of ``proximal = auto``)."""
    G.check_proper(prior, "prior")
    state = ServerState(prior, prior, 0, np.full(num_clients, NO_ROUND, dtype=np.int64))
    if config is not None and config.private:
        state = state._replace(dp_examples=np.zeros(num_clients, dtype=np.int64),
                               dp_participations=np.zeros(num_clients, dtype=np.int64))
    if config is None or not config.server_held:
        return state
    zeros = _stacked_zeros(prior, num_clients)
    return state._replace(factors=zeros, deltas=zeros,
                          received=np.zeros(num_clients, dtype=bool),
                          # rows only for Anderson: 4 (m + 1) K d float64s otherwise unused
                          # (15 GB for 1,000 clients of a 79,510-parameter network)
                          history=S.init_history(zeros, config.anderson_memory
                                                 if config.acceleration == "anderson" else -1),
                          proximal=config.first_proximal(monte_carlo))


def factor_of(state: ServerState, partition_id: int) -> NaturalGaussian:
    """Client ``partition_id``'s factor as the server holds it."""
    return NaturalGaussian(state.factors.eta1[partition_id], state.factors.eta2[partition_id])


def select_clients(run_seed: int, server_round: int, num_clients: int, schedule: str) -> list[int]:
    """Partitions updated in ``server_round`` (1-based), sorted.

    ``sequential`` visits every client once per pass of ``num_clients`` rounds, each pass in a
    permutation seeded by (run seed, pass).
    """
    if schedule in ("synchronous", "asynchronous"):  # asynchronous: everyone starts at once
        return list(range(num_clients))
    if schedule == "sequential":
        pass_index, position = divmod(server_round - 1, num_clients)
        order = numpy_rng(derive_seed(run_seed, "pvi-order", pass_index, -1)).permutation(
            num_clients)
        return [int(order[position])]
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def broadcast(state: ServerState, partition_id: int) -> ServerMessage:
    """The message for ``partition_id`` in the coming round ``state.server_round + 1``."""
    return ServerMessage(state.posterior, state.server_round + 1,
                         int(state.accepted_round[partition_id]))


class Candidates(NamedTuple):
    """One search exchange: the candidate posteriors (stacked; improper ones replaced by the
    current ``q`` and flagged), the plain step of each (0 for the current ``q``, NaN for
    Anderson's point), which are proper, and Anderson's factors (or None)."""

    posteriors: NaturalGaussian
    steps: np.ndarray
    proper: np.ndarray
    anderson: NaturalGaussian | None


def _combined(state: ServerState, step: float) -> NaturalGaussian:
    """``q + step * delta_k`` for every client that sent one, in partition order."""
    posterior = state.posterior
    for pid in np.flatnonzero(state.received):
        delta = NaturalGaussian(state.deltas.eta1[pid], state.deltas.eta2[pid])
        posterior = G.add(posterior, G.scale(delta, step))
    return posterior


def _with_factors(state: ServerState, factors: NaturalGaussian) -> NaturalGaussian:
    """``q`` with every client's factor replaced by ``factors`` (stacked): ``q`` times
    ``prod_k factors_k / t_k``."""
    change = NaturalGaussian(factors.eta1.sum(0) - state.factors.eta1.sum(0),
                             factors.eta2.sum(0) - state.factors.eta2.sum(0))
    return G.add(state.posterior, G.like(state.posterior, change))


def round_first_step(state: ServerState, config: PVIConfig) -> float:
    """The first candidate step of this round: ``first-step``, or with ``step-memory`` at most
    twice the last step taken."""
    last = state.last_step
    if config.step_memory and np.isfinite(last) and last > 0:
        return min(config.first_step, 2.0 * float(last))
    return config.first_step


def candidates(state: ServerState, config: PVIConfig) -> Candidates:
    """The candidates of search exchange ``state.search`` (see :mod:`pvi_step`)."""
    steps = S.step_sizes(round_first_step(state, config), config.line_search_steps,
                         state.search)
    posts = [state.posterior] + [_combined(state, float(s)) for s in steps]
    all_steps = [0.0, *steps.tolist()]
    aa = None
    if config.acceleration == "anderson":
        aa = S.anderson(state.history) if state.search == 0 else None
        if aa is None:
            posts.append(state.posterior)
        else:
            posts.append(_with_factors(state, aa))
        all_steps.append(float("nan"))
    proper = np.array([bool(np.all(np.isfinite(q.eta1)) and np.all(np.isfinite(q.eta2))
                            and G.is_proper(q)) for q in posts])
    if aa is None and config.acceleration == "anderson":
        proper[-1] = False
    posts = [q if ok else state.posterior for q, ok in zip(posts, proper, strict=True)]
    stack = NaturalGaussian(np.stack([q.eta1 for q in posts]), np.stack([q.eta2 for q in posts]))
    return Candidates(stack, np.asarray(all_steps), proper, aa)


def search_step(state: ServerState, replies, config: PVIConfig, num_clients: int,
                exact_free_energy: bool = True):
    """Pick the step from the clients' expected log-likelihoods at the candidates and apply it
    (or ask for the next halvings, or roll the round back). ``exact_free_energy``: the model's
    expectations are deterministic (not Monte Carlo). Returns ``(state, StepInfo)``."""
    cands = candidates(state, config)
    rejected = tuple(r for _, r in replies if isinstance(r, Rejection))
    answered = [r for _, r in sorted(replies, key=lambda r: r[0]) if not isinstance(r, Rejection)]
    complete = len(answered) == num_clients
    diagnostics = {"pvi_search_exchanges": state.search + 1}
    if not answered:
        return _finish(state, 0.0, None, None, rejected, complete, {
            **diagnostics, "pvi_guard": "no client evaluated the candidates; round rolled back"},
            config.nonmonotone)
    ells = np.sum([r.expected_log_likelihood for r in answered], axis=0)
    values = np.array([S.free_energy(G.make(cands.posteriors.eta1[j], cands.posteriors.eta2[j]),
                                     state.prior, ells[j]) if cands.proper[j] else -np.inf
                       for j in range(len(ells))])
    f0, plain = values[0], values[1:1 + config.line_search_steps]
    rule = config.step_rule
    if rule == "auto":  # a numeric damping with the guard: plain backtracking from it
        rule = "safe" if config.auto and not exact_free_energy else "largest"
    index = S.choose(f0, plain, config.guard_tolerance, rule,
                     cands.steps[1:1 + config.line_search_steps], config.sufficient_increase,
                     first_has_margin=state.search == 0, unit_if_best=exact_free_energy)
    if cands.anderson is not None:
        aa_value = values[-1]
        floor = f0 - config.guard_tolerance * max(1.0, abs(f0))
        good = bool(np.isfinite(aa_value) and aa_value >= floor)
        diagnostics["pvi_anderson"] = bool(good)
        if good:
            return _finish(state, float("nan"), cands.anderson, float(aa_value), rejected,
                           complete, diagnostics, config.nonmonotone)
        state = state._replace(history=S.restart(state.history))
    steps = cands.steps[1:1 + config.line_search_steps]
    if state.proximal > 0:
        diagnostics["pvi_proximal"] = float(state.proximal)  # the beta of this round's deltas
    if index is None and state.search == 0 and config.adaptive_proximal:
        state = state._replace(proximal=raised_proximal(state.proximal))
        diagnostics["pvi_proximal_next"] = state.proximal
        if config.acceleration == "anderson":  # the fixed-point map changes with beta
            state = state._replace(history=S.restart(state.history))
    if index is None and state.search == 0:
        index = nonmonotone_index(state, config, plain, steps)
        if index is not None:
            diagnostics["pvi_guard"] = (
                f"no step keeps the free energy ({f0:.6g}); non-monotone step {steps[index]:.3g} "
                f"({plain[index]:.6g} >= {min(state.recent):.6g}, the lowest of the last "
                f"{len(state.recent)} rounds)")
            return _finish(state, float(steps[index]), None, float(plain[index]), rejected,
                           complete, diagnostics, config.nonmonotone)
    if index is None:
        if state.search + 1 < config.max_backtracks:
            # no update yet: the next exchange still works towards this update (settled, 0)
            return state._replace(search=state.search + 1), StepInfo(
                rejected=rejected, diagnostics=diagnostics)
        return _finish(state, 0.0, None, float(f0), rejected, complete, {
            **diagnostics, "pvi_guard": f"no step down to {steps[-1]:.3g} keeps the free energy "
                                        f"({f0:.6g}); round rolled back"}, config.nonmonotone)
    step = float(steps[index])
    floor = f0 - config.guard_tolerance * max(1.0, abs(f0))
    if (index > 0 or state.search > 0) and not values[1] >= floor:
        diagnostics["pvi_guard"] = (f"step {round_first_step(state, config):.3g} would lower "
                                    f"the free energy "
                                    f"({f0:.6g}); backtracked to {step:.3g}")
    elif index > 0 or state.search > 0:
        diagnostics["pvi_rule"] = f"step rule {rule!r} took {step:.3g}"
    return _finish(state, step, None, float(values[1 + index]), rejected, complete,
                   diagnostics, config.nonmonotone)


PROXIMAL_MAX = 16.0  # the largest adaptive proximal weight: changes of 1/17 of a full solve


def raised_proximal(beta: float) -> float:
    """``proximal = auto`` after a stalled round: ``1``, then doubled, up to
    :data:`PROXIMAL_MAX`."""
    return float(min(PROXIMAL_MAX, max(1.0, 2.0 * beta)))


def nonmonotone_index(state: ServerState, config: PVIConfig, values: np.ndarray,
                      steps: np.ndarray) -> int | None:
    """The non-monotone fallback (``pvi.nonmonotone``, with ``damping = auto``): the index of the
    largest candidate step at most the last step taken whose free energy ``values`` is at least
    the lowest of the last ``nonmonotone`` rounds' free energies; None when off, with a numeric
    damping (the guard stays strict), before any step was taken, or when no candidate
    qualifies.

    References
    ----------
    Grippo, Lampariello & Lucidi (1986), "A nonmonotone line search technique for Newton's
    method", SIAM J. Numer. Anal. 23(4), eq. (3) (the reference value is the extreme of the last
    ``M`` objective values; here the lowest, for ascent).
    """
    last = state.last_step
    if (not config.auto or config.nonmonotone <= 0 or not state.recent
            or not (np.isfinite(last) and last > 0)):
        return None
    floor = min(state.recent)
    ok = np.flatnonzero(np.isfinite(values) & (values >= floor) & (steps <= last * (1 + 1e-12)))
    return int(ok[0]) if ok.size else None


def _finish(state: ServerState, step: float, anderson: NaturalGaussian | None,
            value: float | None, rejected, complete: bool, diagnostics: dict, window: int):
    """Apply the chosen step (or Anderson's factors; step 0 rolls the round back) and close the
    round; a known free energy joins the non-monotone window of the last ``window`` rounds
    (``pvi.nonmonotone``; 0: none kept)."""
    if anderson is not None:
        factors = anderson
        posterior = _with_factors(state, anderson)
        accepted = tuple(range(state.received.shape[0]))
    elif step > 0:
        factors = G.add(state.factors, G.scale(state.deltas, step))
        posterior = _combined(state, step)
        accepted = tuple(int(k) for k in np.flatnonzero(state.received))
    else:
        factors, posterior, accepted = state.factors, state.posterior, ()
    free_energy = float("nan") if value is None or not complete else value
    diagnostics["pvi_step"] = "anderson" if anderson is not None else step
    recent = state.recent
    if window > 0 and np.isfinite(free_energy):
        recent = (*recent, float(free_energy))[-window:]
    state = state._replace(posterior=posterior, factors=factors, phase=PHASE_TRAIN, search=0,
                           received=np.zeros_like(state.received), free_energy=free_energy,
                           last_step=state.last_step if anderson is not None or step <= 0
                           else float(step), recent=recent)
    lml = None if np.isnan(free_energy) else free_energy
    return state, StepInfo(updates=1, accepted=accepted, rejected=rejected,
                           metrics={"log_marginal_likelihood": lml}, diagnostics=diagnostics)


def staleness_step(state: ServerState, request_round: int) -> float:
    """Asynchronous ``auto``: the step ``1 / sqrt(1 + tau)`` for a reply computed against the
    posterior of ``tau`` server updates ago (a fresh reply takes the full step).

    An asynchronous server has no free clients to evaluate the free energy, so the step is set
    by staleness, as in staleness-aware asynchronous SGD. On breast-cancer / Dirichlet 0.1 with
    10 clients (seed 0) damping 1 oscillates up to 5 posterior sd away; ``1 / (1 + tau)``
    crawls (0.41 sd after 280 updates); ``1 / sqrt(1 + tau)`` reaches 0.1 sd / 10% after 280
    (260 with three 5x stragglers), against about 190 for hand-tuned damping 0.5. Conjugate
    models converge to the exact posterior: each factor moves a fraction ``s`` of the way to its
    exact value at every visit.

    References
    ----------
    Zhang, Gupta, Lian & Liu (2016), "Staleness-aware Async-SGD for Distributed Deep Learning",
    IJCAI (learning rate divided by the staleness).
    """
    tau = max(0, state.server_round - (int(request_round) - 1))
    return float(1.0 / np.sqrt(1.0 + tau))


def collect_deltas(state: ServerState, replies, config: PVIConfig):
    """Server-held factors, train exchange: keep the round's undamped deltas; the next exchange
    is the step search."""
    rejected, deltas, received = [], _stacked_zeros(state.prior, state.received.shape[0]), \
        np.zeros_like(state.received)
    for pid, reply in sorted(replies, key=lambda r: r[0]):
        if isinstance(reply, Rejection):
            rejected.append(reply)
            continue
        deltas.eta1[pid], deltas.eta2[pid] = reply.delta.eta1, reply.delta.eta2
        received[pid] = True
    if config.schedule == "asynchronous":  # one reply: apply it now
        (pid, reply), = replies
        if isinstance(reply, Rejection):
            return state._replace(server_round=state.server_round + 1), StepInfo(
                updates=1, rejected=(reply,), metrics={"log_marginal_likelihood": None})
        step = staleness_step(state, reply.request_round)
        state = state._replace(server_round=state.server_round + 1, deltas=deltas,
                               received=received)
        state = state._replace(factors=G.add(state.factors, G.scale(deltas, step)),
                               posterior=_combined(state, step), received=np.zeros_like(received))
        return state, StepInfo(updates=1, accepted=(pid,), metrics={
            "log_marginal_likelihood": None}, diagnostics={"pvi_step": step})
    state = state._replace(server_round=state.server_round + 1, deltas=deltas, received=received)
    if not received.any():  # nothing to search: the round makes no change
        return state, StepInfo(updates=1, rejected=tuple(rejected), metrics={
            "log_marginal_likelihood": None if np.isnan(state.free_energy) else state.free_energy})
    if config.acceleration == "anderson":
        state = state._replace(history=S.push(state.history, state.factors, deltas))
    # no update yet: the search exchange works towards the same update (settled, 0 updates)
    return state._replace(phase=PHASE_SEARCH, search=0), StepInfo(rejected=tuple(rejected))


def check_delta(posterior: NaturalGaussian, delta: NaturalGaussian) -> tuple[str, str] | None:
    """Return ``(field, reason)`` if ``delta`` cannot be applied to ``posterior``, else ``None``:
    the updated posterior must be proper and within one update's bound of ``posterior`` (its
    precision grown at most ``2**52``-fold, its mean moved at most ``2**26`` standard
    deviations: :func:`fedbayes_flwr.algorithms.bounds.gaussian_step_error`)."""
    for field, got, want in (("delta.eta1", delta.eta1, posterior.eta1),
                             ("delta.eta2", delta.eta2, posterior.eta2)):
        if got.shape != want.shape:
            return field, f"shape {got.shape}, expected {want.shape}"
        if got.dtype != np.float64:
            return field, f"dtype {got.dtype}, expected float64"
        if not np.all(np.isfinite(got)):
            return field, "non-finite values"
    updated = G.add(posterior, delta)
    if not G.is_proper(updated):
        return "delta.eta2", "update makes the posterior precision non-positive-definite"
    return bounds.gaussian_step_error(posterior, updated)


def server_step(state: ServerState, replies: list[tuple[int, ClientMessage | Rejection]],
                server_damping: float = 1.0) -> tuple[ServerState, ServerInfo]:
    """Apply the round's replies in partition order (Algorithm 1, step 3).

    ``replies`` pairs each partition id with its decoded reply, or with a :class:`Rejection` made
    by the transport (undecodable reply, client error). Each accepted delta is scaled by
    ``server_damping``. A reply that fails :func:`check_delta` is rejected and leaves the
    posterior untouched. One call is one server update (asynchronous PVI calls it per reply).
    """
    posterior = state.posterior
    accepted_round = state.accepted_round
    server_round = state.server_round + 1
    accepted, rejected = [], []
    for pid, reply in sorted(replies, key=lambda r: r[0]):
        if isinstance(reply, Rejection):
            rejected.append(reply)
            continue
        damped = G.scale(reply.delta, server_damping)
        problem = check_delta(posterior, damped)
        if problem is not None:
            rejected.append(Rejection(pid, *problem))
            continue
        posterior = G.add(posterior, damped)
        accepted_round = commit.record_accepted(accepted_round, pid, reply.request_round)
        accepted.append(pid)
    new_state = state._replace(posterior=posterior, server_round=server_round,
                               accepted_round=accepted_round)
    return new_state, ServerInfo(tuple(accepted), tuple(rejected))


def log_marginal_likelihood(state: ServerState, terms: list[float]) -> float:
    """Server side of :func:`free_energy_term`: the global free energy, a lower bound on
    ``log p(y)`` that is tight at the exact posterior of a conjugate model."""
    return float(np.sum(terms) + G.log_partition(state.posterior) - G.log_partition(state.prior))


def optimise_prior_scale(state: ServerState) -> tuple[ServerState, float]:
    """Variational-EM step for the prior scale: maximise the free energy over ``s`` in
    ``p = N(0, s^2 I)`` with ``q`` fixed, ``s^2 = E_q[theta^T theta] / d``, then rebuild
    ``q = p_new x prod t_k`` (the factors are unchanged).

    For conjugate models the factors are exact, so the iteration is EM on the evidence
    ``log p(y | s)`` and converges to its maximiser.

    References
    ----------
    Ashman et al. (2022), Appendix A (hyperparameter learning by maximising the free energy).
    """
    mean, cov = G.to_moments(state.posterior)
    second = float(mean @ mean + (cov.sum() if state.posterior.is_diag else np.trace(cov)))
    scale = float(np.sqrt(second / state.posterior.dim))
    var = np.full(state.posterior.dim, scale**2)
    prior = G.from_moments(np.zeros(state.posterior.dim), var if state.prior.is_diag else np.diag(var))
    posterior = G.add(G.sub(state.posterior, state.prior), prior)
    return state._replace(prior=prior, posterior=posterior), scale
