"""DSVGD's defaults against its paper preset and a NUTS reference on the issue-26 cases.

Cases (``problems.py``): ``skewed`` (label-skewed logistic regression, correlated features
``rho = 0.8``, ``d = 10`` + intercept, ``n = 2000``, 10 clients) and ``small`` (``n = 300``,
``d = 10`` + intercept, 5 clients split by a covariate). Each algorithm runs ``dsvgd`` /
``u-dsvgd`` for 3 passes, ``p-dsvgd`` for 10 rounds and ``svgd`` for 3 rounds; per run: the
largest |mean error| in NUTS sd, the range of the std ratios to NUTS, the largest marginal W1 in
NUTS sd, test accuracy and NLL, the last row's KSD and rollbacks, seconds.

``--fed-sweep``: the federated variants over case x d x N x kernel x seeds (the sweep issue 26
asks for where a variant misses the bar), one JSON row per run written as the sweep goes to
``benchmarks/results/dsvgd/dsvgd_sweep.json`` (``--out``); rows already there are kept and
not rerun.

``--sweep``: centralised SVGD's std ratio on ``N(0, I_d)`` over N x d x kernel bandwidth x seeds
(pure numpy, the variance collapse of the default and the paper bandwidths).

Run: ``python benchmarks/dsvgd/dsvgd_defaults.py [--cases skewed small] [--algorithms ...]
[--seeds 0 1] [--sweep]``; writes ``benchmarks/results/dsvgd/dsvgd_defaults.json`` (merging
with what is there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.dirname(os.path.dirname(HERE)), HERE]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common  # noqa: E402,F401  (quietens TensorFlow, puts the repository on sys.path)
import numpy as np  # noqa: E402
from problems import CASES, make_case  # noqa: E402

OUT = os.path.join(HERE, "..", "results", "dsvgd", "dsvgd_defaults.json")
PASSES = {"dsvgd": 3, "u-dsvgd": 3}
ROUNDS = {"p-dsvgd": 10, "svgd": 3, "sgld": 10, "pvi": 10}
SWEEP_OUT = os.path.join(HERE, "..", "results", "dsvgd", "dsvgd_sweep.json")


def _rounds(algorithm: str, clients: int) -> int:
    base = algorithm.removesuffix("-paper")
    return PASSES[base] * clients if base in PASSES else ROUNDS[base]


def run_case(case: str, algorithm: str, seed: int, directory: str, d: int | None = None,
             overrides: dict | None = None) -> dict:
    from fedbayes_flwr.evaluation.reference import nuts_reference
    from fedbayes_flwr.evaluation.sample_quality import marginal_w1
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.engine import run_in_process_with_posterior
    from fedbayes_flwr.runtime.experiment import build_experiment

    path = make_case(case, directory, d=d)
    clients = CASES[case]["clients"]
    config = parse_run_config({**(overrides or {}),
        "model": "logistic-regression", "data": path, "partition": "natural",
        "num-clients": clients, "algorithm": algorithm, "seed": seed,
        "num-rounds": _rounds(algorithm, clients),
        "output-dir": tempfile.mkdtemp(dir=directory)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exp = build_experiment(config)
        ref = nuts_reference(exp.model, exp.dataset.x_train, exp.dataset.y_train, exp.prior)
        t0 = time.perf_counter()
        result, posterior = run_in_process_with_posterior(config, progress=False)
    seconds = time.perf_counter() - t0
    draws = ref.draws
    mean, sd = draws.mean(0), draws.std(0, ddof=1)
    x = posterior.samples
    last = result["history"][-1]
    return {"case": case, "algorithm": algorithm, "seed": seed, "particles": int(x.shape[0]),
            "d": int(x.shape[1]), "overrides": dict(overrides or {}),
            "outcome": result["outcome"],
            "max_mean_error_sd": float(np.max(np.abs(x.mean(0) - mean) / sd)),
            "sd_ratio_min": float(np.min(x.std(0, ddof=1) / sd)),
            "sd_ratio_max": float(np.max(x.std(0, ddof=1) / sd)),
            "max_w1_sd": float(np.max(marginal_w1(x, draws) / sd)),
            "test_accuracy": last.get("test_accuracy"), "test_nll": last.get("test_nll"),
            "ksd": last.get("diagnostics", {}).get("ksd"),
            "rollbacks": sum(r.get("diagnostics", {}).get("dsvgd_rollbacks", 0)
                             for r in result["history"]),
            "bytes": int(sum(r["bytes_down"] + r["bytes_up"] for r in result["history"])),
            "seconds": round(seconds, 1)}


def sweep(seeds) -> list:
    from fedbayes_flwr.algorithms.dsvgd.svgd import scaled_svgd

    rows = []
    for d in (5, 11, 20):
        for n in (20, 50, 110, 200):
            for name, scale in (("median (default)", 1.0), ("median-log (paper)", None)):
                ratios = []
                for seed in seeds:
                    x0 = np.random.default_rng(seed).normal(size=(n, d)) * 2 + 1
                    x = scaled_svgd(x0, lambda x: -x, 600, bandwidth_scale=scale)
                    ratios.append(float(np.mean(x.std(0, ddof=1))))
                rows.append({"d": d, "N": n, "bandwidth": name, "sd_ratio_mean": np.mean(ratios),
                             "sd_ratio_per_seed": ratios})
                print(rows[-1], flush=True)
    return rows


def fed_sweep(args) -> None:
    """Each (case, algorithm, d, N, kernel, seed) once, appended to ``args.out`` as it ends."""
    doc = json.load(open(args.out)) if os.path.isfile(args.out) else {
        "benchmark": "dsvgd_sweep", "passes": PASSES, "rounds": ROUNDS}
    doc["machine"] = common.machine()
    done = {(r["case"], r["algorithm"], r["d"], r["particles"], r["kernel"], r["seed"])
            for r in doc.setdefault("runs", [])}
    with tempfile.TemporaryDirectory() as directory:
        for case in args.cases:
            for algorithm in args.algorithms:
                for d in args.dims:
                    for n in args.particles:
                        for kernel in args.kernels:
                            for seed in args.seeds:
                                if (case, algorithm, d + 1, n, kernel, seed) in done:
                                    continue
                                row = run_case(case, algorithm, seed, directory, d=d,
                                               overrides={"dsvgd.num-particles": n,
                                                          "dsvgd.kernel": kernel})
                                row["kernel"] = kernel
                                print(json.dumps(row), flush=True)
                                doc["runs"].append(row)
                                os.makedirs(os.path.dirname(args.out), exist_ok=True)
                                with open(args.out, "w") as f:
                                    json.dump(doc, f, indent=2, default=float)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=list(CASES))
    p.add_argument("--algorithms", nargs="+",
                   default=["dsvgd", "u-dsvgd", "p-dsvgd", "svgd", "dsvgd-paper",
                            "u-dsvgd-paper", "p-dsvgd-paper"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--fed-sweep", action="store_true")
    p.add_argument("--dims", nargs="+", type=int, default=[2, 5, 10])
    p.add_argument("--particles", nargs="+", type=int, default=[20, 50, 200])
    p.add_argument("--kernels", nargs="+", default=["isotropic", "mahalanobis"])
    p.add_argument("--out", default=SWEEP_OUT)
    args = p.parse_args()
    if args.fed_sweep:
        fed_sweep(args)
        return
    doc = json.load(open(OUT)) if os.path.isfile(OUT) else {"benchmark": "dsvgd_defaults"}
    doc["machine"] = common.machine()
    if args.sweep:
        doc["sweep_gaussian"] = sweep(args.seeds)
    else:
        runs = {(r["case"], r["algorithm"], r["seed"]): r for r in doc.get("runs", [])}
        with tempfile.TemporaryDirectory() as directory:
            for case in args.cases:
                for algorithm in args.algorithms:
                    for seed in args.seeds:
                        row = run_case(case, algorithm, seed, directory)
                        print(json.dumps(row), flush=True)
                        runs[(case, algorithm, seed)] = row
                        doc["runs"] = list(runs.values())
                        common.write_json(OUT, doc) if hasattr(common, "write_json") else None
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=2, default=float)


if __name__ == "__main__":
    main()
