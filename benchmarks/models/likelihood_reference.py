"""What the LikelihoodModel reference tests (``tests/models/test_likelihood_reference.py``) leave
out because it is too slow for the default suite: the Monte-Carlo error of PVI's user path and
DSVGD against NUTS.

* ``pvi_seed_sweep``: ``user-logistic`` (a :class:`~fedbayes_flwr.models.LikelihoodModel`, PVI's
  Monte-Carlo local solver) and the built-in ``logistic-regression`` (deterministic solver) on
  the tests' Dirichlet(0.3) label-skewed split, same settings (``FAMILIES["pvi"]``), the user
  path over ``--seeds`` seeds: the spread over seeds of the posterior mean (in built-in sd) and
  of the sd ratio, against the tests' derived ``SIGMA_MC = sqrt(2 K / (m T))``; the offset of
  the seeds' average from the built-in (a bias would show here); wall seconds of each run and
  their ratio (user / built-in), wall and CPU (the built-in timed after a warm-up run, so
  neither pays the process's first TensorFlow start; the user path's first seed pays its own
  tracing and is left out of the CPU ratio).
* ``dsvgd``: ``dsvgd`` with ``--particles`` particles (default 50) after one and two passes over
  the 3 clients, on the tests' three problems (built-in logistic, user probit, user Poisson):
  mean error in NUTS sd and sd ratio, against the honest particle tolerance (mean within
  ``3 / sqrt(N)`` sd, sd within ``1 +- 3 / sqrt(2 N)``), and centralised ``svgd`` for contrast.

Run: ``.venv/bin/python benchmarks/models/likelihood_reference.py`` (a few minutes on 2 cores;
``--quick``: 2 seeds, the logistic problem only, results in the temp dir). Writes
``benchmarks/results/models/likelihood_reference.json``.

References
----------
Polyak & Juditsky (1992), "Acceleration of stochastic approximation by averaging"; Liu & Wang
(2016), "Stein Variational Gradient Descent"; Kassab & Simeone (2022), "Federated Generalized
Bayesian Learning via Distributed Stein Variational Gradient Descent" (DSVGD).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import argparse
import json
import tempfile

import common
import numpy as np

sys.path.insert(0, common.ROOT)
from fedbayes_flwr.models import registry as REG  # noqa: E402
from tests.models import test_likelihood_reference as T  # noqa: E402  (the tests' problems)

NAME = "likelihood_reference"


def pvi_seed_sweep(seeds: int, work: str) -> dict:
    data = T.make_data("logistic-regression")
    T.fit("logistic-regression", "pvi", data, os.path.join(work, "warm-up"), **T.SKEWED)
    builtin, t_b, c_b = T.fit("logistic-regression", "pvi", data, os.path.join(work, "builtin"),
                              **T.SKEWED)
    mean_b, sd_b = builtin.posterior.mean(), builtin.posterior.std()
    z, ratio, seconds, cpu = [], [], [], []
    for seed in range(seeds):
        user, t_u, c_u = T.fit("user-logistic", "pvi", data, os.path.join(work, f"user-{seed}"),
                          **{**T.SKEWED, "seed": seed})
        z.append((user.posterior.mean() - mean_b) / sd_b)
        ratio.append(user.posterior.std() / sd_b)
        seconds.append(t_u)
        cpu.append(c_u)
        print(f"seed {seed}: mean diff / sd {np.round(z[-1], 4)}, sd ratio "
              f"{np.round(ratio[-1], 4)}, {t_u:.1f} s, CPU {c_u:.1f} s (built-in {t_b:.1f} s, "
              f"CPU {c_b:.1f} s)")
    z, ratio = np.array(z), np.array(ratio)
    out = {"sigma_mc_derived": T.SIGMA_MC,
           "mean_diff_per_seed": z.tolist(), "sd_ratio_per_seed": ratio.tolist(),
           "mean_diff_sd_over_seeds": z.std(0, ddof=1).tolist() if seeds > 1 else None,
           "sd_ratio_sd_over_seeds": ratio.std(0, ddof=1).tolist() if seeds > 1 else None,
           "mean_diff_average": z.mean(0).tolist(), "sd_ratio_average": ratio.mean(0).tolist(),
           "seconds_builtin": t_b, "seconds_user": seconds,
           "time_ratio": float(np.mean(seconds) / t_b), "cpu_builtin": c_b, "cpu_user": cpu,
           "cpu_ratio": float(np.mean(cpu[1:] if len(cpu) > 1 else cpu) / c_b)}
    print(json.dumps({k: out[k] for k in ("sigma_mc_derived", "mean_diff_sd_over_seeds",
                                          "sd_ratio_sd_over_seeds", "time_ratio",
                                          "cpu_ratio")}))
    return out


def dsvgd_rows(models, particles: int, work: str) -> dict:
    rows = {}
    for model in models:
        data = T.make_data(model)
        ref = T.nuts(model, data, None)
        mu, sd = ref.draws.mean(0), ref.draws.std(0)
        for label, algorithm, rounds in (("dsvgd 1 pass", "dsvgd", 3),
                                         ("dsvgd 2 passes", "dsvgd", 6),
                                         ("svgd", "svgd", 3)):
            keys = {"algorithm": algorithm, "num-rounds": rounds,
                    "dsvgd.num-particles": particles}
            T.FAMILIES["dsvgd-bench"] = keys
            run, seconds, _ = T.fit(model, "dsvgd-bench", data,
                                 os.path.join(work, f"{model}-{algorithm}-{rounds}"))
            err = np.abs(run.posterior.mean() - mu) / sd
            ratio = run.posterior.std() / sd
            ok = bool(np.all(err <= 3 / np.sqrt(particles))
                      and np.all(np.abs(ratio - 1) <= 3 / np.sqrt(2 * particles)))
            rows[f"{model} {label}"] = {"mean_error_sd": err.tolist(), "sd_ratio": ratio.tolist(),
                                        "meets_particle_tolerance": ok, "seconds": seconds}
            print(f"{model} {label}: mean error {err.round(3)}, sd ratio {ratio.round(3)}, "
                  f"tolerance {3 / np.sqrt(particles):.2f} / 1 +- "
                  f"{3 / np.sqrt(2 * particles):.2f}: {'met' if ok else 'NOT met'}")
    return {"particles": particles, "rows": rows}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--particles", type=int, default=50)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["pvi", "dsvgd"], default=None)
    parser.add_argument("--results-dir", default=None)
    args = parser.parse_args(argv)
    REG.load_model_modules(T.PLUGIN)
    work = tempfile.mkdtemp(prefix=f"fedbayes_{NAME}_")
    seeds = 2 if args.quick else args.seeds
    models = T.MODELS[:1] if args.quick else T.MODELS
    results_dir = args.results_dir or (os.path.join(work, "results") if args.quick
                                       else common.RESULTS_DIR)
    doc = {"benchmark": NAME, "quick": args.quick, "machine": common.machine()}
    if args.only in (None, "pvi"):
        doc["pvi_seed_sweep"] = pvi_seed_sweep(seeds, work)
    if args.only in (None, "dsvgd"):
        doc["dsvgd"] = dsvgd_rows(models, args.particles, work)
    os.makedirs(results_dir, exist_ok=True)
    path = os.path.join(results_dir, f"{NAME}.json" if args.only is None
                        else f"{NAME}_{args.only}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    print("wrote", path)


if __name__ == "__main__":
    main()
