"""Client-level DP-FedAvg the way a Flower user writes it: a ServerApp and a ClientApp.

The ServerApp wraps Flower's ``FedAvg`` in Flower's own
``flwr.serverapp.strategy.DifferentialPrivacyClientSideFixedClipping`` (noise multiplier from
:func:`dp_fedavg.client_level_sigma`, clipping norm ``C``, all ``K`` clients each round) with
Flower's own ``RdpAccountant`` (``no-amplification``, the only sampling its fixed-clipping
accounting accepts, ``add-or-remove-one``); the ClientApp carries Flower's ``fixedclipping_mod``
and trains with :func:`dp_fedavg.local_train` (the project's data, partitions and model). Clients
report ``dp-weight = 1``, FedAvg weights by it: the accounted wrapper requires equal weights.

Run it through the Simulation Engine with ``python benchmarks/dp/flower_app.py PROBLEM_JSON SEED
EPSILON DELTA OUT_JSON`` (what :mod:`dp_sweep` does for its Flower check): the server seeds
``numpy.random`` with the run seed (Flower draws its noise from the global ``np.random``), so the
in-process replica :func:`dp_fedavg.run_client_level` reproduces the run to float round-off.

References
----------
McMahan, Ramage, Talwar & Zhang (2018), "Learning Differentially Private Recurrent Language
Models", Algorithm 1; Flower 1.42, ``flwr/serverapp/strategy/dp_fixed_clipping.py`` and
``flwr/clientapp/mod/centraldp_mods.py``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

import dp_fedavg  # noqa: E402
import numpy as np  # noqa: E402
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.clientapp.mod import fixedclipping_mod  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping, FedAvg  # noqa: E402
from flwr.supercore.privacy_accounting import (  # noqa: E402
    NeighboringRelation,
    PrivacyConfig,
    SamplingMethod,
)
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant  # noqa: E402

WEIGHT = "dp-weight"


def make_client_app(problem: dp_fedavg.Problem, seed: int) -> ClientApp:
    """Train ``theta`` locally on this node's partition (``partition-id`` from its node config);
    ``fixedclipping_mod`` clips ``reply - sent`` to the norm the wrapper sends."""
    app = ClientApp(mods=[fixedclipping_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        exp = dp_fedavg.experiment(problem, seed)
        theta = msg.content["arrays"]["theta"].numpy()
        server_round = int(msg.content["config"]["server-round"])
        theta_k = dp_fedavg.local_train(
            dp_fedavg.client_seed(seed, "client-level", server_round, pid), theta,
            exp.client_data(pid), exp, problem)
        content = RecordDict({"arrays": ArrayRecord({"theta": Array(theta_k)}),
                              "metrics": MetricRecord({WEIGHT: 1, "num-examples": len(exp.partitions[pid])})})
        return Message(content=content, reply_to=msg)

    return app


def make_server_app(problem: dp_fedavg.Problem, seed: int, epsilon: float, delta: float,
                    out_path: str) -> ServerApp:
    """FedAvg over every node, wrapped for client-level DP (``epsilon = inf``: plain FedAvg);
    writes the final ``theta``, its test metrics and Flower's accountant's epsilon to
    ``out_path``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        exp = dp_fedavg.experiment(problem, seed)
        k = exp.num_clients
        sigma = dp_fedavg.client_level_sigma(problem, epsilon, delta)
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=k,
                          min_available_nodes=k, weighted_by_key=WEIGHT)
        accountant = None
        if sigma is not None:
            accountant = RdpAccountant(PrivacyConfig(
                target_delta=delta, population_size=k,
                neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                sampling_method=SamplingMethod.NO_AMPLIFICATION, max_epsilon=epsilon))
            strategy = DifferentialPrivacyClientSideFixedClipping(
                strategy, sigma, problem.client_clip, k, accountant=accountant)
        # Flower draws its noise with the legacy global np.random.normal: seeded here, it is the
        # replica's RandomState(seed) stream
        np.random.seed(seed)  # noqa: NPY002
        t0 = time.perf_counter()
        result = strategy.start(grid, ArrayRecord({"theta": Array(dp_fedavg.initial_theta(exp))}),
                                num_rounds=problem.rounds)
        theta = result.arrays["theta"].numpy()
        spent = math.inf if accountant is None else accountant.get_privacy_spent().epsilon
        doc = {"theta": theta.tolist(), "metrics": dp_fedavg.evaluate(exp, theta),
               "flower_accountant_epsilon": spent, "noise_multiplier": sigma,
               "strategy_s": round(time.perf_counter() - t0, 2)}
        with open(out_path, "w") as f:
            json.dump(doc, f)

    return app


def run(problem: dp_fedavg.Problem, seed: int, epsilon: float, delta: float, out_path: str) -> None:
    """Both apps through Flower's Simulation Engine (Ray, one CPU per client actor)."""
    from flwr.simulation import run_simulation

    from run_simulation import quiet_flower_logs, ray_backend_config, start_ray

    quiet_flower_logs()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, HERE, os.environ.get("PYTHONPATH", "")) if p)
    backend_config = ray_backend_config(1.0)
    start_ray(backend_config["init_args"])
    run_simulation(server_app=make_server_app(problem, seed, epsilon, delta, out_path),
                   client_app=make_client_app(problem, seed),
                   num_supernodes=int(problem.run_config["num-clients"]),
                   backend_config=backend_config)


if __name__ == "__main__":
    spec, seed_arg, eps_arg, delta_arg, out = sys.argv[1:6]
    run(dp_fedavg.Problem(**json.loads(spec)), int(seed_arg), float(eps_arg), float(delta_arg), out)
