"""Run configuration: common keys at top level, each algorithm's keys in its own section.

Keys are kebab-case as in Flower's ``[tool.flwr.app.config]`` (``num-rounds``); an algorithm's
keys live in ``[tool.flwr.app.config.<bundle>]``, which Flower flattens to dotted keys
(``pvi.damping``). :func:`parse_run_config` turns a Flower run-config (or the CLI's
``--run-config "k=v ..."``) into a validated :class:`RunConfig`:

* a common key sets a :class:`RunConfig` field;
* ``<bundle>.<key>`` sets the chosen algorithm's section (a preset such as ``bcm-split`` uses its
  bundle's section, ``pvi``); a key of another registered bundle's section is ignored at its
  default value (``flwr run`` passes every section of ``pyproject.toml``) and refused at any
  other (it would have no effect);
* a bare key that is not common resolves to the chosen algorithm's section (``damping=0.5``
  with ``algorithm=pvi`` is ``pvi.damping``);
* anything else raises :class:`ConfigError` with one line naming the key and the known ones.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import tomllib
from dataclasses import dataclass
from typing import Any

from fedbayes_flwr.algorithms import registry
from fedbayes_flwr.data import DATASETS, PARTITIONS, is_dataset_name
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.models import load_model_modules, model_spec, parse_hidden
from fedbayes_flwr.models import registry as model_registry

__all__ = ["ConfigError", "RunConfig", "KEYS", "parse_run_config", "parse_override_string",
           "parse_fault", "parse_faults", "straggler_ids", "section_items", "section_keys",
           "FAULT_KINDS"]

# one-shot kinds hit one train reply (first attempt); raise-always and hang last from ROUND on
FAULT_KINDS = ("nan", "negative-precision", "error", "drop", "garbage", "huge", "raise-always",
               "hang")
# Float keys where infinity is meaningful: "no limit" (as is 0).
UNLIMITED_OK = ("max-seconds", "node-timeout")


@dataclass(frozen=True)
class RunConfig:
    """Common settings of one run plus the chosen algorithm's section (``section``).

    See docs/getting-started.md ("Run-config keys") for each key.
    """

    algorithm: str = "pvi"
    algorithm_modules: str = ""
    model_modules: str = ""
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
    hidden_layers: str = "50"
    test_fraction: float = 0.2
    synthetic_size: int = 200
    synthetic_dim: int = 3
    output_dir: str = "runs/flwr"
    eval_every: int = 1
    max_seconds: float = 0.0
    max_retries: int = 2
    node_timeout: float = 600.0
    round_timeout: float = 600.0
    inject_fault: str = ""
    client_delay: float = 0.0
    stragglers: str = ""
    straggler_factor: float = 5.0
    resume: str = ""
    deployment_nodes: str = ""
    section: Any = dataclasses.field(default=None, compare=True)

    @property
    def bundle_name(self) -> str:
        return registry.get(self.algorithm).bundle.name

    def to_run_config(self) -> dict:
        """The kebab-case dict (what ``result.json`` stores as ``run_config``): common keys,
        then the section's keys as ``<bundle>.<key>``."""
        out = {f.name.replace("_", "-"): getattr(self, f.name)
               for f in dataclasses.fields(self) if f.name != "section"}
        if self.section is not None:
            prefix = self.bundle_name
            out.update({f"{prefix}.{k}": v for k, v in section_items(self.section).items()})
        return out

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def with_section(self, **changes) -> RunConfig:
        """A copy with the section's fields (snake_case names) changed."""
        return dataclasses.replace(self, section=dataclasses.replace(self.section, **changes))


KEYS = tuple(f.name.replace("_", "-") for f in dataclasses.fields(RunConfig) if f.name != "section")


def section_items(section) -> dict:
    """``{kebab-case key: value}`` of an algorithm's config section (a dataclass instance;
    anything else has no keys)."""
    if not dataclasses.is_dataclass(section):
        return {}
    return {f.name.replace("_", "-"): getattr(section, f.name) for f in dataclasses.fields(section)}


def section_keys(config_class) -> tuple[str, ...]:
    """The kebab-case keys of an algorithm's config section."""
    return tuple(f.name.replace("_", "-") for f in dataclasses.fields(config_class))


def _coerce(key: str, value, default):
    kind = type(default)
    if kind is bool:
        if isinstance(value, str):
            if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ConfigError(f"run-config key {key!r}: expected true or false, got {value!r}")
            value = value.lower() in ("1", "true", "yes")
        return bool(value)
    try:
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if kind is float:
            out = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"run-config key {key!r}: expected {kind.__name__}, got {value!r}") from None
    if kind is float:
        if math.isnan(out) or (math.isinf(out) and key not in UNLIMITED_OK):
            raise ConfigError(f"run-config key {key!r}: expected a finite number, got {value!r}"
                              + ("" if math.isnan(out) else " (infinity means no limit only "
                                 f"for {', '.join(UNLIMITED_OK)})"))
        return out
    return str(value)


def _unknown(key: str, section_prefix: str, config_class) -> ConfigError:
    known = [*KEYS, *(f"{section_prefix}.{k}" for k in section_keys(config_class))]
    return ConfigError(f"unknown run-config key {key!r}; known keys: {', '.join(known)}")


def _foreign(key: str, value, prefix: str, sub: str, algorithm: str, other) -> ConfigError | None:
    """``None`` when ``prefix.sub = value`` is another bundle's section key at its declared
    default (what ``flwr run`` passes from ``pyproject.toml``), else the one-line error naming
    the section and the algorithms that use it."""
    default = getattr(other.config_class(), sub.replace("-", "_"))
    try:
        if _coerce(key, value, default) == default:
            return None
    except ConfigError:
        pass
    users = [e.name for e in registry.entries() if e.bundle.name == prefix]
    return ConfigError(f"run-config key {key!r}: section {prefix!r} is not used by algorithm "
                       f"{algorithm!r} (it is used by {', '.join(users)}); drop the key or choose "
                       f"one of those algorithms")


def parse_run_config(values: dict | None = None, base: RunConfig | None = None) -> RunConfig:
    """Build and validate a :class:`RunConfig` from kebab-case ``values`` over ``base``.

    A key of another algorithm's section is accepted only at its declared default (``flwr
    run`` passes every section of ``pyproject.toml``, whose values are the defaults); any other
    value is a :class:`ConfigError` naming the section and the algorithms that use it (the
    key would be silently unused)."""
    base = base or RunConfig()
    values = dict(values or {})
    modules = str(values.get("algorithm-modules", base.algorithm_modules))
    registry.load_modules(modules)
    load_model_modules(str(values.get("model-modules", base.model_modules)))
    algorithm = str(values.get("algorithm", base.algorithm))
    entry = registry.get(algorithm)
    bundle = entry.bundle
    config_class = bundle.config_class
    section = base.section if isinstance(base.section, config_class) else config_class()
    defaults = config_class()
    others = registry.bundles()
    common, section_changes = {}, {}
    for key, value in values.items():
        if key in KEYS:
            name = key.replace("-", "_")
            common[name] = _coerce(key, value, getattr(base, name))
            continue
        prefix, _, sub = key.rpartition(".")
        if prefix and prefix != bundle.name:
            if prefix in others and sub in section_keys(others[prefix].config_class):
                err = _foreign(key, value, prefix, sub, algorithm, others[prefix])
                if err is None:
                    continue  # another algorithm's default (flwr run passes all of pyproject)
                raise err
            raise _unknown(key, bundle.name, config_class)
        if sub not in section_keys(config_class):
            raise _unknown(key, bundle.name, config_class)
        name = sub.replace("-", "_")
        section_changes[name] = _coerce(key if prefix else f"{bundle.name}.{sub}", value,
                                        getattr(defaults, name))  # the declared kind
    section = dataclasses.replace(section, **section_changes)  # type: ignore[type-var]
    config = base.replace(**common, section=section)
    validate(config)
    if entry.preset is not None:
        fixed = entry.preset(config)
        _notice_overridden(algorithm, values, config, fixed)
        config = fixed
        validate(config)  # what the preset fixed must hold too (pdmc-bps with dp-epsilon)
    return config


class PresetNotice(UserWarning):
    """An algorithm preset changed a key the user set."""


def _notice_overridden(algorithm: str, values: dict, before: RunConfig, after: RunConfig) -> None:
    """One warning line per key the user set that the preset fixed to another value."""
    import warnings

    given, fixed = before.to_run_config(), after.to_run_config()
    for key in values:
        name = key if key in given else f"{after.bundle_name}.{key.rpartition('.')[2]}"
        if key != "algorithm" and name in fixed and fixed[name] != given.get(name):
            warnings.warn(f"algorithm {algorithm!r} fixes {key}={fixed[name]!r} "
                          f"(you gave {given[name]!r})", PresetNotice, stacklevel=3)


PRIOR_SCALE_RANGE = (1e-100, 1e100)
"""The prior scales accepted: ``1/s^2`` within ``[1e-200, 1e200]``, so that sums and products
with data terms (precisions, natural parameters) keep about 100 orders of magnitude of headroom
below float64's overflow (``1.8e308``) and above its underflow."""


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
    try:
        items = shlex.split(text or "", posix=False)
    except ValueError as err:  # e.g. "No closing quotation"
        raise ConfigError(f"--run-config {text!r}: {err}") from None
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--run-config item {item!r} is not key=value")
        key, raw = item.split("=", 1)
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = raw.strip("'\"")
    return out


def parse_faults(text: str) -> tuple[tuple[str, int, int], ...]:
    """``inject-fault`` = comma-separated ``KIND@ROUND:PARTITION`` specs (testing hook) ->
    ``((kind, round, partition), ...)``."""
    faults = (parse_fault(item) for item in text.replace(" ", "").split(",") if item)
    return tuple(f for f in faults if f is not None)  # a non-empty spec always parses


def parse_fault(text: str) -> tuple[str, int, int] | None:
    """One ``KIND@ROUND:PARTITION`` spec (testing hook) -> ``(kind, round, partition)``."""
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


def _one_of(names: list[str]) -> str:
    """``a, b, c or d`` (``none`` for an empty list)."""
    if not names:
        return "none"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def validate(c: RunConfig) -> None:
    """Raise :class:`ConfigError` for values no run can use (data-dependent checks come later)."""

    def need(ok: bool, key: str, msg: str):
        if not ok:
            raise ConfigError(f"{key}: {msg}")

    known = model_registry.ALL_MODELS  # read now: plugins (model-modules) included
    need(c.model in known, "model",
         f"unknown model {c.model!r}; choose one of {', '.join(known)} (or load a plugin "
         f"with model-modules)")
    bundle = registry.get(c.algorithm).bundle
    if getattr(model_spec(c.model), "structured", False) and not bundle.structured_models:
        able = [e.name for e in registry.entries() if e.bundle.structured_models]
        raise ConfigError(f"model: {c.model!r} is a mean-field exponential-family model with label "
                          f"symmetry; run it with {_one_of(able)}, not {c.algorithm!r}")
    need(bool(c.data) or is_dataset_name(c.dataset), "dataset",
         f"unknown dataset {c.dataset!r}; choose one of {', '.join(DATASETS)}, hub:<id> "
         f"(flwr-datasets, needs network) or pass --data FILE.npz")
    need(c.partition in PARTITIONS, "partition",
         f"unknown partition {c.partition!r}; choose one of {', '.join(PARTITIONS)}")
    need(bool(c.output_dir.strip()), "output-dir", "must not be empty")
    need(c.num_clients >= 1, "num-clients", f"must be >= 1, got {c.num_clients}")
    need(c.num_rounds >= 1, "num-rounds", f"must be >= 1, got {c.num_rounds}")
    need(c.seed >= 0, "seed", f"must be >= 0, got {c.seed}")
    need(c.prior_scale > 0, "prior-scale", f"must be > 0, got {c.prior_scale}")
    need(PRIOR_SCALE_RANGE[0] <= c.prior_scale <= PRIOR_SCALE_RANGE[1], "prior-scale",
         f"{c.prior_scale:g} is outside [{PRIOR_SCALE_RANGE[0]:g}, {PRIOR_SCALE_RANGE[1]:g}]: the "
         f"prior precision 1/prior-scale^2 and its products with the data must stay finite in "
         f"float64 (largest 1.8e308)")
    need(c.noise_scale > 0, "noise-scale", f"must be > 0, got {c.noise_scale}")
    need(c.eval_every >= 1, "eval-every", f"must be >= 1, got {c.eval_every}")
    need(c.max_seconds >= 0, "max-seconds",
         f"must be >= 0 (0 or inf = no limit), got {c.max_seconds}")
    need(c.max_retries >= 0, "max-retries", f"must be >= 0, got {c.max_retries}")
    need(c.node_timeout > 0, "node-timeout", f"must be > 0 seconds, got {c.node_timeout}")
    need(all(p.strip().isdigit() for p in c.deployment_nodes.split(",") if p.strip()),
         "deployment-nodes", f"must be comma-separated node ids, got {c.deployment_nodes!r}")
    need(c.round_timeout > 0, "round-timeout", f"must be > 0 seconds, got {c.round_timeout}")
    need(c.client_delay >= 0, "client-delay", f"must be >= 0, got {c.client_delay}")
    need(c.straggler_factor >= 1, "straggler-factor", f"must be >= 1, got {c.straggler_factor}")
    bad = [k for k in straggler_ids(c) if not 0 <= k < c.num_clients]
    need(not bad, "stragglers", f"partition ids {bad} outside 0..{c.num_clients - 1}")
    need(c.partition_alpha > 0, "partition-alpha", f"must be > 0, got {c.partition_alpha}")
    need(c.partition_classes >= 1, "partition-classes", f"must be >= 1, got {c.partition_classes}")
    need(0 < c.test_fraction < 1, "test-fraction", f"must be in (0, 1), got {c.test_fraction}")
    bad_faults = [f"{k}@{r}:{p}" for k, r, p in parse_faults(c.inject_fault)
                  if not 0 <= p < c.num_clients or r < 1]
    need(not bad_faults, "inject-fault", f"{', '.join(bad_faults)}: needs ROUND >= 1 and a PARTITION in "
         f"0..{c.num_clients - 1}")
    try:
        parse_hidden(c.hidden_layers)
    except ValueError as err:
        raise ConfigError(f"hidden-layers: {err}") from None
    check = getattr(c.section, "validate", None)  # the section's own checks (optional method)
    if check is not None:
        check(c)
