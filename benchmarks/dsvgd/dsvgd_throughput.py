"""DSVGD throughput: in-process vs Flower's Simulation Engine, 10 clients.

Logistic regression on ``twonorm`` (5920 training rows, 21 parameters), 10 clients (Dirichlet 0.5),
N = 20 particles, L = 200 local and 200 distillation iterations, mini-batches of 100, one client
per round. The same run (same seed, same particles) in-process and through the Simulation Engine
(``run_simulation.py --engine simulation``, one CPU per client): wall time per round from the
result files' ``elapsed_s``, the Flower/in-process ratio per round after the first (the first
holds Flower's and Ray's start-up), and particle updates per second (``N x (L + L')`` per round:
each SVGD iteration moves N particles). Also bytes per round (down and up).

Run: ``.venv/bin/python benchmarks/dsvgd/dsvgd_throughput.py`` (about 3 minutes; ``--quick``: 3 rounds,
50 iterations). Writes ``benchmarks/results/dsvgd/dsvgd_throughput.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common
import numpy as np

from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process


def settings(rounds: int, iterations: int, seed: int) -> dict:
    return {"algorithm": "dsvgd", "model": "logistic-regression", "dataset": "twonorm",
            "num-clients": 10, "num-rounds": rounds, "seed": seed, "dsvgd.num-particles": 20,
            "dsvgd.local-iterations": iterations, "dsvgd.distillation-iterations": iterations}


def per_round(result: dict) -> list[float]:
    elapsed = [0.0] + [row["elapsed_s"] for row in result["history"]]
    return list(np.diff(elapsed))


def flower_run(cfg: dict, out: str) -> dict:
    rc = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in cfg.items()
                  if k.startswith("dsvgd."))
    argv = [sys.executable, os.path.join(common.ROOT, "run_simulation.py"), "--engine",
            "simulation", "--quiet", "--num-cpus-per-client", "1", "--output-dir", out,
            "--algorithm", cfg["algorithm"], "--model", cfg["model"], "--dataset", cfg["dataset"],
            "--num-clients", str(cfg["num-clients"]), "--num-rounds", str(cfg["num-rounds"]),
            "--seed", str(cfg["seed"]), "--run-config", rc]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"Flower run failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "result.json")) as f:
        return json.load(f)


def main():
    parser = common.argument_parser(__doc__, "3 rounds, 50 iterations", "rounds (default 10)")
    args = common.resolve_common_args(parser.parse_args(), "dsvgd_throughput")
    iterations = 50 if args.quick else 200
    cfg = settings(args.rounds, iterations, args.seed)
    results = common.start("dsvgd_throughput", args, {"settings": cfg}, rounds=args.rounds)
    local_dir = os.path.join(args.work_dir, "in-process")
    local = run_in_process(parse_run_config({**cfg, "output-dir": local_dir}), progress=False)
    flower = flower_run(cfg, os.path.join(args.work_dir, "simulation"))
    with (np.load(os.path.join(local_dir, "posterior.npz")) as a,
          np.load(os.path.join(args.work_dir, "simulation", "posterior.npz")) as b):
        max_diff = float(np.max(np.abs(a["samples"] - b["samples"])))
    updates = 20 * 2 * iterations
    t_local, t_flower = per_round(local), per_round(flower)
    later = slice(1, None)
    ratio = [f / max(lo, 1e-9) for f, lo in zip(t_flower[later], t_local[later], strict=True)]
    results.doc.update({
        "particle_updates_per_round": updates,
        "in_process_round_s": [round(t, 3) for t in t_local],
        "simulation_round_s": [round(t, 3) for t in t_flower],
        "ratio_per_round_after_first": [round(r, 3) for r in ratio],
        "ratio_median_after_first": float(np.median(ratio)) if ratio else None,
        "in_process_updates_per_s": updates / float(np.median(t_local[later] or t_local)),
        "simulation_updates_per_s": updates / float(np.median(t_flower[later] or t_flower)),
        "bytes_down_per_round": local["history"][-1]["bytes_down"],
        "bytes_up_per_round": local["history"][-1]["bytes_up"],
        "max_particle_difference": max_diff,
        "final_accuracy": {"in_process": local["final"]["test_accuracy"],
                           "simulation": flower["final"]["test_accuracy"]},
    })
    for key in ("ratio_median_after_first", "in_process_updates_per_s",
                "simulation_updates_per_s", "bytes_down_per_round", "max_particle_difference"):
        print(f"{key}: {results.doc[key]}")
    results.finish()


if __name__ == "__main__":
    main()
