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

ALGORITHMS = ("pvi", "global-vi")
COVARIANCES = ("full", "diag")
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
    covariance: str = "full"
    local_steps: int = 1000
    learning_rate: float = 0.1
    mc_samples: int = 10
    batch_size: int = 0
    test_fraction: float = 0.2
    synthetic_size: int = 200
    synthetic_dim: int = 3
    output_dir: str = "runs/flwr"
    inject_fault: str = ""

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
    return config


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
    from .data import DATASETS, PARTITIONS
    from .models import MODELS
    from .pvi import SCHEDULES

    def need(ok: bool, key: str, msg: str):
        if not ok:
            raise ConfigError(f"{key}: {msg}")

    need(c.algorithm in ALGORITHMS, "algorithm",
         f"unknown algorithm {c.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    need(c.model in MODELS, "model", f"unknown model {c.model!r}; choose one of {', '.join(MODELS)}")
    need(bool(c.data) or c.dataset in DATASETS, "dataset",
         f"unknown dataset {c.dataset!r}; choose one of {', '.join(DATASETS)} or pass --data FILE.npz")
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
    need(c.partition_alpha > 0, "partition-alpha", f"must be > 0, got {c.partition_alpha}")
    need(c.partition_classes >= 1, "partition-classes", f"must be >= 1, got {c.partition_classes}")
    need(c.local_steps >= 1, "local-steps", f"must be >= 1, got {c.local_steps}")
    need(c.learning_rate > 0, "learning-rate", f"must be > 0, got {c.learning_rate}")
    need(c.mc_samples >= 1, "mc-samples", f"must be >= 1, got {c.mc_samples}")
    need(c.batch_size >= 0, "batch-size", f"must be >= 0 (0 = full batch), got {c.batch_size}")
    need(0 < c.test_fraction < 1, "test-fraction", f"must be in (0, 1), got {c.test_fraction}")
    parse_fault(c.inject_fault)
