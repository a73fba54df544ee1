#!/usr/bin/env python
"""Benchmark: a user's Keras MLP (``KerasModel``) against the built-in ``bnn-classifier``.

Issue 24, done-when 3. The Keras MLP 64-32-10 of ``tests/helpers/user_keras.py``, loaded through
``model-modules``, against the built-in ``bnn-classifier`` with ``hidden-layers = '32'`` (the same
architecture), on ``digits``:

* mean-field PVI (``pvi.covariance = diag``), 5 iid clients, 5 rounds, the same seed and the
  defaults otherwise: final test accuracy and NLL of each, the margin (Keras - built-in; the
  criterion is >= -0.03), seconds per update (one round) and the ratio Keras / built-in;
* the PVI posterior mean put back into Keras (``to_keras``): its ``predict`` accuracy, with the
  library's point accuracy at the mean (they must be equal);
* decentralized HMC on the Keras model for a fixed number of iterations (``--dhmc-iterations``):
  test accuracy, NLL, seconds;
* the per-call cost of the batched log density and gradient (``log_density_and_grad`` over
  ``K`` rows, one client's rows) and of decentralized HMC's potential gradient, Keras against the
  built-in, as the median of ``--repeats`` alternating calls.

Writes ``benchmarks/results/models/keras_vs_bnn.json``. 8 to 18 minutes on 2 shared cores
(``--quick``: 2 rounds, 20-iteration DHMC, results in a temp dir).
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
import warnings

import common
import numpy as np

import fedbayes_flwr
from fedbayes_flwr.inference.posterior import SamplePosterior
from fedbayes_flwr.models import make_model, registry
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import build_experiment

NAME = "keras_vs_bnn"
PLUGIN = "tests.helpers.user_keras"
KERAS, BUILTIN = "user-keras-mlp", "bnn-classifier"


def _fit(keys: dict) -> tuple[fedbayes_flwr.Run, float]:
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = fedbayes_flwr.fit(keys, progress=False)
    return run, time.perf_counter() - t0


def _steady(history: list) -> float | None:
    """Seconds per round after the first (which traces), from the rows' ``elapsed_s``."""
    times = [row.get("elapsed_s") for row in history]
    if len(times) < 2 or any(t is None for t in times):
        return None
    return (times[-1] - times[0]) / (len(times) - 1)


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dhmc-iterations", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--local-steps", type=int, default=0,
                        help="pvi.local-steps (default: the library's)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--results-dir", default=None)
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    iterations = 20 if args.quick else args.dhmc_iterations
    results_dir = args.results_dir or (os.path.join(tempfile.gettempdir(), NAME)
                                       if args.quick else common.RESULTS_DIR)
    out_root = tempfile.mkdtemp(prefix=NAME)
    common_keys = {"algorithm": "pvi", "dataset": "digits", "num-clients": 5, "partition": "iid",
                   "num-rounds": rounds, "seed": args.seed, "pvi.covariance": "diag",
                   "hidden-layers": "32", "model-modules": PLUGIN}
    if args.local_steps:
        common_keys["pvi.local-steps"] = args.local_steps
    doc: dict = {"benchmark": NAME, "settings": common_keys, "pvi": {}}

    # ---- PVI: the same seed and settings, the two models
    runs = {}
    for label, model in (("builtin", BUILTIN), ("keras", KERAS)):
        run, seconds = _fit({**common_keys, "model": model,
                             "output-dir": os.path.join(out_root, label)})
        runs[label] = run
        doc["pvi"][label] = {
            "model": model, "outcome": run.outcome,
            "test_accuracy": run.final["test_accuracy"], "test_nll": run.final["test_nll"],
            "accuracy_by_round": [row.get("test_accuracy") for row in run.history],
            "seconds": seconds, "seconds_per_update": seconds / rounds,
            # rounds 2.. only: the first round also traces the compiled functions
            "seconds_per_update_after_round_1": _steady(run.history)}
        print(f"PVI {model:16s} accuracy {run.final['test_accuracy']:.4f}  NLL "
              f"{run.final['test_nll']:.4f}  {seconds / rounds:.1f} s/update")
    pvi = doc["pvi"]
    pvi["accuracy_margin"] = pvi["keras"]["test_accuracy"] - pvi["builtin"]["test_accuracy"]
    pvi["criterion"] = "keras accuracy >= built-in accuracy - 0.03"
    pvi["meets_criterion"] = bool(pvi["accuracy_margin"] >= -0.03)
    pvi["seconds_per_update_ratio"] = (pvi["keras"]["seconds_per_update"]
                                       / pvi["builtin"]["seconds_per_update"])
    if pvi["keras"]["seconds_per_update_after_round_1"] is not None:
        pvi["seconds_per_update_after_round_1_ratio"] = (
            pvi["keras"]["seconds_per_update_after_round_1"]
            / pvi["builtin"]["seconds_per_update_after_round_1"])

    # ---- the posterior mean served by Keras
    exp = build_experiment(parse_run_config({**common_keys, "model": KERAS}))
    x_test, y_test = exp.dataset.x_test, exp.dataset.y_test
    model = make_model(KERAS)
    mean = runs["keras"].posterior.mean()
    served = model.to_keras(mean)
    keras_acc = float(np.mean(np.argmax(served.predict(x_test.astype(np.float32), verbose=0),
                                        axis=1) == y_test))
    point, _ = model.metrics(SamplePosterior(mean[None]), x_test, y_test)
    doc["to_keras"] = {"keras_predict_accuracy": keras_acc,
                       "library_point_accuracy_at_mean": point["test_accuracy"],
                       "library_posterior_predictive_accuracy": pvi["keras"]["test_accuracy"],
                       "equal": keras_acc == point["test_accuracy"]}
    print(f"to_keras: Keras predict {keras_acc:.4f}, library at the mean "
          f"{point['test_accuracy']:.4f}")

    # ---- decentralized HMC, a fixed number of iterations
    dhmc_keys = {**common_keys, "algorithm": "dhmc", "model": KERAS, "dhmc.num-chains": 4,
                 "dhmc.warmup": iterations // 2, "dhmc.iterations": iterations,
                 "output-dir": os.path.join(out_root, "dhmc")}
    for key in ("pvi.covariance", "pvi.local-steps", "num-rounds"):
        dhmc_keys.pop(key, None)
    run, seconds = _fit(dhmc_keys)
    doc["dhmc"] = {"outcome": run.outcome, "iterations": iterations, "warmup": iterations // 2,
                   "chains": 4, "test_accuracy": run.final.get("test_accuracy"),
                   "test_nll": run.final.get("test_nll"), "seconds": seconds}
    print(f"DHMC keras {iterations} iterations: {run.outcome}, accuracy "
          f"{run.final.get('test_accuracy')}, {seconds:.1f} s")

    # ---- per-call cost (one client's rows, K parameter rows)
    x, y = exp.client_data(0)
    theta = 0.1 * np.random.default_rng(0).standard_normal((16, model.param_dim(64)))
    builtin = make_model(BUILTIN, 1.0, (32,), 10)
    pots = {id(model): model.gradient_potential(x, y), id(builtin): builtin.gradient_potential(x, y)}
    calls = {"log_density_and_grad (K=16)":
             lambda m: m.log_density_and_grad(theta, x, y, prior=exp.prior),
             "potential grad (K=16, decentralized HMC)": lambda m: pots[id(m)].grad(theta)}
    doc["calls"] = {"rows": int(x.shape[0]), "param_dim": int(theta.shape[1]), "chains": 16}
    for name, call in calls.items():
        call(model), call(builtin)  # trace
        got_k, got_b = [], []
        for _ in range(args.repeats):  # alternate, so load hits both alike
            got_k.append(_seconds(lambda c=call: c(model)))
            got_b.append(_seconds(lambda c=call: c(builtin)))
        tk, tb = statistics.median(got_k), statistics.median(got_b)
        doc["calls"][name] = {"keras_s": tk, "builtin_s": tb, "ratio": tk / tb}
        print(f"{name:42s} keras {tk * 1e3:7.2f} ms  built-in {tb * 1e3:7.2f} ms  "
              f"ratio {tk / tb:5.2f}")
    doc["machine"] = common.machine()
    doc["registered"] = KERAS in registry.MODELS
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(results_dir, f"{NAME}.json"), "w") as f:
        json.dump(doc, f, indent=2, default=float)


if __name__ == "__main__":
    main()
