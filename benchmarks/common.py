"""What the benchmark scripts share: environment, arguments, runs, curves, the JSON document, plots.

Import it before anything from ``fedbayes_flwr``: importing it quietens TensorFlow and Flower and
puts the repository root on ``sys.path`` (so the scripts run without the package installed).
The scripts run as ``python benchmarks/<family>/<script>.py``; each puts this folder on
``sys.path`` before ``import common``. Results go to ``benchmarks/results/<family>/``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# A script lives in benchmarks/<family>/ and writes to benchmarks/results/<family>/.
FAMILY = os.path.basename(os.path.dirname(os.path.abspath(sys.argv[0] or HERE)))
RESULTS_DIR = os.path.join(HERE, "results", FAMILY if FAMILY != "benchmarks" else "")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from fedbayes_flwr.evaluation.plots import plot_curves  # noqa: E402
from fedbayes_flwr.runtime.config import parse_run_config  # noqa: E402
from fedbayes_flwr.runtime.engine import run_in_process  # noqa: E402
from fedbayes_flwr.runtime.recorder import write_json  # noqa: E402

NUM_CLIENTS = 10
TOLERANCE = 0.01  # "within 1% of global VI's test NLL"
# Breast-cancer partitions: name -> (partition, partition-alpha).
PARTITIONS = {
    "iid": ("iid", 0.5),
    "dirichlet-0.1": ("dirichlet", 0.1),
    "dirichlet-0.5": ("dirichlet", 0.5),
}
# The Monte-Carlo Adam local optimiser. Since the registry refactor ``pvi.local-optimiser``
# defaults to ``auto`` (a deterministic solver for linear / logistic models, Adam for BNNs); the
# benchmarks were designed (and their committed numbers produced) with Adam, the old default, so
# every run that relied on the default says so explicitly.
ADAM = {"local-optimiser": "adam"}
# Per-round keys kept from a run's history (logistic benchmarks).
CURVE_KEYS = ("round", "test_nll", "test_accuracy", "test_ece", "test_brier",
              "log_marginal_likelihood", "bytes_down", "bytes_up", "elapsed_s",
              "rejected_replies")


# ---------------------------------------------------------------------------- arguments
def argument_parser(doc: str, quick_help: str, rounds_help: str) -> argparse.ArgumentParser:
    """A parser with the options every benchmark has: ``--quick``, ``--rounds``, ``--seed``,
    ``--results-dir`` and ``--work-dir``. ``doc`` is the script's docstring (its first paragraph
    is the description)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--rounds", type=int, default=None, help=rounds_help)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", default=None,
                        help="where the JSON and plots go (default benchmarks/results; quick: "
                             "<work-dir>/results)")
    parser.add_argument("--work-dir", default=None,
                        help="run output directories (default: a folder in the temp dir)")
    return parser


def resolve_common_args(args, name: str):
    """Fill the defaults shared by the benchmarks: work dir (temp), results dir (benchmarks/results,
    or under the work dir with --quick) and rounds (10, quick 2)."""
    suffix = "_quick" if args.quick else ""
    args.work_dir = os.path.abspath(
        args.work_dir or os.path.join(tempfile.gettempdir(), f"fedbayes_{name}{suffix}"))
    if args.results_dir is None:
        args.results_dir = os.path.join(args.work_dir, "results") if args.quick else RESULTS_DIR
    args.results_dir = os.path.abspath(args.results_dir)
    if args.rounds is None:
        args.rounds = 2 if args.quick else 10
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    return args


def read_results(args, name: str) -> dict:
    """The document ``<results-dir>/<name>.json`` a benchmark wrote (``--replot``)."""
    with open(os.path.join(args.results_dir, f"{name}.json")) as f:
        return json.load(f)


def replot(args, name: str, plot, table) -> None:
    """``--replot``: ``plot(runs, summary, <results-dir>/<name>.png)`` and print
    ``table(summary)`` from the stored ``<results-dir>/<name>.json``; nothing runs."""
    doc = read_results(args, name)
    plot(doc["runs"], doc["summary"], os.path.join(args.results_dir, f"{name}.png"))
    print(table(doc["summary"]))


def prepare_dirs(args, name: str) -> str:
    """Create the results and work directories; the path of the benchmark's JSON."""
    os.makedirs(args.results_dir, exist_ok=True)
    os.makedirs(args.work_dir, exist_ok=True)
    return os.path.join(args.results_dir, f"{name}.json")


# ---------------------------------------------------------------------------- the JSON document
def machine() -> dict:
    """Where the numbers come from (wall times depend on it)."""
    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "python": sys.version.split()[0]}


def meta(name: str, args, **fields) -> dict:
    """The document's header: benchmark, quick, seed, the script's own ``fields``, work dir,
    machine and start time."""
    return {"benchmark": name, "quick": args.quick, "seed": args.seed, **fields,
            "work_dir": args.work_dir, "machine": machine(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S")}


def partition_meta(names) -> dict:
    return {p: dict(zip(("partition", "partition_alpha"), PARTITIONS[p], strict=True))
            for p in names}


class Results:
    """The JSON document, rewritten atomically (:func:`fedbayes_flwr.runtime.recorder.write_json`) after
    every change, so a crash keeps what was finished."""

    def __init__(self, path: str, meta: dict, sections: dict, keep: bool = False):
        """A fresh document (``meta`` then empty ``sections``), or (``keep``) the one already at
        ``path`` if there is one."""
        self.path = path
        self.t0 = time.perf_counter()
        self.doc = {**meta, **copy.deepcopy(sections)}
        if keep and os.path.exists(path):
            with open(path) as f:
                self.doc = json.load(f)
        self.write()

    def write(self) -> None:
        write_json(self.path, self.doc)

    def finish(self, key: str = "benchmark_wall_s") -> None:
        """Record the wall time since the start under ``key``, write, and say where the results
        are."""
        self.doc[key] = round(time.perf_counter() - self.t0, 1)
        self.write()
        print(f"done in {self.doc[key]:.0f}s: {self.path}", flush=True)


def start(name: str, args, sections: dict, keep: bool = False, **fields) -> Results:
    """Create the directories and the document ``<results-dir>/<name>.json`` (header
    :func:`meta` with ``fields``, then ``sections``; ``keep``: the existing document) and say
    where everything goes. The benchmark's wall time counts from here."""
    path = prepare_dirs(args, name)
    results = Results(path, meta(name, args, **fields), sections, keep=keep)
    print(f"results -> {path}; run outputs -> {args.work_dir}", flush=True)
    return results


# ---------------------------------------------------------------------------- runs
def reused(runs_by_group: dict, group: str, method: str, key: str) -> dict | None:
    """A run of ``method`` already made for another group (partition / split), marked with
    ``key``; pooled-data runs (global VI) do not depend on the group, so they run once."""
    for other, runs in runs_by_group.items():
        if other != group and method in runs:
            return {**runs[method], key: other}
    return None


def timed_run(cfg: dict) -> tuple[dict, dict]:
    """One in-process run of the kebab-case run config ``cfg``: ``(result, record)``, where
    ``result`` is the ``result.json`` content and ``record`` holds the effective run config
    (dotted section keys, ``pvi.damping``), the outcome, the wall time, the 1-minute load
    average before the run and the output directory."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = run_in_process(parse_run_config(cfg), progress=False)
    wall = time.perf_counter() - t0
    return result, {"run_config": result["run_config"], "outcome": result.get("outcome"),
                    "wall_s": round(wall, 3), "load_avg_1min_before": round(load, 2),
                    "output_dir": cfg["output-dir"]}


def run_note(run: dict, key: str) -> str:
    """``(reused from X)`` for a shared run, else its wall time."""
    return f"(reused from {run[key]})" if key in run else f"wall={run['wall_s']:.1f}s"


def section_value(run_config: dict, key: str, bundle: str = "pvi"):
    """A section key of a stored run config (``result.json`` stores them dotted: ``pvi.damping``)."""
    return run_config.get(f"{bundle}.{key}", run_config.get(key))


# ---------------------------------------------------------------------------- curves
def curve(history: list[dict], updates_per_round: int, keys=CURVE_KEYS,
          skip_missing: bool = False) -> list[dict]:
    """History rows (one per evaluation point) reduced to ``keys`` (a key a row lacks is None, or
    left out with ``skip_missing``), plus cumulative client updates."""
    rows = []
    for h in history:
        row = {k: h.get(k) for k in keys if not skip_missing or k in h}
        row["client_updates"] = h["round"] * updates_per_round
        rows.append(row)
    return rows


def health(rows: list[dict]) -> dict:
    """Signs of trouble: rejected replies, non-finite metrics, NLL rising at the end."""
    nll = [r["test_nll"] for r in rows]
    finite = all(v is not None and math.isfinite(v) for v in nll)
    best = min(nll) if finite else None
    out = {"rejected_replies": int(sum(r.get("rejected_replies") or 0 for r in rows)),
           "all_finite": finite, "best_test_nll": best,
           "final_over_best": nll[-1] / best if finite and best else None}
    acc = [r["test_accuracy"] for r in rows if r.get("test_accuracy") is not None]
    if acc:
        out["best_test_accuracy"] = max(acc)
    return out


def rounds_to_within(rows: list[dict], reference: float, tol: float = TOLERANCE) -> dict:
    """First round whose test NLL <= (1 + tol) * reference, and the first after which all stay."""
    target = (1.0 + tol) * reference
    hit = [r["test_nll"] is not None and r["test_nll"] <= target for r in rows]
    first = next((r for r, ok in zip(rows, hit, strict=True) if ok), None)
    stay = None
    for i in range(len(rows) - 1, -1, -1):
        if not hit[i]:
            break
        stay = rows[i]
    return {"target_nll": target,
            "round": None if first is None else first["round"],
            "client_updates": None if first is None else first["client_updates"],
            "round_stays_within": None if stay is None else stay["round"],
            "client_updates_stays_within": None if stay is None else stay["client_updates"]}


# ---------------------------------------------------------------------------- timing
def per_round_excl_first(elapsed: list[float]) -> float | None:
    """Mean seconds per recorded round after the first (round 1 also pays for TensorFlow
    tracing and, under Flower, node discovery); None with fewer than two rounds."""
    n = len(elapsed)
    return (elapsed[-1] - elapsed[0]) / (n - 1) if n > 1 else None


def ratio(num, den):
    return num / den if num is not None and den else None


def spread(values: list[float]) -> dict:
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "std": float(v.std()), "min": float(v.min()),
            "max": float(v.max())}


# ---------------------------------------------------------------------------- plots
def plot_nll(curves: dict, results_dir: str, stem: str, title: str, hline: tuple,
             zoom_from: int = NUM_CLIENTS, flat: dict | None = None) -> None:
    """Test NLL against client updates, to ``<stem>.png`` and, from ``zoom_from`` client updates
    on (the end of the first pass), ``<stem>_zoom.png``. ``flat`` maps a label to a value drawn
    as a flat curve across each figure; ``hline`` is ``(label, value)``, dashed."""
    last_x = max(pts[-1][0] for pts in curves.values())
    for suffix, x0 in (("", 0), ("_zoom", zoom_from)):
        shown = {k: [(x, y) for x, y in pts if x >= x0] for k, pts in curves.items()}
        shown.update({k: [(x0, v), (last_x, v)] for k, v in (flat or {}).items()})
        plot_curves(shown, os.path.join(results_dir, f"{stem}{suffix}.png"),
                    xlabel="client updates", ylabel="test NLL",
                    title=title + (" (zoom)" if suffix else ""), hline=hline)


# marker and colour of each merge in the AMPS benchmarks' per-seed figures
MERGE_STYLE = {"bipartite": ("o", "tab:blue"), "swap": ("x", "tab:cyan"),
               "naive": ("s", "tab:red"), "batch": ("D", "black")}


def plot_methods_by_seed(ax, rows: list[dict], key: str, ylabel: str, methods, labels: dict,
                         style: dict = MERGE_STYLE) -> None:
    """One-shot merges per seed: the single agents' mean (min-max bars) and one marker per
    method (``style[m] = (marker, colour)``; ``batch`` hollow and larger) of ``row[m][key]``."""
    seeds = [r["seed"] for r in rows]
    loc = [r["local"][key] for r in rows]
    mid = np.array([v["mean"] for v in loc])
    ax.errorbar(seeds, mid, yerr=[mid - [v["min"] for v in loc], [v["max"] for v in loc] - mid],
                fmt="^", color="tab:gray", alpha=0.6, capsize=2,
                label="single agents (mean, min-max)")
    for m in methods:
        marker, color = style[m]
        ax.plot(seeds, [r[m][key] for r in rows], marker, color=color, ls="none",
                mfc="none" if m == "batch" else color, ms=8 if m == "batch" else 6,
                label=labels[m])
    ax.set_xlabel("seed")
    ax.set_xticks(seeds)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


ESS_PER_WORK = (("ess_per_event", "ESS / event", "tab:blue"),
                ("ess_per_full_grad", "ESS / full-data gradient", "tab:green"),
                ("ess_per_busiest_worker_grad", "ESS / gradient of the busiest worker",
                 "tab:orange"))


def plot_ess_per_work(ax, per: dict, ms, title: str, spread_bars: bool = False) -> None:
    """Federated samplers against the number of workers M: ESS per event, per full-data
    gradient and per gradient of the busiest worker (``per[str(M)][key]`` holds ``mean`` and
    ``std``; ``spread_bars`` draws +- sd), log-log."""
    for key, label, color in ESS_PER_WORK:
        mean = np.array([per[str(m)][key]["mean"] for m in ms])
        if spread_bars:
            sd = np.array([per[str(m)][key]["std"] for m in ms])
            ax.errorbar(ms, mean, yerr=sd, fmt="o-", color=color, capsize=3, label=label)
        else:
            ax.plot(ms, mean, "o-", color=color, label=label)
    workers_axes(ax, ms, "ESS (mean over coordinates) per unit of work")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def workers_axes(ax, ms, ylabel: str) -> None:
    """Log-log axes over the numbers of workers ``ms`` (ticks at each M), with a grid."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("workers M")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")


# ---------------------------------------------------------------------------- Flower runs
def per_exchange(history: list[dict], skip: int = 1) -> tuple[float, int]:
    """Seconds per exchange over the recorded rows after the first ``skip`` (warm-up)."""
    rows = history[skip - 1:] if skip else history
    if len(rows) < 2:
        return float("nan"), 0
    exchanges = rows[-1]["round"] - rows[0]["round"]
    return (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / exchanges, exchanges


def toml_value(value) -> str:
    """A run-config value in Flower's TOML syntax."""
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(value) if isinstance(value, str) else str(value)


def flower_run(keys: dict, workers: int, rounds: int, eval_every: int, out: str,
               cpus: float, keep=("round", "elapsed_s", "events")) -> dict:
    """One ``run_simulation.py --engine simulation`` run (``keys`` as run config); seconds per
    update after the first recorded row, and the history rows' ``keep`` keys."""
    rc = " ".join(f"{k}={toml_value(v)}" for k, v in {**keys, "eval-every": eval_every}.items())
    cmd = [sys.executable, os.path.join(ROOT, "run_simulation.py"), "--engine", "simulation",
           "--quiet", "--output-dir", out, "--num-clients", str(workers), "--num-rounds",
           str(rounds), "--num-cpus-per-client", str(cpus), "--run-config", rc]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800,
                          env={**os.environ, "PYTHONPATH": ROOT})
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    with open(os.path.join(out, "result.json")) as f:
        result = json.load(f)
    per, counted = per_exchange(result["history"])
    return {"seconds_per_exchange": per, "exchanges_counted": counted, "history":
            [{k: h.get(k) for k in keep} for h in result["history"]],
            "wall_s": round(time.perf_counter() - t0, 1)}


