"""Decentralized MH-HMC: iterations per second of the in-process engine (issue 27).

``dmala`` and ``dhmc`` at one mixing round per phase (the paper's budget), linear regression
(d = 4, 250 rows), 5 agents on a ring, 16 chains, fixed step 0.04, through the generic
in-process engine (every agent's client step per exchange, as the Simulation Engine sequences
them), with the end-of-run plots switched off (they cost seconds and are not per iteration).
``--against DIR`` runs another checkout's package (e.g. the main branch) for the before/after
ratio; run both in one go, alternating (``--repeats``), since the machine is shared.

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Algorithm 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KEYS = {"model": "linear-regression", "dataset": "synthetic", "synthetic-dim": 4,
        "synthetic-size": 250, "num-clients": 5, "partition": "iid", "dhmc.graph": "ring",
        "dhmc.num-chains": 16, "dhmc.adapt": False, "dhmc.step-size": 0.04, "dhmc.warmup": 20,
        "dhmc.mixing-rounds": 1}


def one(algorithm: str, iterations: int) -> dict:
    """Time one run of this process's package (plots off)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import fedbayes_flwr.evaluation.plots as plots
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.engine import run_in_process

    for name in ("plot_history", "plot_trace", "plot_reliability", "plot_mixture_posterior"):
        setattr(plots, name, lambda *a, **k: None)
    keys = {**KEYS, "algorithm": algorithm, "dhmc.iterations": iterations,
            "eval-every": 10**6}
    run_in_process(parse_run_config({**keys, "dhmc.iterations": 2,
                                     "output-dir": tempfile.mkdtemp()}), progress=False)
    t0 = time.perf_counter()
    result = run_in_process(parse_run_config({**keys, "output-dir": tempfile.mkdtemp()}),
                            progress=False)
    wall = time.perf_counter() - t0
    row = result["history"][-1]
    total = iterations + KEYS["dhmc.warmup"]
    return {"iterations_per_s": total / wall, "wall_s": round(wall, 3),
            "exchanges": row["exchanges"], "seconds_per_exchange": wall / row["exchanges"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--against", default="", help="another checkout (before)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # ALGORITHM: one timing of the package first on sys.path
        print(json.dumps(one(args.child, args.iterations)))
        return
    code = {"this": ROOT, **({"against": os.path.abspath(args.against)} if args.against else {})}
    rows: dict = {}
    for rep in range(args.repeats):
        for algorithm in ("dmala", "dhmc"):
            for label, root in code.items():  # alternating: the load hits both alike
                env = {**os.environ, "PYTHONPATH": root, "TF_CPP_MIN_LOG_LEVEL": "2"}
                out = subprocess.run([sys.executable, __file__, "--child", algorithm,
                                      "--iterations", str(args.iterations)], cwd=root, env=env,
                                     capture_output=True, text=True, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                rows.setdefault(algorithm, {}).setdefault(label, []).append(got)
                print(rep, algorithm, label, got, flush=True)
    load = os.getloadavg()
    doc = {"benchmark": "iteration_cost", "keys": KEYS, "iterations": args.iterations,
           "load_average": load, "runs": rows, "summary": {}}
    for algorithm, by in rows.items():
        best = {label: max(r["iterations_per_s"] for r in runs) for label, runs in by.items()}
        doc["summary"][algorithm] = {**{f"{k}_iterations_per_s": round(v, 1)
                                        for k, v in best.items()},
                                     **({"speed-up": round(best["this"] / best["against"], 2)}
                                        if "against" in best else {})}
    out = os.path.join(ROOT, "benchmarks", "results", "dhmc", "iteration_cost.json")
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(json.dumps(doc["summary"]))


if __name__ == "__main__":
    main()
