#!/usr/bin/env python
"""Benchmark: PVI (synchronous / sequential) against global VI, and Flower against in-process.

Breast-cancer logistic regression (the default dataset and model), 10 clients. For each partition
(iid, Dirichlet alpha = 0.1, Dirichlet alpha = 0.5) it runs, in-process:

* synchronous PVI (damping 0.5, the default) for ``R`` rounds (10 client updates a round);
* sequential PVI (damping 1.0 and 0.5) for ``10 R`` rounds (one client update a round), so both
  schedules spend the same number of client updates (``10 R``);
* global VI (one client with the pooled data) for ``R`` rounds with the same optimiser settings;
  its final test NLL is the reference (the ``damping = 1.0`` run; the default ``damping = 0.5``
  run is recorded alongside, and a run with a converged optimiser -- 5000 steps, learning rate
  0.01, 50 MC samples -- is a second reference). Global VI does not depend on the partition, so
  it runs once and is shared.

Every run uses the Monte-Carlo Adam local optimiser (``local-optimiser = "adam"``, stated
explicitly: the run-config default became ``auto`` in the registry refactor).

It records test NLL / accuracy per round, the first round (and client update) at which each PVI
run's test NLL is within 1% of global VI's, and, for synchronous PVI on Dirichlet 0.5, the wall
time per round of Flower's Simulation Engine against the in-process engine (same seed), checking
that both give the same posterior.

Usage::

    .venv/bin/python benchmarks/pvi/pvi_vs_global_vi.py            # full run, a few minutes
    .venv/bin/python benchmarks/pvi/pvi_vs_global_vi.py --quick    # smoke test, about a minute

Results: ``benchmarks/results/pvi/pvi_vs_global_vi.json`` (written after every configuration) and
``benchmarks/results/pvi/pvi_vs_global_vi_<partition>[_zoom].png`` plus ``..._timing.png``. ``--quick``
writes to a temporary directory instead (see ``--results-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common  # first: environment and sys.path
import numpy as np

from fedbayes_flwr.evaluation.plots import plot_curves

NAME = "pvi_vs_global_vi"
NUM_CLIENTS = common.NUM_CLIENTS
TOLERANCE = common.TOLERANCE
PARTITIONS = common.PARTITIONS  # name -> (partition, partition-alpha)
# name -> (algorithm, schedule, damping, rounds multiplier, client updates per round, overrides)
METHODS = {
    "sync-pvi-d0.5": ("pvi", "synchronous", 0.5, 1, NUM_CLIENTS, {}),
    "seq-pvi-d1.0": ("pvi", "sequential", 1.0, NUM_CLIENTS, 1, {}),
    "seq-pvi-d0.5": ("pvi", "sequential", 0.5, NUM_CLIENTS, 1, {}),
    "global-vi-d1.0": ("global-vi", "synchronous", 1.0, 1, 1, {}),
    # The global-vi preset fixes pvi.damping = 1.0, so this run now equals global-vi-d1.0 (the
    # committed results predate that preset); kept so the JSON keeps its shape.
    "global-vi-d0.5": ("global-vi", "synchronous", 0.5, 1, 1, {}),
    # Global VI with a converged optimiser (the default 1000 Adam steps at lr 0.1 with 10 MC
    # samples leave the pooled 455-row problem noticeably short of its optimum).
    "global-vi-converged": ("global-vi", "synchronous", 1.0, 1, 1,
                            {"local-steps": 5000, "learning-rate": 0.01, "mc-samples": 50}),
}
# The reference: global VI with the same optimiser settings as PVI (Adam, run-config defaults).
REFERENCE = "global-vi-d1.0"
CONVERGED_REFERENCE = "global-vi-converged"
TIMING_PARTITION = "dirichlet-0.5"
HEADLINE_PARTITION = "dirichlet-0.5"


def run_config(method: str, partition: str, rounds: int, seed: int, output_dir: str) -> dict:
    """The kebab-case run config of one (method, partition); PVI's keys are bare (they resolve to
    the ``pvi`` section) and every method uses Adam (:data:`common.ADAM`)."""
    algorithm, schedule, damping, mult, _, overrides = METHODS[method]
    scheme, alpha = PARTITIONS[partition]
    return {"algorithm": algorithm, "schedule": schedule, "damping": damping, **common.ADAM,
            "partition": scheme, "partition-alpha": alpha, "num-clients": NUM_CLIENTS,
            "num-rounds": rounds * mult, "seed": seed, **overrides, "output-dir": output_dir}


def run_method(method: str, partition: str, args, results: common.Results) -> dict:
    """One in-process run; global VI pools the data, so its run is shared by every partition."""
    if METHODS[method][0] == "global-vi":
        shared = common.reused(results.doc["runs"], partition, method, "reused_from_partition")
        if shared is not None:
            return shared
    out = os.path.join(args.work_dir, partition, method)
    result, record = common.timed_run(run_config(method, partition, args.rounds, args.seed, out))
    rows = common.curve(result["history"], METHODS[method][4])
    return {**record, "health": common.health(rows), "curve": rows}


def run_partition(partition: str, args, results: common.Results) -> None:
    """Every method on one partition, in-process; reference, rounds-to-1%, finals, plot."""
    runs = results.doc["runs"].setdefault(partition, {})
    for method in METHODS:
        runs[method] = run_method(method, partition, args, results)
        results.write()
        last = runs[method]["curve"][-1]
        note = common.run_note(runs[method], "reused_from_partition")
        print(f"[{partition:>13}] {method:<19} rounds={last['round']:>3} "
              f"updates={last['client_updates']:>3} test_nll={last['test_nll']:.5f} "
              f"acc={last['test_accuracy']:.4f} "
              f"rejected={runs[method]['health']['rejected_replies']} {note}", flush=True)

    final = {m: run["curve"][-1] for m, run in runs.items()}
    ref = final[REFERENCE]["test_nll"]
    conv = final[CONVERGED_REFERENCE]["test_nll"]
    results.doc["reference"][partition] = {
        "method": REFERENCE, "test_nll": ref, "test_accuracy": final[REFERENCE]["test_accuracy"],
        "log_marginal_likelihood": final[REFERENCE]["log_marginal_likelihood"],
        "test_nll_over_rounds": common.spread([r["test_nll"] for r in runs[REFERENCE]["curve"]]),
        "log_marginal_likelihood_over_rounds": common.spread(
            [r["log_marginal_likelihood"] for r in runs[REFERENCE]["curve"]]),
        "converged_method": CONVERGED_REFERENCE, "converged_test_nll": conv,
        "converged_log_marginal_likelihood": final[CONVERGED_REFERENCE]["log_marginal_likelihood"],
        "default_damping_method": "global-vi-d0.5",
        "default_damping_test_nll": final["global-vi-d0.5"]["test_nll"]}
    hits, finals = {}, {}
    for method, row in final.items():
        finals[method] = {"test_nll": row["test_nll"], "test_accuracy": row["test_accuracy"],
                          "log_marginal_likelihood": row["log_marginal_likelihood"],
                          "rounds": row["round"], "client_updates": row["client_updates"]}
        if METHODS[method][0] == "pvi":
            hits[method] = common.rounds_to_within(runs[method]["curve"], ref)
            finals[method]["relative_gap_to_global_vi"] = (row["test_nll"] - ref) / ref
            finals[method]["relative_gap_to_converged_global_vi"] = (row["test_nll"] - conv) / conv
    results.doc["rounds_to_within_1pct"][partition] = hits
    results.doc["final"][partition] = finals
    if partition == HEADLINE_PARTITION:
        pvi_methods = [m for m in finals if METHODS[m][0] == "pvi"]
        results.doc["headline"] = {
            "partition": partition, "sync_rounds": args.rounds,
            "global_vi_test_nll": ref, "converged_global_vi_test_nll": conv,
            **{f"{m}_test_nll": finals[m]["test_nll"] for m in pvi_methods},
            **{f"{m}_relative_gap": finals[m]["relative_gap_to_global_vi"] for m in pvi_methods},
            **{f"{m}_relative_gap_to_converged": finals[m]["relative_gap_to_converged_global_vi"]
               for m in pvi_methods},
            **{f"{m}_rounds_to_within_1pct": hits[m]["round"] for m in pvi_methods}}
    results.write()
    for method, h in hits.items():
        f = finals[method]
        print(f"[{partition:>13}] {method:<19} within 1% of global VI ({ref:.5f}) at "
              f"round={h['round']} (updates={h['client_updates']}, stays from round "
              f"{h['round_stays_within']}); final gap {f['relative_gap_to_global_vi']:+.2%}, "
              f"to converged global VI ({conv:.5f}) "
              f"{f['relative_gap_to_converged_global_vi']:+.2%}", flush=True)

    curves = {method: [(r["client_updates"], r["test_nll"]) for r in run["curve"]]
              for method, run in runs.items() if METHODS[method][0] == "pvi"}
    common.plot_nll(curves, args.results_dir, f"{NAME}_{partition}",
                    title=f"breast-cancer logistic regression, {NUM_CLIENTS} clients, {partition}",
                    hline=("global VI (same optimiser)", ref),
                    flat={"global VI (converged optimiser)": conv})


def run_engine(engine: str, partition: str, args) -> dict:
    """Synchronous PVI through run_simulation.py (a fresh process) with one engine."""
    out = os.path.join(args.work_dir, "timing", engine)
    cfg = run_config("sync-pvi-d0.5", partition, args.rounds, args.seed, out)
    overrides = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                         for k, v in cfg.items() if k != "output-dir")
    cmd = [sys.executable, os.path.join(common.ROOT, "run_simulation.py"), "--engine", engine,
           "--output-dir", out, "--run-config", overrides, "--quiet"]
    log_path = os.path.join(args.work_dir, "timing", f"{engine}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, cwd=common.ROOT, stdout=log, stderr=subprocess.STDOUT,
                            timeout=args.timeout).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{engine} run failed (exit {rc}); see {log_path}")
    with open(os.path.join(out, "result.json")) as f:
        result = json.load(f)
    with np.load(os.path.join(out, "posterior.npz")) as z:
        mean = z["mean"].copy()
    elapsed = [h["elapsed_s"] for h in result["history"]]
    n = len(elapsed)
    per_round = common.per_round_excl_first(elapsed)
    return {"engine": engine, "command": cmd, "log": log_path, "process_wall_s": round(wall, 3),
            "outcome": result.get("outcome"),
            "rounds": n, "elapsed_s": elapsed,
            "round_1_s": elapsed[0],
            "total_s": elapsed[-1],
            "mean_s_per_round_excl_round_1": per_round,
            "mean_s_per_round_incl_round_1": elapsed[-1] / n,
            "final_test_nll": result["final"]["test_nll"],
            "final_log_marginal_likelihood": result["final"]["log_marginal_likelihood"],
            "rejected_replies": int(sum(h["rejected_replies"] for h in result["history"])),
            "history_test_nll": [h["test_nll"] for h in result["history"]],
            "_mean": mean}


def run_timing(args, results: common.Results) -> None:
    """Flower Simulation Engine against the in-process engine, same config and seed.

    Each repeat runs both engines as fresh processes; the summary ratios are medians over repeats.
    The 1-minute load average before each run is recorded: other work on the machine skews the
    figures (Flower runs two clients at a time on two cores, in-process runs them one by one).
    """
    partition = TIMING_PARTITION
    repeats = []
    for rep in range(args.timing_repeats):
        engines = {}
        for engine in ("in-process", "simulation"):
            load = os.getloadavg()[0]
            engines[engine] = run_engine(engine, partition, args)
            e = engines[engine]
            e["load_avg_1min_before"] = round(load, 2)
            print(f"[timing {rep + 1}/{args.timing_repeats}] {engine:<10} rounds={e['rounds']} "
                  f"total={e['total_s']:.2f}s "
                  f"per-round(excl. r1)={e['mean_s_per_round_excl_round_1'] or float('nan'):.3f}s"
                  f" process={e['process_wall_s']:.1f}s test_nll={e['final_test_nll']:.6f} "
                  f"load={load:.2f}", flush=True)
        flw, inp = engines["simulation"], engines["in-process"]
        repeats.append({
            "engines": engines,
            "ratio_per_round_excl_round_1": common.ratio(
                flw["mean_s_per_round_excl_round_1"], inp["mean_s_per_round_excl_round_1"]),
            "ratio_total": common.ratio(flw["total_s"], inp["total_s"]),
            "ratio_process_wall": common.ratio(flw["process_wall_s"], inp["process_wall_s"]),
            "same_posterior_max_abs_diff_mean": float(np.max(np.abs(flw.pop("_mean")
                                                                    - inp.pop("_mean")))),
            "test_nll_abs_diff": abs(flw["final_test_nll"] - inp["final_test_nll"]),
            "log_marginal_likelihood_abs_diff": abs(flw["final_log_marginal_likelihood"]
                                                    - inp["final_log_marginal_likelihood"])})

    def median(key, engine=None):
        vals = [(r["engines"][engine][key] if engine else r[key]) for r in repeats]
        vals = [v for v in vals if v is not None]
        return float(np.median(vals)) if vals else None

    bench_run = results.doc["runs"].get(partition, {}).get("sync-pvi-d0.5")
    first_inp = repeats[0]["engines"]["in-process"]
    results.doc["timing"] = {
        "config": run_config("sync-pvi-d0.5", partition, args.rounds, args.seed, "<per engine>"),
        "note": "elapsed_s is measured by the server's Recorder from its creation (after data "
                "loading; for Flower also after Ray start-up, but including node discovery). "
                "Round 1 also includes TensorFlow tracing in every process, so the per-round "
                "figure excludes it. Each Flower round is one train and one evaluate exchange. "
                "Summary figures are medians over repeats.",
        "repeats": repeats,
        "in_process": {k: median(k, "in-process") for k in (
            "mean_s_per_round_excl_round_1", "mean_s_per_round_incl_round_1", "round_1_s",
            "total_s", "process_wall_s")},
        "flower_simulation": {k: median(k, "simulation") for k in (
            "mean_s_per_round_excl_round_1", "mean_s_per_round_incl_round_1", "round_1_s",
            "total_s", "process_wall_s")},
        "ratio_flower_over_in_process_per_round_excl_round_1": median(
            "ratio_per_round_excl_round_1"),
        "ratio_flower_over_in_process_total": median("ratio_total"),
        "ratio_flower_over_in_process_process_wall": median("ratio_process_wall"),
        "same_posterior_max_abs_diff_mean": max(r["same_posterior_max_abs_diff_mean"]
                                                for r in repeats),
        "test_nll_abs_diff": max(r["test_nll_abs_diff"] for r in repeats),
        "log_marginal_likelihood_abs_diff": max(r["log_marginal_likelihood_abs_diff"]
                                                for r in repeats),
        "in_process_matches_benchmark_run": None if bench_run is None else
        abs(bench_run["curve"][-1]["test_nll"] - first_inp["final_test_nll"]),
    }
    results.write()
    t = results.doc["timing"]
    per_round = t["ratio_flower_over_in_process_per_round_excl_round_1"]
    print(f"[timing] median flower/in-process per round (excl. r1) = "
          f"{float('nan') if per_round is None else per_round:.2f}x, total = "
          f"{t['ratio_flower_over_in_process_total']:.2f}x; max |mean diff| = "
          f"{t['same_posterior_max_abs_diff_mean']:.2e}, |NLL diff| = "
          f"{t['test_nll_abs_diff']:.2e}", flush=True)
    curves = {f"{engine} #{i + 1}": [(r, s) for r, s in enumerate(e["elapsed_s"], start=1)]
              for i, rep in enumerate(repeats) for engine, e in rep["engines"].items()}
    plot_curves(curves, os.path.join(args.results_dir, f"{NAME}_timing.png"),
                xlabel="round", ylabel="elapsed seconds (server)",
                title=f"sync PVI, {partition}: Flower simulation vs in-process")


def parse_args(argv=None) -> argparse.Namespace:
    parser = common.argument_parser(
        __doc__, quick_help="smoke test: 2 rounds, Dirichlet 0.5 only, results in a temp dir",
        rounds_help="synchronous rounds R (sequential runs 10 R); default 10, quick 2")
    parser.add_argument("--partitions", nargs="+", choices=tuple(PARTITIONS), default=None,
                        help="default: all (quick: dirichlet-0.5)")
    parser.add_argument("--skip-flower", action="store_true", help="skip the engine timing")
    parser.add_argument("--timing-only", action="store_true",
                        help="only the engine timing; updates 'timing' in an existing JSON")
    parser.add_argument("--timing-repeats", type=int, default=None,
                        help="engine timing repeats (medians are reported); default 2, quick 1")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds allowed for each run_simulation.py process")
    args = common.resolve_common_args(parser.parse_args(argv), NAME)
    if args.timing_repeats is None:
        args.timing_repeats = 1 if args.quick else 2
    if args.partitions is None:
        args.partitions = [HEADLINE_PARTITION] if args.quick else list(PARTITIONS)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    sections = {"runs": {}, "reference": {}, "rounds_to_within_1pct": {}, "final": {},
                "headline": {}, "timing": None}
    results = common.start(
        NAME, args, sections, keep=args.timing_only, dataset="breast-cancer", model="logistic-regression",
        num_clients=NUM_CLIENTS, sync_rounds=args.rounds,
        sequential_rounds=args.rounds * NUM_CLIENTS, tolerance=TOLERANCE,
        local_optimiser=common.ADAM["local-optimiser"], reference_method=REFERENCE,
        converged_reference_method=CONVERGED_REFERENCE,
        methods={m: dict(zip(("algorithm", "schedule", "damping", "rounds_multiplier",
                              "client_updates_per_round", "run_config_overrides"), v, strict=True))
                 for m, v in METHODS.items()},
        partitions=common.partition_meta(args.partitions))
    if not args.timing_only:
        for partition in args.partitions:
            run_partition(partition, args, results)
    if args.timing_only or not args.skip_flower:
        run_timing(args, results)
    results.finish("timing_wall_s" if args.timing_only else "benchmark_wall_s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
