"""Run configuration: every run-config key, its default, its type and its check.

Keys are kebab-case as in Flower's ``[tool.flwr.app.config]`` (``num-rounds``); attributes are the
snake_case twins. :func:`parse_run_config` turns a Flower run-config (or the CLI's
``--run-config "k=v ..."``) into a validated :class:`RunConfig`; unknown keys and bad values raise
:class:`ConfigError` with one line naming the key.
"""

from __future__ import annotations

import dataclasses
import shlex
import tomllib
from dataclasses import dataclass

ALGORITHMS = ("pvi", "global-vi", "global-vi-federated", "bcm-same", "bcm-split", "vcl",
              "streaming-vb", "streaming-vb-no-deletion")
COVARIANCES = ("auto", "full", "diag")
FAULT_KINDS = ("nan", "negative-precision", "error", "drop")


class ConfigError(ValueError):
    """A run-config key is unknown or has a bad value."""


@dataclass(frozen=True)
class RunConfig:
    """All settings of one run. See README.md ("Run-config keys") for each key."""

    algorithm: str = "pvi"
    model: str = "logistic-regression"
    dataset: str = "breast-cancer"
    data: str = ""
    num_clients: int = 10
    partition: str = "dirichlet"
    partition_alpha: float = 0.5
    partition_classes: int = 2
    num_rounds: int = 10
    seed: int = 0
    prior_scale: float = 1.0
    noise_scale: float = 1.0
    schedule: str = "synchronous"
    damping: float = 0.5
    covariance: str = "auto"
    hidden_layers: str = "50"
    local_steps: int = 1000
    learning_rate: float = 0.1
    mc_samples: int = 10
    batch_size: int = 0
    test_fraction: float = 0.2
    synthetic_size: int = 200
    synthetic_dim: int = 3
    output_dir: str = "runs/flwr"
    inject_fault: str = ""
    server_damping: float = 1.0
    local_optimiser: str = "adam"
    fixed_point_iterations: int = 30
    local_damping: float = 0.5
    optimise_prior: bool = False
    client_delay: float = 0.0
    stragglers: str = ""
    straggler_factor: float = 5.0

    def to_run_config(self) -> dict:
        """The kebab-case dict (what ``result.json`` stores as ``run_config``)."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)


KEYS = tuple(f.name.replace("_", "-") for f in dataclasses.fields(RunConfig))


def _coerce(key: str, value, default):
    kind = type(default)
    if kind is bool:
        if isinstance(value, str):
            value = value.lower() in ("1", "true", "yes")
        return bool(value)
    try:
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if kind is float:
            return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"run-config key {key!r}: expected {kind.__name__}, got {value!r}") from None
    return str(value)


def parse_run_config(values: dict | None = None, base: RunConfig | None = None) -> RunConfig:
    """Build and validate a :class:`RunConfig` from kebab-case ``values`` over ``base``."""
    base = base or RunConfig()
    changes = {}
    for key, value in (values or {}).items():
        if key not in KEYS:
            raise ConfigError(f"unknown run-config key {key!r}; known keys: {', '.join(KEYS)}")
        name = key.replace("-", "_")
        changes[name] = _coerce(key, value, getattr(base, name))
    config = base.replace(**changes)
    validate(config)
    return apply_algorithm_preset(config)


def apply_algorithm_preset(c: RunConfig) -> RunConfig:
    """Fix the keys an algorithm defines (the README's algorithm table); the effective values are
    what ``result.json`` records.

    * ``bcm-same`` / ``bcm-split``: one synchronous round, no damping.
    * ``vcl`` / ``streaming-vb``: one sequential pass (``num-rounds = num-clients``), no deletion.
    * ``streaming-vb-no-deletion``: sequential passes that revisit clients without deleting.
    * ``global-vi``: the pooled data on one client, synchronous, no damping.
    * ``global-vi-federated``: synchronous, one natural-gradient step (``local-damping``) per
      client per round: global VI's dynamics (Ashman et al. 2022, Section 2.5).
    """
    if c.algorithm in ("bcm-same", "bcm-split"):
        return c.replace(num_rounds=1, schedule="synchronous", damping=1.0, server_damping=1.0)
    if c.algorithm in ("vcl", "streaming-vb"):
        return c.replace(num_rounds=c.num_clients, schedule="sequential", damping=1.0,
                         server_damping=1.0)
    if c.algorithm == "streaming-vb-no-deletion":
        return c.replace(schedule="sequential", damping=1.0, server_damping=1.0)
    if c.algorithm == "global-vi":  # one client: damping would only slow the fit down
        return c.replace(schedule="synchronous", damping=1.0, server_damping=1.0)
    if c.algorithm == "global-vi-federated":
        return c.replace(schedule="synchronous", damping=1.0, server_damping=1.0,
                         local_optimiser="fixed-point", fixed_point_iterations=1)
    return c


def straggler_ids(c: RunConfig) -> tuple[int, ...]:
    """Partition ids listed in ``stragglers`` (``"7,8,9"``)."""
    try:
        return tuple(int(s) for s in c.stragglers.replace(" ", "").split(",") if s)
    except ValueError:
        raise ConfigError(f"stragglers: expected comma-separated partition ids, got "
                          f"{c.stragglers!r}") from None


def parse_override_string(text: str) -> dict:
    """Parse Flower's ``--run-config "key=value key2='text'"`` syntax (TOML values)."""
    out = {}
    for item in shlex.split(text or "", posix=False):
        if "=" not in item:
            raise ConfigError(f"--run-config item {item!r} is not key=value")
        key, raw = item.split("=", 1)
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = raw.strip("'\"")
    return out


def parse_fault(text: str) -> tuple[str, int, int] | None:
    """``inject-fault`` = ``KIND@ROUND:PARTITION`` (testing hook) -> ``(kind, round, partition)``."""
    if not text:
        return None
    try:
        kind, rest = text.split("@")
        rnd, pid = rest.split(":")
        fault = (kind, int(rnd), int(pid))
    except ValueError:
        raise ConfigError(f"inject-fault {text!r}: expected KIND@ROUND:PARTITION") from None
    if kind not in FAULT_KINDS:
        raise ConfigError(f"inject-fault kind {kind!r}; choose one of {', '.join(FAULT_KINDS)}")
    return fault


def validate(c: RunConfig) -> None:
    """Raise :class:`ConfigError` for values no run can use (data-dependent checks come later)."""
    from .data import DATASETS, PARTITIONS, is_dataset_name
    from .models import MODELS
    from .pvi import LOCAL_OPTIMISERS, SCHEDULES

    def need(ok: bool, key: str, msg: str):
        if not ok:
            raise ConfigError(f"{key}: {msg}")

    need(c.algorithm in ALGORITHMS, "algorithm",
         f"unknown algorithm {c.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    need(c.model in MODELS, "model", f"unknown model {c.model!r}; choose one of {', '.join(MODELS)}")
    need(bool(c.data) or is_dataset_name(c.dataset), "dataset",
         f"unknown dataset {c.dataset!r}; choose one of {', '.join(DATASETS)}, hub:<id> "
         f"(flwr-datasets, needs network) or pass --data FILE.npz")
    need(c.partition in PARTITIONS, "partition",
         f"unknown partition {c.partition!r}; choose one of {', '.join(PARTITIONS)}")
    need(c.schedule in SCHEDULES, "schedule",
         f"unknown schedule {c.schedule!r}; choose one of {', '.join(SCHEDULES)}")
    need(c.covariance in COVARIANCES, "covariance",
         f"unknown covariance {c.covariance!r}; choose one of {', '.join(COVARIANCES)}")
    need(c.num_clients >= 1, "num-clients", f"must be >= 1, got {c.num_clients}")
    need(c.num_rounds >= 1, "num-rounds", f"must be >= 1, got {c.num_rounds}")
    need(c.seed >= 0, "seed", f"must be >= 0, got {c.seed}")
    need(c.prior_scale > 0, "prior-scale", f"must be > 0, got {c.prior_scale}")
    need(c.noise_scale > 0, "noise-scale", f"must be > 0, got {c.noise_scale}")
    need(0 < c.damping <= 1, "damping", f"must be in (0, 1], got {c.damping}")
    need(0 < c.server_damping <= 1, "server-damping", f"must be in (0, 1], got {c.server_damping}")
    need(0 < c.local_damping <= 1, "local-damping", f"must be in (0, 1], got {c.local_damping}")
    need(c.local_optimiser in LOCAL_OPTIMISERS, "local-optimiser",
         f"unknown local optimiser {c.local_optimiser!r}; choose one of {', '.join(LOCAL_OPTIMISERS)}")
    need(c.fixed_point_iterations >= 1, "fixed-point-iterations",
         f"must be >= 1, got {c.fixed_point_iterations}")
    need(c.client_delay >= 0, "client-delay", f"must be >= 0, got {c.client_delay}")
    need(c.straggler_factor >= 1, "straggler-factor", f"must be >= 1, got {c.straggler_factor}")
    bad = [k for k in straggler_ids(c) if not 0 <= k < c.num_clients]
    need(not bad, "stragglers", f"partition ids {bad} outside 0..{c.num_clients - 1}")
    need(c.partition_alpha > 0, "partition-alpha", f"must be > 0, got {c.partition_alpha}")
    need(c.partition_classes >= 1, "partition-classes", f"must be >= 1, got {c.partition_classes}")
    need(c.local_steps >= 1, "local-steps", f"must be >= 1, got {c.local_steps}")
    need(c.learning_rate > 0, "learning-rate", f"must be > 0, got {c.learning_rate}")
    need(c.mc_samples >= 1, "mc-samples", f"must be >= 1, got {c.mc_samples}")
    need(c.batch_size >= 0, "batch-size", f"must be >= 0 (0 = full batch), got {c.batch_size}")
    need(0 < c.test_fraction < 1, "test-fraction", f"must be in (0, 1), got {c.test_fraction}")
    parse_fault(c.inject_fault)
    from .bnn import parse_hidden

    try:
        parse_hidden(c.hidden_layers)
    except ValueError as err:
        raise ConfigError(f"hidden-layers: {err}") from None
    if c.model.startswith("bnn-"):
        need(c.covariance != "full", "covariance",
             f"model {c.model!r} supports only a mean-field posterior; use covariance='diag'")
