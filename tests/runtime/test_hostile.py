"""Hostile input: property-based tests (hypothesis) over everything a peer or a user can send.

Three suites, each at least 500 derandomised examples (reproducible in CI):

* the codec: arbitrary and malformed Flower records decoded against every registered action's
  request and reply templates either give a message that passes the template's validation or
  raise :class:`fedbayes_flwr.codec.CodecError` naming a field (never another exception);
* reply validation: for every registered bundle (a cheap setup per family and variant) and each
  action it actually requests, a reply mutated at random (shapes, dtypes, NaN/inf, huge values,
  missing and extra keys, wrong schema version, undecodable arrays, client errors) goes through
  the Flower strategy's own path (``BundleStrategy._decode``: codec, then
  :func:`fedbayes_flwr.runtime.steps.judge` = ``check_message`` + ``bundle.check``, then
  ``server_step``). It is either a :class:`Rejection` (and the server state afterwards equals the
  state after a plain "no reply", compared field by field with ``np.array_equal``; a
  ``stop``-policy sampler stops with one line before any step instead) or accepted (and no
  field an honest reply keeps finite becomes NaN/inf); no exception escapes and the state the
  reply was judged against is never modified in place;
* dataset loading: random ``.npz`` files (random keys, dtypes, shapes, NaN/inf, junk bytes) given
  as ``data=`` either load into a dataset that keeps :class:`fedbayes_flwr.data.Dataset`'s
  documented invariants or raise :class:`fedbayes_flwr.data.DataError` /
  :class:`fedbayes_flwr.errors.ConfigError` with one line.

The Simulation Engine is not started: the strategy is driven directly, without a Grid.
"""

from __future__ import annotations

import copy
import functools
import io
import os
import tempfile
import warnings
import zipfile

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, RecordDict
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedbayes_flwr import codec
from fedbayes_flwr.algorithms.base import Rejection, Round, failure_policy, round_seed
from fedbayes_flwr.data import DataError, load_dataset
from fedbayes_flwr.errors import ConfigError, RunStopped
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import _InProcess
from fedbayes_flwr.runtime.experiment import MISMATCH, build_experiment, num_classes
from fedbayes_flwr.runtime.steps import Tally, stop_on_failure
from fedbayes_flwr.runtime.validation import check_message
from tests.helpers.flower_utils import task_identity

SETTINGS = settings(max_examples=500, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ------------------------------------------------------------------ cheap setups, one per variant
GM = {"model": "gaussian-mean", "dataset": "synthetic", "synthetic-dim": 2, "synthetic-size": 40,
      "num-clients": 3, "partition": "iid", "seed": 1}
AMPS = {"algorithm": "amps", "num-clients": 3, "partition": "iid", "amps.restarts": 1,
        "amps.max-iter": 5}
PARTICLES = {"dsvgd.num-particles": 4, "dsvgd.local-iterations": 3,
             "dsvgd.distillation-iterations": 3}
VARIANTS = {
    "pvi": {**GM, "algorithm": "pvi"},
    "pvi-async": {**GM, "algorithm": "pvi", "pvi.schedule": "asynchronous"},
    "pvi-sequential": {**GM, "algorithm": "pvi", "pvi.schedule": "sequential"},
    "dsvgd": {**GM, "algorithm": "dsvgd", **PARTICLES},
    "u-dsvgd": {**GM, "algorithm": "u-dsvgd", **PARTICLES},
    "dsgld": {**GM, "algorithm": "dsgld", "sgld.num-chains": 3, "sgld.steps-per-round": 3},
    "fedavg": {**GM, "model": "linear-regression", "algorithm": "fedavg",
               "fedavg.local-steps": 3},
    "fedavg-paper": {**GM, "model": "linear-regression", "algorithm": "fedavg-paper",
                     "fedavg.local-steps": 3},
    "amps-gmm": {**AMPS, "model": "gmm", "dataset": "amps-mixture"},
    "amps-lda": {**AMPS, "model": "lda", "dataset": "lda-corpus"},
    "amps-latent-feature": {**AMPS, "model": "latent-feature", "dataset": "latent-features"},
    "pdmc": {**GM, "algorithm": "pdmc", "pdmc.num-chains": 3},
    "pdmc-bps": {**GM, "algorithm": "pdmc-bps", "pdmc.num-chains": 3},
    "dhmc": {**GM, "model": "linear-regression", "algorithm": "dhmc", "dhmc.num-chains": 3,
             "dhmc.warmup": 2, "dhmc.iterations": 4, "dhmc.mixing-rounds": 2},
}
# exchanges of an honest run per variant, to collect the states each action is requested in
# (AMPS: a moments query, if any, then the one upload; the others alternate their actions)
EXCHANGES = {"amps-gmm": 1, "amps-lda": 1, "amps-latent-feature": 2}


def test_every_registered_bundle_and_action_is_exercised():
    """A family (or an action) added to the registry without a setup here that requests it
    would escape the reply suite below. Bundles defined by tests (the toy) are not counted."""
    from fedbayes_flwr.algorithms import registry

    requested: dict[str, set] = {}
    for name in VARIANTS:
        exp = _experiment(name)
        requested.setdefault(exp.bundle.name, set()).update(
            req.action for snap in _snapshots(name) for req in snap.requests.values())
        assert requested[exp.bundle.name] <= set(exp.actions)
    for bundle_name, bundle in registry.bundles().items():
        if not bundle.init_server.__module__.startswith("fedbayes_flwr."):
            continue
        assert bundle_name in requested, f"no variant here runs the {bundle_name} bundle"
        actions = {name: _experiment(name).actions for name in VARIANTS
                   if _experiment(name).bundle.name == bundle_name}
        every = set().union(*(set(a) for a in actions.values()))
        assert requested[bundle_name] == every, (bundle_name, every - requested[bundle_name])


@functools.cache
def _experiment(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_experiment(parse_run_config(VARIANTS[name]))


class Snapshot:
    """One exchange of an honest in-process run: the server state its replies are judged
    against, the round, the requests and the honest (judged) replies."""

    def __init__(self, state, rnd, requests, replies):
        self.state, self.rnd, self.requests, self.replies = state, rnd, requests, replies
        self.frozen = copy.deepcopy(state)  # what ``state`` must still equal after every use


@functools.cache
def _snapshots(name):
    """The exchanges of a short honest run (the in-process engine's own client side)."""
    exp = _experiment(name)
    bundle, setup = exp.bundle, exp.setup
    arrival = bundle.mode(setup.config) == "apply-on-arrival"
    state, side, tally = bundle.init_server(setup), _InProcess(exp), Tally()
    everyone = frozenset(range(exp.num_clients))
    out, number, step, settled = [], 0, 0, True
    for _ in range(EXCHANGES.get(name, 4)):
        number, step = (number + 1, 0) if settled else (number, step + 1)
        rnd = Round(number, step, round_seed(setup.run_seed, bundle.name, number, step),
                    everyone, True)
        requests = dict(sorted(bundle.requests(state, setup, rnd).items()))
        replies = {pid: side.reply(state, pid, req, number, 0, tally)
                   for pid, req in requests.items()}
        assert not any(isinstance(r, Rejection) for r in replies.values()), name
        out.append(Snapshot(state, rnd, requests, replies))
        if arrival:  # apply-on-arrival: one reply per server step
            replies = dict([min(replies.items())])
        state, info = bundle.server_step(state, sorted(replies.items()), setup, rnd)
        settled = info.settled
    return tuple(out)


def _strategy(name):
    """A fresh strategy (it keeps per-partition state: dead partitions, client versions)."""
    from strategies.base import BundleStrategy

    exp = _experiment(name)
    strategy = BundleStrategy(exp.bundle, exp.setup, run_config=exp.config.to_run_config())
    strategy.nodes = {pid: 100 + pid for pid in range(exp.num_clients)}
    strategy.partition_of = {node: pid for pid, node in strategy.nodes.items()}
    return strategy


# ------------------------------------------------------------------ state comparison
def _same(a, b) -> bool:
    """Exact equality of two (nested) states: arrays by dtype and ``np.array_equal``."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, tuple | list):
        return (type(a) is type(b) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b, strict=True)))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _non_finite(state, path: str = "") -> set:
    """Dotted paths of the state's fields holding NaN or +/-inf (a state may hold NaN as a
    sentinel, e.g. a free energy not computed yet: only fields an honest run keeps finite
    must stay finite)."""
    if isinstance(state, np.ndarray):
        bad = state.dtype.kind in "fc" and not np.all(np.isfinite(state))
        return {path} if bad else set()
    if isinstance(state, tuple | list):
        names = getattr(state, "_fields", range(len(state)))
        return set().union(*(_non_finite(v, f"{path}.{n}")
                             for n, v in zip(names, state, strict=True)))
    if isinstance(state, float) and not np.isfinite(state):
        return {path}
    return set()


# ------------------------------------------------------------------ hostile values
HUGE = (1e308, -1e308, 1e300, -1e300, 1e154, np.finfo(np.float64).max, 5e-324, -0.0)
INT64 = st.integers(-(2**63), 2**63 - 1)
config_scalars = st.one_of(
    INT64, st.sampled_from([0, -1, 1, 2, 2**31, -(2**63), 2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(HUGE),
    st.booleans(), st.text(max_size=8), st.binary(max_size=8))
config_values = st.one_of(
    config_scalars, st.lists(INT64, max_size=3), st.lists(st.floats(), max_size=3),
    st.lists(st.text(max_size=3), max_size=3))
dtypes = st.one_of(hnp.scalar_dtypes(), hnp.byte_string_dtypes(max_len=3),
                   hnp.unicode_string_dtypes(max_len=3),
                   st.sampled_from([np.dtype("float64"), np.dtype("float32"), np.dtype("int64")]))
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.sampled_from(HUGE))
any_arrays = dtypes.flatmap(lambda dt: hnp.arrays(dt, shapes))


@st.composite
def malformed_arrays(draw):
    """An ``Array`` whose metadata and bytes disagree, or whose bytes are not a ``.npy``."""
    data = draw(st.one_of(
        st.binary(max_size=64),
        any_arrays.map(lambda a: Array(a).data),  # a valid .npy of some other array
        st.just(_npz_bytes()),  # a zip archive, which np.load opens as NpzFile
        st.builds(lambda b, cut: b[:cut], any_arrays.map(lambda a: Array(a).data),
                  st.integers(0, 200)),  # truncated
        st.just(b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, "
                b"'shape': (1000000000000,), }" + b" " * 40 + b"\n")))  # a huge header
    dtype = draw(st.one_of(st.sampled_from(["float64", "int64", "object", "", "garbage", "<f8",
                                            "V0", "S-1"]), st.text(max_size=6)))
    shape = draw(st.lists(st.integers(-3, 2**40), max_size=4).map(tuple))
    stype = draw(st.sampled_from(["numpy.ndarray", "torch.Tensor", "", "pickle"]))
    return Array(dtype, shape, stype, data)


@functools.cache
def _npz_bytes():
    buf = io.BytesIO()
    np.savez(buf, a=np.zeros(3))
    return buf.getvalue()


@st.composite
def same_shape_values(draw, array: np.ndarray):
    """The array's own shape and dtype with hostile values (NaN, inf, huge, tiny, random)."""
    if array.dtype.kind == "f":
        return draw(hnp.arrays(array.dtype, array.shape, elements=floats))
    return draw(hnp.arrays(array.dtype, array.shape))


MUTATIONS = st.sampled_from((
    "array-values", "array-values", "array-scale", "array-any", "array-malformed", "array-drop",
    "array-extra", "config-value", "config-drop", "config-extra", "schema", "record-drop"))
SCHEMA_VERSIONS = st.one_of(st.sampled_from((0, 2, -1, 1.0, True, "1", b"\x01")), config_values)


@st.composite
def hostile_records(draw, valid: RecordDict) -> RecordDict:
    """``valid`` with 0-4 random mutations (a few examples stay valid on purpose)."""
    arrays = dict(valid.array_records["arrays"].items())
    config = dict(valid.config_records["config"].items())
    honest = {key: array.numpy() for key, array in arrays.items()}  # shapes and dtypes
    records = {"arrays": True, "config": True}
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(MUTATIONS)
        akey = draw(st.sampled_from(tuple(sorted(arrays)))) if arrays else None
        ckey = draw(st.sampled_from(tuple(sorted(config))))
        if kind == "array-values" and akey in honest:
            arrays[akey] = Array(draw(same_shape_values(honest[akey])))
        elif kind == "array-scale" and akey in honest and honest[akey].dtype.kind == "f":
            factor = draw(st.sampled_from((1e150, -1e150, 1e300, 1e-300, -1.0, 0.0)))
            with np.errstate(all="ignore"):
                arrays[akey] = Array(np.ascontiguousarray(honest[akey] * factor))
        elif kind == "array-any" and akey:
            arrays[akey] = Array(np.ascontiguousarray(draw(any_arrays)))
        elif kind == "array-malformed" and akey:
            arrays[akey] = draw(malformed_arrays())
        elif kind == "array-drop" and akey:
            del arrays[akey]
        elif kind == "array-extra":
            key = draw(st.one_of(st.text(min_size=1, max_size=8),
                                 st.sampled_from(tuple(sorted(arrays)) or ("x",)).map(lambda k: k + ".x")))
            arrays[key] = Array(np.ascontiguousarray(draw(any_arrays)))
        elif kind == "config-value":
            config[ckey] = draw(config_values)
        elif kind == "config-drop":
            config.pop(ckey)
            if not config:
                config["schema-version"] = codec.SCHEMA_VERSION
        elif kind == "config-extra":
            config[draw(st.text(min_size=1, max_size=8))] = draw(config_values)
        elif kind == "schema":
            config["schema-version"] = draw(SCHEMA_VERSIONS)
        elif kind == "record-drop":
            records[draw(st.sampled_from(tuple(sorted(records))))] = False
    content = RecordDict()
    if records["arrays"]:
        content[draw(st.sampled_from(("arrays", "arrays", "Arrays")))] = ArrayRecord(arrays)
    if records["config"]:
        content[draw(st.sampled_from(("config", "config", "cfg")))] = ConfigRecord(config)
    return content


def _one_line(text: str) -> bool:
    return bool(text) and "\n" not in text


# ------------------------------------------------------------------ (a) the codec
def _templates():
    """``(kind, template, allow_inf)`` of every request and reply of every variant."""
    out = []
    for name in VARIANTS:
        exp = _experiment(name)
        for action, spec in exp.actions.items():
            out.append((f"{exp.bundle.name}.{action}", spec.request, frozenset()))
            out.append((f"{exp.bundle.name}.{action}.reply", spec.reply, spec.allow_inf))
    return out


@st.composite
def codec_cases(draw):
    kind, template, allow_inf = draw(st.sampled_from(_TEMPLATES))
    return kind, template, allow_inf, draw(hostile_records(codec.encode(template, kind)))


_TEMPLATES = _templates()


@SETTINGS
@given(case=codec_cases(), exact=st.booleans())
def test_codec_decodes_or_names_the_field(case, exact):
    """``decode`` returns a message its template accepts, or raises CodecError naming a field;
    ``received_nbytes`` (counted before decoding) never raises."""
    kind, template, allow_inf, content = case
    assert codec.received_nbytes(content) >= 0
    try:
        message = codec.decode(content, kind, template, allow_inf, exact_shapes=exact)
    except codec.CodecError as err:
        assert _one_line(err.field) and _one_line(err.reason), err
        event("codec: CodecError")
        return
    event("codec: decoded")
    version = content.config_records["config"]["schema-version"]
    assert type(version) is int and version == codec.SCHEMA_VERSION  # not True, not 1.0
    assert check_message(template, message, allow_inf, exact_shapes=exact) is None
    # the codec only returns the template's scalar types (no numpy scalars, no lists)
    assert _scalar_types(template) == _scalar_types(message)


def _scalar_types(message):
    if isinstance(message, tuple):
        return tuple(_scalar_types(v) for v in message)
    return "array" if isinstance(message, np.ndarray) else type(message)


# ------------------------------------------------------------------ (b) reply validation
@st.composite
def reply_cases(draw):
    name = draw(st.sampled_from(tuple(sorted(VARIANTS))))
    snapshots = _snapshots(name)
    snap = draw(st.sampled_from(snapshots))
    pid = draw(st.sampled_from(tuple(sorted(snap.requests))))
    action = snap.requests[pid].action
    bundle = _experiment(name).bundle
    valid = codec.encode(snap.replies[pid], f"{bundle.name}.{action}.reply")
    if draw(st.integers(0, 19)) == 0:  # the client's ClientApp raised: an error reply
        reason = draw(st.one_of(st.text(max_size=20), st.just(f"ValueError: {MISMATCH} x")))
        return name, snap, pid, Error(code=draw(st.integers(0, 10)), reason=reason)
    return name, snap, pid, draw(hostile_records(valid))


@functools.cache
def _no_reply_state(name, snap_index, pid):
    """The server state after this exchange when ``pid`` sent nothing valid."""
    exp = _experiment(name)
    snap = _snapshots(name)[snap_index]
    replies = _others(exp, snap, pid)
    replies[pid] = Rejection(pid, "reply", "no reply")
    state, _ = exp.bundle.server_step(snap.state, sorted(replies.items()), exp.setup, snap.rnd)
    return state


@functools.cache
def _honest_state(name, snap_index, pid):
    """The server state after this exchange when ``pid`` replied honestly."""
    exp = _experiment(name)
    snap = _snapshots(name)[snap_index]
    replies = {**_others(exp, snap, pid), pid: snap.replies[pid]}
    state, _ = exp.bundle.server_step(snap.state, sorted(replies.items()), exp.setup, snap.rnd)
    return state


def _others(exp, snap, pid) -> dict:
    """The other partitions' honest replies of a barrier exchange (none for arrival)."""
    if exp.bundle.mode(exp.setup.config) == "apply-on-arrival":
        return {}
    return {p: r for p, r in snap.replies.items() if p != pid}


@SETTINGS
@given(case=reply_cases())
def test_hostile_replies_are_rejected_without_touching_the_server_state(case):
    """decode -> judge -> server_step as the strategy runs them (see the module docstring)."""
    name, snap, pid, content = case
    exp, strategy = _experiment(name), _strategy(name)
    request = snap.requests[pid]
    strategy.state, strategy._rnd = snap.state, snap.rnd
    strategy._pending = dict(snap.requests)
    with task_identity():  # Flower stamps messages with the running task's identity
        message = strategy._encode(None, pid, request, snap.rnd.number, 0)
        reply = Message(content, reply_to=message)
    try:
        out = strategy._decode(pid, request.action, reply)
    except RunStopped as err:  # only a client that says it runs another experiment stops it
        assert isinstance(content, Error) and MISMATCH in content.reason, err
        return
    assert _same(snap.state, snap.frozen), "judging a reply modified the server state"
    event(f"reply: {'rejected' if isinstance(out, Rejection) else 'accepted'}")
    decoded = {**_others(exp, snap, pid), pid: out}
    if isinstance(out, Rejection) and "stop" in failure_policy(exp.bundle, exp.setup.config):
        # samplers whose target loses a term without a worker end the run (after retries,
        # which a hostile client fails alike) before any server step: one line, state kept
        with pytest.raises(RunStopped) as stop:
            stop_on_failure(exp.bundle.name, snap.rnd.number, decoded)
        assert _one_line(stop.value.reason) or isinstance(content, Error), stop.value
        assert strategy.state is snap.state and _same(snap.state, snap.frozen)
        return
    strategy._apply(decoded)
    assert _same(snap.state, snap.frozen), "server_step modified the state in place"
    if isinstance(out, Rejection):
        assert out.partition_id == pid and _one_line(out.field), out
        if not isinstance(content, Error):
            assert _one_line(out.reason), out
        index = next(i for i, s in enumerate(_snapshots(name)) if s is snap)
        assert _same(strategy.state, _no_reply_state(name, index, pid)), out
    else:
        assert check_message(exp.actions[request.action].reply, out,
                             exp.actions[request.action].allow_inf) is None
        index = next(i for i, s in enumerate(_snapshots(name)) if s is snap)
        allowed = _non_finite(_honest_state(name, index, pid)) | _non_finite(snap.state)
        assert _non_finite(strategy.state) <= allowed, f"an accepted reply made {name} fields " \
            f"{sorted(_non_finite(strategy.state) - allowed)} non-finite"


# ------------------------------------------------------------------ (c) dataset loading
DATA_KEYS = ("x_train", "y_train", "x_test", "y_test", "client_id")
TARGET_MODELS = {"none": "gaussian-mean", "real": "linear-regression",
                 "binary": "logistic-regression"}
numeric = st.sampled_from([np.dtype(t) for t in ("float64", "float32", "int64", "int8", "uint8",
                                                 "bool", "complex128", "float16")])
data_dtypes = st.one_of(numeric, numeric, numeric, hnp.byte_string_dtypes(max_len=3),
                        hnp.unicode_string_dtypes(max_len=3), hnp.datetime64_dtypes(),
                        st.just(np.dtype([("a", "<f8"), ("b", "<i4")])))
data_shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)


NPZ_KINDS = st.sampled_from(("near-valid",) * 4 + ("arrays",) * 2
                            + ("junk", "npy", "zip-junk", "truncated", "pickle"))
SPOILS = st.sampled_from(("drop", "values", "values", "label", "reshape", "empty", "cast",
                          "replace"))


def _elements(dtype):
    """Mostly small labels and values, often NaN, inf, huge or negative."""
    if dtype.kind == "f":
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=dtype.itemsize * 8),
                         st.sampled_from((0.0, 1.0, 2.0, -1.0, 3.5, 1e4 * dtype.itemsize)))
    if dtype.kind in "iu":
        return st.one_of(st.integers(0, 3), st.integers(np.iinfo(dtype).min,
                                                        np.iinfo(dtype).max))
    return None


@st.composite
def data_arrays(draw):
    dtype = draw(data_dtypes)
    return draw(hnp.arrays(dtype, data_shapes, elements=_elements(dtype)))


@st.composite
def npz_files(draw):
    """Bytes of a (usually) malformed ``.npz``: random keys, arrays, or junk."""
    kind = draw(NPZ_KINDS)
    if kind == "junk":
        return draw(st.binary(max_size=64))
    if kind == "npy":
        buf = io.BytesIO()
        np.save(buf, draw(data_arrays()))
        return buf.getvalue()
    if kind == "zip-junk":  # a zip archive whose members are not .npy files
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr(draw(st.sampled_from(("x_train.npy", "x_train", "a.txt"))),
                       draw(st.binary(max_size=40)))
        return buf.getvalue()
    if kind == "pickle":  # an object array needs pickle, which loading refuses
        buf = io.BytesIO()
        np.savez(buf, x_train=np.array([{"a": 1}, None], dtype=object))
        return buf.getvalue()
    if kind == "near-valid":  # a valid file with 0-2 keys spoilt
        n, d = draw(st.integers(1, 12)), draw(st.integers(1, 3))
        arrays = {"x_train": np.arange(float(n * d)).reshape(n, d), "y_train": np.arange(n) % 3}
        if draw(st.booleans()):
            arrays.update(x_test=np.ones((2, d)), y_test=np.array([0, 1]))
        if draw(st.booleans()):
            arrays["client_id"] = np.arange(n) % 2
        for _ in range(draw(st.integers(0, 2))):
            key, how = draw(st.sampled_from(DATA_KEYS)), draw(SPOILS)
            if how == "drop":
                arrays.pop(key, None)
            elif how == "values" and key in arrays:
                arrays[key] = draw(hnp.arrays(arrays[key].dtype, arrays[key].shape,
                                              elements=_elements(arrays[key].dtype)))
            elif how == "reshape" and key in arrays:
                arrays[key] = arrays[key].reshape(arrays[key].shape + (1,))
            elif how == "label" and key in arrays and arrays[key].size:  # one odd label
                arrays[key] = arrays[key].copy()
                arrays[key].flat[-1] = draw(st.sampled_from((3, 12, 999_999, 2**62)))
            elif how == "empty" and key in arrays and arrays[key].ndim:  # no columns/rows
                arrays[key] = arrays[key][..., :0]
            elif how == "cast" and key in arrays:
                with warnings.catch_warnings():  # complex -> real drops the imaginary part
                    warnings.simplefilter("ignore")
                    arrays[key] = arrays[key].astype(draw(data_dtypes))
            else:
                arrays[key] = draw(data_arrays())
    else:
        keys = draw(st.lists(st.one_of(st.sampled_from(DATA_KEYS), st.just("other")),
                             unique=True, max_size=5))
        arrays = {key: draw(data_arrays()) for key in keys}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    if kind == "truncated":
        data = data[:draw(st.integers(0, len(data)))]
    return data


def _check_dataset(ds, target) -> None:
    """The invariants :class:`fedbayes_flwr.data.Dataset` documents."""
    n, d = ds.x_train.shape
    assert ds.x_train.dtype == np.float64 and n >= 1 and d >= 1
    assert ds.x_test.dtype == np.float64 and ds.x_test.ndim == 2
    assert ds.x_test.shape[0] >= 1 and ds.x_test.shape[1] == d
    assert np.all(np.isfinite(ds.x_train)) and np.all(np.isfinite(ds.x_test))
    if target == "none":
        assert ds.y_train is None
        return
    for y, rows in ((ds.y_train, n), (ds.y_test, ds.x_test.shape[0])):
        assert y.shape == (rows,)
        if target == "real":
            assert y.dtype == np.float64 and np.all(np.isfinite(y))
        else:
            assert y.dtype == np.int64 and np.all(y >= 0)
            if target == "binary":
                assert np.all(y <= 1)
    if ds.client_id is not None:
        assert ds.client_id.dtype == np.int64 and ds.client_id.shape == (n,)


@pytest.fixture(scope="module")
def data_dir():
    with tempfile.TemporaryDirectory() as tmp:
        yield tmp


@SETTINGS
@given(data=npz_files(), target=st.sampled_from(("none", "real", "binary", "multiclass")))
def test_malformed_npz_is_a_one_line_data_error(data_dir, data, target):
    """``load_dataset(data_file=...)`` keeps the Dataset invariants or raises one DataError
    line; what loads builds the whole experiment (partitions, model, prior) or fails alike."""
    path = os.path.join(data_dir, "user.npz")
    with open(path, "wb") as f:
        f.write(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ds = load_dataset("synthetic", target, seed=0, test_fraction=0.25, data_file=path)
        except DataError as err:
            assert _one_line(str(err)), err
            event("load: DataError")
            return
        _check_dataset(ds, target)
        event("load: loaded")
        if target == "multiclass":  # the model's output count (a BNN is too slow to build here)
            try:
                assert 1 <= num_classes(ds) <= max(ds.y_train.size + ds.y_test.size, 2)
            except DataError as err:
                assert _one_line(str(err)), err
            return
        keys = {"model": TARGET_MODELS[target], "data": path, "num-clients": 2,
                "partition": "natural" if ds.client_id is not None else "iid"}
        try:
            build_experiment.__wrapped__(parse_run_config(keys))  # not cached: same path
            event("build: built")
        except (DataError, ConfigError) as err:
            assert _one_line(str(err)), err
            event("build: DataError or ConfigError")
