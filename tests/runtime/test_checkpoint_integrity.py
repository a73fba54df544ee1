"""Corrupted and edited checkpoints are refused in one line (issue 32, row 1 and 2).

A real run's ``checkpoint.npz`` is truncated, emptied, has one byte flipped, or is rewritten with
parts that disagree (an update count the history does not have, junk history rows, state
arrays of the wrong shape); ``--resume`` must exit 2 with one ``error:`` line naming the file and
the fault, and leave the earlier ``result.json`` as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest

from fedbayes_flwr.inference.tree import leaves, rebuild
from fedbayes_flwr.runtime import checkpoint as C

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import run_simulation  # noqa: E402

BASE = ["--engine", "in-process", "--algorithm", "pvi", "--model", "linear-regression",
        "--dataset", "synthetic", "--num-clients", "3", "--seed", "0", "--quiet"]


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A finished 2-update run's directory (checkpoint and result.json)."""
    out = tmp_path_factory.mktemp("stored")
    assert run_simulation.main([*BASE, "--num-rounds", "2", "--output-dir", str(out)]) == 0
    return out


def _copy(stored, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(stored, run)
    return run


def _resume(run, capsys):
    before = (run / "result.json").read_bytes()
    code = run_simulation.main(["--resume", str(run), "--num-rounds", "3", "--quiet", "--engine",
                                "in-process"])
    err = capsys.readouterr().err.strip().splitlines()
    assert (run / "result.json").read_bytes() == before  # the earlier results untouched
    return code, err


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _empty(path):
    path.write_bytes(b"")


def _flip(path):
    """Flip one byte inside the first stored array (a CRC or the digest must notice)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _empty, _flip])
def test_a_damaged_checkpoint_is_one_error_line(stored, tmp_path, capsys, damage):
    run = _copy(stored, tmp_path)
    damage(run / C.FILE)
    code, err = _resume(run, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: resume:"), err
    assert str(run / C.FILE) in err[0]


def _rewrite(run, **changes):
    """Save the checkpoint with some parts changed (a valid digest over the changed content:
    what an edit that also recomputed the digest leaves)."""
    ckpt = C.load(str(run))
    C.save(str(run), ckpt._replace(**changes))


@pytest.mark.parametrize("changes, match", [
    ({"update": 99}, "update 99 disagrees with the history"),
    ({"history": [{"round": 1}, {"round": 1}]}, "rounds do not increase"),
    ({"history": [{"junk": 1}, {"round": 2}]}, "history row has no integer 'round'"),
])
def test_parts_that_disagree_are_refused(stored, tmp_path, capsys, changes, match):
    run = _copy(stored, tmp_path)
    _rewrite(run, **changes)
    code, err = _resume(run, capsys)
    assert code == 2 and len(err) == 1 and match in err[0], err


def test_an_edited_file_fails_its_digest(stored, tmp_path, capsys):
    """The metadata rewritten (update and history consistent with each other) without the
    digest: the content digest written with the file no longer matches."""
    run = _copy(stored, tmp_path)
    path = run / C.FILE
    with np.load(path, allow_pickle=False) as data:
        members = {k: data[k] for k in data.files}
    meta = json.loads(str(members["__meta__"]))
    meta["history"] = meta["history"][:1]
    meta["update"] = meta["history"][-1]["round"]
    members["__meta__"] = np.array(json.dumps(meta))
    np.savez(path, **members)
    code, err = _resume(run, capsys)
    assert code == 2 and len(err) == 1 and "content digest" in err[0], err


def test_state_of_the_wrong_shape_is_refused(stored, tmp_path, capsys):
    run = _copy(stored, tmp_path)
    ckpt = C.load(str(run))
    key, value = next((k, v) for k, v in leaves(ckpt.server_state)
                      if isinstance(v, np.ndarray) and v.ndim == 2)
    bad = rebuild(ckpt.server_state,
                    lambda k, v: np.zeros((v.shape[0], v.shape[1] + 1)) if k == key else v)
    C.save(str(run), ckpt._replace(server_state=bad))
    code, err = _resume(run, capsys)
    assert code == 2 and len(err) == 1 and "wrong shapes" in err[0] and key in err[0], err


def test_an_intact_checkpoint_still_resumes(stored, tmp_path, capsys):
    run = _copy(stored, tmp_path)
    assert run_simulation.main(["--resume", str(run), "--num-rounds", "3", "--quiet",
                                "--engine", "in-process"]) == 0
    with open(run / "result.json") as f:
        assert [r["round"] for r in json.load(f)["history"]][-1] == 3
