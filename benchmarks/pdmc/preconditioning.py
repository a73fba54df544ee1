"""Fed-PDMC with and without the preconditioner (issue 33) over posterior correlation x dimension:
ESS per gradient evaluation, per exchange, per event and per second, min ESS, R-hat and the
marginal W1 to a long NUTS reference, with centralised NUTS as the anchor.

Data: ``benchmarks/dsvgd/problems.py``'s ``make_case("skewed", dir, d, rho)``: logistic regression
on ``d`` equicorrelated features (correlation ``rho``), ``n = 2000`` training rows, 10 clients
split by label (90 % of each client's rows carry its label), the model's ``N(0, I)`` prior, the
intercept as the last coordinate (``d + 1`` parameters).

Runs: ``pdmc`` (Zig-Zag) and ``pdmc-bps`` through the in-process engine with every default except
``pdmc.preconditioner`` (``none`` or ``auto``) and the wall-clock cap ``pdmc.max-seconds``
(``--max-seconds``, 60 here against the default 110, to fit the grid in a few minutes per case);
the run stops at its default target (min ESS 400 and max R-hat 1.01) or at the cap. Per run,
from the kept chains (burn-in removed): min ESS over coordinates and max R-hat (``tfp.mcmc``
through :class:`~fedbayes_flwr.inference.posterior.SamplePosterior`), the largest marginal W1
to the reference in units of the reference's posterior sd, and the min ESS per worker gradient
evaluation (``grad_evals``: one worker's gradient at one point, on its own rows, rejected
thinning candidates and the Laplace fit's Hessians included), per full-data gradient
(``grad_evals / 10``: the shards are of similar size), per exchange (one server round trip,
the fit's included), per event and per second of the run's wall time.

Reference and anchor: :func:`fedbayes_flwr.evaluation.reference.nuts_reference` (``tfp.mcmc``
NUTS, dual-averaging step size, 4 chains x 2,000 draws after 1,000 warm-up) on the pooled rows,
cached. Its ESS per gradient is the anchor: min ESS over its sampling phase's leapfrog steps
(``4 x 2000 x mean_leapfrogs``; the warm-up's are not counted), each a full-data gradient, on
the same machine.

Run: ``.venv/bin/python benchmarks/pdmc/preconditioning.py`` (the cases of the committed table;
``--cases 0.8:10 0.5:5``, ``--samplers pdmc``, ``--max-seconds``); ``--replot`` redraws from the
JSON. Writes ``benchmarks/results/pdmc/preconditioning.json`` and ``preconditioning.png``.

References
----------
Bertazzi & Bierkens (2022), "Adaptive schemes for piecewise deterministic Monte Carlo
algorithms"; Bierkens, Fearnhead & Roberts (2019), "The Zig-Zag process and super-efficient
sampling for Bayesian analysis of big data"; Hoffman & Gelman (2014), "The No-U-Turn Sampler".
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

import common  # noqa: E402,F401  (quietens TensorFlow, puts the repository on sys.path)
import numpy as np  # noqa: E402
from problems import make_case  # noqa: E402

OUT = os.path.join(HERE, "..", "results", "pdmc", "preconditioning.json")
CASES = ["0.8:10", "0:5", "0.5:10", "0.95:10", "0.8:30"]
CLIENTS = 10


def reference(exp):
    from fedbayes_flwr.evaluation.reference import nuts_reference

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = nuts_reference(exp.model, exp.dataset.x_train, exp.dataset.y_train, exp.prior,
                             num_chains=4, num_draws=2000, num_warmup=1000, seed=0)
    grads = 4 * 2000 * ref.info["mean_leapfrogs"]
    return ref, {"min_ess": float(np.min(ref.ess)), "max_rhat": float(np.max(ref.rhat)),
                 "grad_evals": float(grads), "ess_per_grad": float(np.min(ref.ess) / grads),
                 "seconds": ref.info.get("seconds"), "divergences": ref.info.get("divergences")}


def run_one(path: str, algorithm: str, preconditioner: str, max_seconds: float, ref,
            directory: str) -> dict:
    from fedbayes_flwr.evaluation.sample_quality import marginal_w1
    from fedbayes_flwr.inference.posterior import SamplePosterior
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.engine import run_in_process_with_posterior

    config = parse_run_config({
        "model": "logistic-regression", "data": path, "partition": "natural",
        "num-clients": CLIENTS, "algorithm": algorithm, "seed": 0,
        "pdmc.preconditioner": preconditioner, "pdmc.max-seconds": max_seconds,
        "output-dir": tempfile.mkdtemp(dir=directory)})
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result, posterior = run_in_process_with_posterior(config, progress=False)
    seconds = time.perf_counter() - t0
    chains = posterior.chains
    post = SamplePosterior(chains)
    ess = float(np.min(post.ess()))
    draws = ref.draws
    w1 = marginal_w1(chains.reshape(-1, chains.shape[-1]), draws) / draws.std(0, ddof=1)
    last = result["history"][-1]
    grads, events, exchanges = float(last["grad_evals"]), float(last["events"]), last["round"]
    return {"algorithm": algorithm, "preconditioner": preconditioner,
            "outcome": result["outcome"], "min_ess": ess, "max_rhat": float(np.max(post.rhat())),
            "max_w1_sd": float(np.max(w1)), "grad_evals": grads, "events": events,
            "exchanges": int(exchanges), "seconds": round(seconds, 1),
            "laplace_exchanges": last.get("diagnostics", {}).get("laplace_exchanges"),
            "ess_per_grad": ess / grads, "ess_per_full_grad": ess / (grads / CLIENTS),
            "ess_per_exchange": ess / exchanges, "ess_per_event": ess / max(events, 1.0),
            "ess_per_second": ess / seconds}


def plot(doc: dict, path: str) -> None:
    from fedbayes_flwr.evaluation.plots import _pyplot, _save

    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    cases = list(doc["cases"])
    xs = np.arange(len(cases))
    width = 0.2
    variants = [(a, p) for a in ("pdmc", "pdmc-bps") for p in ("none", "auto")]
    for ax, key, label in zip(axes, ("ess_per_full_grad", "ess_per_second", "max_w1_sd"),
                              ("min ESS per full-data gradient", "min ESS per second",
                               "max marginal W1 / posterior sd"), strict=True):
        for j, (alg, pre) in enumerate(variants):
            vals = [next((r[key] for r in doc["cases"][c]["runs"]
                          if r["algorithm"] == alg and r["preconditioner"] == pre), np.nan)
                    for c in cases]
            ax.bar(xs + (j - 1.5) * width, vals, width, label=f"{alg} {pre}")
        if key == "ess_per_full_grad":
            ax.scatter(xs, [doc["cases"][c]["nuts"]["ess_per_grad"] for c in cases], color="k",
                       marker="*", s=80, zorder=3, label="NUTS (centralised)")
            ax.set_yscale("log")
        if key == "max_w1_sd":
            ax.axhline(0.1, color="k", ls=":", lw=1)
        ax.set_xticks(xs, [c.replace(":", "\nd=").replace("rho", "") for c in cases])
        ax.set_xlabel("rho, d")
        ax.set_title(label)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)


def table(doc: dict) -> str:
    rows = ["| rho | d | sampler | preconditioner | outcome | min ESS | max R-hat | max W1 / sd | "
            "ESS / full grad | ESS / exchange | ESS / event | ESS / s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case, entry in doc["cases"].items():
        rho, d = case.split(":")
        for r in entry["runs"]:
            rows.append(f"| {rho} | {d} | {r['algorithm']} | {r['preconditioner']} | "
                        f"{r['outcome']} | {r['min_ess']:.0f} | {r['max_rhat']:.3f} | "
                        f"{r['max_w1_sd']:.3f} | {r['ess_per_full_grad']:.2e} | "
                        f"{r['ess_per_exchange']:.3f} | {r['ess_per_event']:.4f} | "
                        f"{r['ess_per_second']:.1f} |")
        n = entry["nuts"]
        rows.append(f"| {rho} | {d} | NUTS (centralised) | - | - | {n['min_ess']:.0f} | "
                    f"{n['max_rhat']:.3f} | 0 (reference) | {n['ess_per_grad']:.2e} | - | - | - |")
    return "\n".join(rows)


def main() -> None:
    import json

    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.experiment import build_experiment
    from fedbayes_flwr.runtime.recorder import write_json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=CASES, help="rho:d pairs")
    p.add_argument("--samplers", nargs="+", default=["pdmc", "pdmc-bps"])
    p.add_argument("--preconditioners", nargs="+", default=["none", "auto"])
    p.add_argument("--max-seconds", type=float, default=60.0)
    p.add_argument("--replot", action="store_true")
    args = p.parse_args()
    png = OUT.replace(".json", ".png")
    doc = json.load(open(OUT)) if os.path.isfile(OUT) else {"benchmark": "preconditioning",
                                                             "cases": {}}
    if not args.replot:
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
                    for pre in args.preconditioners:
                        row = run_one(path, algorithm, pre, args.max_seconds, ref, directory)
                        entry["runs"] = [r for r in entry["runs"] if (r["algorithm"], r[
                            "preconditioner"]) != (algorithm, pre)] + [row]
                        print(case, {k: row[k] for k in ("algorithm", "preconditioner",
                                                         "outcome", "min_ess", "max_rhat",
                                                         "max_w1_sd", "seconds")}, flush=True)
                        write_json(OUT, doc)
    plot(doc, png)
    print(table(doc))


if __name__ == "__main__":
    main()
