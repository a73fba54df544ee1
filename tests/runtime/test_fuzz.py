"""Fuzzing the CLI's front door (issue 32, done-when 2): generated bad inputs on three surfaces
(command-line flags and run-config values, ``.npz`` data files, checkpoint files) driven through
``run_simulation.main`` in-process.

Every input must end in exit status 2 with exactly one ``error:`` line on stderr and no
traceback, and must leave the output directory as it was (not created). The engine itself is
replaced by a no-op (``_run_engine``), so an input that happens to be valid costs only its
validation and still must exit 0, not crash. Hypothesis runs derandomised (a fixed seed: the same
inputs every run) with :data:`EXAMPLES` inputs per surface.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import zipfile
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import run_simulation  # noqa: E402
from fedbayes_flwr.runtime import checkpoint as C  # noqa: E402
from fedbayes_flwr.runtime.config import KEYS  # noqa: E402

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "500"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
BASE = ["--engine", "in-process", "--quiet", "--model", "linear-regression", "--dataset",
        "synthetic", "--num-rounds", "1", "--num-clients", "2"]

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch, tmp_path_factory):
    """Validation only: a valid input reaches the engine, which does nothing; relative paths
    (generated output directories) land in a scratch working directory."""
    monkeypatch.setattr(run_simulation, "_run_engine", lambda *a, **k: 0)
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd", numbered=False)
                      if not (tmp_path_factory.getbasetemp() / "cwd").exists()
                      else tmp_path_factory.getbasetemp() / "cwd")


def _main(argv) -> tuple[int, list[str], str]:
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        try:
            code = run_simulation.main([str(a) for a in argv])
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 1
    lines = [x for x in err.getvalue().splitlines() if x.strip()]
    return code, lines, err.getvalue()


def _refused_in_one_line(code, lines, text, where):
    assert "Traceback" not in text, text
    event(f"exit {code}")  # --hypothesis-show-statistics: how many were refused
    if code == 0:  # a valid input: the engine (a no-op here) was reached
        return
    assert code == 2, (code, text)
    errors = [x for x in lines if x.startswith("error:")]
    assert len(errors) == 1, text
    assert not os.path.exists(where), f"the refused run created {where}"


# ------------------------------------------------------------------ surface 1: flags and keys
NASTY_TEXT = st.one_of(
    st.sampled_from(["", " ", "nan", "inf", "-inf", "-1", "0", "1e400", "-1e400", "1e-400",
                     "1" * 400, "none", "None", "true", "[1,2]", "{}", "'", '"', "=", "==",
                     "a=b", "\x00", "é", "../..", "/dev/null", "/proc/1/nope", "-0", "0x10",
                     "1_000", "  3  ", "3.5", "2**64", "9223372036854775808"]),
    st.text(min_size=0, max_size=12),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
FLAGS = sorted(run_simulation.FLAGS)


@FUZZ
@given(flag=st.sampled_from(FLAGS), value=NASTY_TEXT)
def test_fuzzed_flag_values(tmp_path_factory, flag, value):
    out = str(tmp_path_factory.getbasetemp() / "flag-out")
    shutil.rmtree(out, ignore_errors=True)
    argv = [*BASE, "--output-dir", out]
    if flag != "output-dir":
        argv += [f"--{flag}", value]
    else:
        argv = [*BASE, "--output-dir", value]
        out = os.path.abspath(value) if value.strip() and "\x00" not in value else out
    code, lines, text = _main(argv)
    _refused_in_one_line(code, lines, text, out if flag != "output-dir" else "/nonexistent")


@FUZZ
@given(key=st.one_of(st.sampled_from(KEYS),
                     st.sampled_from(["pvi.damping", "pvi.schedule", "pvi.covariance",
                                      "dsvgd.num-particles", "inject-fault", "pvi.nope",
                                      "nope", "pvi.", ".x", "a.b.c"]),
                     st.text(min_size=1, max_size=8)),
       value=NASTY_TEXT)
def test_fuzzed_run_config_values(tmp_path_factory, key, value):
    out = str(tmp_path_factory.getbasetemp() / "rc-out")
    shutil.rmtree(out, ignore_errors=True)
    if key in ("output-dir", "resume"):
        return  # paths: covered by the flag surface and the checkpoint surface
    text_value = json.dumps(value) if not value.replace(".", "").lstrip("-").isdigit() else value
    code, lines, text = _main([*BASE, "--output-dir", out, "--run-config",
                               f"{key}={text_value}"])
    _refused_in_one_line(code, lines, text, out)


# ------------------------------------------------------------------ surface 2: .npz data files
def _array():
    shapes = st.sampled_from([(0,), (5,), (5, 2), (5, 0), (0, 2), (5, 2, 2), (1,), (3, 1), ()])
    kinds = st.sampled_from(["f8", "f4", "i8", "u8", "i1", "b1", "c16", "U3", "S3", "O", "m8"])
    fills = st.sampled_from(["normal", "nan", "inf", "huge", "negative", "labels", "uint-big"])
    return st.tuples(shapes, kinds, fills)


def _make(spec, rng):
    shape, kind, fill = spec
    if kind == "O":
        return np.array([None] * int(np.prod(shape)) if shape else None, dtype=object)
    if kind in ("U3", "S3"):
        return np.full(shape, "ab", dtype=kind)
    values = {"normal": rng.normal(size=shape), "nan": np.full(shape, np.nan),
              "inf": np.full(shape, np.inf), "huge": np.full(shape, 1e300),
              "negative": -np.abs(rng.normal(size=shape)) - 1,
              "labels": rng.integers(0, 3, size=shape).astype(float),
              "uint-big": np.full(shape, 2.0**63 + 4096)}[fill]
    with np.errstate(all="ignore"):
        if kind == "u8" and fill == "uint-big":
            return np.full(shape, 2**63 + 5, dtype=np.uint64)
        if kind in ("i8", "u8", "i1", "b1", "m8"):
            return np.nan_to_num(values, nan=0, posinf=1, neginf=-1).astype(kind)
        return values.astype(kind)


@FUZZ
@given(keys=st.lists(st.sampled_from(["x_train", "y_train", "x_test", "y_test", "client_id",
                                      "extra", "X_TRAIN"]), min_size=0, max_size=5, unique=True),
       specs=st.lists(_array(), min_size=5, max_size=5),
       model=st.sampled_from(["linear-regression", "logistic-regression", "bnn-classifier"]),
       seed=st.integers(0, 2**32 - 1))
def test_fuzzed_npz_files(tmp_path_factory, keys, specs, model, seed):
    base = tmp_path_factory.getbasetemp()
    out = str(base / "npz-out")
    shutil.rmtree(out, ignore_errors=True)
    rng = np.random.default_rng(seed)
    path = base / "fuzz.npz"
    np.savez(path, **{k: _make(s, rng) for k, s in zip(keys, specs, strict=False)})
    code, lines, text = _main([*BASE, "--model", model, "--data", str(path), "--output-dir", out])
    _refused_in_one_line(code, lines, text, out)


# ------------------------------------------------------------------ surface 3: checkpoint files
@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    out = tmp_path_factory.mktemp("stored")
    with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
        real = run_simulation.main([*BASE, "--num-rounds", "2", "--output-dir", str(out)])
    assert real == 0
    return out


def _mutate(data: bytes, kind: str, where: int, byte: int) -> bytes:
    where %= max(len(data), 1)
    if kind == "flip":
        b = bytearray(data)
        b[where] ^= (byte % 255) + 1
        return bytes(b)
    if kind == "truncate":
        return data[:where]
    if kind == "insert":
        return data[:where] + bytes([byte % 256]) + data[where:]
    if kind == "delete":
        return data[:where] + data[where + 1:]
    return bytes([byte % 256]) * (where % 64)  # "replace": a short run of one byte


def _meta_edit(data: bytes, field: str, value) -> bytes:
    """The metadata JSON rewritten with ``field`` changed (the digest left as it was)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        members = {k: z[k] for k in z.files}
    meta = json.loads(str(members["__meta__"]))
    meta[field] = value
    members["__meta__"] = np.array(json.dumps(meta))
    buf = io.BytesIO()
    np.savez(buf, **members)
    return buf.getvalue()


JSONISH = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(),
                    st.text(max_size=5), st.lists(st.integers(), max_size=3),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@FUZZ
@given(kind=st.sampled_from(["flip", "truncate", "insert", "delete", "replace", "meta"]),
       where=st.integers(0, 10**9), byte=st.integers(0, 255),
       field=st.sampled_from(["update", "history", "format", "bundle", "engine", "run_config",
                              "client_versions", "counters", "structure"]),
       value=JSONISH)
def test_fuzzed_checkpoints(stored, tmp_path_factory, kind, where, byte, field, value):
    run = tmp_path_factory.getbasetemp() / "ckpt-run"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(stored, run)
    original = (stored / C.FILE).read_bytes()
    damaged = (_meta_edit(original, field, value) if kind == "meta"
               else _mutate(original, kind, where, byte))
    (run / C.FILE).write_bytes(damaged)
    before = (run / "result.json").read_bytes()
    code, lines, text = _main(["--resume", str(run), "--num-rounds", "3", "--quiet", "--engine",
                               "in-process"])
    assert "Traceback" not in text, text
    assert (run / "result.json").read_bytes() == before  # the earlier results untouched
    event(f"exit {code}")
    if code == 0:  # the damage missed the content (e.g. zip padding): the same checkpoint
        assert _same_checkpoint(stored, run), kind
        return
    assert code == 2 and len([x for x in lines if x.startswith("error:")]) == 1, text


def _same_checkpoint(a, b) -> bool:
    try:
        with zipfile.ZipFile(a / C.FILE) as za, zipfile.ZipFile(b / C.FILE) as zb:
            return all(za.read(n) == zb.read(n) for n in za.namelist())
    except Exception:  # noqa: BLE001 (a damaged file that still loaded: compare what loaded)
        return C.load(str(a)).history == C.load(str(b)).history
