"""Fed-PDMC throughput: events per second summed over chains, in-process and through Flower.

Zig-Zag on the paper's Gaussian example (``gaussian-mean``, d = 10, N = 50 rows, flat prior), M
workers, K chains advanced by one exchange per event:

* in-process, the vectorised event loop (:func:`fedbayes_flwr.algorithms.pdmc.driver.simulate`) and the
  generic engine with the bundle (:func:`fedbayes_flwr.runtime.engine.run_in_process`), K = 1 and 64,
  M = 4 and 10;
* through Flower's Simulation Engine (``run_simulation.py --engine simulation``), K = 64, M = 4
  and 10, with the time of an (almost) empty exchange to M nodes measured in the same run:
  ``t_empty(M)`` = seconds per exchange of the empty-exchange plugin
  (``benchmarks/flower/empty_exchange.py``: one integer each way, no work) over the same number of
  rounds. Both exclude the first recorded block (start-up,
  warm-up): per-exchange time = difference of ``elapsed_s`` between recorded rows divided by
  the exchanges between them.

The issue's targets: in-process >= 1000 events/s at M = 10 with K = 64; through Flower
>= 0.8 K / t_empty(M) events/s.

References
----------
The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov Processes",
Algorithm 2 (one exchange per event); ../shared/FLOWER_NOTES.md (the Simulation Engine's
per-exchange floor).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common  # noqa: F401  (environment, sys.path)
import numpy as np
from common import argument_parser, flower_run, per_exchange, resolve_common_args, start

from fedbayes_flwr.algorithms.pdmc import sampler as S
from fedbayes_flwr.algorithms.pdmc.driver import simulate
from fedbayes_flwr.inference import potentials as P

D, N = 10, 50
DATA_KEYS = {"model": "gaussian-mean", "dataset": "synthetic", "synthetic-dim": D,
             "synthetic-size": N + 13, "partition": "iid", "prior-scale": 1.0,
             "pdmc.flat-prior": True}


def in_process_loop(workers: int, chains: int, process_time: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    y = 0.5 + rng.standard_normal((N, D))
    pots = [P.gaussian_mean_potential(part, 1.0) for part in np.array_split(y, workers)]
    prior = P.gaussian_prior_potential(D, None)
    x0 = y.mean(0) + rng.standard_normal((chains, D)) / np.sqrt(N)
    v0 = S.initial_velocity("zigzag", rng, chains, D)
    t0 = time.perf_counter()
    run = simulate(pots, prior, "zigzag", x0, v0, process_time, 0.1, seed=seed)
    wall = time.perf_counter() - t0
    events = int(run.events.sum())
    return {"events": events, "exchanges": run.exchanges, "wall_s": round(wall, 3),
            "events_per_s": events / wall, "exchanges_per_s": run.exchanges / wall}


def engine_run(workers: int, chains: int, exchanges: int, out: str) -> dict:
    from common import timed_run

    result, record = timed_run({"algorithm": "pdmc", **DATA_KEYS, "num-clients": workers,
                                "num-rounds": exchanges, "eval-every": max(1, exchanges // 5),
                                "pdmc.num-chains": chains, "output-dir": out})
    per, counted = per_exchange(result["history"])
    last = result["history"][-1]
    first = result["history"][0]
    events = last["events"] - first["events"]
    return {"seconds_per_exchange": per, "exchanges_counted": counted,
            "events_per_s": events / (per * counted) if counted else None,
            "wall_s": record["wall_s"]}


def main() -> None:
    parser = argument_parser(__doc__, "fewer exchanges and no Flower runs", "unused")
    parser.add_argument("--exchanges", type=int, default=200,
                        help="exchanges per Flower run (default 200; 5 recorded blocks)")
    parser.add_argument("--no-flower", action="store_true", help="in-process numbers only")
    args = parser.parse_args()
    resolve_common_args(args, "pdmc_throughput")
    results = start("pdmc_throughput", args, {"in_process": {}, "engine": {}, "flower": {}})
    doc = results.doc
    process_time = 20.0 if args.quick else 100.0
    for workers in (4, 10):
        for chains in (1, 64):
            key = f"M={workers},K={chains}"
            doc["in_process"][key] = in_process_loop(workers, chains, process_time, args.seed)
            doc["engine"][key] = engine_run(workers, chains, 100 if args.quick else 500,
                                            os.path.join(args.work_dir, f"engine-{key}"))
            results.write()
            print(key, "loop", round(doc["in_process"][key]["events_per_s"]), "events/s;",
                  "engine", doc["engine"][key]["events_per_s"], flush=True)
    if not (args.quick or args.no_flower):
        rounds = args.exchanges
        every = max(1, rounds // 5)
        for workers in (4, 10):
            cpus = round(2.0 / workers, 3)  # every worker its own actor on 2 cores
            empty = flower_run({"algorithm-modules": "benchmarks.flower.empty_exchange",
                                "algorithm": "empty-exchange", "model": "gaussian-mean",
                                "dataset": "synthetic", "synthetic-dim": D,
                                "synthetic-size": N + 13, "partition": "iid"},
                               workers, rounds, every,
                               os.path.join(args.work_dir, f"empty-M{workers}"), cpus)
            pdmc = flower_run({"algorithm": "pdmc", **DATA_KEYS, "pdmc.num-chains": 64},
                              workers, rounds, every,
                              os.path.join(args.work_dir, f"pdmc-M{workers}"), cpus)
            entry = {"t_empty_s": empty.get("seconds_per_exchange"), "empty": empty,
                     "pdmc": pdmc}
            if "history" in pdmc and len(pdmc["history"]) > 1:
                h = pdmc["history"]
                events = h[-1]["events"] - h[0]["events"]
                entry["events_per_s"] = events / (pdmc["seconds_per_exchange"]
                                                  * pdmc["exchanges_counted"])
                entry["target_events_per_s"] = 0.8 * 64 / entry["t_empty_s"]
                entry["target_met"] = entry["events_per_s"] >= entry["target_events_per_s"]
            doc["flower"][f"M={workers},K=64"] = entry
            results.write()
            print(f"flower M={workers}:", {k: v for k, v in entry.items()
                                          if k not in ("empty", "pdmc")}, flush=True)
    loop = doc["in_process"]["M=10,K=64"]["events_per_s"]
    doc["claim"] = {"in_process_events_per_s_M10_K64": loop,
                    "in_process_target_met": loop >= 1000}
    results.finish()


if __name__ == "__main__":
    main()
