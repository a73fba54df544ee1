"""Decentralized MH-HMC throughput: iterations/s and ESS per exchange, in-process vs Flower.

Linear regression (d = 4, 250 rows), 5 agents on a ring, 16 chains, fixed step 0.04, one leapfrog
step per iteration; ``s`` mixing rounds and the flooded decision make ``2 s + 2`` exchanges per
iteration (the ring's diameter is 2). Three ways to run the same iteration:

* the vectorised loop over agents and chains (:func:`fedbayes_flwr.algorithms.dhmc.loop.simulate`);
* the generic in-process engine with the bundle (one client step per agent per exchange);
* Flower's Simulation Engine (``run_simulation.py --engine simulation``), every agent its own
  actor, with the empty-exchange probe (``benchmarks/flower/empty_exchange.py``) timed in the same run
  for Flower's own cost per exchange.

Reported: iterations per second, seconds per exchange, ESS (minimum over coordinates, across
chains) per exchange for the in-process runs.

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Algorithm 1; ../shared/FLOWER_NOTES.md.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common  # noqa: F401  (environment, sys.path)
import numpy as np
from common import argument_parser, flower_run, resolve_common_args, start, timed_run

from fedbayes_flwr.algorithms.decentralized import graphs as gossip
from fedbayes_flwr.algorithms.decentralized import mixing as mixmat
from fedbayes_flwr.algorithms.dhmc.loop import simulate
from fedbayes_flwr.inference.posterior import SamplePosterior
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import build_experiment

AGENTS, CHAINS, STEP = 5, 16, 0.04
KEYS = {"algorithm": "dhmc", "model": "linear-regression", "dataset": "synthetic",
        "synthetic-dim": 4, "synthetic-size": 250, "partition": "iid", "dhmc.graph": "ring",
        "dhmc.num-chains": CHAINS, "dhmc.adapt": False, "dhmc.step-size": STEP,
        "dhmc.warmup": 20}


def loop_run(iterations: int, rounds: int) -> dict:
    from fedbayes_flwr.algorithms.dhmc.bundle import initial_position, local_potential

    exp = build_experiment(parse_run_config({**KEYS, "num-clients": AGENTS,
                                             "output-dir": "unused"}))
    pots = [local_potential(exp.setup, exp.client_data(i)) for i in range(AGENTS)]
    w = mixmat.metropolis_weights(gossip.ring(AGENTS))
    t0 = time.perf_counter()
    run = simulate(pots, w, initial_position(exp.setup), STEP, iterations, warmup=20,
                   rounds=rounds, seed=0, adapt=False, decision="flood")
    wall = time.perf_counter() - t0
    exchanges = (iterations + 20) * (2 * rounds + 2)
    ess = float(np.min(SamplePosterior(run.samples.mean(axis=0)).ess()))
    return {"iterations_per_s": (iterations + 20) / wall, "wall_s": round(wall, 3),
            "ess_min": ess, "ess_per_exchange": ess / exchanges}


def engine_run(iterations: int, rounds: int, out: str) -> dict:
    result, record = timed_run({**KEYS, "num-clients": AGENTS, "dhmc.mixing-rounds": rounds,
                                "dhmc.iterations": iterations, "eval-every": iterations + 20,
                                "output-dir": out})
    row = result["history"][-1]
    ess = row["diagnostics"]["ess_min"]
    return {"iterations_per_s": (iterations + 20) / record["wall_s"], "wall_s": record["wall_s"],
            "exchanges": row["exchanges"], "ess_min": ess,
            "ess_per_exchange": ess / row["exchanges"]}


def main() -> None:
    parser = argument_parser(__doc__, "fewer iterations, no Flower runs", "unused")
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--flower-iterations", type=int, default=40)
    parser.add_argument("--no-flower", action="store_true")
    args = parser.parse_args()
    resolve_common_args(args, "dhmc_throughput")
    iters = 100 if args.quick else args.iterations
    results = start("dhmc_throughput", args, {"loop": {}, "engine": {}, "flower": {}},
                    agents=AGENTS, chains=CHAINS, step=STEP)
    doc = results.doc
    for rounds in (1, 5):
        key = f"s={rounds}"
        doc["loop"][key] = loop_run(iters, rounds)
        doc["engine"][key] = engine_run(iters, rounds, os.path.join(args.work_dir, key))
        results.write()
        print(key, {k: v["iterations_per_s"] for k, v in (("loop", doc["loop"][key]),
                                                          ("engine", doc["engine"][key]))},
              flush=True)
    if not (args.quick or args.no_flower):
        n = args.flower_iterations
        cpus = round(2.0 / AGENTS, 3)
        per_iteration = 2 * 1 + 2
        empty = flower_run({"algorithm-modules": "benchmarks.flower.empty_exchange",
                            "algorithm": "empty-exchange", "model": "linear-regression",
                            "dataset": "synthetic", "synthetic-dim": 4, "synthetic-size": 250,
                            "partition": "iid"}, AGENTS, n * per_iteration,
                           n * per_iteration // 4, os.path.join(args.work_dir, "empty"), cpus)
        run = flower_run({**KEYS, "dhmc.mixing-rounds": 1, "dhmc.iterations": n,
                          "dhmc.warmup": 0}, AGENTS, n, n // 4,
                         os.path.join(args.work_dir, "flower-s1"), cpus,
                         keep=("round", "elapsed_s", "exchanges"))
        entry = {"t_empty_s": empty.get("seconds_per_exchange"), "dhmc": run}
        if "seconds_per_exchange" in run:
            entry["seconds_per_iteration"] = run["seconds_per_exchange"]
            entry["iterations_per_s"] = 1.0 / run["seconds_per_exchange"]
            entry["seconds_per_exchange"] = run["seconds_per_exchange"] / per_iteration
        doc["flower"]["s=1"] = entry
        results.write()
        print("flower s=1:", {k: v for k, v in entry.items() if k != "dhmc"}, flush=True)
    results.finish()


if __name__ == "__main__":
    main()
