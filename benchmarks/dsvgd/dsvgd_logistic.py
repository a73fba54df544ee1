"""DSVGD on Bayesian logistic regression with the paper's hyperprior (seed 001, Section 7.2).

``logistic-hyperprior`` (theta = (w, log xi), w ~ N(0, I / xi), xi ~ Gamma(1, rate 100)) on
``twonorm`` and ``breast-cancer``, K = 2 and 20 agents (Dirichlet 0.5), and the 4-agent label skew
(each agent holds 40% of one label's rows and 10% of the other's), N = 2 and 6 particles: test
accuracy per round for DSVGD, U-DSVGD, centralised SVGD (the same iterations per round) and, when
registered, SGLD (centralised, 200 steps per round), DSGLD (one chain per round at a random
client) and the point estimates FedAvg (every client each round) and the paper's FedAvg (one client
per round, FedAvgM with server rate n_k / n), which ignore N; and the rounds each needs to reach
95% of SVGD's final accuracy. Federated methods run 2K rounds (2 passes for the one-client-per-round
ones), the centralised ones 10 rounds.

Run: ``.venv/bin/python benchmarks/dsvgd/dsvgd_logistic.py`` (about 45 minutes on 2 cores, most of it
FedAvg with 20 clients: 8 minutes per setting;
``--quick``: twonorm, K = 2, N = 6, 4 rounds). Writes ``benchmarks/results/dsvgd/dsvgd_logistic.json``
and one accuracy plot per setting. ``--setting "breast-cancer K=20"`` (repeatable) reruns only the
named settings (both N) and merges them into the existing JSON, leaving the other settings as they
are; the rerun is listed under ``reruns``.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common
import numpy as np

from fedbayes_flwr.algorithms import registry
from fedbayes_flwr.data import load_dataset
from fedbayes_flwr.evaluation.plots import plot_curves

FEDERATED = ("dsvgd", "u-dsvgd", "dsgld", "fedavg-paper", "fedavg")
CENTRAL = ("svgd", "sgld")
POINT = ("fedavg-paper", "fedavg")  # point estimates: the particle number does not apply


def label_skew_file(dataset: str, work_dir: str, seed: int) -> str:
    """A ``.npz`` with a natural partition: agents 0-1 hold 40% of label 0's rows each and 10%
    of label 1's, agents 2-3 the reverse."""
    data = load_dataset(dataset, "binary", seed=seed)
    rng = np.random.default_rng(seed)
    client = np.empty(len(data.y_train), dtype=np.int64)
    for label, owners in ((0, (0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 3)),
                          (1, (2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 1, 1))):
        rows = rng.permutation(np.flatnonzero(data.y_train == label))
        shares = np.array_split(rows, len(owners))  # 20 slices of 5%: 8 + 8 + 2 + 2
        for owner, share in zip(owners, shares, strict=True):
            client[share] = owner
    path = os.path.join(work_dir, f"{dataset}-label-skew.npz")
    np.savez(path, x_train=data.x_train, y_train=data.y_train, x_test=data.x_test,
             y_test=data.y_test, client_id=client)
    return path


def settings(quick: bool, work_dir: str, seed: int) -> dict[str, dict]:
    out = {}
    datasets = ("twonorm",) if quick else ("twonorm", "breast-cancer")
    for dataset in datasets:
        for k in ((2,) if quick else (2, 20)):
            out[f"{dataset} K={k}"] = {"dataset": dataset, "num-clients": k,
                                        "partition": "dirichlet", "partition-alpha": 0.5}
        if not quick:
            out[f"{dataset} label-skew K=4"] = {"data": label_skew_file(dataset, work_dir, seed),
                                                "num-clients": 4, "partition": "natural"}
    return out


def rounds_to(curve: list[dict], target: float):
    for row in curve:
        if row["test_accuracy"] is not None and row["test_accuracy"] >= target:
            return row["round"]
    return None


def main():
    parser = common.argument_parser(__doc__, "twonorm, K = 2, N = 6, 4 rounds", "unused")
    parser.add_argument("--setting", action="append", default=None,
                        help='run only this setting, e.g. "breast-cancer K=20" (repeatable), and '
                             "merge it into the existing JSON")
    args = common.resolve_common_args(parser.parse_args(), "dsvgd_logistic")
    os.makedirs(args.work_dir, exist_ok=True)
    grid = settings(args.quick, args.work_dir, args.seed)
    if args.setting:
        unknown = [s for s in args.setting if s not in grid]
        if unknown:
            raise SystemExit(f"unknown --setting {', '.join(map(repr, unknown))}; "
                             f"settings: {', '.join(map(repr, grid))}")
        grid = {name: grid[name] for name in args.setting}
    sizes = (6,) if args.quick else (2, 6)
    methods = [m for m in (*FEDERATED, *CENTRAL) if m in registry.names()]
    results = common.start("dsvgd_logistic", args, {"settings": {}}, keep=bool(args.setting),
                           methods=methods)
    if args.setting:  # merged into the existing document: say which rows are newer
        results.doc.setdefault("reruns", []).append(
            {"settings": list(grid), "methods": methods,
             "started": time.strftime("%Y-%m-%dT%H:%M:%S")})
        results.doc.setdefault("settings", {})
    point_runs: dict = {}
    for name, base in grid.items():
        for n in sizes:
            key = f"{name} N={n}"
            entry = {"base": {k: v for k, v in base.items() if k != "data"}, "methods": {}}
            for method in methods:
                central = method in CENTRAL
                rounds = 4 if args.quick else (10 if central else 2 * base["num-clients"])
                cfg = {**base, "algorithm": method, "model": "logistic-hyperprior",
                       "num-rounds": rounds, "seed": args.seed,
                       "output-dir": os.path.join(args.work_dir, key.replace(" ", "_"), method)}
                if method in ("sgld", "dsgld"):
                    cfg["sgld.num-chains"] = n
                elif method in ("dsvgd", "u-dsvgd", "svgd"):
                    cfg["dsvgd.num-particles"] = n
                if central:  # the pooled data: the preset fixes num-clients = 1
                    cfg.pop("num-clients"), cfg.pop("partition")
                if method in POINT and (name, method) in point_runs:  # N does not matter
                    entry["methods"][method] = {**point_runs[name, method], "reused": True}
                    continue
                result, record = common.timed_run(cfg)
                curve = common.curve(result["history"], 1)
                entry["methods"][method] = {"curve": curve, "wall_s": record["wall_s"],
                                            "final_accuracy": result["final"]["test_accuracy"]}
                if method in POINT:
                    point_runs[name, method] = entry["methods"][method]
                print(f"{key:32s} {method:8s} acc {result['final']['test_accuracy']:.4f} "
                      f"({record['wall_s']:.0f}s)", flush=True)
                results.doc["settings"][key] = entry
                results.write()
            target = 0.95 * entry["methods"]["svgd"]["final_accuracy"]
            entry["svgd_95_target"] = target
            entry["rounds_to_95pct_of_svgd"] = {m: rounds_to(v["curve"], target)
                                                for m, v in entry["methods"].items()}
            results.write()
            plot_curves({m: [(r["round"], r["test_accuracy"]) for r in v["curve"]]
                         for m, v in entry["methods"].items()},
                        os.path.join(args.results_dir,
                                     f"dsvgd_logistic_{key.replace(' ', '_')}.png"),
                        "round", "test accuracy", title=key,
                        hline=("95% of SVGD", target))
    if args.setting:
        results.doc["reruns"][-1]["wall_s"] = round(time.perf_counter() - results.t0, 1)
        results.write()
        print(f"merged {', '.join(grid)} into {results.path}", flush=True)
    else:
        results.finish()


if __name__ == "__main__":
    main()
