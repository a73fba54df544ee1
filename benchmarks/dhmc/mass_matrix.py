"""Decentralized MH-HMC with an agreed mass matrix on correlated logistic regression (issue 33).

Problems: ``benchmarks/dsvgd/problems.py``'s ``make_case("skewed", d=D, rho=R)`` (equicorrelated
features, ``n = 2000`` rows, 10 label-skewed clients: each holds 90 % of one label), the
logistic-regression model with the run's default prior, partition ``natural`` (one agent per
client, ring of 10, ``mixing-rounds = auto``). Cells ``(rho, d)`` (``d`` features; the model
adds an intercept): rho 0.8 at d 10 first, then rho 0.95 and 0 at d 10, d 30 at rho 0.8, rho 0.5
at d 10 and d 5 at rho 0.8 (in that order; each run is written as it finishes; ``--skip``,
``--cells``, ``--settings`` and ``--keep`` run a part and add it to the JSON).

Each cell runs ``dhmc`` with ``dhmc.mass-matrix = none``, ``diagonal`` and ``dense``, everything
else at its defaults (16 chains, 200 warm-up iterations, one leapfrog step, exact energy, agreed
decisions) and ``dhmc.iterations`` kept iterations (``--iterations``, default 200: a fixed
length, so the runs are compared at equal work), in-process. Reported per run: minimum ESS over
coordinates and maximum R-hat (across chains), ESS per gradient evaluation (the library's
``ess_per_grad_eval``: per LOCAL gradient evaluation, one for all ``K`` chains, every agent's
summed, warm-up included; and per full-data gradient of one chain, NUTS's unit: one local
evaluation is ``K / m`` of those, ``m`` agents each holding ``1 / m`` of the rows), ESS per
exchange, ESS per second of the run, and the marginal W1 of every
coordinate to a long NUTS reference (:func:`fedbayes_flwr.evaluation.reference.nuts_reference`:
``tfp.mcmc`` NUTS, 4 chains x 2000 draws after 1000 warm-up, cached) in reference posterior sd
(max and mean over coordinates). The centralised anchor is that NUTS run itself on the pooled
data: min ESS per full-data gradient (``4 x 2000 x`` its mean leapfrog steps per draw, sampling
only) and per second.

Results: ``benchmarks/results/dhmc/mass_matrix.json`` and ``mass_matrix.png``; the table is in
docs/families/dhmc.md. ``--quick``: the first cell, 50 kept iterations.

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Algorithm 1; Stan Reference Manual (windowed
adaptation of the mass matrix); Hoffman & Gelman (2014), "The No-U-Turn Sampler".
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/: common
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "dsvgd"))  # problems

import common  # noqa: F401  (environment, sys.path)
import numpy as np
from common import argument_parser, resolve_common_args, start, timed_run
from problems import make_case

from fedbayes_flwr.evaluation.plots import _pyplot, _save
from fedbayes_flwr.evaluation.reference import nuts_reference
from fedbayes_flwr.evaluation.sample_quality import marginal_w1
from fedbayes_flwr.inference.posterior import SamplePosterior
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import build_experiment

CELLS = [(0.8, 10), (0.95, 10), (0.0, 10), (0.8, 30), (0.5, 10), (0.8, 5)]
SETTINGS = ("none", "diagonal", "dense")
AGENTS = 10


def _keys(path: str, setting: str, iterations: int, out: str, seed: int) -> dict:
    return {"algorithm": "dhmc", "model": "logistic-regression", "data": path,
            "partition": "natural", "num-clients": AGENTS, "seed": seed,
            "dhmc.iterations": iterations, "dhmc.mass-matrix": setting, "output-dir": out}


def anchor(path: str, work: str) -> tuple[dict, np.ndarray]:
    """The NUTS reference of the pooled data and its efficiency figures."""
    exp = build_experiment(parse_run_config(_keys(path, "none", 1, work, 0)))
    ref = nuts_reference(exp.model, exp.dataset.x_train, exp.dataset.y_train, exp.prior)
    info = ref.info
    grads = ref.chains.shape[0] * ref.chains.shape[1] * info["mean_leapfrogs"]
    ess_min = float(np.min(ref.ess))
    return {"ess_min": ess_min, "rhat_max": float(np.max(ref.rhat)),
            "ess_per_full_grad": ess_min / grads, "ess_per_s": ess_min / info["seconds"],
            "seconds": info["seconds"], "mean_leapfrogs": info["mean_leapfrogs"],
            "step_size": info["step_size"], "from_cache": ref.from_cache}, ref.draws


def one(path: str, setting: str, iterations: int, out: str, seed: int, ref: np.ndarray) -> dict:
    result, record = timed_run(_keys(path, setting, iterations, out, seed))
    chains = np.load(os.path.join(out, "posterior.npz"))["chains"]
    post = SamplePosterior(chains)
    row = result["history"][-1]
    ess_min = float(np.min(post.ess()))
    w1 = marginal_w1(chains, ref) / ref.std(axis=0)
    return {"outcome": record["outcome"], "kept_iterations": int(chains.shape[1]),
            "ess_min": ess_min, "rhat_max": float(np.max(post.rhat())),
            "ess_per_grad_eval": ess_min / row["grad_evals"],
            "ess_per_full_grad": ess_min / (row["grad_evals"] * chains.shape[0] / AGENTS),
            "ess_per_exchange": ess_min / row["exchanges"], "ess_per_s": ess_min / row["wall_s"],
            "w1_max_sd": float(np.max(w1)), "w1_mean_sd": float(np.mean(w1)),
            "acceptance_rate": row["acceptance_rate"], "step_size": row["step_size"],
            "grad_evals": row["grad_evals"], "exchanges": row["exchanges"],
            "run_wall_s": row["wall_s"], "load_avg_1min_before": record["load_avg_1min_before"]}


def plot(doc: dict, path: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (vary, fixed) in zip(axes, (("rho", 10), ("features", 0.8)), strict=True):
        cells = sorted((c for c in doc["cells"].values()
                        if (c["features"] if vary == "rho" else c["rho"]) == fixed),
                       key=lambda c: c[vary])
        xs = [c[vary] for c in cells]
        for setting in SETTINGS:
            ys = [c["runs"].get(setting, {}).get("ess_per_full_grad", np.nan) for c in cells]
            ax.plot(xs, ys, "o-", label=f"dhmc {setting}")
        ax.plot(xs, [c["nuts"]["ess_per_full_grad"] for c in cells], "k--", label="NUTS (pooled)")
        ax.set_yscale("log")
        ax.set_xlabel("feature correlation rho" if vary == "rho" else "features (d - 1)")
        ax.set_ylabel("min ESS per full-data gradient")
        ax.set_title(f"{fixed} features" if vary == "rho" else f"rho = {fixed}")
        ax.legend(fontsize=8)
    _save(fig, path)


def main() -> None:
    parser = argument_parser(__doc__, "the first cell, 50 kept iterations", "unused")
    parser.add_argument("--iterations", type=int, default=200, help="kept iterations per run")
    parser.add_argument("--cells", type=int, default=len(CELLS), help="how many cells to run")
    parser.add_argument("--skip", type=int, default=0, help="cells to skip (already in the JSON)")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="comma-separated mass-matrix settings (default: all three)")
    parser.add_argument("--keep", action="store_true",
                        help="add to the existing JSON instead of starting afresh")
    parser.add_argument("--defaults", action="store_true",
                        help="instead: the first cell with no length (target ESS 400, the "
                             "110 s cap), mass-matrix none vs auto, under 'defaults'")
    args = parser.parse_args()
    resolve_common_args(args, "mass_matrix")
    cells = CELLS[:1] if args.quick else CELLS[args.skip:args.cells]
    iterations = 50 if args.quick else args.iterations
    settings = args.settings.split(",")
    results = start("mass_matrix", args, {"cells": {}}, keep=args.keep, iterations=iterations,
                    agents=AGENTS)
    if args.defaults:
        rho, d = CELLS[0]
        path = make_case("skewed", args.work_dir, d=d, rho=rho)
        _, ref = anchor(path, os.path.join(args.work_dir, "unused"))
        runs = results.doc.setdefault("defaults", {"rho": rho, "features": d, "runs": {}})["runs"]
        for setting in ("none", "auto"):
            out = os.path.join(args.work_dir, f"defaults_{setting}")
            runs[setting] = one(path, setting, 0, out, args.seed, ref)
            results.write()
            print(f"defaults {setting}: {runs[setting]}", flush=True)
        cells = []
    for rho, d in cells:
        label = f"rho={rho:g} d={d}"
        path = make_case("skewed", args.work_dir, d=d, rho=rho)
        nuts, ref = anchor(path, os.path.join(args.work_dir, "unused"))
        cell = {"rho": rho, "d": d + 1, "features": d, "nuts": nuts, "runs": {}}
        results.doc["cells"][label] = cell
        print(f"{label}: NUTS min ESS {nuts['ess_min']:.0f}, per full gradient "
              f"{nuts['ess_per_full_grad']:.2e}", flush=True)
        for setting in settings:
            out = os.path.join(args.work_dir, f"{label.replace(' ', '_')}_{setting}")
            run = one(path, setting, iterations, out, args.seed, ref)
            cell["runs"][setting] = run
            results.write()
            print(f"  {setting:8s} ESS min {run['ess_min']:6.0f}  R-hat {run['rhat_max']:.3f}  "
                  f"ESS/grad {run['ess_per_grad_eval']:.2e}  ESS/exch "
                  f"{run['ess_per_exchange']:.2e}  ESS/s {run['ess_per_s']:.2f}  W1 max "
                  f"{run['w1_max_sd']:.3f} sd  step {run['step_size']:.3f}  "
                  f"run {run['run_wall_s']:.0f}s", flush=True)
        plot(results.doc, os.path.join(os.path.dirname(results.path), "mass_matrix.png"))
    results.finish()


if __name__ == "__main__":
    main()
