"""Fed-PDMC's bound-free variant (``pdmc.bounds = metropolis``, issue 33 item 4) against exact
thinning on a model that has both: what the Metropolis correction costs.

Data and runs as ``preconditioning.py`` (its ``skewed`` logistic regression, ``rho:d`` cases, 10
label-skewed clients, NUTS reference and anchor), every default except ``pdmc.bounds``
(``exact`` or ``metropolis``) and the cap ``pdmc.max-seconds`` (``--max-seconds``). Metropolis
rows add the acceptance rate; their samples are one per trajectory (``pdmc.trajectory`` 1.0, the
default, in the preconditioned coordinates) and ``pdmc.rate-grid`` is swept (``--rate-grids``;
the default 0.5 was chosen from this table).

Run: ``.venv/bin/python benchmarks/pdmc/metropolis.py`` (``--cases 0.8:10``, ``--samplers``,
``--max-seconds``). Writes ``benchmarks/results/pdmc/metropolis.json`` and prints the table.

References
----------
Chevallier, Power & Sutton (2025), "Towards practical PDMP sampling: Metropolis adjustments,
locally adaptive step-sizes, and NUTS-based time lengths".
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "dsvgd"))
sys.path.insert(0, HERE)

import common  # noqa: E402,F401  (quietens TensorFlow, puts the repository on sys.path)
import numpy as np  # noqa: E402
from preconditioning import CLIENTS, reference  # noqa: E402
from problems import make_case  # noqa: E402

OUT = os.path.join(HERE, "..", "results", "pdmc", "metropolis.json")


def run_one(path: str, algorithm: str, bounds: str, max_seconds: float, ref,
            directory: str, rate_grid: float = 0.25) -> dict:
    from fedbayes_flwr.evaluation.sample_quality import marginal_w1
    from fedbayes_flwr.inference.posterior import SamplePosterior
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.engine import run_in_process_with_posterior

    config = parse_run_config({
        "model": "logistic-regression", "data": path, "partition": "natural",
        "num-clients": CLIENTS, "algorithm": algorithm, "seed": 0, "pdmc.bounds": bounds,
        "pdmc.max-seconds": max_seconds, "pdmc.rate-grid": rate_grid,
        "output-dir": tempfile.mkdtemp(dir=directory)})
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result, posterior = run_in_process_with_posterior(config, progress=False)
    seconds = time.perf_counter() - t0
    chains = posterior.chains
    post = SamplePosterior(chains)
    ess = float(np.min(post.ess()))
    w1 = marginal_w1(chains.reshape(-1, chains.shape[-1]), ref.draws) / ref.draws.std(0, ddof=1)
    last = result["history"][-1]
    grads, exchanges = float(last["grad_evals"]), last["round"]
    diag = last.get("diagnostics", {})
    return {"algorithm": algorithm, "bounds": bounds, "outcome": result["outcome"],
            "rate_grid": rate_grid if bounds == "metropolis" else None,
            "min_ess": ess, "max_rhat": float(np.max(post.rhat())),
            "max_w1_sd": float(np.max(w1)), "acceptance": diag.get("acceptance"),
            "samples_per_chain": int(chains.shape[1]), "grad_evals": grads,
            "exchanges": int(exchanges), "seconds": round(seconds, 1),
            "ess_per_full_grad": ess / (grads / CLIENTS), "ess_per_exchange": ess / exchanges,
            "ess_per_second": ess / seconds}


def table(doc: dict) -> str:
    head = ("| rho | d | sampler | bounds | rate-grid | outcome | min ESS | max R-hat | "
            "max W1 / sd | acceptance | ESS / full grad | ESS / exchange | ESS / s |")
    lines = [head, "|" + "---|" * 13]
    for case, entry in doc["cases"].items():
        rho, d = case.split(":")
        for r in entry["runs"]:
            acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
            grid = "-" if r.get("rate_grid") is None else f"{r['rate_grid']:g}"
            lines.append(f"| {rho} | {d} | {r['algorithm']} | {r['bounds']} | {grid} | "
                         f"{r['outcome']} | "
                         f"{r['min_ess']:.0f} | {r['max_rhat']:.3f} | {r['max_w1_sd']:.3f} | "
                         f"{acc} | {r['ess_per_full_grad']:.2e} | {r['ess_per_exchange']:.3f} | "
                         f"{r['ess_per_second']:.1f} |")
        nuts = entry["nuts"]
        lines.append(f"| {rho} | {d} | NUTS (centralised) | - | - | - | {nuts['min_ess']:.0f} | "
                     f"{nuts['max_rhat']:.3f} | 0 (reference) | - | {nuts['ess_per_grad']:.2e} "
                     f"| - | - |")
    return "\n".join(lines)


def main() -> None:
    import json

    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.experiment import build_experiment
    from fedbayes_flwr.runtime.recorder import write_json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["0.8:10"], help="rho:d pairs")
    p.add_argument("--samplers", nargs="+", default=["pdmc", "pdmc-bps"])
    p.add_argument("--max-seconds", type=float, default=40.0)
    p.add_argument("--rate-grids", nargs="+", type=float, default=[0.25, 0.5, 1.0],
                   help="pdmc.rate-grid values of the metropolis runs")
    p.add_argument("--bounds", nargs="+", default=["exact", "metropolis"])
    args = p.parse_args()
    doc = json.load(open(OUT)) if os.path.isfile(OUT) else {"benchmark": "metropolis",
                                                             "cases": {}}
    doc["machine"] = common.machine()
    doc["max_seconds"] = args.max_seconds
    with tempfile.TemporaryDirectory() as directory:
        for case in args.cases:
            rho, d = case.split(":")
            path = make_case("skewed", directory, d=int(d), rho=float(rho))
            exp = build_experiment(parse_run_config({
                "model": "logistic-regression", "data": path, "partition": "natural",
                "num-clients": CLIENTS, "algorithm": "pdmc", "output-dir": directory}))
            ref, nuts = reference(exp)
            entry = doc["cases"].setdefault(case, {"runs": []})
            entry["nuts"] = nuts
            for algorithm in args.samplers:
                for bounds in args.bounds:
                    for grid in (args.rate_grids if bounds == "metropolis" else [0.25]):
                        row = run_one(path, algorithm, bounds, args.max_seconds, ref,
                                      directory, grid)
                        key = (algorithm, bounds, row["rate_grid"])
                        entry["runs"] = [r for r in entry["runs"] if (
                            r["algorithm"], r["bounds"], r.get("rate_grid")) != key] + [row]
                        print(case, row, flush=True)
                        write_json(OUT, doc)
    print(table(doc))


if __name__ == "__main__":
    main()
