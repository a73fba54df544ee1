"""Leaderboard: ``run_simulation.py --compare`` on the embedded data sets, with every family's defaults.

Runs the CLI exactly as the docs print it (``python run_simulation.py --engine in-process --compare
...``, with ``python`` this interpreter), one command per case, and collects each case's
``compare.json`` into ``benchmarks/results/compare/leaderboard.json`` (and its ``compare.png`` as
``<case>.png``); ``--write-docs`` then
rewrites the leaderboard section of ``docs/compare.md`` from that JSON (``render_docs``), which
``tests/comparison/test_leaderboard_docs.py`` checks is what the page holds.

Cases: breast-cancer logistic regression (NUTS reference on the pooled 455 rows, 31 parameters),
diabetes linear regression (the exact posterior) and digits softmax regression (650 parameters: no
reference, predictive metrics only). Every case: 10 clients, Dirichlet(0.5) label split where the
target is a class, seed 0, each algorithm's defaults (no ``--num-rounds``: the samplers then run
their own lengths).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import common  # noqa: E402

NAME = "leaderboard"
DOCS_PAGE = os.path.join(common.ROOT, "docs", "compare.md")
START, END = "<!-- leaderboard:start -->", "<!-- leaderboard:end -->"
ALGORITHMS = "pvi,global-vi,dsvgd,sgld,fedavg,amps,pdmc,dhmc"
CASES = {
    "breast-cancer-logistic": ["--model", "logistic-regression", "--dataset", "breast-cancer",
                               "--partition", "dirichlet", "--partition-alpha", "0.5"],
    "diabetes-linear": ["--model", "linear-regression", "--dataset", "diabetes",
                        "--partition", "iid"],
    "digits-softmax": ["--model", "bnn-classifier", "--dataset", "digits", "--partition",
                       "dirichlet", "--partition-alpha", "0.5", "--partition-classes", "10",
                       "--run-config", "hidden-layers=''"],
}
SOFTMAX_ALGORITHMS = "pvi,dsvgd,sgld,fedavg"  # the samplers and AMPS refuse or need a potential


def command(case: str, algorithms: str, seed: int, output_dir: str) -> list[str]:
    """The CLI command of ``case`` as the docs print it (``python`` first)."""
    return ["python", "run_simulation.py", "--engine", "in-process", "--quiet", "--compare",
            algorithms, *CASES[case], "--num-clients", "10", "--seed", str(seed),
            "--output-dir", output_dir]


def render_docs(doc: dict) -> str:
    """The docs' leaderboard section (between the markers) from the benchmark's JSON."""
    parts = [START, ""]
    for case in doc["cases"]:
        ref = case["reference"]
        parts += [f"### {case['name']}", "", "```text", case["command"], "```", "",
                  f"Reference: {ref['kind']}"
                  + (f" ({ref['diagnostics']['reason']})" if "reason" in ref["diagnostics"] else "")
                  + (f"; min ESS {ref['diagnostics']['ess_min']:.0f}, max R-hat "
                     f"{ref['diagnostics']['rhat_max']:.4f}" if ref["kind"] == "nuts" else "")
                  + (f"; a perfect sampler's W1 is about {ref['diagnostics']['w1_floor']:.3f} "
                     f"reference sd" if "w1_floor" in ref["diagnostics"] else "") + ".", "",
                  case["table"].rstrip(), ""]
    machine = doc["header"]["machine"]
    load = doc.get("load_average")
    parts += [f"Measured {doc['header']['started']} ({machine['cpus']} CPUs, "
              f"{machine['platform']}), {doc['seconds']:.0f} s in all"
              + (f", 1-minute load average {load[0]:.1f} at the start and {load[1]:.1f} at the "
                 f"end (wall times, and the samplers that stop at their time limit, depend on "
                 f"it)" if load else "") + ".", "", END]
    return "\n".join(parts)


def write_docs(doc: dict, page: str = DOCS_PAGE) -> None:
    with open(page) as f:
        text = f.read()
    if START not in text or END not in text:
        raise SystemExit(f"{page}: no {START} ... {END} section")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    with open(page, "w") as f:
        f.write(head + render_docs(doc) + tail)


def main() -> int:
    parser = common.argument_parser(__doc__, "digits and breast-cancer with pvi,sgld only",
                                    "unused (each algorithm runs its defaults)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite docs/compare.md's leaderboard from the JSON (nothing runs "
                             "when the JSON exists and --cases is not given)")
    args = common.resolve_common_args(parser.parse_args(), NAME)
    out = common.prepare_dirs(args, NAME)
    if args.write_docs and os.path.exists(out) and "--cases" not in sys.argv:
        with open(out) as f:
            write_docs(json.load(f))
        return 0
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    doc = {"header": common.meta(NAME, args, cases=cases), "cases": [],
           "load_average": [os.getloadavg()[0]] * 2}
    start = time.perf_counter()
    for case in cases:
        algorithms = SOFTMAX_ALGORITHMS if case == "digits-softmax" else ALGORITHMS
        if args.quick:
            algorithms = "pvi,sgld"
        folder = os.path.join(args.work_dir, case)
        shown = command(case, algorithms, args.seed, f"runs/compare-{case}")
        argv = [sys.executable, *command(case, algorithms, args.seed, folder)[1:]]
        print(f"{case}: {shlex.join(shown)}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=common.ROOT, text=True, capture_output=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{case}: exit {proc.returncode}")
        with open(os.path.join(folder, "compare.json")) as f:
            result = json.load(f)
        with open(os.path.join(folder, "compare.md")) as f:
            table = f.read().split("\n\n", 2)[2].split("\n\n")[0]  # after the title and ref
        doc["cases"].append({"name": case, "command": shlex.join(shown),
                             "seconds": time.perf_counter() - t0,
                             "reference": {"kind": result["reference"]["kind"],
                                           "diagnostics": result["reference"]["diagnostics"]},
                             "algorithms": result["algorithms"], "table": table})
        doc["seconds"] = time.perf_counter() - start
        doc["load_average"][1] = os.getloadavg()[0]
        common.write_json(out, doc)  # after every case: nothing lost
        shutil.copyfile(os.path.join(folder, "compare.png"),
                        os.path.join(args.results_dir, f"{case}.png"))
        print(table, flush=True)
    if args.write_docs:
        write_docs(doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
