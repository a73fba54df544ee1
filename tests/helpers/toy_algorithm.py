"""A toy algorithm defined only inside tests: proof that a family plugs in without touching any
engine, strategy, client or config module.

One-shot merging of local exact Gaussian posteriors for conjugate models (``gaussian-mean``,
``linear-regression``): client k returns its exact local posterior ``p_k ∝ p(theta) l_k(theta)``;
the server merges the N accepted ones in natural parameters,
``eta = sum_k eta_k - (N - 1) eta_prior`` (every client's copy of the prior but one removed),
which is the exact global posterior when every client answers (and the exact posterior of the
answering clients' data otherwise).

Loaded by the ``algorithm-modules`` run-config key (``tests.helpers.toy_algorithm``), which both apps
import, so the registration reaches the CLI subprocess and the Ray actors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms.base import ActionSpec, Bundle, Rejection, Request, StepInfo
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.inference.posterior import GaussianPosterior


@dataclass(frozen=True)
class ToyConfig:
    prior_copies_removed: bool = True  # False: the naive product over-counts the prior


class ServerState(NamedTuple):
    prior: NaturalGaussian
    posterior: NaturalGaussian
    merged: int  # updates made (the merge is one-shot: 1 after the first)


class ClientState(NamedTuple):
    visits: np.ndarray  # int64 (1,)


class MergeRequest(NamedTuple):
    server_round: int


class MergeReply(NamedTuple):
    posterior: NaturalGaussian


def init_server(setup):
    return ServerState(setup.prior, setup.prior, 0)


def init_client(setup, partition_id):
    return ClientState(np.zeros(1, np.int64))


def requests(state, setup, rnd):
    if state.merged:  # one-shot: nothing more to ask
        return {}
    return {pid: Request("train", MergeRequest(rnd.number)) for pid in range(setup.num_clients)}


def client_step(seed, state, request, data, setup):
    factor = setup.model.likelihood_factor(data.x, data.y)
    local = G.add(G.like(factor, setup.prior), factor)
    return ClientState(state.visits + 1), MergeReply(local), {}


def server_step(state, replies, setup, rnd):
    if state.merged:
        return state, StepInfo(updates=1)
    accepted = [(pid, r) for pid, r in replies if not isinstance(r, Rejection)]
    rejected = tuple(r for _, r in replies if isinstance(r, Rejection))
    eta = state.prior
    for _, reply in accepted:
        eta = G.add(eta, G.sub(reply.posterior, state.prior) if setup.config.prior_copies_removed
                    else reply.posterior)
    return ServerState(state.prior, eta, 1), StepInfo(
        updates=1, accepted=tuple(pid for pid, _ in accepted), rejected=rejected)


def posterior(state, setup):
    return GaussianPosterior(state.posterior)


def actions(setup):
    return {"train": ActionSpec("train", MergeRequest(0), MergeReply(setup.prior))}


def check(state, setup, action, reply):
    if not G.is_proper(reply.posterior):
        return "posterior.eta2", "local posterior precision is not positive definite"
    return None


BUNDLE = Bundle(name="toy_merge", config_class=ToyConfig, init_server=init_server,
                init_client=init_client, requests=requests, client_step=client_step,
                server_step=server_step, posterior=posterior, actions=actions,
                client_state_template=lambda setup: init_client(setup, 0), check=check,
                done=lambda state, setup: bool(state.merged))


def registrations():
    return [("toy-merge", BUNDLE, None, "one-shot merge of exact local Gaussian posteriors (test)")]
