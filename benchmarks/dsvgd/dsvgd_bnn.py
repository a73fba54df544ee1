"""DSVGD on a BNN classifier: accuracy, NLL and calibration against FedAvg and centralised SVGD.

``bnn-classifier`` on ``digits`` (8x8, 10 classes; the offline stand-in for MNIST and
Fashion-MNIST, which load through ``hub:`` where a network exists), one ReLU hidden layer of
width 50 and 100 (the paper's Fig. 8: calibration as the width grows), prior sd 0.607 (precision
lambda = e), 10 clients (Dirichlet 0.5), 10 rounds (one DSVGD pass), N = 20 particles with the
reference's step 1e-3. Methods: DSVGD, U-DSVGD's first pass is identical so it is not run,
FedAvg (every client each round; point estimate, plug-in predictive), the paper's FedAvg (one
client per round) and centralised SVGD (the same iterations). Final test accuracy, NLL, ECE;
each run's reliability diagram is copied to ``dsvgd_bnn_reliability_w<width>_<method>.png``.

Also the BNN regressor (``bnn-regression``, width 50, on ``diabetes`` with 5 Dirichlet(0.5)
clients, same methods): test RMSE and NLL.

Run: ``.venv/bin/python benchmarks/dsvgd/dsvgd_bnn.py`` (about 6 minutes on 2 cores; ``--quick``:
width 50, 2 rounds; ``--part classification|regression`` runs one part and keeps the other's
results). Writes ``benchmarks/results/dsvgd/dsvgd_bnn.json``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common

METHODS = ("dsvgd", "fedavg", "fedavg-paper", "svgd")
REGRESSION = {"model": "bnn-regression", "dataset": "diabetes", "num-clients": 5,
              "partition": "dirichlet", "partition-alpha": 0.5, "prior-scale": 0.607,
              "hidden-layers": "50"}
BASE = {"model": "bnn-classifier", "dataset": "digits", "num-clients": 10,
        "partition": "dirichlet", "partition-alpha": 0.5, "prior-scale": 0.607}


def _keep_png(out: str, results_dir: str, width: str, method: str) -> str:
    """Copy the run's reliability diagram next to the JSON; its file name."""
    import shutil

    name = f"dsvgd_bnn_reliability_w{width}_{method}.png"
    shutil.copyfile(os.path.join(out, "reliability.png"), os.path.join(results_dir, name))
    return name


def regression(args, results) -> None:
    """The BNN regressor on diabetes: RMSE and NLL per method."""
    results.doc.setdefault("regression", {})
    for method in METHODS:
        out = os.path.join(args.work_dir, "regression", method)
        cfg = {**REGRESSION, "algorithm": method, "num-rounds": args.rounds, "seed": args.seed,
               "output-dir": out}
        if method == "svgd":
            cfg.pop("num-clients"), cfg.pop("partition"), cfg.pop("partition-alpha")
        result, record = common.timed_run(cfg)
        final = result["final"]
        results.doc["regression"][method] = {"rmse": final.get("test_rmse"),
                                             "nll": final.get("test_nll"),
                                             "wall_s": record["wall_s"]}
        results.write()
        print(f"regression {method:14s} rmse {final.get('test_rmse'):.3f} nll "
              f"{final.get('test_nll'):.3f} ({record['wall_s']:.0f}s)", flush=True)


def main():
    parser = common.argument_parser(__doc__, "width 50, 2 rounds", "rounds (default 10)")
    parser.add_argument("--part", choices=("all", "classification", "regression"), default="all")
    args = common.resolve_common_args(parser.parse_args(), "dsvgd_bnn")
    widths = ("50",) if args.quick else ("50", "100")
    results = common.start("dsvgd_bnn", args, {"base": BASE, "runs": {}, "regression": {}},
                           keep=args.part != "all", rounds=args.rounds)
    if args.part in ("all", "regression"):
        regression(args, results)
    if args.part == "regression":
        results.finish()
        return
    for width in widths:
        for method in METHODS:
            key = f"width {width} {method}"
            out = os.path.join(args.work_dir, f"w{width}", method)
            cfg = {**BASE, "algorithm": method, "hidden-layers": width,
                   "num-rounds": args.rounds, "seed": args.seed, "output-dir": out}
            if method == "svgd":
                cfg.pop("num-clients"), cfg.pop("partition"), cfg.pop("partition-alpha")
            result, record = common.timed_run(cfg)
            final = result["final"]
            results.doc["runs"][key] = {
                "width": int(width), "method": method, "wall_s": record["wall_s"],
                "accuracy": final.get("test_accuracy"), "nll": final.get("test_nll"),
                "ece": final.get("test_ece"),
                "reliability_png": _keep_png(out, args.results_dir, width, method),
                "curve": [h.get("test_accuracy") for h in result["history"]]}
            results.write()
            print(f"{key:28s} acc {final.get('test_accuracy'):.3f} nll {final.get('test_nll'):.3f}"
                  f" ece {final.get('test_ece'):.3f} ({record['wall_s']:.0f}s)", flush=True)
    results.finish()


if __name__ == "__main__":
    main()
