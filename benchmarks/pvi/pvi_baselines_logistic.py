#!/usr/bin/env python
"""Benchmark: the PVI family against its baselines on breast-cancer logistic regression.

Breast-cancer logistic regression (the default dataset and model), 10 clients, seed 0, in-process
engine. For each partition (Dirichlet alpha = 0.1 and iid) it runs:

* PVI synchronous (damping 0.5, ``R`` rounds), sequential (damping 1.0, ``10 R`` rounds = ``R``
  passes) and asynchronous (damping 0.5, ``10 R`` server updates, clients 7, 8, 9 five times
  slower on the virtual clock);
* PVI synchronous with the deterministic fixed-point (natural-gradient) local optimiser (30
  iterations per client update) instead of Adam, to compare local optimisers;
* the baselines: BCM with the same prior and with a split prior (one shot), VCL (one sequential
  pass) and streaming VB without deletion (``10 R`` rounds = ``R`` sequential passes);
* global VI federated the paper's way: one damped natural-gradient step (local damping 0.5) per
  client per round for ``2 R`` rounds, whose trajectory should approach global VI;
* global VI (one client with the pooled data) with 30 fixed-point iterations: the reference,
  which converges to the exact global-VI optimum for logistic regression. It is checked against
  Adam (same free energy, so its ELBO must be at least as high) and against 60
  fixed-point iterations (convergence). Global VI does not depend on the partition, so it runs
  once and is shared.

Every run that does not name its local optimiser uses Adam (``local-optimiser = "adam"``, stated
explicitly: the run-config default was Adam when the benchmark was written and is ``auto`` since
the registry refactor).

It records per round the test NLL, accuracy and ECE, the global free energy
(``log_marginal_likelihood``; None for asynchronous PVI, which does not evaluate it per update)
and the wall time, and checks that BCM with a split prior on Dirichlet 0.1 is worse (higher test
NLL) than synchronous PVI after ``R`` rounds.

Usage::

    .venv/bin/python benchmarks/pvi/pvi_baselines_logistic.py            # full run, a few minutes
    .venv/bin/python benchmarks/pvi/pvi_baselines_logistic.py --quick    # smoke test, about a minute

Results: ``benchmarks/results/pvi/pvi_baselines_logistic.json`` (written after every run) and
``benchmarks/results/pvi/pvi_baselines_logistic_<partition>[_zoom].png``. ``--quick`` writes to a temporary
directory instead (see ``--results-dir``).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common  # first: environment and sys.path
import numpy as np

from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import build_experiment

NAME = "pvi_baselines_logistic"
NUM_CLIENTS = common.NUM_CLIENTS
PARTITIONS = {p: common.PARTITIONS[p] for p in ("dirichlet-0.1", "iid")}
ACCEPTANCE_PARTITION = "dirichlet-0.1"
ADAM = common.ADAM
# name -> (algorithm, run-config overrides, rounds as a multiple of R (None: the algorithm's preset
# fixes them), client updates per round). Damping and schedule of the baselines are fixed by the
# presets in fedbayes_flwr.algorithms.pvi.bundle (PRESETS); only what the preset leaves free is set here.
# PVI's keys are given bare: they resolve to the pvi section (pvi.damping, ...).
METHODS = {
    "pvi-sync": ("pvi", {"schedule": "synchronous", "damping": 0.5, **ADAM}, 1, NUM_CLIENTS),
    "pvi-seq": ("pvi", {"schedule": "sequential", "damping": 1.0, **ADAM}, NUM_CLIENTS, 1),
    "pvi-async": ("pvi", {"schedule": "asynchronous", "damping": 0.5, **ADAM, "stragglers": "7,8,9",
                          "straggler-factor": 5.0}, NUM_CLIENTS, 1),
    "pvi-sync-fixed-point": ("pvi", {"schedule": "synchronous", "damping": 0.5,
                                     "local-optimiser": "fixed-point"}, 1, NUM_CLIENTS),
    "bcm-same": ("bcm-same", {**ADAM}, None, NUM_CLIENTS),
    "bcm-split": ("bcm-split", {**ADAM}, None, NUM_CLIENTS),
    "vcl": ("vcl", {**ADAM}, None, 1),
    "streaming-vb-no-deletion": ("streaming-vb-no-deletion", {**ADAM}, NUM_CLIENTS, 1),
    # The preset fixes the fixed-point optimiser with one iteration per client update.
    "global-vi-federated": ("global-vi-federated", {"local-damping": 0.5}, 2, NUM_CLIENTS),
    # Global VI (M = 1): the reference, and its two checks. Rounds are fixed at 1.
    "global-vi": ("global-vi", {"local-optimiser": "fixed-point", "fixed-point-iterations": 30},
                  None, 1),
    "global-vi-adam": ("global-vi", {**ADAM}, None, 1),
    "global-vi-fixed-point-60": ("global-vi", {"local-optimiser": "fixed-point",
                                               "fixed-point-iterations": 60}, None, 1),
}
REFERENCE = "global-vi"
STOPS_EARLY = ("bcm-same", "bcm-split", "vcl")
LABELS = {"pvi-sync": "PVI sync", "pvi-seq": "PVI seq", "pvi-async": "PVI async",
          "pvi-sync-fixed-point": "PVI sync, fixed point", "bcm-same": "BCM same (one shot)",
          "bcm-split": "BCM split (one shot)", "vcl": "VCL (one pass)",
          "streaming-vb-no-deletion": "streaming VB, no deletion",
          "global-vi-federated": "global VI federated"}
GLOBAL_VI = tuple(m for m, spec in METHODS.items() if spec[0] == "global-vi")
PLOTTED = tuple(m for m in METHODS if m not in GLOBAL_VI)
OPTIMISER_PAIR = ("pvi-sync", "pvi-sync-fixed-point")  # (Adam, fixed point)


def run_config(method: str, partition: str, rounds: int, seed: int, output_dir: str) -> dict:
    """The kebab-case run config of one (method, partition); R = ``rounds``."""
    algorithm, overrides, mult, _ = METHODS[method]
    scheme, alpha = PARTITIONS[partition]
    cfg = {"algorithm": algorithm, "partition": scheme, "partition-alpha": alpha,
           "num-clients": NUM_CLIENTS, "seed": seed, **overrides, "output-dir": output_dir}
    cfg["num-rounds"] = 1 if mult is None else rounds * mult  # the preset overrides it if it fixes it
    return cfg


def curve(history: list[dict], updates_per_round: int) -> list[dict]:
    """The common per-round rows, plus the wall time of each round and the virtual time
    (asynchronous PVI)."""
    rows = common.curve(history, updates_per_round)
    previous = 0.0
    for row, h in zip(rows, history, strict=True):
        row["round_wall_s"] = round(h["elapsed_s"] - previous, 4)
        previous = h["elapsed_s"]
        if h.get("virtual_time") is not None:
            row["virtual_time"] = h["virtual_time"]
        row["clients"] = h.get("clients")
    return rows


SECTIONS = {"partition_summary": {}, "runs": {}, "final": {}, "global_vi_check": {},
            "global_vi_federated": {}, "local_optimisers": {}, "rounds_to_within_1pct": {},
            "acceptance": None}


def run_method(method: str, partition: str, args, results: common.Results) -> dict:
    """One in-process run; global VI pools the data, so its runs are shared by every partition."""
    if method in GLOBAL_VI:
        shared = common.reused(results.doc["runs"], partition, method, "reused_from_partition")
        if shared is not None:
            return shared
    out = os.path.join(args.work_dir, partition, method)
    result, record = common.timed_run(run_config(method, partition, args.rounds, args.seed, out))
    rows = curve(result["history"], METHODS[method][3])
    with np.load(os.path.join(out, "posterior.npz")) as z:
        mean = z["mean"].tolist()
    return {**record, "health": common.health(rows), "posterior_mean": mean, "curve": rows}


def partition_summary(partition: str, args) -> dict:
    """Rows and label counts of each client (what makes the Dirichlet 0.1 split hard)."""
    exp = build_experiment(parse_run_config(run_config("pvi-sync", partition, args.rounds, args.seed,
                                                       args.work_dir)))
    y = exp.dataset.y_train
    return {"train_rows": int(y.shape[0]), "test_rows": int(exp.dataset.y_test.shape[0]),
            "client_rows": [int(len(p)) for p in exp.partitions],
            "client_label_counts": [[int(np.sum(y[p] == c)) for c in (0, 1)]
                                    for p in exp.partitions]}


def final_row(run: dict, ref: dict) -> dict:
    last = run["curve"][-1]
    return {"test_nll": last["test_nll"], "test_accuracy": last["test_accuracy"],
            "test_ece": last["test_ece"], "log_marginal_likelihood": last["log_marginal_likelihood"],
            "rounds": last["round"], "client_updates": last["client_updates"],
            "wall_s": run["wall_s"], "rejected_replies": run["health"]["rejected_replies"],
            "relative_nll_gap_to_global_vi": (last["test_nll"] - ref["test_nll"]) / ref["test_nll"],
            "max_abs_mean_diff_to_global_vi": float(np.max(np.abs(
                np.asarray(run["posterior_mean"]) - np.asarray(ref["posterior_mean"]))))}


def run_partition(partition: str, args, results: common.Results) -> None:
    """Every method on one partition; finals, checks and the plot."""
    results.doc["partition_summary"][partition] = partition_summary(partition, args)
    runs = results.doc["runs"].setdefault(partition, {})
    for method in METHODS:
        runs[method] = run_method(method, partition, args, results)
        results.write()
        run, last = runs[method], runs[method]["curve"][-1]
        note = common.run_note(run, "reused_from_partition")
        lml = last["log_marginal_likelihood"]
        print(f"[{partition:>13}] {method:<24} rounds={last['round']:>3} "
              f"updates={last['client_updates']:>3} nll={last['test_nll']:.5f} "
              f"acc={last['test_accuracy']:.4f} ece={last['test_ece']:.4f} "
              f"elbo={'None' if lml is None else f'{lml:.3f}'} "
              f"rejected={run['health']['rejected_replies']} {note}", flush=True)

    ref = {**runs[REFERENCE]["curve"][-1], "posterior_mean": runs[REFERENCE]["posterior_mean"]}
    finals = {m: final_row(run, ref) for m, run in runs.items()}
    results.doc["final"][partition] = finals
    results.doc["rounds_to_within_1pct"][partition] = {
        m: common.rounds_to_within(runs[m]["curve"], ref["test_nll"]) for m in PLOTTED}
    if partition == args.partitions[0]:
        results.doc["global_vi_check"] = global_vi_check(runs)
    results.doc["global_vi_federated"][partition] = federated_trajectory(runs, ref)
    adam, fp = OPTIMISER_PAIR
    results.doc["local_optimisers"][partition] = {
        m: {"local_optimiser": common.section_value(runs[m]["run_config"], "local-optimiser"),
            "test_nll": finals[m]["test_nll"], "wall_s": finals[m]["wall_s"],
            "s_per_client_update": finals[m]["wall_s"] / finals[m]["client_updates"],
            # round 1 of the first Adam run in a process also pays for TensorFlow tracing
            "s_per_round_excl_round_1": common.per_round_excl_first(
                [r["elapsed_s"] for r in runs[m]["curve"]]),
            "log_marginal_likelihood": finals[m]["log_marginal_likelihood"]} for m in (adam, fp)}
    if partition == ACCEPTANCE_PARTITION:
        split, sync = finals["bcm-split"], finals["pvi-sync"]
        results.doc["acceptance"] = {
            "check": f"bcm-split on {partition} is worse (higher test NLL) than PVI sync after "
                     f"{sync['rounds']} rounds",
            "partition": partition, "bcm_split_test_nll": split["test_nll"],
            "pvi_sync_test_nll": sync["test_nll"], "pvi_sync_rounds": sync["rounds"],
            "passed": bool(split["test_nll"] > sync["test_nll"])}
    results.write()
    summarise(partition, results)
    plot(partition, runs, ref, args)


def global_vi_check(runs: dict) -> dict:
    """The fixed-point reference against Adam and against twice the iterations."""
    names = (REFERENCE, "global-vi-adam", "global-vi-fixed-point-60")
    fp, adam, fp60 = (runs[m]["curve"][-1] for m in names)
    mean = dict(zip(("fp", "adam", "fp60"), (np.asarray(runs[m]["posterior_mean"]) for m in names),
                    strict=True))
    return {
        "elbo_fixed_point_30": fp["log_marginal_likelihood"],
        "elbo_adam_default": adam["log_marginal_likelihood"],
        "elbo_fixed_point_60": fp60["log_marginal_likelihood"],
        "fixed_point_elbo_at_least_adam": bool(fp["log_marginal_likelihood"]
                                               >= adam["log_marginal_likelihood"]),
        "test_nll_fixed_point_30": fp["test_nll"], "test_nll_adam_default": adam["test_nll"],
        "test_nll_fixed_point_60": fp60["test_nll"],
        "max_abs_mean_diff_fixed_point_30_vs_60": float(np.max(np.abs(mean["fp"] - mean["fp60"]))),
        "max_abs_mean_diff_fixed_point_30_vs_adam": float(np.max(np.abs(mean["fp"] - mean["adam"]))),
        "wall_s": {m: runs[m]["wall_s"] for m in GLOBAL_VI}}


def federated_trajectory(runs: dict, ref: dict) -> dict:
    """Global VI federated, round by round, against the global-VI reference."""
    rows = runs["global-vi-federated"]["curve"]
    return {"round": [r["round"] for r in rows],
            "test_nll_gap": [r["test_nll"] - ref["test_nll"] for r in rows],
            "elbo_gap": [ref["log_marginal_likelihood"] - r["log_marginal_likelihood"] for r in rows],
            "final_max_abs_mean_diff": float(np.max(np.abs(
                np.asarray(runs["global-vi-federated"]["posterior_mean"])
                - np.asarray(ref["posterior_mean"]))))}


def summarise(partition: str, results: common.Results) -> None:
    doc = results.doc
    ref = doc["final"][partition][REFERENCE]
    print(f"[{partition:>13}] final (global VI: nll={ref['test_nll']:.5f}, "
          f"elbo={ref['log_marginal_likelihood']:.3f})", flush=True)
    for m, f in doc["final"][partition].items():
        hit = doc["rounds_to_within_1pct"][partition].get(m, {}).get("client_updates")
        print(f"    {m:<24} nll={f['test_nll']:.5f} ({f['relative_nll_gap_to_global_vi']:+7.2%}) "
              f"acc={f['test_accuracy']:.4f} ece={f['test_ece']:.4f} wall={f['wall_s']:6.1f}s"
              f" within-1%-at-update={hit}", flush=True)
    traj = doc["global_vi_federated"][partition]
    print("    global-vi-federated elbo gap by round: "
          + " ".join(f"{g:.2e}" for g in traj["elbo_gap"]), flush=True)
    if partition == ACCEPTANCE_PARTITION and doc["acceptance"]:
        a = doc["acceptance"]
        print(f"    ACCEPTANCE {a['check']}: {a['passed']} (bcm-split {a['bcm_split_test_nll']:.5f} "
              f"vs pvi-sync {a['pvi_sync_test_nll']:.5f})", flush=True)


def plot(partition: str, runs: dict, ref: dict, args) -> None:
    """Test NLL against client updates. Methods that stop early (one-shot BCM, one-pass VCL) are
    extended by a flat segment from their last update to the end of the axis."""
    curves = {m: [(r["client_updates"], r["test_nll"]) for r in runs[m]["curve"]] for m in PLOTTED}
    last_x = max(pts[-1][0] for pts in curves.values())
    labelled = {}
    for m, pts in curves.items():
        if m in STOPS_EARLY:
            pts = [*pts, (last_x, pts[-1][1])]
        labelled[LABELS[m]] = pts
    common.plot_nll(labelled, args.results_dir, f"{NAME}_{partition}",
                    title=f"breast cancer, logistic regression, M = {NUM_CLIENTS}, {partition}",
                    hline=("global VI (fixed point)", ref["test_nll"]))


def parse_args(argv=None) -> argparse.Namespace:
    parser = common.argument_parser(
        __doc__, quick_help="smoke test: R = 2, Dirichlet 0.1 only, results in a temp dir",
        rounds_help="synchronous rounds R (sequential / async / streaming VB run 10 R, "
                    "federated global VI 2 R); default 10, quick 2")
    parser.add_argument("--partitions", nargs="+", choices=tuple(PARTITIONS), default=None,
                        help="default: all (quick: dirichlet-0.1)")
    args = common.resolve_common_args(parser.parse_args(argv), NAME)
    if args.partitions is None:
        args.partitions = [ACCEPTANCE_PARTITION] if args.quick else list(PARTITIONS)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    results = common.start(
        NAME, args, SECTIONS, dataset="breast-cancer", model="logistic-regression", engine="in-process",
        num_clients=NUM_CLIENTS, R=args.rounds, reference_method=REFERENCE,
        tolerance=common.TOLERANCE,
        methods={m: {"algorithm": a, "run_config_overrides": o,
                     "rounds": "preset" if mult is None else mult * args.rounds,
                     "client_updates_per_round": upr}
                 for m, (a, o, mult, upr) in METHODS.items()},
        partitions=common.partition_meta(args.partitions))
    for partition in args.partitions:
        run_partition(partition, args, results)
    results.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
