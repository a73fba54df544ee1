"""Per-exchange cost of a Flower deployment on this machine, split by who controls it.

Runs ``fedbayes_flwr.deploy.run.run_deployment`` (TLS, SuperNode authentication, one SuperNode per
partition: what ``run_simulation.py --engine deployment`` runs) for

* ``empty``: the empty-exchange plugin (``benchmarks/flower/empty_exchange.py``: one integer each way,
  nothing computed), Flower's own cost per exchange plus this app's start-up;
* ``linear``: PVI on Bayesian linear regression (conjugate: closed-form local step), synthetic;
* ``logistic``: PVI on logistic regression (the deterministic local solver, TensorFlow), breast
  cancer;

each ``before`` (the client app as it was before issue 12: TensorFlow imported with the app,
via ``benchmarks/flower/eager_imports.py``, and the data loaded and split again for every message) and
``after`` (lazy TensorFlow, node-local partition cache). With ``FEDBAYES_TIMING_LOG`` set, the
ClientApp appends the timestamps of every message (``clients/client_app.py``); per message:

* ``flower_start``: process start to the app's first import (Flower starts a new ClientApp
  process per message and imports ``flwr``),
* ``imports``: this app's modules and the run's plugin modules,
* ``data``: run config, data load and partitioning (or the cached partition), model and prior,
* ``compute``: decode, client step, encode,

and per exchange the wall time between the last replies of consecutive exchanges (the first
exchange of a run, with the cache miss and the ServerApp's start, is reported apart). Project-
controlled time = imports + data + compute; the rest of an exchange is Flower's (process start,
its fixed polls: SuperNode idle sleep 3 s, SuperExec poll 1 s, transport).

Usage::

    .venv/bin/python benchmarks/flower/deployment_split.py            # every case, before and after
    .venv/bin/python benchmarks/flower/deployment_split.py --cases linear --modes after --rounds 2

Writes ``benchmarks/results/flower/deployment_split.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from fedbayes_flwr.deploy.run import run_deployment  # noqa: E402
from fedbayes_flwr.runtime.config import parse_run_config  # noqa: E402

CASES = {
    "empty": {"algorithm": "empty-exchange", "algorithm-modules": "benchmarks.flower.empty_exchange",
              "model": "linear-regression", "dataset": "synthetic"},
    "linear": {"algorithm": "pvi", "model": "linear-regression", "dataset": "synthetic"},
    "logistic": {"algorithm": "pvi", "model": "logistic-regression",
                 "dataset": "breast-cancer"},
}
PHASES = ("flower_start", "imports", "data", "compute")


def phases(row: dict) -> dict:
    """One message's split (seconds)."""
    start = row["process_start"] or row["import_start"]
    return {"flower_start": row["import_start"] - start,
            "imports": (row["import_end"] - row["import_start"])
            + (row["handler_start"] - row["call_start"]),
            "data": row["data_ready"] - row["handler_start"],
            "compute": row["reply_ready"] - row["data_ready"]}


def exchanges(rows: list[dict]) -> list[list[dict]]:
    """Messages grouped by exchange (same message type, action and update), in time order."""
    groups = defaultdict(list)
    for row in rows:
        groups[(row["type"], row["action"], row["round"])].append(row)
    return sorted(groups.values(), key=lambda g: min(r["handler_start"] for r in g))


def summarise(rows: list[dict]) -> dict:
    groups = exchanges(rows)
    ends = [max(r["reply_ready"] for r in g) for g in groups]
    walls = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    steady = [phases(r) for g in groups[1:] for r in g]
    first = [phases(r) for r in groups[0]] if groups else []

    def mean(items, key):
        return round(statistics.fmean(p[key] for p in items), 3) if items else None

    out = {"exchanges": len(groups), "messages": len(rows),
           "wall_per_exchange_s": round(statistics.fmean(walls), 3) if walls else None,
           "wall_per_exchange_sd_s": round(statistics.stdev(walls), 3) if len(walls) > 1 else None,
           "first_exchange": {k: mean(first, k) for k in PHASES}}
    out.update({k: mean(steady, k) for k in PHASES})
    if steady:
        out["project_s"] = round(sum(out[k] for k in ("imports", "data", "compute")), 3)
    return out


def run_case(case: str, mode: str, rounds: int, clients: int, work: str) -> dict:
    keys = dict(CASES[case], **{"num-clients": clients, "num-rounds": rounds, "seed": 0,
                                "output-dir": os.path.join(work, f"{case}-{mode}")})
    if mode == "before":
        modules = keys.get("algorithm-modules", "")
        keys["algorithm-modules"] = ",".join(m for m in (modules, "benchmarks.flower.eager_imports")
                                             if m)
    log = os.path.join(work, f"{case}-{mode}.jsonl")
    os.environ["FEDBAYES_TIMING_LOG"] = log
    started = time.monotonic()
    try:
        run_deployment(parse_run_config(keys).to_run_config(), progress=True,
                       partition_cache=(mode == "after"))
    finally:
        os.environ.pop("FEDBAYES_TIMING_LOG", None)
    total = time.monotonic() - started
    with open(log) as f:
        rows = [json.loads(line) for line in f]
    with open(os.path.join(keys["output-dir"], "result.json")) as f:
        result = json.load(f)
    return {"case": case, "mode": mode, "rounds": rounds, "clients": clients,
            "command_s": round(total, 1), "outcome": result["outcome"], **summarise(rows)}


def table(results: list[dict]) -> str:
    head = ("| case | mode | exchanges | wall / exchange (s) | Flower start (s) | imports (s) | "
            "data (s) | compute (s) | project-controlled (s) |")
    lines = [head, "|" + "---|" * 9]
    for r in results:
        lines.append(f"| {r['case']} | {r['mode']} | {r['exchanges']} | "
                     f"{r['wall_per_exchange_s']} ± {r['wall_per_exchange_sd_s']} | "
                     f"{r['flower_start']} | {r['imports']} | {r['data']} | {r['compute']} | "
                     f"{r.get('project_s')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--modes", default="before,after")
    parser.add_argument("--rounds", type=int, default=3, help="updates per run (default 3)")
    parser.add_argument("--clients", type=int, default=3, help="SuperNodes (default 3)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "flower",
                                                      "deployment_split.json"))
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="deployment-split-")
    results = []
    for case in args.cases.split(","):
        for mode in args.modes.split(","):
            results.append(run_case(case, mode, args.rounds, args.clients, work))
            print(json.dumps(results[-1]), flush=True)
    doc = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "load_average": os.getloadavg()},
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "results": results}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
