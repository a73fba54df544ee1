"""Re-run issue 31's eight surviving mutants against the tests written to kill them.

Each mutant is a one-line change of the code as it stands, applied to a scratch copy of the
repository (the checkout is never modified); pytest runs there, so ``fedbayes_flwr`` resolves
to the mutated copy. A mutant is *killed* when at least one of its tests fails.

    python benchmarks/mutation/survivors.py                 # every mutant, its killing tests
    python benchmarks/mutation/survivors.py M26 M03          # some
    python benchmarks/mutation/survivors.py --tests old M26  # the test files that missed it

The JSON (``benchmarks/results/mutation/survivors.json``) records, per mutant, the edit, the
command, the exit status and the first failing test with its assertion message.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
sys.path.insert(0, str(ROOT))
from tests.helpers.mutants import SURVIVORS  # noqa: E402

PVI_OLD = ["tests/pvi/test_pvi_family.py", "tests/pvi/test_pvi_auto.py", "tests/pvi/test_pvi_exact.py"]

#: id -> (killing tests, test files that missed it); the edits are tests/helpers/mutants.py's
TESTS: dict[str, tuple[list[str], list[str]]] = {
    "M26": (["tests/pvi/test_pvi_mutants.py::test_client_held_free_energy_is_the_exact_evidence"],
            PVI_OLD),
    "M11": (["tests/pdmc/test_pdmc_mutants.py"],
            ["tests/pdmc/test_pdmc_reference.py", "tests/pdmc/test_pdmc.py"]),
    "M03": (["tests/pvi/test_pvi_mutants.py::test_client_held_server_damping_is_the_exact_damped_update"],
            PVI_OLD),
    "M07": (["tests/dsvgd/test_dsvgd_mutants.py"], ["tests/dsvgd/test_dsvgd.py"]),
    "M21": (["tests/algorithms/test_seeds.py"],
            ["tests/algorithms/test_sgld.py", "tests/runtime/test_api.py"]),
    "M25": (["tests/pvi/test_pvi_mutants.py::test_prior_scale_em_is_the_closed_form_fixed_point"],
            PVI_OLD),
    "M19c": (["tests/runtime/test_validation_scalars.py"],
             ["tests/runtime/test_hostile.py", "tests/runtime/test_faults.py"]),
    "M04": (["tests/pvi/test_pvi_mutants.py::test_async_staleness_step_is_one_over_sqrt_one_plus_tau"],
            PVI_OLD),
}


def _copy(scratch: Path, base: str | None = None) -> None:
    """The working tree (tracked and untracked, not ignored) into ``scratch``; with ``base``, the
    tree of that commit instead (the tests as they were before the killing tests were written)."""
    if base is not None:
        archive = subprocess.run(["git", "archive", base], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
        return
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, scratch / name)


def _first_failure(output: str) -> tuple[str | None, str | None]:
    """The first failing test's id and the first ``E`` line of its report (the assertion)."""
    test = re.search(r"^FAILED (\S+)", output, re.M)
    if test is None:
        return None, None
    error = re.search(r"^E\s+(\S.*)$", output, re.M)
    return test.group(1), (error.group(1) if error else "")[:300]


def run(mutant: str, which: str, base: str | None = None, marks: str = "not deployment") -> dict:
    edit = SURVIVORS[mutant]
    path, old, new = edit.path, edit.old, edit.new
    killers, missed = TESTS[mutant]
    tests = killers if which == "new" else missed
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant}-") as tmp:
        scratch = Path(tmp)
        _copy(scratch, base)
        source = (scratch / path).read_text()
        if source.count(old) != 1:
            raise SystemExit(f"{mutant}: {old!r} occurs {source.count(old)} times in {path}")
        (scratch / path).write_text(source.replace(old, new))
        command = [PY, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", marks, *tests]
        start = time.perf_counter()
        done = subprocess.run(command, cwd=scratch, capture_output=True, text=True,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "COLUMNS": "200"})
        seconds = time.perf_counter() - start
    failed, message = _first_failure(done.stdout)
    return {"mutant": mutant, "file": path, "original": old, "mutated": new, "tests": tests,
            "command": f"pytest -x -q -m '{marks}' " + " ".join(tests), "base": base,
            "returncode": done.returncode,
            "killed": done.returncode == 1, "first_failure": failed, "message": message,
            "seconds": round(seconds, 1), "summary": done.stdout.strip().splitlines()[-1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mutants", nargs="*", default=list(TESTS))
    parser.add_argument("--tests", choices=("new", "old"), default="new")
    parser.add_argument("--base", default=None, help="commit whose tree (tests included) is "
                        "mutated instead of the working tree, e.g. the commit before the killing tests")
    parser.add_argument("-m", dest="marks", default="not deployment", help="pytest -m expression")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/"
                        "mutation/survivors.json for --tests new, survivors_old.json for old)")
    args = parser.parse_args()
    out = Path(args.out or ROOT / "benchmarks" / "results" / "mutation" /
               ("survivors.json" if args.tests == "new" else "survivors_old.json"))
    results = []
    for mutant in args.mutants:
        result = run(mutant, args.tests, args.base, args.marks)
        print(json.dumps(result), flush=True)
        results.append(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(out.read_text())["mutants"] if out.exists() else {}
    previous.update({r["mutant"]: r for r in results})
    out.write_text(json.dumps({"tests": args.tests, "mutants": previous}, indent=1) + "\n")


if __name__ == "__main__":
    main()
