"""An (almost) empty exchange, as an algorithm plugin: Flower's own cost per exchange.

Every update sends each of the M clients one integer and takes one integer back; nothing is
computed. Loaded with ``algorithm-modules=benchmarks.flower.empty_exchange`` (both apps import it, so
it reaches the Ray actors), ``algorithm=empty-exchange``. ``benchmarks/pdmc/pdmc_throughput.py``
measures ``t_empty(M)`` with it.

References
----------
../shared/FLOWER_NOTES.md (the Simulation Engine's per-exchange floor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from fedbayes_flwr.algorithms.base import ActionSpec, Bundle, Request, StepInfo
from fedbayes_flwr.inference.posterior import GaussianPosterior


@dataclass(frozen=True)
class EmptyConfig:
    """No settings."""

    unused: int = 0


class State(NamedTuple):
    number: int


class Ping(NamedTuple):
    number: int


class Pong(NamedTuple):
    number: int


def _requests(state, setup, rnd):
    return {pid: Request("train", Ping(rnd.number)) for pid in range(setup.num_clients)}


def _client_step(seed, state, request, data, setup):
    return state, Pong(request.message.number), {}


def _server_step(state, replies, setup, rnd):
    return State(state.number + 1), StepInfo(updates=1, accepted=tuple(p for p, _ in replies))


BUNDLE = Bundle(
    name="empty_exchange", config_class=EmptyConfig, init_server=lambda setup: State(0),
    init_client=lambda setup, pid: State(0), requests=_requests, client_step=_client_step,
    server_step=_server_step, posterior=lambda state, setup: GaussianPosterior(setup.prior),
    actions=lambda setup: {"train": ActionSpec("train", Ping(0), Pong(0))},
    client_state_template=lambda setup: State(np.int64(0).item()))


def registrations():
    return [("empty-exchange", BUNDLE, None, "an empty exchange (benchmark probe)")]
