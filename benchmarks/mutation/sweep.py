"""Seeded mutation sweep of one family's maths modules (issue 31): cosmic-ray makes the mutants,
a pre-forked runner tests them.

    nice -n 15 python benchmarks/mutation/sweep.py --family pvi --sample 100 --seed 0
    python benchmarks/mutation/sweep.py --family pvi --list          # the population, no tests
    python benchmarks/mutation/sweep.py --family pvi --only pvi/step.py  # one module's mutants

The mutants are cosmic-ray's (every operator that takes no arguments, over the modules in
``FAMILIES``); ``--sample N --seed S`` draws N of them uniformly without replacement
(``random.Random(S).sample`` over the population sorted by module, operator, occurrence), so a
sweep is reproducible. The tests for each module are a stated map (``FAMILIES[f]["tests"]``,
optionally per module): the fast test files that import the module, run with ``-x``.

Per-mutant cost is kept small by forking: this process imports numpy, scipy, TensorFlow, TFP,
Keras, flwr and pytest once (no TF op runs before the fork, and ``fedbayes_flwr`` is never imported
here), copies the working tree to a scratch directory once, and for each mutant writes the mutated
module there and forks a child that runs ``pytest.main`` on the module's tests in that copy (no
bytecode is written, so no stale ``.pyc`` can hide a mutant). One mutant runs at a time; a child
that outlives ``--timeout`` (default: 4x the unmutated run + 30 s) is killed and the mutant counted
as ``timeout``. Exit 0 is *survived*, a failing test (1) *killed*, any other status (collection
or import error, a crash) *killed* with ``"error": true``.

The JSON (``benchmarks/results/mutation/<family>.json``) has killed / survived / timeout per
module, every sampled mutant with its line before and after, the equivalent mutants (listed in
``EQUIVALENT`` with a reason, excluded from the score) and the seconds per mutant.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks" / "results" / "mutation"
PKG = "fedbayes_flwr"

#: family -> the maths modules (relative to fedbayes_flwr/) and the fast tests that cover them;
#: ``tests`` maps a module to its tests, ``"*"`` is the default. Wiring (bundle, config,
#: messages) is left out: what is mutated is the numerics.
FAMILIES: dict[str, dict[str, Any]] = {
    "pvi": {
        "modules": ["algorithms/pvi/step.py", "algorithms/pvi/server.py",
                    "algorithms/pvi/client.py", "algorithms/pvi/tempered.py"],
        "tests": {"*": ["tests/pvi/test_pvi_mutants.py", "tests/pvi/test_pvi_sweep.py",
                        "tests/pvi/test_pvi_exact.py", "tests/pvi/test_local_solver.py"],
                  # the server-held step search, guard and proximal weight: test_pvi_auto
                  "algorithms/pvi/server.py": [
                      "tests/pvi/test_pvi_mutants.py", "tests/pvi/test_pvi_sweep.py",
                      "tests/pvi/test_pvi_exact.py", "tests/pvi/test_pvi_auto.py",
                      "tests/pvi/test_pvi_step_search.py"],
                  # the tempered wrapper's scaling is tested in test_pvi_auto (one fast test)
                  "algorithms/pvi/tempered.py": [
                      "tests/pvi/test_pvi_auto.py::"
                      "test_tempered_model_scales_every_likelihood_and_nothing_else",
                      "tests/pvi/test_pvi_mutants.py", "tests/pvi/test_pvi_sweep.py",
                      "tests/pvi/test_pvi_exact.py", "tests/pvi/test_local_solver.py"],
                  "algorithms/pvi/step.py": [
                      "tests/pvi/test_pvi_mutants.py", "tests/pvi/test_pvi_auto.py",
                      "tests/pvi/test_pvi_step_search.py"]},
    },
    "dsvgd": {
        "modules": ["algorithms/dsvgd/svgd.py"],
        "tests": {"*": ["tests/dsvgd/test_svgd.py", "tests/dsvgd/test_dsvgd_mutants.py",
                        "tests/dsvgd/test_svgd_defaults.py"]},
    },
    "pdmc": {
        "modules": ["algorithms/pdmc/sampler.py", "algorithms/pdmc/privacy.py",
                    "algorithms/pdmc/driver.py", "algorithms/pdmc/metropolis.py"],
        # driver.py's bound-free loop and metropolis.py are tested by test_pdmc_metropolis
        "tests": {"*": ["tests/pdmc/test_pdmc_mutants.py", "tests/pdmc/test_pdmc.py",
                        "tests/pdmc/test_pdmc_metropolis.py"],
                  "algorithms/pdmc/privacy.py": ["tests/pdmc/test_pdmc_privacy.py"],
                  # the same files, the Metropolis tests first (they kill its mutants)
                  "algorithms/pdmc/metropolis.py": ["tests/pdmc/test_pdmc_metropolis.py",
                                                    "tests/pdmc/test_pdmc_mutants.py",
                                                    "tests/pdmc/test_pdmc.py"]},
    },
    "amps": {
        "modules": ["algorithms/amps/merge.py", "algorithms/amps/streaming.py"],
        "tests": {"*": ["tests/amps/test_vb_lda.py", "tests/amps/test_amps.py",
                        "tests/amps/test_amps_mutants.py"]},
    },
    "dhmc": {
        "modules": ["algorithms/dhmc/agents.py", "algorithms/dhmc/loop.py",
                    "algorithms/dhmc/baselines.py", "algorithms/dhmc/mass.py"],
        # the trackers' invariant (agents.py) and the mass matrix (mass.py) have their own files
        "tests": {"*": ["tests/dhmc/test_dhmc_baselines.py", "tests/dhmc/test_dhmc.py",
                        "tests/dhmc/test_dhmc_tracking.py", "tests/dhmc/test_dhmc_mass.py"]},
    },
    "decentralized": {
        "modules": ["algorithms/decentralized/graphs.py", "algorithms/decentralized/mixing.py",
                    "algorithms/decentralized/routing.py"],
        "tests": {"*": ["tests/algorithms/test_gossip.py", "tests/algorithms/test_gossip_mutants.py",
                        "tests/algorithms/test_commit_routing.py"]},
    },
    "inference": {
        "modules": ["inference/gaussian.py", "inference/expfam.py", "inference/posterior.py",
                    "inference/kde.py", "inference/student_t.py", "inference/potentials.py",
                    "inference/sensitivity.py", "inference/vi.py", "inference/vb/lda.py",
                    "inference/vb/latent_feature.py", "inference/vb/gmm.py",
                    "inference/vb/gaussian_vector.py"],
        "tests": {
            "*": ["tests/inference/test_gaussian.py", "tests/inference/test_posterior.py"],
            "inference/gaussian.py": ["tests/inference/test_gaussian.py",
                                      "tests/pvi/test_pvi_exact.py"],
            "inference/posterior.py": ["tests/inference/test_posterior.py"],
            "inference/expfam.py": ["tests/amps/test_vb_lda.py",
                                    "tests/amps/test_vb_latent_feature.py"],
            "inference/kde.py": ["tests/dsvgd/test_svgd.py"],
            "inference/student_t.py": ["tests/models/test_ar1.py"],
            "inference/potentials.py": ["tests/pdmc/test_pdmc_mutants.py",
                                        "tests/models/test_nets_numpy.py",
                                        "tests/pdmc/test_pdmc_privacy.py"],
            "inference/sensitivity.py": ["tests/pdmc/test_pdmc_privacy.py"],
            "inference/vi.py": ["tests/pvi/test_local_solver.py"],
            "inference/vb/lda.py": ["tests/amps/test_vb_lda.py"],
            "inference/vb/latent_feature.py": ["tests/amps/test_vb_latent_feature.py"],
            "inference/vb/gmm.py": ["tests/amps/test_amps.py"],
            "inference/vb/gaussian_vector.py": ["tests/amps/test_amps.py"],
        },
    },
}

#: (module, line, operator, the mutated line stripped) -> why the mutant cannot change behaviour;
#: these are listed in the JSON and left out of the score.
EQUIVALENT: dict[tuple[str, int, str, str], str] = {
    ("algorithms/amps/merge.py", 214, "core/NumberReplacer",
     "weights = np.where(np.isfinite(weights), weights, - 1e+300)"):
        "-1e300 and - 1e+300 are the same float literal",
    ("algorithms/amps/merge.py", 287, "core/NumberReplacer",
     "truth = np.asarray(truth, dtype=np.float64).reshape(len(truth), - 2)"):
        "numpy (2.x) reads any negative reshape size as 'infer', so -2 is the same as -1",
    ("algorithms/pvi/server.py", 203, "core/ReplaceComparisonOperator_Lt_NotEq",
     "if state.search + 1 != config.max_backtracks:"):
        "search starts at 0 and grows only while search + 1 < max-backtracks (validated >= 1), "
        "so search + 1 never exceeds max-backtracks and < agrees with !=",
    ("algorithms/pvi/server.py", 212, "core/ReplaceAndWithOr",
     "if (index > 0 or state.search > 0) or not values[1] >= floor:"):
        "when index = 0 in exchange 0, values[1] is the chosen candidate, acceptable by choose "
        "(>= floor), so the extra disjunct is false",
    ("algorithms/pvi/server.py", 216, "core/ReplaceComparisonOperator_Gt_NotEq",
     "elif index != 0 or state.search > 0:"):
        "index is a non-negative int here (choose's None is handled above), so > 0 is != 0",
    ("algorithms/pvi/tempered.py", 58, "core/NumberReplacer", "@lru_cache(maxsize= 63)"):
        "the cache size only decides when a Tempered wrapper is rebuilt; every value is the same",
    ("algorithms/decentralized/graphs.py", 140, "core/ReplaceBinaryOperator_BitOr_BitXor",
     "bad = ~((arr == 0) ^ (arr == 1))"):
        "arr == 0 and arr == 1 are never both true, so their xor is their or",
    ("algorithms/decentralized/graphs.py", 150, "core/ReplaceComparisonOperator_NotEq_Lt",
     "asym = np.argwhere(arr < arr.T)"):
        "a 0/1 matrix that is not symmetric has an entry with arr < arr.T (the transposed one of "
        "each mismatch), so the same matrices are refused; the message names that pair, true too",
    ("algorithms/decentralized/graphs.py", 303, "core/ReplaceComparisonOperator_Lt_LtE",
     "upper = np.triu(rng.random((m, m)) <= p, k=1)"):
        "a uniform double equals p with probability at most 2^-53 per entry: the same graphs",
    ("algorithms/pvi/client.py", 131, "core/ReplaceComparisonOperator_Gt_GtE", "if beta >= 0:"):
        "at beta = 0 the proximal branch computes power 1 (tempered() returns the model itself) "
        "and target (cavity + 0 q) * 1, which is the cavity to the bit: the else branch",
    ("algorithms/pvi/client.py", 131, "core/ReplaceComparisonOperator_Gt_NotEq", "if beta != 0:"):
        "beta is never negative (PVIConfig refuses pvi.proximal < 0; the adaptive weight starts "
        "at 0 or 1 and only grows), so != 0 is > 0",
    ("algorithms/pvi/server.py", 138, "core/ReplaceComparisonOperator_Eq_LtE",
     'if aa is None and config.acceleration <= "anderson":'):
        "PVIConfig admits only 'none' and 'anderson'; 'none' <= 'anderson' is False and "
        "'anderson' <= 'anderson' True: the same as ==",
    ("algorithms/pvi/server.py", 325, "core/ReplaceComparisonOperator_Eq_LtE",
     'if config.acceleration <= "anderson":'):
        "PVIConfig admits only 'none' and 'anderson'; 'none' <= 'anderson' is False and "
        "'anderson' <= 'anderson' True: the same as ==",
    ("algorithms/pvi/client.py", 109, "core/ReplaceComparisonOperator_Eq_LtE",
     'return prior if config.cavity <= "same-prior" else G.scale(prior, 1.0 / num_clients)'):
        "PVIConfig.validate admits only CAVITIES; 'pvi' and 'no-deletion' return above, so here "
        "cavity is 'same-prior' or 'split-prior', and 'split-prior' <= 'same-prior' is False: "
        "the same as ==",
    ("algorithms/pvi/server.py", 186, "core/ReplaceComparisonOperator_Gt_NotEq",
     "if state.proximal != 0:"):
        "the proximal weight is never negative (PVIConfig refuses pvi.proximal < 0; "
        "first_proximal gives 0 or 1 and raised_proximal only grows it), so != 0 is > 0",
    ("algorithms/pvi/server.py", 191, "core/ReplaceComparisonOperator_Eq_LtE",
     'if config.acceleration <= "anderson":  # the fixed-point map changes with beta'):
        "PVIConfig admits only 'none' and 'anderson'; 'none' <= 'anderson' is False and "
        "'anderson' <= 'anderson' True: the same as ==",
    ("algorithms/pvi/server.py", 212, "core/ReplaceComparisonOperator_Gt_GtE",
     "if (index > 0 or state.search >= 0) and not values[1] >= floor:"):
        "the extra case is index = 0 in exchange 0, where values[1] is the chosen candidate, "
        "acceptable by choose (>= floor), so the condition stays false; the elif is unchanged",
    ("algorithms/pvi/server.py", 262, "core/NumberReplacer",
     "accepted = tuple(range(state.received.shape[ -1]))"):
        "received is the 1-D (num_clients,) flag array (init_server), so shape[-1] is shape[0]",
    ("algorithms/dhmc/agents.py", 210, "core/ReplaceUnaryOperator_USub_UAdd",
     "r = c - np.sum(state.g_last * displacement, axis=+1)"):
        "an agent's arrays are (K chains, d) (init_agent documents w0 (K, d); the engine and "
        "the library loop stack chains), so axis 1 is the last axis",
    ("algorithms/dhmc/agents.py", 211, "core/ReplaceUnaryOperator_Delete_USub",
     "return r, num_agents * np.sum(state.y * displacement, axis=1)"):
        "an agent's arrays are (K chains, d) (init_agent documents w0 (K, d); the engine and "
        "the library loop stack chains), so axis 1 is the last axis",
    ("algorithms/dsvgd/svgd.py", 372, "core/ReplaceComparisonOperator_Gt_NotEq",
     "s0 = float(np.mean(np.std(start, axis=0, ddof=1))) if start.shape[0] != 1 else 1.0"):
        "differs from > 1 only for N = 0 particles, which as_particles refuses before the only "
        "caller (guarded_svgd) gets here; even then std is NaN and the next line maps s0 to 1.0",
    ("algorithms/dsvgd/svgd.py", 433, "core/NumberReplacer",
     "spread = float(np.mean(np.std(x, axis=0, ddof=1))) if x.shape[0] > 1 else 0.0"):
        "the branch is taken for one particle only, and the next line maps a spread of 0 to 1.0, "
        "the original's value",
    ("algorithms/pdmc/metropolis.py", 206, "core/ReplaceComparisonOperator_Eq_GtE",
     'w = (-sl / step)[:, None] if sampler >= "zigzag" else -sl / step'):
        "the sampler is 'zigzag' or 'bps' (the bundle validates pdmc.sampler against SAMPLERS); "
        "'bps' >= 'zigzag' is False and 'zigzag' >= 'zigzag' True: the same as ==",
}

#: ``EQUIVALENT`` keyed by (module, operator, mutated line), the line number left out
_EQUIVALENT_TEXT = {(mod, op, text): why for (mod, _line, op, text), why in EQUIVALENT.items()}

MARKS = "not deployment and not docs and not slow and not flower"


def _operators() -> list[tuple[str, Any]]:
    """cosmic-ray's operators that take no arguments (the number-replacer family included)."""
    from cosmic_ray import plugins

    ops = []
    for name in sorted(plugins.operator_names()):
        cls = plugins.get_operator(name)
        if not cls.arguments():
            ops.append((name, cls()))
    return ops


def population(family: str) -> list[dict[str, Any]]:
    """Every mutant cosmic-ray generates over the family's modules (no code is run)."""
    from cosmic_ray.ast import ast_nodes, get_ast_from_path

    mutants = []
    ops = _operators()
    for module in FAMILIES[family]["modules"]:
        path = ROOT / PKG / module
        tree = get_ast_from_path(path)
        spans = annotation_spans(path.read_text())
        for name, op in ops:
            positions = [pos for node in ast_nodes(tree) for pos in op.mutation_positions(node)]
            for occurrence, (start, end) in enumerate(positions):
                note = any(a <= tuple(start) and tuple(end) <= b for a, b in spans)
                mutants.append({"module": module, "operator": name, "occurrence": occurrence,
                                "line": start[0], "col": start[1], "end": list(end),
                                "annotation": note})
    return mutants


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) of every annotation in a module that has ``from __future__ import
    annotations``: a mutant there changes a string nobody evaluates (equivalent)."""
    import ast

    tree = ast.parse(source)
    future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                 and any(a.name == "annotations" for a in n.names) for n in tree.body)
    if not future:
        return []
    notes: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None and arg.annotation is not None:
                    notes.append(arg.annotation)
            if node.returns is not None:
                notes.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            notes.append(node.annotation)
    return [((n.lineno, n.col_offset), (n.end_lineno or n.lineno, n.end_col_offset or 0))
            for n in notes]


def mutated_source(mutant: dict[str, Any], original: str) -> str | None:
    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    op = get_operator(mutant["operator"])()
    return mutate_code(original, op, mutant["occurrence"])


def _copy_tree(scratch: Path) -> None:
    """The working tree (tracked and untracked, not ignored) into ``scratch``; outside a git
    checkout, the package, tests and project files."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True)
    if listed.returncode != 0:
        skip = shutil.ignore_patterns("__pycache__", "*.pyc")
        for name in (PKG, "tests", "strategies", "clients"):
            shutil.copytree(ROOT / name, scratch / name, ignore=skip)
        for name in ("pyproject.toml", "run_simulation.py"):
            shutil.copy2(ROOT / name, scratch / name)
        return
    files = listed.stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, scratch / name)


#: one thread per library: one mutant runs at a time on a shared machine
THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "2"}


def _preimport() -> None:
    """The heavy imports, once, before any fork (importing runs no TF op)."""
    for key, value in THREADS.items():
        os.environ.setdefault(key, value)
    import numpy  # noqa: F401
    import pytest  # noqa: F401
    import scipy.linalg  # noqa: F401
    import scipy.stats  # noqa: F401
    import tensorflow  # noqa: F401
    import tensorflow_probability  # noqa: F401

    for optional in ("keras", "flwr", "hypothesis"):
        try:
            __import__(optional)
        except ImportError:
            pass


def _run_child(scratch: Path, tests: list[str], log: Path, timeout: float) -> tuple[str, int, float]:
    """Fork one child that runs pytest on ``tests`` in ``scratch``; (outcome, status, seconds)."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child
        code = 3
        try:
            os.setpgid(0, 0)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.chdir(scratch)
            sys.path.insert(0, str(scratch))
            import pytest

            code = int(pytest.main([*tests, "-x", "-q", "-p", "no:cacheprovider",
                                    "--rootdir", str(scratch), "-m", MARKS,
                                    "-W", "ignore::DeprecationWarning"]))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = start + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return "timeout", -9, time.perf_counter() - start
        time.sleep(0.05)
    seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return "survived", code, seconds
    return "killed", code, seconds


def _first_failure(log: Path) -> str | None:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line[:300]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", required=True, choices=sorted(FAMILIES))
    parser.add_argument("--sample", type=int, default=100, help="mutants to draw (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="sample only this module's mutants")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per mutant (default: 4x the unmutated run + 30)")
    parser.add_argument("--list", action="store_true", help="print the population and stop")
    parser.add_argument("--baseline", action="store_true",
                        help="time the unmutated tests and stop")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--resume", action="store_true",
                        help="continue a stopped sweep from its partial JSON (same sample): every "
                             "mutant already tested keeps its outcome, the rest are tested")
    parser.add_argument("--rerun", action="store_true",
                        help="re-test only the survivors (and timeouts) of the family's JSON, "
                             "with the same sample, and update it (after adding tests)")
    args = parser.parse_args(argv)

    family = FAMILIES[args.family]
    full = population(args.family)
    pop = [m for m in full if not m["annotation"]]
    if args.only:
        pop = [m for m in pop if m["module"].endswith(args.only)]
        if not pop:
            parser.error(f"--only {args.only!r} matches no module of {args.family}")
    if args.list:
        for m in pop:
            print(m["module"], m["line"], m["operator"], m["occurrence"])
        print(f"{len(pop)} mutants", file=sys.stderr)
        return 0
    n = len(pop) if args.sample <= 0 else min(args.sample, len(pop))
    sample = sorted(random.Random(args.seed).sample(pop, n),
                    key=lambda m: (m["module"], m["line"], m["operator"], m["occurrence"]))
    out = args.out or OUT / f"{args.family}.json"
    previous: dict[tuple[str, str, int], dict[str, Any]] = {}
    # outcomes taken over from the JSON (equivalents are decided again from ``EQUIVALENT``)
    reuse = ("killed", "survived", "timeout") if args.resume else ("killed",)
    if args.rerun or args.resume:
        old = json.loads(out.read_text())
        if (old["seed"], old["sampled"], old["population"]) != (args.seed, n, len(pop)):
            parser.error(f"--rerun/--resume: {out} was drawn with seed {old['seed']}, {old['sampled']} of "
                         f"{old['population']} mutants; this is seed {args.seed}, {n} of {len(pop)}")
        previous = {(r["module"], r["operator"], r["occurrence"]): r for r in old["mutants"]
                    if r["outcome"] in reuse}

    t0 = time.perf_counter()
    _preimport()
    import_s = time.perf_counter() - t0
    sys.dont_write_bytecode = True
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    scratch = Path(tempfile.mkdtemp(prefix=f"sweep-{args.family}-"))
    logs = scratch / "_logs"
    try:
        _copy_tree(scratch)
        logs.mkdir()

        def tests_for(module: str) -> list[str]:
            return family["tests"].get(module, family["tests"]["*"])

        baseline: dict[str, float] = {}
        for group in sorted({" ".join(tests_for(m["module"])) for m in sample}):
            log = logs / "baseline.log"
            outcome, code, seconds = _run_child(scratch, group.split(), log, 1800.0)
            if outcome != "survived":
                print(log.read_text()[-3000:], file=sys.stderr)
                print(f"the unmutated tests fail ({code}): {group}", file=sys.stderr)
                return 2
            baseline[group] = round(seconds, 2)
            print(f"baseline {seconds:.1f} s: {group}", flush=True)
        if args.baseline:
            return 0

        records: list[dict[str, Any]] = []

        def write(complete: bool) -> dict[str, Any]:
            per_module: dict[str, dict[str, int]] = {}
            for r in records:
                counts = per_module.setdefault(r["module"], {"killed": 0, "survived": 0, "timeout": 0,
                                                             "equivalent": 0})
                counts[r["outcome"]] += 1
            tested = [r for r in records if r["outcome"] != "equivalent"]
            detected = sum(r["outcome"] in ("killed", "timeout") for r in tested)
            secs = [r["seconds"] for r in tested]
            from importlib.metadata import version

            result = {
                "family": args.family,
                "command": "nice -n 15 python benchmarks/mutation/sweep.py " + " ".join(
                    a for a in (argv if argv is not None else sys.argv[1:])
                    if a not in ("--rerun", "--resume")),
                "rerun_of_survivors": args.rerun,
                "resumed": args.resume,
                "tool": f"cosmic-ray {version('cosmic-ray')} (operators without arguments), "
                        "pre-forked pytest runner",
                "seed": args.seed,
                "population": len(pop),
                "annotation_mutants_excluded": {
                    "count": len(full) - len(pop),
                    "reason": "in a type annotation, which `from __future__ import annotations` keeps "
                              "as a string nothing evaluates (equivalent)"},
                "sampled": n,
                "modules": family["modules"],
                "tests": family["tests"],
                "pytest_marks": MARKS,
                "baseline_seconds": baseline,
                "import_seconds": round(import_s, 2),
                "seconds_per_mutant": round(sum(secs) / len(secs), 2) if secs else None,
                "wall_seconds": round(time.perf_counter() - t0, 1),
                "per_module": per_module,
                "killed": sum(r["outcome"] == "killed" for r in tested),
                "survived": sum(r["outcome"] == "survived" for r in tested),
                "timeout": sum(r["outcome"] == "timeout" for r in tested),
                "equivalent": [r for r in records if r["outcome"] == "equivalent"],
                "score": round(detected / len(tested), 4) if tested else None,
                "detected": detected,
                "tested": len(tested),
                "complete": complete,
                "mutants": records,
            }
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1) + "\n")
            return result

        for i, m in enumerate(sample):
            if i and i % 5 == 0:
                write(False)  # a partial JSON ("complete": false) if the sweep is stopped
            path = scratch / PKG / m["module"]
            original = path.read_text()
            mutated = mutated_source(m, original)
            before = original.splitlines()[m["line"] - 1].strip()
            rec = dict(m, before=before)
            if mutated is None or mutated == original:
                rec.update(outcome="equivalent", reason="cosmic-ray produced no change")
                records.append(rec)
                continue
            after_lines = mutated.splitlines()
            rec["after"] = after_lines[m["line"] - 1].strip() if m["line"] <= len(after_lines) else ""
            # matched without the line number (lines move with every edit; the reasons are
            # about the mutated text): the line in ``EQUIVALENT`` says where it was written
            key = (m["module"], m["operator"], rec["after"])
            old_rec = previous.get((m["module"], m["operator"], m["occurrence"]))
            if old_rec is not None and old_rec["outcome"] in reuse \
                    and old_rec.get("after") == rec["after"]:
                records.append(old_rec)  # --rerun: killed before, kept (--resume: any outcome)
                continue
            if m["annotation"]:
                rec.update(outcome="equivalent", reason="in a type annotation, which `from "
                           "__future__ import annotations` keeps as a string nothing evaluates")
                records.append(rec)
                continue
            if key in _EQUIVALENT_TEXT:
                rec.update(outcome="equivalent", reason=_EQUIVALENT_TEXT[key])
                records.append(rec)
                continue
            tests = tests_for(m["module"])
            timeout = args.timeout or 4 * baseline[" ".join(tests)] + 30
            path.write_text(mutated)
            log = logs / f"{i}.log"
            try:
                outcome, code, seconds = _run_child(scratch, tests, log, timeout)
            finally:
                path.write_text(original)
            rec.update(outcome=outcome, status=code, seconds=round(seconds, 2))
            if outcome == "killed":
                rec["error"] = code != 1
                rec["failed"] = _first_failure(log)
            records.append(rec)
            print(f"[{i + 1}/{n}] {outcome:8s} {seconds:6.1f} s  {m['module']}:{m['line']} "
                  f"{m['operator']}  {before!r} -> {rec['after']!r}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    summary = write(True)
    print(f"{args.family}: {summary['detected']}/{summary['tested']} detected (score "
          f"{summary['score']}), {summary['survived']} survived, "
          f"{len(summary['equivalent'])} equivalent, {summary['seconds_per_mutant']} s per "
          f"mutant -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
