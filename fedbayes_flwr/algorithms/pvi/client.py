"""PVI's client side: the cavity, the local optimum of the local free energy against it, the
damped (client-held) or undamped (server-held) factor change, and the client's free-energy terms.

References
----------
Ashman et al. (2022), "Partitioned Variational Inference: A Framework for Probabilistic Federated
Learning", eq. (2) (local free energy), eq. (3) (factor update by division), Algorithm 1 (local update).
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.algorithms import commit
from fedbayes_flwr.algorithms.pvi import privacy
from fedbayes_flwr.algorithms.pvi.config import PVIConfig
from fedbayes_flwr.algorithms.pvi.messages import (
    CandidateMessage,
    CandidateReply,
    ClientMessage,
    ClientState,
    ServerMessage,
    StepMessage,
)
from fedbayes_flwr.algorithms.pvi.tempered import tempered
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.inference.posterior import GaussianPosterior


def init_client(prior: NaturalGaussian) -> ClientState:
    """A client starts with ``t_k = 1`` (zero natural parameters) of the prior's structure."""
    return commit.init(G.zeros(prior.dim, prior.is_diag))


def sync_client(state: ClientState, accepted_round: int) -> ClientState:
    """Commit the pending factor if the server accepted it, else drop it."""
    return commit.acknowledge(state, accepted_round)


def local_optimum(seed, model, x, y, cavity: NaturalGaussian, init: NaturalGaussian,
                  config: PVIConfig, num_clients: int = 1) -> NaturalGaussian:
    """``argmax_q F_k(q)``: closed form for conjugate models, else the configured optimiser;
    always DP-SGD in a DP run (``pvi.dp``: :func:`private_optimum`).

    For a conjugate model the tilted distribution ``q_cav x p(y_k | theta)`` is Gaussian; a full
    covariance family takes it exactly, a mean-field family takes its KL projection.
    """
    if config.private:
        return private_optimum(seed, model, x, y, cavity, init, config, num_clients)
    factor = model.likelihood_factor(x, y) if config.closed_form else None
    if factor is not None:
        tilted = G.add(G.like(factor, cavity), factor)
        return G.to_diag(tilted) if init.is_diag else tilted
    # TensorFlow is imported here, not with this module: conjugate models never need it, and a
    # deployed node starts a new process per message (FLOWER_NOTES: ~4 s of TensorFlow import)
    from fedbayes_flwr.inference.vi import fit_fixed_point, fit_gaussian, solve_local

    optimiser = config.local_optimiser
    if optimiser == "auto":
        optimiser = "solve" if model.deterministic_expectations else "adam"
    if optimiser == "solve":
        return solve_local(model, x, y, cavity, init)
    if optimiser == "fixed-point":
        return fit_fixed_point(seed, model, x, y, cavity, init, config.fixed_point_iterations,
                               config.local_damping, config.vi.mc_samples)
    return fit_gaussian(seed, model, x, y, cavity, model.local_init(init, x.shape[1]), config.vi)


def private_optimum(seed, model, x, y, cavity: NaturalGaussian, init: NaturalGaussian,
                    config: PVIConfig, num_clients: int) -> NaturalGaussian:
    """The DP-SGD local solve (:func:`fedbayes_flwr.inference.vi.fit_gaussian_dp_sgd`) with this
    client's sampling rate ``batch-size / n_k`` and noise multiplier (given, or calibrated for
    its ``n_k``: :mod:`fedbayes_flwr.algorithms.pvi.privacy`).

    References
    ----------
    Heikkila et al. (2023), "Differentially private partitioned variational inference", TMLR,
    Section 4 (DP-SGD clients).
    """
    from fedbayes_flwr.inference.vi import DPSGDConfig, fit_gaussian_dp_sgd

    n = int(x.shape[0])
    if config.batch_size > n:  # a node with its own data (the server checked the split ones)
        raise ValueError(f"pvi.batch-size: {config.batch_size} is larger than this partition's "
                         f"{n} rows (pvi.dp={config.dp})")
    dp = DPSGDConfig(float(config.dp_clip), privacy.noise_multiplier(config, n, num_clients),
                     privacy.sampling_rate(config.batch_size, n))
    return fit_gaussian_dp_sgd(seed, model, x, y, cavity, model.local_init(init, x.shape[1]),
                               config.vi, dp)


def cavity_for(config: PVIConfig, posterior: NaturalGaussian, factor: NaturalGaussian,
               prior: NaturalGaussian | None, num_clients: int) -> NaturalGaussian:
    """The effective prior of the local problem for each algorithm of the PVI family.

    References
    ----------
    Ashman et al. (2022), Section 4 and 5: PVI (``q / t_k``), streaming VB / VCL without deletion
    (``q``), Bayesian committee machines with the same prior (``p``) or a split prior (``p^(1/M)``).
    """
    if config.cavity == "pvi":
        return G.sub(posterior, factor)
    if config.cavity == "no-deletion":
        return posterior
    if prior is None:
        raise ValueError(f"cavity {config.cavity!r} needs the prior")
    prior = G.like(posterior, prior)
    return prior if config.cavity == "same-prior" else G.scale(prior, 1.0 / num_clients)


def client_step(seed, state: ClientState, message: ServerMessage, model, x, y, config: PVIConfig,
                prior: NaturalGaussian | None = None,
                num_clients: int = 1) -> tuple[ClientState, ClientMessage]:
    """One client update (Algorithm 1, step 2).

    Returns the new client state (the new factor pending) and the reply carrying
    ``delta = rho * (t_new - t_old)``. ``prior`` and ``num_clients`` are needed by the BCM cavities
    only. Without deletion (streaming VB) the factor grows by ``q_new / q`` every visit.
    """
    state = sync_client(state, message.accepted_round)
    cavity = cavity_for(config, message.posterior, state.value, prior, num_clients)
    q_new = local_optimum(seed, model, x, y, cavity, message.posterior, config, num_clients)
    if config.cavity == "no-deletion":
        change = G.sub(q_new, message.posterior)
    else:
        change = G.sub(G.sub(q_new, cavity), state.value)
    delta = G.scale(change, config.rho)
    pending = G.add(state.value, G.scale(delta, config.server_damping))
    return commit.propose(state, pending, message.server_round), ClientMessage(
        delta, int(x.shape[0]), message.server_round)


def undamped_change(seed, message: StepMessage, model, x, y, config: PVIConfig,
                    prior: NaturalGaussian | None = None, num_clients: int = 1) -> ClientMessage:
    """Server-held factors: the undamped change ``t_k' - t_k`` of the factor the server sent
    (without deletion: ``q' / q``); the client keeps nothing (the server picks the step).

    With a proximal weight ``beta = message.proximal > 0`` the local solve is

        q_k = argmax_q  E_q[log p(y_k | theta)] - KL(q || q_cav) - beta * KL(q || q),

    that is (the two KLs merge, natural parameters) ``a * E_q[log p(y_k | theta)] - KL(q || r)``
    with ``a = 1 / (1 + beta)`` and ``r = a * (q_cav + beta * q)``; ``t_k' = q_k / q_cav`` as
    before. As ``beta`` grows the change tends to ``a`` times the local natural gradient, and
    the clients' changes add up to ``a`` times the global one, an ascent direction of the
    global free energy.

    References
    ----------
    Ashman et al. (2022), PVI, eq. (2)-(3) (local free energy, factor update); Khan & Rue (2023),
    "The Bayesian Learning Rule", eq. (7) and Section 1.2 (a KL-proximal step is a natural-
    gradient step); Parikh & Boyd (2014), "Proximal Algorithms", Section 4.1.
    """
    factor = message.factor
    cavity = cavity_for(config, message.posterior, factor, prior, num_clients)
    beta = float(message.proximal)
    if beta > 0:
        power = 1.0 / (1.0 + beta)
        target = G.scale(G.add(cavity, G.scale(message.posterior, beta)), power)
        q_new = local_optimum(seed, tempered(model, power), x, y, target, message.posterior,
                              config)
    else:
        q_new = local_optimum(seed, model, x, y, cavity, message.posterior, config)
    if config.cavity == "no-deletion":
        change = G.sub(q_new, message.posterior)
    else:
        change = G.sub(G.sub(q_new, cavity), factor)
    return ClientMessage(change, int(x.shape[0]), message.server_round)


def candidate_terms(message: CandidateMessage, model, x, y) -> CandidateReply:
    """``E_q[log p(y_k | theta)]`` at every candidate ``q`` of a step search."""

    terms = [model.expected_log_likelihood(
        GaussianPosterior(G.make(message.eta1[j], message.eta2[j])), x, y)
        for j in range(message.eta1.shape[0])]
    return CandidateReply(np.asarray(terms, dtype=np.float64))


def free_energy_term(state: ClientState, posterior: NaturalGaussian, accepted_round: int, model,
                     x, y) -> tuple[ClientState, float]:
    """Client ``k``'s share of the global free energy at ``q``.

    ``F(q) = sum_k (E_q[log p(y_k | theta)] - E_q[eta_k . T(theta)]) + A(eta_q) - A(eta_0)``
    (Ashman et al. 2022, Section 2.2 and B.2: the sum of local free energies is the global free
    energy). The client computes its bracket; the server adds the log-normaliser difference.
    """

    state = sync_client(state, accepted_round)
    term = model.expected_log_likelihood(GaussianPosterior(posterior), x, y)
    return state, term - G.expected_dot(state.value, posterior)
