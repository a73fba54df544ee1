#!/usr/bin/env python
"""Benchmark: the generic autodiff path of a user's model against the built-in fast path.

A logistic regression written as a user would (:class:`fedbayes_flwr.models.LikelihoodModel`
over one TensorFlow log-likelihood, ``tests/helpers/user_models.py``) against the built-in
``logistic-regression`` on the same data (breast-cancer, 455 training rows, 30 features plus the
intercept), for the calls the families make:

* ``log_density_and_grad`` over ``K`` parameter rows (DSVGD particles, SGLD chains, PVI's
  Monte-Carlo draws);
* ``per_datum_grads`` for a batch of rows (SGLD, bounds);
* ``gradient_potential``'s ``grad``, ``value`` and ``hess_quad`` over ``K`` rows (decentralized
  HMC's numpy potential), and its ``grad`` on the training rows tiled 10x and 100x (where the
  fixed cost of a TensorFlow call stops dominating).

Each call is made once to trace, then timed as the median of ``--repeats`` calls. The two models
alternate call by call, so machine load affects both alike; the ratio (generic / built-in) is the
figure to read. Writes ``benchmarks/results/models/generic_gradient.json``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import argparse
import json
import statistics
import tempfile
import time

import common
import numpy as np

from fedbayes_flwr.models import make_model
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import build_experiment

sys.path.insert(0, common.ROOT)
from tests.helpers.user_models import user_logistic  # noqa: E402  (the user's model)

NAME = "generic_gradient"


def _timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--chains", type=int, default=16, help="parameter rows K (default 16)")
    parser.add_argument("--quick", action="store_true", help="20 repeats, results in a temp dir")
    parser.add_argument("--results-dir", default=None)
    args = parser.parse_args(argv)
    repeats = 20 if args.quick else args.repeats
    results_dir = args.results_dir or (os.path.join(tempfile.gettempdir(), NAME)
                                       if args.quick else common.RESULTS_DIR)
    exp = build_experiment(parse_run_config({"model": "logistic-regression",
                                             "dataset": "breast-cancer", "num-clients": 1}))
    x, y = exp.dataset.x_train, exp.dataset.y_train
    builtin, generic = make_model("logistic-regression"), user_logistic()
    d = builtin.param_dim(x.shape[1])
    rng = np.random.default_rng(0)
    theta = 0.1 * rng.standard_normal((args.chains, d))
    v = rng.standard_normal((args.chains, d))
    idx = np.arange(100)
    pot_b, pot_g = builtin.gradient_potential(x, y), generic.gradient_potential(x, y)
    calls = {
        "log_density_and_grad": lambda m: m.log_density_and_grad(theta, x, y, prior=exp.prior),
        "per_datum_grads (100 rows)": lambda m: m.per_datum_grads(theta[0], x, y, idx),
        "potential grad": lambda m: (pot_b if m is builtin else pot_g).grad(theta),
        "potential value": lambda m: (pot_b if m is builtin else pot_g).value(theta),
        "potential hess_quad": lambda m: (pot_b if m is builtin else pot_g).hess_quad(theta, v),
    }
    rows = {}
    for name, call in calls.items():
        call(builtin), call(generic)  # trace once (equal numbers: tests/models)
        got_b, got_g = [], []
        for _ in range(repeats):  # alternate, so load hits both alike
            got_b += _timed(lambda c=call: c(builtin), 1)
            got_g += _timed(lambda c=call: c(generic), 1)
        tb, tg = statistics.median(got_b), statistics.median(got_g)
        rows[name] = {"builtin_s": tb, "generic_s": tg, "ratio": tg / tb}
        print(f"{name:32s} built-in {tb * 1e3:8.3f} ms  generic {tg * 1e3:8.3f} ms  "
              f"ratio {tg / tb:6.2f}")
    # the numpy potential by data size: TensorFlow's fixed per-call cost (~0.5 ms) against
    # numpy's per-row cost; the training rows tiled 1x, 10x, 100x
    by_rows = {}
    for tiles in (1, 10, 100):
        xt, yt = np.tile(x, (tiles, 1)), np.tile(y, tiles)
        pb, pg = builtin.gradient_potential(xt, yt), generic.gradient_potential(xt, yt)
        pb.grad(theta), pg.grad(theta)
        got_b, got_g = [], []
        for _ in range(max(repeats // tiles, 5)):
            got_b += _timed(lambda p=pb: p.grad(theta), 1)
            got_g += _timed(lambda p=pg: p.grad(theta), 1)
        tb, tg = statistics.median(got_b), statistics.median(got_g)
        by_rows[str(xt.shape[0])] = {"builtin_s": tb, "generic_s": tg, "ratio": tg / tb}
        print(f"potential grad, {xt.shape[0]:6d} rows      built-in {tb * 1e3:8.3f} ms  generic "
              f"{tg * 1e3:8.3f} ms  ratio {tg / tb:6.2f}")
    doc = {"benchmark": NAME, "rows": int(x.shape[0]), "param_dim": int(d),
           "chains": args.chains, "repeats": repeats, "calls": rows,
           "potential_grad_by_rows": by_rows, "machine": common.machine()}
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, f"{NAME}.json"), "w") as f:
        json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
