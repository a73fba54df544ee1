#!/usr/bin/env python
"""Benchmark (diagnostic): why a monotone step rule stalls synchronous PVI on the digits BNN
(issue 13).

Runs the digits BNN on the pathological split (``pvi_damping.BNN``, seed 0) with ``damping =
auto``, the ``safe`` step rule and step memory but no non-monotone window and no proximal local
solves, for ``--rounds``
rounds (12: where that run stalls), then, at that state, computes every client's undamped delta
with three different local-solve seeds and measures

* the cosine between two seeds' combined deltas, for the change of the means (in posterior sd)
  and of the log-variances, per unit step (taken at ``s = 1/64``, where the change is linear);
* the change of the free energy along each combined delta and along their average, at steps
  ``1/1024 ... 1``, with a 256-sample common-random-number estimate and its standard error.

A delta that seeds agree on (cosine near 1) and along which the free energy falls from ``s = 0``
is a consistent descent direction, not Monte-Carlo noise: a monotone rule stops there for good,
which is why ``pvi.nonmonotone`` exists (:func:`fedbayes_flwr.algorithms.pvi.server.nonmonotone_index`).

It then measures the same profile along the combined delta of *proximal* local solves
(``pvi.proximal``, weights ``beta`` in :data:`BETAS`, the first seed's local-solve seeds): the
clients' changes of infinitesimal local steps add up to the global natural gradient, those of
full local solves need not, and a KL-proximal term pulls each change toward its local natural
gradient (:func:`fedbayes_flwr.algorithms.pvi.client.undamped_change`). If the free energy rises along
the proximal deltas where it falls along the plain one, ``proximal = auto`` (switched on by the
first stalled round) is what un-stalls the run.

Usage::

    .venv/bin/python benchmarks/pvi/pvi_bnn_stall.py           # ~3 min on 2 cores
    .venv/bin/python benchmarks/pvi/pvi_bnn_stall.py --quick   # smoke test: 2 rounds, 50 local steps

Results: ``benchmarks/results/pvi/pvi_bnn_stall.json``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common  # first: environment and sys.path
import numpy as np
import tensorflow as tf
from pvi_damping import BNN

from fedbayes_flwr.algorithms.base import client_seed
from fedbayes_flwr.algorithms.pvi import client as pvi_client
from fedbayes_flwr.algorithms.pvi import messages as pvi_messages
from fedbayes_flwr.algorithms.pvi import server as pvi_server
from fedbayes_flwr.algorithms.pvi import step as S
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.posterior import GaussianPosterior
from fedbayes_flwr.models.base import _data_tensors
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process
from fedbayes_flwr.runtime.experiment import build_experiment

NAME = "pvi_bnn_stall"
SETTING = {**BNN, "seed": 0, "pvi.step-rule": "safe", "pvi.step-memory": True,
           "pvi.nonmonotone": 0, "pvi.proximal": 0.0}  # stop 19's stalling run, as it was
STEPS = (1 / 1024, 1 / 256, 1 / 64, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
SAMPLES = 256
BETAS = (1.0, 3.0, 9.0)
EVAL_SEED = np.array([91, 3], dtype=np.int32)


def combined_deltas(exp, state, number: int, beta: float = 0.0) -> G.NaturalGaussian:
    """Every client's undamped delta at ``state``, local-solve seeds of round ``number``, proximal
    weight ``beta``."""
    out = []
    for pid in range(exp.num_clients):
        d = exp.client_data(pid)
        msg = pvi_messages.StepMessage(state.posterior, pvi_server.factor_of(state, pid), number, beta)
        seed = client_seed(exp.config.seed, "pvi", "step", number, pid, 0)
        out.append(pvi_client.undamped_change(seed, msg, exp.model, d.x, d.y, exp.setup.config,
                                       exp.prior, exp.num_clients).delta)
    return G.NaturalGaussian(np.stack([d.eta1 for d in out]), np.stack([d.eta2 for d in out]))


def main() -> int:
    parser = common.argument_parser(__doc__, quick_help="smoke test: 2 rounds, 50 local steps",
                                    rounds_help="rounds before the diagnosis (default 12)")
    args = parser.parse_args()
    rounds = 2 if args.quick else (args.rounds or 12)  # before the shared default of 10
    args = common.resolve_common_args(args, NAME)
    setting = {**SETTING, **({"local-steps": 50} if args.quick else {}),
               "num-rounds": rounds + 1}
    results = common.start(NAME, args, {}, setting=setting, rounds=rounds, steps=list(STEPS),
                           samples=SAMPLES)
    exp = build_experiment(parse_run_config(setting))
    state, rows = None, []
    for update, st, log in iterate_in_process(exp, rounds):
        state = st
        rows.append({"round": update, "free_energy": log.log_marginal_likelihood,
                     "step": log.diagnostics.get("pvi_step"),
                     "guard": log.diagnostics.get("pvi_guard")})
    results.doc["run"] = rows
    deltas = [combined_deltas(exp, state, number) for number in
              (rounds + 1, rounds + 101, rounds + 201)]
    deltas.append(G.NaturalGaussian(sum(d.eta1 for d in deltas) / 3,
                                    sum(d.eta2 for d in deltas) / 3))
    deltas += [combined_deltas(exp, state, rounds + 1, beta) for beta in BETAS]
    names = ["seed a", "seed b", "seed c", "average"] + [f"proximal {b:g}" for b in BETAS]
    mean0, var0 = G.to_moments(state.posterior)

    def at(delta, s):
        return pvi_server._combined(state._replace(deltas=delta, received=np.ones(exp.num_clients,
                                                                            bool)), s)

    def change(delta, s=1 / 64):  # per unit step, in posterior sd / log-variance
        m, v = G.to_moments(at(delta, s))
        return (m - mean0) / np.sqrt(var0) / s, (np.log(v) - np.log(var0)) / s

    def cos(a, b):
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

    moves = [change(d) for d in deltas[:3]]
    results.doc["cosines"] = [
        {"pair": f"{names[i]} / {names[j]}", "means": cos(moves[i][0], moves[j][0]),
         "log_variances": cos(moves[i][1], moves[j][1])}
        for i in range(3) for j in range(i + 1, 3)]
    x, y = _data_tensors(exp.dataset.x_train, exp.dataset.y_train)

    def ell(q):
        theta = tf.constant(GaussianPosterior(q).sample(EVAL_SEED, SAMPLES))
        return exp.model.log_likelihood_tf(theta, x, y).numpy()

    base, kl0 = ell(state.posterior), S.kl(state.posterior, exp.prior)
    results.doc["free_energy_at_state"] = float(base.mean() - kl0)
    profiles = {}
    for name, delta in zip(names, deltas, strict=True):
        profile = []
        for s in STEPS:
            q = at(delta, s)
            if not G.is_proper(q):
                profile.append({"step": s, "proper": False})
                continue
            diff = ell(q) - base
            profile.append({"step": s, "proper": True,
                            "change": float(diff.mean() - (S.kl(q, exp.prior) - kl0)),
                            "se": float(diff.std(ddof=1) / np.sqrt(SAMPLES))})
        profiles[name] = profile
        print(name, " ".join(f"{p['step']:g}:{p['change']:+.1f}" if p["proper"] else
                             f"{p['step']:g}:improper" for p in profile), flush=True)
    results.doc["profiles"] = profiles
    falls = [p["change"] < 0 for name, prof in profiles.items() if not name.startswith("prox")
             for p in prof if p["proper"]]
    results.doc["verdict"] = {
        "proximal_best_change": {
            name: max((p["change"] for p in prof if p["proper"]), default=None)
            for name, prof in profiles.items() if name.startswith("proximal")},
        "min_cosine_means": min(c["means"] for c in results.doc["cosines"]),
        "min_cosine_log_variances": min(c["log_variances"] for c in results.doc["cosines"]),
        "free_energy_falls_at_every_step": bool(all(falls))}
    print(results.doc["verdict"], flush=True)
    results.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
