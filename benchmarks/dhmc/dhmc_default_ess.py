"""Decentralized MH-HMC with no length given: ESS and wall time of ``--algorithm dhmc`` defaults.

Issue 11 asks that ``--algorithm dhmc`` with no length gives ESS >= 400 per coordinate on
problems of held-out size (d <= 10, n <= 1000, 4-8 agents) in under two minutes in-process on
2 cores. Every run here uses the defaults (16 chains, 200 warm-up iterations with dual
averaging, 10 mixing rounds, leapfrog, exact energy, agreed decisions, target ESS 400, cap 110 s)
through the generic in-process engine (``run_in_process``: the same path as
``run_simulation.py --engine in-process``). Reported per problem: outcome (``done`` = target ESS
reached), kept iterations, minimum ESS over coordinates and maximum R-hat (both across chains,
never across agents), acceptance rate and wall time of the run (imports excluded; the 1-minute
load average before the run is recorded, since the machine may be shared).

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Algorithm 1.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common  # noqa: F401  (environment, sys.path)
import numpy as np
from common import argument_parser, resolve_common_args, start, timed_run

from fedbayes_flwr.inference.posterior import SamplePosterior

# (label, model, synthetic-dim, synthetic-size, agents, graph); d = dim (+1 intercept for logistic)
PROBLEMS = [
    ("linear d=4 n=250 ring-5", "linear-regression", 4, 250, 5, "ring"),
    ("linear d=10 n=1000 ring-8", "linear-regression", 10, 1000, 8, "ring"),
    ("logistic d=6 n=1000 ring-5", "logistic-regression", 5, 1000, 5, "ring"),
    ("logistic d=10 n=1000 ring-8", "logistic-regression", 9, 1000, 8, "ring"),
    ("logistic d=10 n=1000 complete-4", "logistic-regression", 9, 1000, 4, "complete"),
]


def one(label, model, dim, size, agents, graph, seed, out) -> dict:
    keys = {"algorithm": "dhmc", "model": model, "dataset": "synthetic", "synthetic-dim": dim,
            "synthetic-size": size, "num-clients": agents, "partition": "iid", "seed": seed,
            "dhmc.graph": graph, "output-dir": out}
    result, record = timed_run(keys)
    chains = np.load(os.path.join(out, "posterior.npz"))["chains"]
    post = SamplePosterior(chains)
    row = result["history"][-1]
    return {**record, "label": label, "d": int(chains.shape[-1]), "agents": agents,
            "kept_iterations": int(chains.shape[1]), "ess_min": float(np.min(post.ess())),
            "rhat_max": float(np.max(post.rhat())), "acceptance_rate": row["acceptance_rate"],
            "run_wall_s": row["wall_s"], "step_size": row["step_size"]}


def main() -> None:
    parser = argument_parser(__doc__, "the first two problems only", "unused")
    args = parser.parse_args()
    resolve_common_args(args, "dhmc_default_ess")
    problems = PROBLEMS[:2] if args.quick else PROBLEMS
    results = start("dhmc_default_ess", args, {"runs": {}}, target_ess=400, cap_s=120)
    for label, *spec in problems:
        out = os.path.join(args.work_dir, label.replace(" ", "_"))
        run = one(label, *spec, args.seed, out)
        results.doc["runs"][label] = run
        results.write()
        print(f"{label:34s} {run['outcome']:9s} kept {run['kept_iterations']:4d}  "
              f"ESS min {run['ess_min']:6.0f}  R-hat max {run['rhat_max']:.3f}  "
              f"accept {run['acceptance_rate']:.2f}  run {run['run_wall_s']:.1f}s  "
              f"(load {run['load_avg_1min_before']:.1f})", flush=True)
    results.finish()


if __name__ == "__main__":
    main()
