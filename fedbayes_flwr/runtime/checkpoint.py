"""Checkpoints: what a stopped run needs to continue, written atomically after every history row.

A checkpoint (``checkpoint.npz`` in the run's output directory) holds

* the run config (``result.json``'s ``run_config``) and the bundle's name;
* the engine's loop state: the number of server updates made (the last recorded one), and the
  virtual clock of apply-on-arrival runs. Seeds are stateless (keyed on the run seed, the update
  number, the partition and the attempt: :func:`fedbayes_flwr.algorithms.base.client_seed`), so
  the update number *is* the random state;
* the bundle's server state (any NamedTuple of arrays, scalars, nested NamedTuples and tuples);
* every client's state (in-process: the engine's own; Flower: uploaded by each node at checkpoint
  time, :mod:`clients.handler`), with the per-client *version* the server last saw, so a node
  that lost its state is detected instead of silently restarting from scratch;
* the recorder's history and counters.

Everything is stored without pickle: arrays in one ``.npz`` file, the structure (NamedTuple types
by module and qualified name, looked up among the modules already imported: the registry's and
the run's ``algorithm-modules``; no other name in the file is imported), scalars and the history
as JSON in the same file. The file is written to a
temporary name and renamed (``os.replace``), so a crash leaves the previous checkpoint whole.

Resuming a deterministic (barrier) schedule reproduces the uninterrupted run bit for bit. An
apply-on-arrival run resumes from its checkpointed state with every client idle (the replies in
flight when it stopped are dropped; commit-on-acknowledgement clients discard the factors those
replies proposed), so it continues correctly but not bit for bit.

The Flower side (asking nodes for their states, putting them back, versions) is
:mod:`strategies.checkpointing`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import warnings
import zipfile
import zlib
from typing import Any, NamedTuple

import numpy as np

from fedbayes_flwr.algorithms import registry
from fedbayes_flwr.inference.tree import is_namedtuple, leaves
from fedbayes_flwr.models import load_model_modules
from fedbayes_flwr.runtime.config import parse_run_config

FILE = "checkpoint.npz"
FORMAT_VERSION = 2
_META = "__meta__"
_DIGEST = "__sha256__"


# Flower glue: the client-state exchange (query.<bundle> messages with these actions) and the
# version every request and reply carries (the number of requests the client has processed).
STATE_GET, STATE_PUT = "client-state.get", "client-state.put"
VERSION_KEY = "client-version"
STATE_LOST = "client state lost"


class StateAck(NamedTuple):
    """Body of a client-state query and of its acknowledgement: the client's version."""

    version: int


def is_stateful(template) -> bool:
    """Whether a client state template holds anything (stateless clients keep empty arrays)."""
    arrays: list = []
    scalars = '"v":' in json.dumps(flatten(template, arrays))
    return scalars or any(a.size > 0 for a in arrays)


class CheckpointError(ValueError):
    """A checkpoint cannot be read or does not fit the run (one line naming what)."""


class Checkpoint(NamedTuple):
    """A run's resumable state.

    Attributes
    ----------
    bundle : str
        The bundle's name.
    engine : str
        The engine that wrote it (``in-process``, ``simulation``, ...).
    run_config : dict
        The kebab-case run config (``RunConfig.to_run_config()``).
    update : int
        Server updates made (the last history row's ``round``).
    server_state : NamedTuple
        The bundle's server state after ``update``.
    client_states : tuple
        Every partition's client state, in partition order (``()`` when not collected).
    client_versions : tuple of int
        Per partition, the client-state version the server last saw (Flower; ``()`` otherwise).
    history : list of dict
        The recorder's rows.
    counters : dict
        The recorder's ``accepted`` / ``rejected`` totals and ``elapsed_s``; the engine's
        ``virtual_time`` (apply-on-arrival).
    """

    bundle: str
    engine: str
    run_config: dict
    update: int
    server_state: Any
    client_states: tuple = ()
    client_versions: tuple = ()
    history: list = []
    counters: dict = {}


# ---------------------------------------------------------------------------- structure <-> JSON
def flatten(obj, arrays: list) -> Any:
    """A JSON-able description of ``obj``; its arrays are appended to ``arrays`` (by index).

    Handles NamedTuples (by type), tuples, lists, dicts with string keys, numpy arrays and
    scalars (kept with their dtype), Python scalars and None.
    """
    if is_namedtuple(obj):
        cls = type(obj)
        return {"nt": f"{cls.__module__}:{cls.__qualname__}",
                "f": {name: flatten(value, arrays) for name, value in zip(obj._fields, obj,
                                                                          strict=True)}}
    if isinstance(obj, np.ndarray | np.generic):
        arrays.append(np.asarray(obj))
        return {"a": len(arrays) - 1, "scalar": isinstance(obj, np.generic)}
    if isinstance(obj, tuple | list):
        return {"t" if isinstance(obj, tuple) else "l": [flatten(v, arrays) for v in obj]}
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError("checkpoint: dict keys must be strings")
        return {"d": {k: flatten(v, arrays) for k, v in obj.items()}}
    if obj is None or isinstance(obj, bool | int | float | str):
        return {"v": obj}
    raise TypeError(f"checkpoint: cannot store a {type(obj).__name__}")


def _namedtuple_class(name: str):
    module, _, qualname = name.partition(":")
    owner = sys.modules.get(module)  # never import what a file names: only known modules
    if owner is None:
        raise CheckpointError(f"checkpoint: type {name} belongs to a module that is not loaded")
    cls: Any = owner
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")):
        raise CheckpointError(f"checkpoint: {name} is not a NamedTuple type")
    return cls


def unflatten(desc, arrays) -> Any:
    """Inverse of :func:`flatten`."""
    if "nt" in desc:
        cls = _namedtuple_class(desc["nt"])
        if set(desc["f"]) != set(cls._fields):
            raise CheckpointError(f"checkpoint: {desc['nt']} has fields {list(cls._fields)}, "
                                  f"the file {list(desc['f'])}")
        return cls(**{k: unflatten(v, arrays) for k, v in desc["f"].items()})
    if "a" in desc:
        value = arrays[f"a{desc['a']}"]
        return value[()] if desc["scalar"] else value
    if "t" in desc:
        return tuple(unflatten(v, arrays) for v in desc["t"])
    if "l" in desc:
        return [unflatten(v, arrays) for v in desc["l"]]
    if "d" in desc:
        return {k: unflatten(v, arrays) for k, v in desc["d"].items()}
    return desc["v"]


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o)}")


# ---------------------------------------------------------------------------- files
def path_in(output_dir: str) -> str:
    return os.path.join(output_dir, FILE)


def _digest(meta_text: str, arrays) -> str:
    """SHA-256 over the metadata JSON and every array (dtype, shape, bytes), in index order."""
    h = hashlib.sha256(meta_text.encode())
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save(output_dir: str, ckpt: Checkpoint) -> str:
    """Write ``ckpt`` to ``output_dir/checkpoint.npz`` atomically; returns the path."""
    arrays: list = []
    structure = {"server_state": flatten(ckpt.server_state, arrays),
                 "client_states": flatten(tuple(ckpt.client_states), arrays)}
    meta = {"format": FORMAT_VERSION, "bundle": ckpt.bundle, "engine": ckpt.engine,
            "run_config": ckpt.run_config, "update": int(ckpt.update),
            "client_versions": [int(v) for v in ckpt.client_versions],
            "history": ckpt.history, "counters": ckpt.counters, "structure": structure}
    buffer = io.BytesIO()
    text = json.dumps(meta, default=_json_default)
    members = {_META: np.array(text), _DIGEST: np.array(_digest(text, arrays)),
               **{f"a{i}": a for i, a in enumerate(arrays)}}
    np.savez(buffer, **members)
    path = path_in(output_dir)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(buffer.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load(output_dir: str) -> Checkpoint:
    """Read the checkpoint of ``output_dir``; :class:`CheckpointError` names what is wrong.

    The file is refused, in one line naming it, when it cannot be read (truncated, emptied, a
    bad CRC), when its content digest (SHA-256 over the metadata and every array, written with
    it) does not match, or when its parts disagree (:func:`_check_parts`: the update count, the
    history rows, the client versions). The registry's bundles and the run's own
    ``algorithm-modules`` and ``model-modules`` (which the resumed run imports anyway) are
    loaded first, so the state types and the model resolve."""
    path = path_in(output_dir)
    if not os.path.isfile(path):
        where = repr(output_dir) if os.path.isabs(output_dir) else \
            f"{output_dir!r} (= {os.path.abspath(output_dir)})"
        raise CheckpointError(f"resume: no {FILE} in {where} (a run writes one after every "
                              f"recorded update)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        text = str(arrays.pop(_META))
        digest = str(arrays.pop(_DIGEST)) if _DIGEST in arrays else None
        meta = json.loads(text)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error,
            NotImplementedError, RuntimeError) as err:  # zipfile: unsupported flags, "encrypted"
        raise CheckpointError(f"resume: cannot read {path} ({type(err).__name__}: "
                              f"{str(err) or 'empty'})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"resume: {path} has format {found!r}, expected {FORMAT_VERSION}")
    ordered = [arrays.get(f"a{i}") for i in range(len(arrays))]
    if digest is None or any(a is None for a in ordered) or _digest(text, ordered) != digest:
        raise CheckpointError(f"resume: {path} does not match the content digest written with "
                              f"it (the file was changed after the run wrote it)")
    _check_parts(path, meta)
    registry.bundles()
    registry.load_modules(str(meta["run_config"].get("algorithm-modules", "")))
    load_model_modules(str(meta["run_config"].get("model-modules", "")))
    structure = meta["structure"]
    try:
        server_state = unflatten(structure["server_state"], arrays)
        client_states = unflatten(structure["client_states"], arrays)
    except (KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"resume: {path}: the stored state structure is broken "
                              f"({type(err).__name__}: {err})") from None
    return Checkpoint(meta["bundle"], meta["engine"], meta["run_config"], int(meta["update"]),
                      server_state, client_states, tuple(meta["client_versions"]),
                      meta["history"], meta["counters"])


def _check_parts(path: str, meta: dict) -> None:
    """Refuse a checkpoint whose parts disagree: ``update`` must be the last history row's
    ``round`` (any ``update >= 0`` with no rows: a strategy checkpointed without a recorder),
    the rows' rounds must increase, and there must be at most one client version per
    partition."""
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"resume: {path}: {why}")

    for key, kind in (("bundle", str), ("engine", str), ("run_config", dict), ("update", int),
                      ("client_versions", list), ("history", list), ("counters", dict),
                      ("structure", dict)):
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise bad(f"{key!r} is missing or not a {kind.__name__}")
    rows = meta["history"]
    if not all(isinstance(r, dict) and isinstance(r.get("round"), int) for r in rows):
        raise bad("a history row has no integer 'round'")
    rounds = [r["round"] for r in rows]
    if any(b <= a for a, b in zip(rounds, rounds[1:], strict=False)):
        raise bad(f"the history's rounds do not increase ({rounds[:10]}...)")
    if meta["update"] < 0 or (rounds and meta["update"] != rounds[-1]):
        raise bad(f"update {meta['update']} disagrees with the history (last recorded update "
                  f"{rounds[-1] if rounds else 'none'})")
    clients = meta["run_config"].get("num-clients")
    if isinstance(clients, int) and len(meta["client_versions"]) > clients:
        raise bad(f"{len(meta['client_versions'])} client versions for {clients} clients")


def check_fits(ckpt: Checkpoint, bundle_name: str, template) -> None:
    """Raise :class:`CheckpointError` unless ``ckpt`` holds ``bundle_name``'s server state of
    the template's type."""
    if ckpt.bundle != bundle_name:
        raise CheckpointError(f"resume: the checkpoint is of bundle {ckpt.bundle!r}, the run "
                              f"uses {bundle_name!r}")
    if type(ckpt.server_state) is not type(template):
        raise CheckpointError(f"resume: the checkpoint's server state is a "
                              f"{type(ckpt.server_state).__name__}, the bundle's a "
                              f"{type(template).__name__}")
    stored = {k: np.shape(v) for k, v in leaves(ckpt.server_state)
              if isinstance(v, np.ndarray | np.generic)}
    wanted = {k: np.shape(v) for k, v in leaves(template)
              if isinstance(v, np.ndarray | np.generic)}
    # the leading axis may grow during a run (sample buffers); the others are the model's
    wrong = [f"{k}: {stored[k]} (expected (..., {', '.join(map(str, shape[1:]))}))"
             for k, shape in wanted.items()
             if k in stored and (len(stored[k]) != len(shape) or stored[k][1:] != shape[1:])]
    if wrong:
        raise CheckpointError(f"resume: the checkpoint's server state has the wrong shapes "
                              f"({'; '.join(wrong[:3])})")


def check_client_count(ckpt: Checkpoint, num_clients: int) -> None:
    """Raise :class:`CheckpointError` unless ``ckpt`` holds one client state per partition."""
    if len(ckpt.client_states) != num_clients:
        raise CheckpointError(f"resume: the checkpoint holds {len(ckpt.client_states)} client "
                              f"states, the run has {num_clients} partitions")


def resume_config(ckpt: Checkpoint, output_dir: str, num_rounds: int | None = None):
    """The run config of a resumed run: the stored one, in ``output_dir``, with ``num_rounds``
    total updates when given (:class:`fedbayes_flwr.runtime.config.RunConfig`)."""

    values = {**ckpt.run_config, "output-dir": os.path.abspath(output_dir)}
    if num_rounds is not None:
        values["num-rounds"] = int(num_rounds)
    config = parse_run_config(values)
    if config.bundle_name != ckpt.bundle:
        raise CheckpointError(f"resume: the stored run config selects bundle "
                              f"{config.bundle_name!r}, the checkpoint holds {ckpt.bundle!r}")
    return config


# run-config keys a resumed run may set differently from the stored run
RESUME_MAY_CHANGE = ("num-rounds", "output-dir", "resume", "deployment-nodes")


def resumed(config):
    """``(config, checkpoint)`` for a run config whose ``resume`` key names a stored run's
    output directory; ``(config, None)`` when ``resume`` is empty.

    The returned config is the stored run's (:func:`resume_config`) with this config's
    ``num-rounds`` (total updates) and ``resume``, writing to the stored run's directory.
    Every other key must equal the stored value: under ``flwr run`` the ClientApps read the
    same run config as the ServerApp, so a different value would make another experiment.
    Raises :class:`CheckpointError` naming each key that differs (stored and given values).
    """
    if not config.resume:
        return config, None
    ckpt = load(config.resume)
    stored = resume_config(ckpt, config.resume, config.num_rounds)
    want, given = stored.to_run_config(), config.to_run_config()
    differ = [f"{k}: stored {want[k]!r}, given {given.get(k)!r}" for k in sorted(want)
              if k not in RESUME_MAY_CHANGE and given.get(k) != want[k]]
    if differ:
        raise CheckpointError(f"resume: the run config must be the stored run's (only "
                              f"num-rounds may change); differs in {'; '.join(differ)}")
    if os.path.abspath(config.output_dir) != stored.output_dir:
        warnings.warn(f"output-dir {config.output_dir!r} is not used: the resumed run goes on "
                      f"in {stored.output_dir}", stacklevel=2)
    # the nodes of THIS deployment (a resumed deployment registers new ones)
    return stored.replace(resume=stored.output_dir,
                          deployment_nodes=config.deployment_nodes), ckpt
