"""The shape every algorithm family shares: a *bundle* of pure functions over NamedTuple states.

A bundle (:class:`Bundle`) is what an engine needs to run a family, in-process or through Flower:

* ``init_server(setup) -> server_state`` and ``init_client(setup, partition_id) -> client_state``;
* ``requests(server_state, setup, rnd) -> {partition_id: Request}``: who gets what in this exchange
  (every client, one client, the idle ones, every worker for an event, each agent its neighbours'
  messages). A :class:`Request` carries an *action* tag (``"train"``, ``"evaluate"``, ...) whose
  :class:`ActionSpec` gives the Flower message category and the templates replies are validated
  against;
* ``client_step(seed, client_state, request, data, setup) -> (client_state, reply, info)``;
* ``server_step(server_state, [(partition_id, reply | Rejection)], setup, rnd) -> (state, StepInfo)``;
* ``posterior(server_state, setup)``: the common posterior interface
  (:class:`fedbayes_flwr.inference.posterior.Posterior`);
* ``check(server_state, setup, action, reply)``: the family's invariant (a precision stays positive,
  Dirichlet parameters stay positive), run after the structural validation of
  :func:`fedbayes_flwr.runtime.validation.check_message`, by both engines.

Seeds (:func:`round_seed`, :func:`client_seed`) are stateless ``int32[2]`` arrays keyed on the run
seed, the bundle, the update number, the partition and the attempt, never on message order, so
every engine draws the same numbers.

References
----------
Cabezas et al. (2024), "BlackJAX: Composable Bayesian inference in JAX" (init/step pairs over
NamedTuple states); Babuschkin et al. (2020), Optax (init/update); Dillon et al. (2017),
"TensorFlow Distributions" (TransitionKernel one_step / bootstrap_results).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from fedbayes_flwr.seeds import derive_seed

CATEGORIES = ("train", "evaluate", "query")
MODES = ("barrier", "apply-on-arrival")
FAILURE_POLICIES = ("reject", "retry", "stop", "retry-stop")


class Rejection(NamedTuple):
    """A reply the server refused (or that never came), with the field and the reason."""

    partition_id: int
    field: str
    reason: str


class Request(NamedTuple):
    """One message to one client: the bundle's action tag and the message NamedTuple."""

    action: str
    message: Any


class ActionSpec(NamedTuple):
    """How one action travels and what its reply must look like.

    Attributes
    ----------
    category : str
        Flower's message category: ``train``, ``evaluate`` or ``query`` (the message type is
        ``<category>.<bundle name>``).
    request : NamedTuple
        Template of the request (arrays of the expected shapes and dtypes).
    reply : NamedTuple
        Template of the reply.
    allow_inf : frozenset of str
        Reply fields (dotted, relative to the reply) where +/-inf is a valid value (a PDMC event
        time "no event before the horizon"); NaN is never valid.
    """

    category: str
    request: Any
    reply: Any
    allow_inf: frozenset = frozenset()


class Round(NamedTuple):
    """What an engine tells ``requests`` and ``server_step`` about the current exchange.

    Attributes
    ----------
    number : int
        1-based number of the server update this exchange works towards (an exchange that
        follows an update, e.g. PVI's free-energy query, belongs to the update it follows).
    step : int
        0-based index of this exchange within ``number`` (several exchanges per update: gossip).
    seed : numpy.ndarray
        The round seed (shared by all clients: e.g. common momentum), from :func:`round_seed`.
    idle : frozenset of int
        Partitions with no request in flight (all of them for barrier bundles).
    evaluate : bool
        Whether the engine records (evaluates and writes results) once update ``number`` is
        complete; a bundle may skip work that only serves the record (PVI's free energy).
    """

    number: int
    step: int
    seed: np.ndarray
    idle: frozenset
    evaluate: bool


class StepInfo(NamedTuple):
    """What a server step reports.

    Attributes
    ----------
    updates : int
        Algorithm updates made by this step (0 for intermediate exchanges); ``num-rounds`` and
        ``eval-every`` count these.
    accepted, rejected : tuple
        Partitions whose replies were applied; :class:`Rejection` s of this step.
    settled : bool
        False while the update just made (``updates >= 1``) still needs follow-up exchanges
        before it can be recorded (PVI's free-energy query): the next exchange keeps its update
        number. An exchange that works *towards* an update without making it (PVI's train
        exchange before its step search, a gossip round) returns ``updates = 0`` with
        ``settled = True``: the next exchange then has the same number ``update + 1``.
    metrics : dict
        Scalars for the history row (``log_marginal_likelihood``, ``prior_scale``, ...).
    diagnostics : dict
        Algorithm-specific diagnostics for the history row's ``diagnostics`` dict.
    """

    updates: int = 0
    accepted: tuple = ()
    rejected: tuple = ()
    settled: bool = True
    metrics: dict = {}
    diagnostics: dict = {}


class Setup(NamedTuple):
    """Everything fixed for a run that every step may read: the config reaches every step.

    Attributes
    ----------
    model : fedbayes_flwr.models.Model
    prior : fedbayes_flwr.inference.gaussian.NaturalGaussian
    num_clients : int
    num_features : int
    run_seed : int
    config : dataclass
        The bundle's own config section (e.g. :class:`fedbayes_flwr.algorithms.pvi.config.PVIConfig`).
    """

    model: Any
    prior: Any
    num_clients: int
    num_features: int
    run_seed: int
    config: Any


class ClientData(NamedTuple):
    """One client's training rows (``y`` is None for models without targets)."""

    x: np.ndarray
    y: np.ndarray | None


# The bundle's contract, one Protocol per function (BlackJAX's InitFn/UpdateFn and Optax's
# TransformInitFn/TransformUpdateFn are the models). States, messages and replies are the
# family's own NamedTuples, hence ``Any``.


class InitServerFn(Protocol):
    """``init_server(setup) -> server_state``."""

    def __call__(self, setup: Setup, /) -> Any: ...


class InitClientFn(Protocol):
    """``init_client(setup, partition_id) -> client_state``."""

    def __call__(self, setup: Setup, partition_id: int, /) -> Any: ...


class RequestsFn(Protocol):
    """``requests(server_state, setup, rnd) -> {partition_id: Request}``: who gets what."""

    def __call__(self, state: Any, setup: Setup, rnd: Round, /) -> Mapping[int, Request]: ...


class ClientStepFn(Protocol):
    """``client_step(seed, client_state, request, data, setup) -> (client_state, reply, info)``."""

    def __call__(self, seed: np.ndarray, state: Any, request: Request, data: ClientData,
                 setup: Setup, /) -> tuple[Any, Any, dict]: ...


class ServerStepFn(Protocol):
    """``server_step(server_state, [(partition_id, reply | Rejection)], setup, rnd)
    -> (server_state, StepInfo)``."""

    def __call__(self, state: Any, replies: Sequence[tuple[int, Any]], setup: Setup,
                 rnd: Round, /) -> tuple[Any, StepInfo]: ...


class PosteriorFn(Protocol):
    """``posterior(server_state, setup)``: the common posterior interface."""

    def __call__(self, state: Any, setup: Setup, /) -> Any: ...


class ActionsFn(Protocol):
    """``actions(setup) -> {action: ActionSpec}``."""

    def __call__(self, setup: Setup, /) -> Mapping[str, ActionSpec]: ...


class ClientStateTemplateFn(Protocol):
    """``client_state_template(setup)``: the template of the persisted client state."""

    def __call__(self, setup: Setup, /) -> Any: ...


class CheckFn(Protocol):
    """``check(server_state, setup, action, reply) -> (field, reason) | None``: invariants."""

    def __call__(self, state: Any, setup: Setup, action: str, reply: Any,
                 /) -> tuple[str, str] | None: ...


class ModeFn(Protocol):
    """``mode(config) -> "barrier" | "apply-on-arrival"``."""

    def __call__(self, config: Any, /) -> str: ...


class DoneFn(Protocol):
    """``done(server_state, setup) -> bool``, checked at evaluation points."""

    def __call__(self, state: Any, setup: Setup, /) -> bool: ...


class PolicyFn(Protocol):
    """``policy(config) -> str``: a failure policy that depends on the bundle's settings."""

    def __call__(self, config: Any, /) -> str: ...


class CorruptFn(Protocol):
    """``corrupt(kind, reply, request) -> reply``: the ``inject-fault`` testing hook."""

    def __call__(self, kind: str, reply: Any, request: Any, /) -> Any: ...


class PriorDiagFn(Protocol):
    """``prior_diag(config, model) -> bool``: whether the prior is held mean-field."""

    def __call__(self, config: Any, model: Any, /) -> bool: ...


class MemoryEstimate(NamedTuple):
    """What a run of a bundle will hold in memory, estimated before anything is allocated.

    Attributes
    ----------
    nbytes : int
        The estimate, in bytes.
    formula : str
        How it is counted, with the numbers put in (``(2 K + 4) d^2 x 8 bytes: K = 3, d = 200000``).
    alternative : str
        What to change for a smaller run (``pvi.covariance=diag``, fewer particles).
    """

    nbytes: int
    formula: str
    alternative: str


class MemoryFn(Protocol):
    """``memory_estimate(setup) -> MemoryEstimate | None``: the bundle's large arrays, from a
    :class:`Setup` whose ``prior`` is still None (the check runs before the prior is built)."""

    def __call__(self, setup: Setup, /) -> MemoryEstimate | None: ...


def _no_check(state: Any, setup: Setup, action: str, reply: Any, /) -> tuple[str, str] | None:
    return None


def _barrier(config: Any, /) -> str:
    return "barrier"


def _never(state: Any, setup: Setup, /) -> bool:
    return False


def _diag_if_mean_field(config: Any, model: Any, /) -> bool:
    return bool(model.mean_field_only)


class Bundle(NamedTuple):
    """One algorithm family: its pure functions and its config class (see the module docstring).

    Attributes
    ----------
    name : str
        A Python identifier (it routes Flower messages: ``train.<name>``), and the section name of
        its run-config keys (``<name>.<key>``).
    config_class : type
        A frozen dataclass with defaults; optional ``validate(self)`` raising
        :class:`fedbayes_flwr.errors.ConfigError`.
    init_server, init_client, requests, client_step, server_step, posterior
        See the module docstring.
    actions : callable
        ``actions(setup) -> {action: ActionSpec}``.
    client_state_template : callable
        ``client_state_template(setup)``: template of the client state (persisted between
        exchanges in Flower's ``context.state``).
    check : callable
        ``check(server_state, setup, action, reply) -> (field, reason) | None``: invariants.
    mode : callable
        ``mode(config) -> "barrier" | "apply-on-arrival"``.
    done : callable
        ``done(server_state, setup) -> bool``, checked at evaluation points (a target ESS).
    failure_policy : str or callable
        ``policy(config) -> str`` when it depends on the bundle's settings (e.g. decentralized
        HMC: ``retry-stop`` unless ``on-dropout = continue``), else one of:
        ``reject`` (go on without the reply), ``retry`` (re-send with a fresh attempt seed, up to
        ``max-retries``, then reject), ``stop`` (end the run with a one-line reason; results
        are written) or ``retry-stop`` (retry, then stop: for samplers whose target loses a term
        when a worker is dropped, e.g. PDMC).
    corrupt : callable or None
        ``corrupt(kind, reply, request) -> reply``: the ``inject-fault`` testing hook for
        bundle-specific faults (``nan`` is generic).
    prior_diag : callable
        ``prior_diag(config, model) -> bool``: whether the prior is held mean-field.
    structured_models : bool
        Whether the family runs the structured mean-field models (``gmm``, ``lda``,
        ``latent-feature``; :data:`fedbayes_flwr.models.STRUCTURED_MODELS`), which are not
        likelihoods over one parameter vector. Only AMPS does.
    memory_estimate : callable or None
        ``memory_estimate(setup) -> MemoryEstimate | None``: the memory the family's large arrays
        (a full covariance, particles and their kernel, Hessian bounds) will take, from a
        :class:`Setup` without its prior; the engines refuse a run whose estimate exceeds the
        available memory before allocating (:mod:`fedbayes_flwr.runtime.memory`).
    """

    name: str
    config_class: type
    init_server: InitServerFn
    init_client: InitClientFn
    requests: RequestsFn
    client_step: ClientStepFn
    server_step: ServerStepFn
    posterior: PosteriorFn
    actions: ActionsFn
    client_state_template: ClientStateTemplateFn
    check: CheckFn = _no_check
    mode: ModeFn = _barrier
    done: DoneFn = _never
    failure_policy: str | PolicyFn = "reject"
    corrupt: CorruptFn | None = None
    prior_diag: PriorDiagFn = _diag_if_mean_field
    structured_models: bool = False
    memory_estimate: MemoryFn | None = None


def auto_or_number(value, kind: type):
    """A config value that is ``"auto"`` or a number, as TOML and the CLI give it (maybe a
    number as text): ``"auto"`` unchanged, a number (or numeric text) as ``kind`` (an integral
    float for ``int``); anything else unchanged, for the config's ``validate`` to name."""
    if isinstance(value, bool) or value == "auto":
        return value
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return value
    if isinstance(value, int | float) and (kind is float or float(value).is_integer()):
        return kind(value)
    return value


def failure_policy(bundle: Bundle, config) -> str:
    """The bundle's failure policy (one of :data:`FAILURE_POLICIES`) under its ``config``."""
    policy = bundle.failure_policy
    return policy(config) if callable(policy) else policy


def round_seed(run_seed: int, bundle: str, number: int, step: int) -> np.ndarray:
    """The seed every client shares in exchange ``step`` of update ``number``."""
    return derive_seed(run_seed, f"{bundle}.round", number, -1, step)


def client_seed(run_seed: int, bundle: str, action: str, number: int, partition_id: int,
                attempt: int = 0) -> np.ndarray:
    """The seed of one client's work: keyed on partition and attempt (a retry draws afresh).

    The ``train`` action's stream is the bundle's name itself (PVI's seeds are unchanged since
    PVI was first written); other actions get ``<bundle>.<action>``.
    """
    stream = bundle if action == "train" else f"{bundle}.{action}"
    return derive_seed(run_seed, stream, number, partition_id, attempt)
