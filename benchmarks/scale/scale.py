"""Field scale: mean-field PVI on MNIST-shaped data with a 784-100-10 network, against the floor.

For each number of clients (Dirichlet 0.5 split of ``mnist-like``'s 60,000 rows) one in-process
run of mean-field PVI (``bnn-classifier``, ``hidden-layers = 100``: 79,510 parameters) in its own
process, so its peak resident memory is its own (``os.wait4``), and two protocols:

* ``default``: the library's defaults (``damping = auto``: the server's step search asks every
  client for ``E_q[log p(y_k | theta)]`` at each candidate step, 64 draws over all its rows);
* ``fixed``: the paper's protocol, ``pvi.damping = 1 / K`` for ``K`` clients, ``pvi.guard =
  false`` (no search; a synchronous sum of ``K`` undamped deltas overshoots, and ``1 / K`` keeps
  every update a proper Gaussian).

Both with the same local budget (``--local-steps`` Adam steps, ``--mc-samples`` draws, lots of
``--batch-size`` rows) and evaluation on the 10,000 test rows every round (a history row per
round is what times a round).

**The floor** is the same number of forward/backward passes over the same rows in plain
TensorFlow: for every client, ``local-steps`` steps of a ``tf.function`` mean-field training step
of the same network (``mc-samples`` draws on a lot of ``batch-size`` of *its* rows, Adam), and
the round's evaluation (the forward pass of 100 draws over the 10,000 test rows), timed in this
process. ``time / floor`` is what the library adds: the step search's free-energy queries,
the server's update, messages, the run's bookkeeping.

Writes ``benchmarks/results/scale/scale.json`` (seconds per round after the first, peak memory,
bytes per round, test accuracy/NLL, floor, ratio) and ``scale.png``. Measured on the machine it
runs on (``device`` records whether TensorFlow saw a GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402,I001

import numpy as np  # noqa: E402

from fedbayes_flwr.data import load_dataset, partition_indices  # noqa: E402

NAME = "scale"
HIDDEN = 100
PROTOCOLS = ("default", "fixed")


def parse_args():
    p = common.argument_parser(__doc__, "10 clients, 2 rounds, 5 local steps", "rounds per run")
    p.add_argument("--clients", default="10,100,1000", help="comma-separated client counts")
    p.add_argument("--protocols", default="default,fixed")
    p.add_argument("--local-steps", type=int, default=20)
    p.add_argument("--mc-samples", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--keep", action="store_true", help="add to the existing JSON (other cases)")
    p.add_argument("--floor-clients", default="10,100",
                   help="client counts whose floor is measured (it costs a round's training)")
    args = common.resolve_common_args(p.parse_args(), NAME)
    if args.quick:
        args.clients, args.local_steps = "10", 5
    if args.rounds == 10 and not args.quick:
        args.rounds = 3
    return args


def run_config(args, clients: int, protocol: str, out: str) -> dict:
    return {"algorithm": "pvi", "model": "bnn-classifier", "dataset": "mnist-like",
            "num-clients": clients, "partition": "dirichlet", "partition-alpha": 0.5,
            "num-rounds": args.rounds, "eval-every": 1, "seed": args.seed,
            "hidden-layers": str(HIDDEN), "output-dir": out,
            "pvi.local-steps": args.local_steps, "pvi.mc-samples": args.mc_samples,
            "pvi.batch-size": args.batch_size,
            **({"pvi.damping": 1.0 / clients, "pvi.guard": False} if protocol == "fixed" else {})}


def run_child(cfg: dict) -> dict:
    """One run in a child process: its result.json, wall time and peak resident memory."""
    code = ("import json, sys\nfrom fedbayes_flwr.runtime.config import parse_run_config\n"
            "from fedbayes_flwr.runtime.engine import run_in_process\n"
            "run_in_process(parse_run_config(json.loads(sys.argv[1])), progress=False)\n")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg)], cwd=common.ROOT,
                            stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        return {"error": err.strip().splitlines()[-1] if err.strip() else f"status {status}",
                "wall_s": round(wall, 1), "peak_rss_gb": round(usage.ru_maxrss / 2**20, 3)}
    with open(os.path.join(cfg["output-dir"], "result.json")) as f:
        result = json.load(f)
    hist = result["history"]
    elapsed = [row["elapsed_s"] for row in hist]
    per_round = np.diff([0.0, *elapsed])
    return {"wall_s": round(wall, 1), "peak_rss_gb": round(usage.ru_maxrss / 2**20, 3),
            "seconds_per_round": [round(float(s), 2) for s in per_round],
            "seconds_per_round_after_first": (round(float(np.mean(per_round[1:])), 2)
                                              if len(per_round) > 1 else None),
            "bytes_per_round": int(np.mean([row["bytes_down"] + row["bytes_up"] for row in hist])),
            "test_accuracy": result["final"].get("test_accuracy"),
            "test_nll": result["final"].get("test_nll"), "outcome": result.get("outcome")}


def floor_seconds(args, clients: int) -> dict:
    """Seconds of the plain-TensorFlow floor of one round for ``clients`` clients."""
    import tensorflow as tf

    data = load_dataset("mnist-like", "multiclass")
    parts = partition_indices(data, clients, "dirichlet", alpha=0.5, seed=args.seed)
    sizes = [784, HIDDEN, 10]
    d = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))

    def logits(theta, x):  # plain network: theta (M, d) -> (M, B, 10)
        w1 = tf.reshape(theta[:, :784 * HIDDEN], [-1, 784, HIDDEN])
        b1 = theta[:, 784 * HIDDEN:784 * HIDDEN + HIDDEN]
        rest = theta[:, 784 * HIDDEN + HIDDEN:]
        w2 = tf.reshape(rest[:, :HIDDEN * 10], [-1, HIDDEN, 10])
        h = tf.nn.relu(tf.einsum("bi,sio->sbo", x, w1) + b1[:, None, :])
        return tf.linalg.matmul(h, w2) + rest[:, None, HIDDEN * 10:]

    @tf.function(reduce_retracing=True)
    def train(x, y, steps, mu, rho):
        m = [tf.zeros_like(mu), tf.zeros_like(rho)]
        v = [tf.zeros_like(mu), tf.zeros_like(rho)]
        n = tf.shape(x)[0]
        batch = tf.minimum(n, args.batch_size)
        for t in tf.range(steps):
            seed = tf.stack([t, 7])
            idx = tf.random.experimental.stateless_shuffle(tf.range(n), seed=seed)[:batch]
            xb, yb = tf.gather(x, idx), tf.gather(y, idx)
            eps = tf.random.stateless_normal([args.mc_samples, d], seed=seed, dtype=tf.float64)
            with tf.GradientTape() as tape:
                tape.watch([mu, rho])
                theta = mu + tf.nn.softplus(rho) * eps
                ce = tf.nn.sparse_softmax_cross_entropy_with_logits(
                    tf.broadcast_to(yb[None, :], [args.mc_samples, batch]), logits(theta, xb))
                loss = tf.reduce_mean(ce) - tf.reduce_sum(tf.math.log(tf.nn.softplus(rho))) / 60000.0
            g = tape.gradient(loss, [mu, rho])
            m = [0.9 * a + 0.1 * b for a, b in zip(m, g, strict=True)]
            v = [0.999 * a + 0.001 * b**2 for a, b in zip(v, g, strict=True)]
            mu = mu - 1e-3 * m[0] / (tf.sqrt(v[0]) + 1e-8)
            rho = rho - 1e-3 * m[1] / (tf.sqrt(v[1]) + 1e-8)
        return mu, rho

    mu0 = tf.constant(np.random.default_rng(0).normal(0, 0.05, d))
    rho0 = tf.constant(np.full(d, -5.0))
    xs = [(tf.constant(data.x_train[i]), tf.constant(data.y_train[i].astype(np.int32))) for i in parts]
    train(xs[0][0], xs[0][1], tf.constant(1), mu0, rho0)  # trace once, outside the timing
    evaluate = tf.function(lambda theta, x: tf.reduce_mean(tf.nn.softmax(logits(theta, x)), axis=0))
    draws = tf.constant(np.random.default_rng(1).normal(0, 0.05, (100, d)))
    x_test = tf.constant(data.x_test)
    evaluate(draws, x_test[:10])
    t0 = time.perf_counter()
    for x, y in xs:
        if int(x.shape[0]) > 0:
            train(x, y, tf.constant(args.local_steps), mu0, rho0)
    train_s = time.perf_counter() - t0
    for i in range(0, x_test.shape[0], 2048):  # the library's chunk size
        evaluate(draws, x_test[i:i + 2048])
    total = time.perf_counter() - t0
    return {"floor_s": round(total, 2), "train_s": round(train_s, 2),
            "evaluate_s": round(total - train_s, 2), "clients_with_rows": sum(len(i) > 0 for i in parts)}


def device() -> str:
    import tensorflow as tf

    return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


def table(doc: dict) -> str:
    lines = ["| clients | protocol | s / round (after 1st) | floor s | time / floor | peak GB | "
             "MB / round | test acc | test NLL |", "|---|---|---|---|---|---|---|---|---|"]
    for case in sorted(doc["cases"].values(), key=lambda c: (c["clients"], c["protocol"])):
        if "error" in case:
            lines.append(f"| {case['clients']} | {case['protocol']} | error: {case['error']} | | | "
                         f"{case['peak_rss_gb']} | | | |")
            continue
        s = case["seconds_per_round_after_first"] or case["seconds_per_round"][0]
        floor = doc["floors"].get(str(case["clients"]), {}).get("floor_s")
        floor_cells = f"{floor:.1f} | {s / floor:.2f}" if floor else "- | -"
        lines.append(f"| {case['clients']} | {case['protocol']} | {s:.1f} | {floor_cells} | "
                     f"{case['peak_rss_gb']:.2f} | "
                     f"{case['bytes_per_round'] / 2**20:.1f} | {case['test_accuracy']:.3f} | "
                     f"{case['test_nll']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    results = common.start(NAME, args, {"cases": {}, "floors": {}}, keep=args.keep,
                           hidden=HIDDEN, local_steps=args.local_steps, mc_samples=args.mc_samples,
                           batch_size=args.batch_size, rounds=args.rounds, device=device())
    for clients in [int(c) for c in args.clients.split(",")]:
        if str(clients) in args.floor_clients.split(","):
            results.doc["floors"][str(clients)] = floor_seconds(args, clients)
            results.write()
            print(f"floor, {clients} clients: {results.doc['floors'][str(clients)]}", flush=True)
        for protocol in args.protocols.split(","):
            out = os.path.join(args.work_dir, f"{protocol}-{clients}")
            cfg = run_config(args, clients, protocol, out)
            case = {"clients": clients, "protocol": protocol, "rounds": args.rounds,
                    "local_steps": args.local_steps, "damping": cfg.get("pvi.damping", "auto"),
                    **run_child(cfg)}
            results.doc["cases"][f"{protocol}-{clients}"] = case
            results.write()
            print(f"{protocol}, {clients} clients: {case}", flush=True)
    results.finish()
    print(table(results.doc))


if __name__ == "__main__":
    main()
