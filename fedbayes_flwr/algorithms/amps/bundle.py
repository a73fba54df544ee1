"""AMPS and its baselines as one bundle: one round, every client fits, the server merges.

Notation: ``N`` accepted clients, ``lambda_0`` the prior's parameters, ``lambda_i`` client
``i``'s local posterior (NamedTuples of :mod:`fedbayes_flwr.inference.expfam` blocks, see
:mod:`fedbayes_flwr.inference.vb`), ``K`` components.

**Exchanges.** One update (``num-rounds`` is fixed to 1 by every name):

1. ``latent-feature`` only, once: a ``query`` in which every client reports its data moments
   (row count and sum of squares); the server estimates the features' prior precision ``nu0``
   from their sum (:meth:`~fedbayes_flwr.inference.vb.latent_feature.LatentFeature.
   prior_precision_from_moments`) and sends the resulting prior to everyone, so every client
   uses the same prior (Campbell & How 2014, Section 3.3: "nu_k0 was estimated from the data").
   It counts as no update; with every reply rejected the update is spent and nothing merged.
2. ``train``: the server sends ``lambda_0``; every client runs mean-field coordinate ascent with
   ``amps.restarts`` random symmetry-breaking starts (ELBO tolerance ``amps.tol``, at most
   ``amps.max-iter`` sweeps; vector models: the exact conjugate posterior or the local VI
   optimum) and sends ``lambda_i`` once, with its ELBO and fitting time.

**Server.** A reply is rejected, with the field and the reason, when ``lambda_i`` leaves its
family's domain or ``lambda_i - lambda_0`` is not a valid likelihood contribution (negative added
counts or precision; :func:`fedbayes_flwr.algorithms.amps.merge.contribution_error`), or has the wrong
number of
components (the structural check). ``N`` counts the accepted replies only. Then, by
``amps.variant``:

* ``amps``: :func:`fedbayes_flwr.algorithms.amps.merge.align` with ``amps.search`` (``bipartite``: iterative
  maximum-weight matching; ``swap``: the paper's pairwise swaps), then
  ``lambda = (1 - N) lambda_0 + sum_i P_i lambda_i``;
* ``naive-merge``: the same without permutations (the paper's eq. 3);
* ``local-only``: the lowest accepted partition's own posterior (a single agent's view).

``batch-vb`` is ``naive-merge`` with one client holding every row (the batch reference). Models
without label symmetry (``gaussian-mean``, ``linear-regression``, ``logistic-regression``)
have nothing to align: ``amps`` equals ``naive-merge`` there.

Metrics per update: the AMPS objective ``J`` of the merge and of the naive merge, the merge's
wall time; diagnostics: search sweeps and evaluations, the clients' ELBOs and fitting times.

References
----------
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", eq. (3) (naive merge),
eqs. (10)-(12) (AMPS), Sections 3.1-3.3 (the models, searches and nu_k0).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from fedbayes_flwr.algorithms.amps import merge as merging
from fedbayes_flwr.algorithms.base import ActionSpec, Bundle, Rejection, Request, StepInfo
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.inference.posterior import GaussianPosterior, StructuredPosterior
from fedbayes_flwr.inference.vb.gaussian_vector import GaussianVector, to_natural
from fedbayes_flwr.models import model_spec
from fedbayes_flwr.seeds import numpy_rng

VARIANTS = ("amps", "naive-merge", "local-only")
VECTOR_MODELS = ("gaussian-mean", "linear-regression", "logistic-regression")
TRAIN, MOMENTS = "train", "moments"


@dataclass(frozen=True)
class AMPSConfig:
    """AMPS settings: the run-config section ``[tool.flwr.app.config.amps]``.

    Attributes
    ----------
    variant : str
        ``amps``, ``naive-merge`` or ``local-only``; set by the algorithm names.
    search : str
        ``bipartite`` (iterative maximum-weight matching) or ``swap`` (pairwise swaps).
    components : int
        ``K``: mixture components, topics or latent features (structured models).
    restarts : int
        Random restarts of each local fit; the best ELBO is kept.
    tol : float
        Relative ELBO change that ends a local fit.
    max_iter : int
        Coordinate-ascent sweeps per restart at most.
    concentration : float
        ``gmm``: the weights' Dirichlet parameter; ``latent-feature``: ``Beta(c, c)``.
    doc_concentration : float
        ``lda``: the documents' Dirichlet ``alpha`` (0 = ``1 / K``).
    topic_concentration : float
        ``lda``: the topics' Dirichlet ``eta``.
    """

    variant: str = "amps"
    search: str = "bipartite"
    components: int = 3
    restarts: int = 5
    tol: float = 1e-6
    max_iter: int = 500
    concentration: float = 1.0
    doc_concentration: float = 0.0
    topic_concentration: float = 0.1

    def validate(self, run) -> None:
        """Raise :class:`ConfigError` (one line naming the key) for values no run can use."""

        def need(ok: bool, key: str, msg: str):
            if not ok:
                raise ConfigError(f"amps.{key}: {msg}")

        need(self.variant in VARIANTS, "variant",
             f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        need(self.search in merging.SEARCHES, "search",
             f"unknown search {self.search!r}; choose one of {', '.join(merging.SEARCHES)}")
        need(self.components >= 1, "components", f"must be >= 1, got {self.components}")
        need(self.restarts >= 1, "restarts", f"must be >= 1, got {self.restarts}")
        need(self.tol > 0, "tol", f"must be > 0, got {self.tol}")
        need(self.max_iter >= 1, "max-iter", f"must be >= 1, got {self.max_iter}")
        need(self.concentration > 0, "concentration", f"must be > 0, got {self.concentration}")
        need(self.doc_concentration >= 0, "doc-concentration",
             f"must be >= 0 (0 = 1/K), got {self.doc_concentration}")
        need(self.topic_concentration > 0, "topic-concentration",
             f"must be > 0, got {self.topic_concentration}")
        structured = getattr(model_spec(run.model), "structured", False)
        if not structured and run.model not in VECTOR_MODELS:
            raise ConfigError(f"model: AMPS runs the structured models (gmm, lda, "
                              f"latent-feature) and {', '.join(VECTOR_MODELS)}, not "
                              f"{run.model!r} (its local posterior has no closed form)")


class ServerState(NamedTuple):
    """The prior the clients fit from, the merged posterior (the prior until merged), the round
    and the features' prior precision (``latent-feature``; 0 until estimated)."""

    prior: Any
    posterior: Any
    server_round: int
    prior_precision: float


class ClientState(NamedTuple):
    """Clients keep nothing: one fit per run."""

    empty: np.ndarray


class Down(NamedTuple):
    prior: Any
    server_round: int


class Up(NamedTuple):
    """``lambda_i``, its ELBO (0 for vector models), sweeps, rows, round and fitting seconds."""

    posterior: Any
    elbo: float
    iterations: int
    num_examples: int
    request_round: int
    fit_seconds: float


class MomentsQuery(NamedTuple):
    server_round: int


class MomentsReply(NamedTuple):
    moments: np.ndarray


# ---------------------------------------------------------------------------- the model
def vb_model(setup, prior_precision: float | None = None):
    """The run's :class:`~fedbayes_flwr.inference.vb.VBModel`: a structured model built from the AMPS
    section, or a vector model wrapped by
    :class:`~fedbayes_flwr.inference.vb.gaussian_vector.GaussianVector`."""
    if getattr(setup.model, "structured", False):
        nu0 = prior_precision if prior_precision and prior_precision > 0 else None
        return setup.model.vb(setup.config, setup.num_features, setup.prior, nu0)

    return GaussianVector(setup.model, setup.prior)


def _needs_moments(state: ServerState, setup) -> bool:
    return bool(getattr(setup.model, "needs_moments", False)) and state.prior_precision <= 0


def fit_local(seed, prior, data, setup) -> Up:
    """One client's local posterior from ``prior`` (module docstring, exchange 2)."""
    config = setup.config
    vb = vb_model(setup)
    check = getattr(setup.model, "check_data", None)
    reason = check(data.x) if check else None
    if reason:
        raise ValueError(reason)
    start = time.perf_counter()
    kwargs = {"y": data.y} if getattr(vb, "needs_targets", False) else {}
    result = vb.fit(data.x, prior, numpy_rng(seed), restarts=config.restarts, tol=config.tol,
                    max_iter=config.max_iter, **kwargs)
    elbo = float(result.elbo) if np.isfinite(result.elbo) else 0.0
    return Up(result.params, elbo, int(result.iterations), int(data.x.shape[0]), 0,
              time.perf_counter() - start)


def merge_replies(prior, posteriors: list, setup) -> tuple[Any, dict, dict]:
    """The server's merge of accepted posteriors by ``amps.variant``: ``(merged, metrics,
    diagnostics)``."""
    config = setup.config
    symmetric = vb_model(setup).symmetric
    start = time.perf_counter()
    naive = merging.objective(prior, posteriors, None, symmetric)
    diagnostics = {}
    if config.variant == "local-only":
        merged, value = posteriors[0], float("nan")
    elif config.variant == "naive-merge":
        merged, value = merging.merge(prior, posteriors, None, symmetric), naive
    else:
        found = merging.align(prior, posteriors, symmetric, config.search)
        merged, value = merging.merge(prior, posteriors, found.perms, symmetric), found.objective
        diagnostics = {"search_sweeps": found.sweeps, "search_evaluations": found.evaluations}
    seconds = time.perf_counter() - start
    metrics = {"merge_seconds": round(seconds, 6), "naive_objective": naive}
    if np.isfinite(value):
        metrics["objective"] = value
    return merged, metrics, diagnostics


class MergeError(RuntimeError):
    """The merged parameters left their family's domain (cannot happen with valid
    contributions; reported rather than returned)."""


# ---------------------------------------------------------------------------- bundle functions
def _init_server(setup) -> ServerState:
    prior = vb_model(setup).prior()
    return ServerState(prior, prior, 0, 0.0)


def _init_client(setup, partition_id: int) -> ClientState:
    return ClientState(np.zeros(0))


def _requests(state: ServerState, setup, rnd) -> dict[int, Request]:
    clients = range(setup.num_clients)
    if _needs_moments(state, setup):
        return {pid: Request(MOMENTS, MomentsQuery(state.server_round)) for pid in clients}
    number = state.server_round + 1
    return {pid: Request(TRAIN, Down(state.prior, number)) for pid in clients}


def _client_step(seed, state: ClientState, request: Request, data, setup):
    if request.action == MOMENTS:
        return state, MomentsReply(vb_model(setup).data_moments(data.x)), {}
    up = fit_local(seed, request.message.prior, data, setup)
    return state, up._replace(request_round=request.message.server_round), {}


def _server_step(state: ServerState, replies, setup, rnd):
    rejected = tuple(r for _, r in replies if isinstance(r, Rejection))
    good = sorted(((pid, r) for pid, r in replies if not isinstance(r, Rejection)),
                  key=lambda item: item[0])
    accepted = tuple(pid for pid, _ in good)
    if _needs_moments(state, setup):
        if not good:  # the update is spent: nothing can be fitted without the shared prior
            return (state._replace(server_round=state.server_round + 1),
                    StepInfo(updates=1, rejected=rejected))
        total = np.sum([r.moments for _, r in good], axis=0)
        nu0 = float(vb_model(setup).prior_precision_from_moments(total))
        prior = vb_model(setup, nu0).prior()
        return (state._replace(prior=prior, posterior=prior, prior_precision=nu0),
                StepInfo(updates=0, accepted=accepted, rejected=rejected,
                         diagnostics={"prior_precision": nu0}))
    posterior, metrics, diagnostics = state.posterior, {}, {}
    if good:
        posterior, metrics, diagnostics = merge_replies(state.prior, [r.posterior for _, r in good],
                                                        setup)
        reason = merging.contribution_error(state.prior, posterior)
        if reason and setup.config.variant != "local-only":
            raise MergeError(f"amps: the merged posterior is invalid ({reason})")
        elbos = [r.elbo for _, r in good]
        seconds = [r.fit_seconds for _, r in good]
        diagnostics.update({"clients_merged": len(good), "elbo_mean": float(np.mean(elbos)),
                            "fit_seconds_max": float(np.max(seconds)),
                            "fit_seconds_mean": float(np.mean(seconds))})
        if state.prior_precision > 0:
            diagnostics["prior_precision"] = state.prior_precision
    return (state._replace(posterior=posterior, server_round=state.server_round + 1),
            StepInfo(updates=1, accepted=accepted, rejected=rejected, metrics=metrics,
                     diagnostics=diagnostics))


def _posterior(state: ServerState, setup):
    if getattr(setup.model, "structured", False):
        return StructuredPosterior(state.posterior, vb_model(setup, state.prior_precision))

    return GaussianPosterior(to_natural(state.posterior))


def _actions(setup) -> dict[str, ActionSpec]:
    prior = vb_model(setup).prior()
    actions = {TRAIN: ActionSpec("train", Down(prior, 0), Up(prior, 0.0, 0, 0, 0, 0.0))}
    if getattr(setup.model, "needs_moments", False):
        actions[MOMENTS] = ActionSpec("query", MomentsQuery(0), MomentsReply(np.zeros(2)))
    return actions


def _client_state_template(setup) -> ClientState:
    return ClientState(np.zeros(0))


def _check(state: ServerState, setup, action: str, reply) -> tuple[str, str] | None:
    """A valid likelihood contribution answering this round, at most ``2**52`` times the
    prior's scale per datum (:mod:`fedbayes_flwr.algorithms.bounds`); non-negative moments."""
    if action == MOMENTS:
        if reply.moments[0] < 1 or np.any(reply.moments < 0):
            return "moments", f"need a row count >= 1 and non-negative sums, got {reply.moments}"
        return None
    if reply.num_examples < 1:
        return "num_examples", f"must be >= 1, got {reply.num_examples}"
    if reply.request_round != state.server_round + 1:
        return "request_round", (f"answers round {reply.request_round}, expected "
                                 f"{state.server_round + 1}")
    reason = (merging.contribution_error(state.prior, reply.posterior)
              or merging.contribution_size_error(state.prior, reply.posterior,
                                                 reply.num_examples))
    return ("posterior", reason) if reason else None


def _corrupt(kind: str, reply, request: Request):
    """``negative-precision``: the first block's first precision / concentration array negated
    (an invalid likelihood contribution)."""
    if kind == "negative-precision" and request.action == TRAIN:
        post = reply.posterior
        first = post[0]
        bad = first._replace(**{first._fields[-1]: -np.abs(first[-1])})
        return reply._replace(posterior=post._replace(**{post._fields[0]: bad}))
    raise ValueError(f"AMPS cannot make a {kind!r} fault")


def _prior_diag(config: AMPSConfig, model) -> bool:
    return False


BUNDLE = Bundle(
    name="amps", config_class=AMPSConfig, init_server=_init_server, init_client=_init_client,
    requests=_requests, client_step=_client_step, server_step=_server_step,
    posterior=_posterior, actions=_actions, client_state_template=_client_state_template,
    check=_check, corrupt=_corrupt, prior_diag=_prior_diag, structured_models=True)


def _variant(name: str, one_client: bool = False):
    def preset(c):
        c = c.replace(num_rounds=1, num_clients=1) if one_client else c.replace(num_rounds=1)
        return c.with_section(variant=name)
    return preset


PRESETS = {
    "amps": (_variant("amps"), "AMPS: local mean-field VB, one upload, the server aligns each "
                               "client's component labels (permutation search) and merges"),
    "naive-merge": (_variant("naive-merge"), "the same upload merged without alignment: "
                                             "lambda = (1 - N) lambda_0 + sum_i lambda_i"),
    "batch-vb": (_variant("naive-merge", one_client=True),
                 "mean-field VB on the pooled data (one client): the batch reference"),
    "local-only": (_variant("local-only"), "one agent's own posterior (the lowest accepted "
                                           "partition): the single-agent baseline"),
}


def registrations():
    """``(name, bundle, preset, description)`` for AMPS and its baselines."""
    return [(name, BUNDLE, preset, description) for name, (preset, description) in PRESETS.items()]
