"""Decentralized MH-HMC: effective samples per exchange over mixing rounds, graphs, integrators.

Issue 27's figure of merit. Linear regression (d = 3, 250 rows sorted along the first covariate,
so every agent sees a different slice), 5 agents, exact conjugate posterior; mixing rounds per
phase ``s`` in (1, 2, 4, auto) x graph (ring, path, complete) x integrator:

* ``dmala``: the paper's symplectic-Euler step, local decisions (``2 s`` exchanges/iteration);
* ``dhmc``: one leapfrog step, exact energy, agreed decisions (``2 s + D``, ``D`` the diameter);
* ``dhmc-L3``: three leapfrog steps per proposal (``6 s + D``).

Each run: 16 chains from the posterior's bulk, 150 warm-up iterations adapting the shared step
(dual averaging to mean acceptance 0.6, Metropolis test on), then ``--iterations`` kept, all in
the vectorised loop (:func:`fedbayes_flwr.algorithms.dhmc.loop.simulate`, which applies the
bundle's agent functions). Reported per run: the minimum ESS over coordinates across chains,
ESS per exchange, ESS per second of the loop, the largest mean error (posterior sd) and the
largest relative error of a std, acceptance, disagreement. JSON:
``benchmarks/results/dhmc/exchanges.json``.

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Algorithm 1 and Section 4 (one mixing round).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from fedbayes_flwr.algorithms.decentralized import graphs as gossip  # noqa: E402
from fedbayes_flwr.algorithms.decentralized import mixing as mixmat  # noqa: E402
from fedbayes_flwr.algorithms.dhmc import agents as H  # noqa: E402
from fedbayes_flwr.algorithms.dhmc.bundle import AUTO_TOLERANCE  # noqa: E402
from fedbayes_flwr.algorithms.dhmc.loop import simulate  # noqa: E402
from fedbayes_flwr.inference import potentials as P  # noqa: E402
from fedbayes_flwr.inference.posterior import SamplePosterior  # noqa: E402

AGENTS, CHAINS, WARMUP = 5, 16, 150
METHODS = {"dmala": ("euler", "local", 1), "dhmc": ("leapfrog", "agree", 1),
           "dhmc-L3": ("leapfrog", "agree", 3)}
GRAPHS = {"ring": gossip.ring, "path": gossip.path, "complete": gossip.complete}


def problem(n=250, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    x[:, 0] += np.linspace(-2.0, 2.0, n)
    x = x[np.argsort(x[:, 0])]
    y = x @ rng.standard_normal(d) + rng.standard_normal(n)
    prior = P.gaussian_prior_potential(d, 1.0)
    cov = np.linalg.inv(x.T @ x + np.eye(d))
    pots = [H.LocalPotential(P.linear_regression_potential(x[i], y[i], 1.0), prior, AGENTS)
            for i in np.array_split(np.arange(n), AGENTS)]
    return pots, cov @ x.T @ y, np.sqrt(np.diag(cov))


def diameter(graph) -> int:
    from scipy.sparse.csgraph import shortest_path

    return int(shortest_path(graph.adjacency.astype(float), unweighted=True).max())


def one(pots, mean, sd, graph_name, rounds, method, iterations) -> dict:
    integrator, decision, steps = METHODS[method]
    graph = GRAPHS[graph_name](AGENTS)
    w = mixmat.metropolis_weights(graph)
    s = mixmat.rounds_for(w, AUTO_TOLERANCE) if rounds == "auto" else int(rounds)
    w0 = mean + sd * np.random.default_rng(1).standard_normal((CHAINS, mean.shape[0]))
    t0 = time.perf_counter()
    run = simulate(pots, w, w0, 0.02, iterations, warmup=WARMUP, rounds=s, seed=0,
                   integrator=integrator, energy="exact", decision=decision,
                   leapfrog_steps=steps)
    wall = time.perf_counter() - t0
    pooled = run.samples.mean(axis=0)
    flat = pooled.reshape(-1, pooled.shape[-1])
    ess = float(np.min(SamplePosterior(pooled).ess()))
    per_iteration = 2 * s * steps + (diameter(graph) if decision == "agree" else 0)
    exchanges = per_iteration * (iterations + WARMUP)
    return {"graph": graph_name, "rounds": rounds, "s": s, "method": method,
            "exchanges_per_iteration": per_iteration, "step": round(run.epsilon, 4),
            "acceptance": round(run.accept_rate, 3), "disagreement": round(run.disagreement, 3),
            "ess_min": round(ess, 1), "ess_per_exchange": ess / exchanges,
            "ess_per_s_loop": ess / wall, "wall_s": round(wall, 2),
            "mean_error_sd": float(np.max(np.abs(flat.mean(0) - mean) / sd)),
            "std_error": float(np.max(np.abs(flat.std(0) / sd - 1)))}


def table(rows) -> str:
    lines = ["| graph | method | rounds (s) | exchanges / it | ESS / 1k exchanges | "
             "mean err (sd) | std err | acceptance |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['graph']} | `{r['method']}` | {r['rounds']} ({r['s']}) | "
                     f"{r['exchanges_per_iteration']} | {1000 * r['ess_per_exchange']:.1f} | "
                     f"{r['mean_error_sd']:.2f} | {r['std_error']:.2f} | {r['acceptance']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=600)
    parser.add_argument("--quick", action="store_true", help="ring only, 200 iterations")
    args = parser.parse_args()
    iterations = 200 if args.quick else args.iterations
    pots, mean, sd = problem()
    rows = []
    for graph_name in (("ring",) if args.quick else tuple(GRAPHS)):
        for method in METHODS:
            for rounds in (1, 2, 4, "auto"):
                rows.append(one(pots, mean, sd, graph_name, rounds, method, iterations))
                print(json.dumps(rows[-1]), flush=True)
    out = os.path.join(ROOT, "benchmarks", "results", "dhmc", "exchanges.json")
    with open(out, "w") as fh:
        json.dump({"benchmark": "exchanges", "agents": AGENTS, "chains": CHAINS,
                   "warmup": WARMUP, "iterations": iterations, "load_average": os.getloadavg(),
                   "rows": rows}, fh, indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
