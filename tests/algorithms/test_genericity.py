"""The generic engines run a family they have never heard of.

A toy bundle defined only in ``tests/helpers/toy_algorithm.py`` (one-shot merging of exact local Gaussian
posteriors: exact for gaussian-mean) is loaded through ``algorithm-modules``, runs in-process and
through the Simulation Engine with identical results, has its faults rejected and counted, and
runs with a registry holding only the toy while PVI cannot even be imported. Also: the generic
ClientApp handler without Ray, failure policies (retry, stop), and ``eval-every``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fedbayes_flwr import models
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process, run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOY = {"algorithm-modules": "tests.helpers.toy_algorithm", "algorithm": "toy-merge",
       "model": "gaussian-mean", "dataset": "synthetic", "num-clients": 4, "num-rounds": 1,
       "partition": "dirichlet", "partition-alpha": 0.5, "seed": 3}


def _exact(exp, rows=None):
    x = exp.dataset.x_train if rows is None else exp.dataset.x_train[rows]
    return models.exact_posterior(exp.model, exp.prior, x, None)


def _assert_same_gaussian(a, b, rtol=1e-10):
    np.testing.assert_allclose(a.eta1, b.eta1, rtol=rtol, atol=1e-12)
    np.testing.assert_allclose(a.eta2, b.eta2, rtol=rtol, atol=1e-12)


def test_toy_bundle_is_exact_in_process(tmp_path):
    exp = build_experiment(parse_run_config(TOY))
    [(update, state, log)] = list(iterate_in_process(exp))
    assert update == 1 and log.clients == (0, 1, 2, 3) and not log.rejected
    _assert_same_gaussian(state.posterior, _exact(exp))  # the merge is exact (up to rounding)
    # the check has power: without removing the M - 1 extra prior copies it is wrong
    naive = build_experiment(parse_run_config({**TOY, "toy_merge.prior-copies-removed": False}))
    [(_, bad, _)] = list(iterate_in_process(naive))
    assert np.max(np.abs(bad.posterior.eta2 - state.posterior.eta2)) > 0.5


def test_toy_fault_is_rejected_counted_and_leaves_the_others_exact(tmp_path):
    exp = build_experiment(parse_run_config({**TOY, "inject-fault": "nan@1:2"}))
    [(_, state, log)] = list(iterate_in_process(exp))
    assert [r.partition_id for r in log.rejected] == [2] and log.clients == (0, 1, 3)
    assert log.rejected[0].field == "posterior.eta1"  # the generic NaN fault, named by field
    rows = np.concatenate([exp.partitions[k] for k in (0, 1, 3)])
    _assert_same_gaussian(state.posterior, _exact(exp, rows))


def test_done_rule_ends_a_one_shot_run_early(tmp_path):
    result = run_in_process(parse_run_config({**TOY, "num-rounds": 5,
                                              "output-dir": str(tmp_path)}), progress=False)
    assert result["outcome"] == "done" and [h["round"] for h in result["history"]] == [1]


@pytest.mark.flower
def test_toy_simulation_engine_equals_in_process(tmp_path):
    argv = [sys.executable, os.path.join(ROOT, "run_simulation.py"), "--engine", "simulation",
            "--quiet", "--output-dir", str(tmp_path / "sim"), "--algorithm", "toy-merge",
            "--model", "gaussian-mean", "--dataset", "synthetic", "--num-clients", "4",
            "--num-rounds", "1", "--partition", "dirichlet", "--partition-alpha", "0.5",
            "--seed", "3", "--run-config",
            "algorithm-modules='tests.helpers.toy_algorithm' inject-fault='nan@1:2'"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-4000:]
    sim = json.loads((tmp_path / "sim" / "result.json").read_text())
    local = run_in_process(parse_run_config({**TOY, "inject-fault": "nan@1:2",
                                             "output-dir": str(tmp_path / "local")}),
                           progress=False)
    assert sim["engine"] == "simulation" and sim["bundle"] == "toy_merge"
    strip = [{k: v for k, v in h.items() if k != "elapsed_s"} for h in sim["history"]]
    assert strip == [{k: v for k, v in h.items() if k != "elapsed_s"} for h in local["history"]]
    assert sim["history"][0]["rejected_replies"] == 1
    assert sim["history"][0]["rejections"][0]["field"] == "posterior.eta1"
    with np.load(tmp_path / "sim" / "posterior.npz") as a, \
            np.load(tmp_path / "local" / "posterior.npz") as b:
        np.testing.assert_array_equal(a["mean"], b["mean"])
        np.testing.assert_array_equal(a["std"], b["std"])


def test_generic_modules_work_without_pvi(tmp_path):
    """Block every family module, import every generic piece, run the toy with a registry of
    one."""
    from fedbayes_flwr.algorithms.registry import BUILTIN_MODULES

    code = textwrap.dedent(f"""
        import sys
        for name in {BUILTIN_MODULES!r}:
            sys.modules[name] = None  # any import of it now fails
        import fedbayes_flwr.runtime.engine, fedbayes_flwr.runtime.config, fedbayes_flwr.runtime.recorder
        import strategies.base, clients.client_app, clients.handler
        from fedbayes_flwr.algorithms import registry
        from fedbayes_flwr.runtime.config import parse_run_config
        from fedbayes_flwr.runtime.engine import run_in_process
        cfg = parse_run_config({{**{TOY!r}, "output-dir": {str(tmp_path)!r}}})
        assert registry.names() == ("toy-merge",), registry.names()
        result = run_in_process(cfg, progress=False)
        assert result["outcome"] == "completed", result["outcome"]
        app = clients.client_app.make_client_app({{"algorithm-modules": "tests.helpers.toy_algorithm",
                                                   "algorithm": "toy-merge"}})
        assert "train.toy_merge" in app._registered_funcs
        print("OK", result["history"][0]["clients"])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK [0, 1, 2, 3]" in proc.stdout


def test_generic_client_handler_without_ray():
    """The ClientApp's handler answers a request built by hand exactly as the library does."""
    from tests.helpers.flower_utils import task_identity

    with task_identity():
        _handler_round_trip()


def _handler_round_trip():
    from flwr.app import Context, RecordDict

    from clients.handler import handle, state_key
    from fedbayes_flwr import codec
    from fedbayes_flwr.algorithms.base import Request
    from fedbayes_flwr.runtime.steps import client_work
    from strategies.base import BundleStrategy

    exp = build_experiment(parse_run_config({**TOY, "algorithm-modules": "tests.helpers.toy_algorithm"}))
    strategy = BundleStrategy(exp.bundle, exp.setup)
    strategy.nodes, strategy.partition_of = {1: 77}, {77: 1}
    request = Request("train", exp.actions["train"].request._replace(server_round=1))
    message = strategy._encode(None, 1, request, 1, 0)
    assert message.metadata.message_type == "train.toy_merge"
    context = Context(1, 77, {"partition-id": 1}, RecordDict(), {})
    reply = handle(exp, 1, message, context)
    decoded = codec.decode(reply.content, "toy_merge.train.reply", exp.actions["train"].reply)
    _, expected = client_work(exp, exp.bundle.init_client(exp.setup, 1), 1, request, 1)
    _assert_same_gaussian(decoded.posterior, expected.posterior, rtol=0)
    stored = codec.load_state(context.state, state_key(exp),
                              exp.bundle.client_state_template(exp.setup))
    assert stored.visits[0] == 1  # the client state persisted in context.state


@pytest.mark.parametrize("policy", ["retry", "stop"])
def test_failure_policies(tmp_path, policy):
    from fedbayes_flwr.algorithms.registry import register
    from tests.helpers import toy_algorithm

    bundle = toy_algorithm.BUNDLE._replace(name=f"toy_{policy}", failure_policy=policy)
    register(f"toy-{policy}", bundle)
    cfg = parse_run_config({**TOY, "algorithm": f"toy-{policy}", "inject-fault": "error@1:1",
                            "output-dir": str(tmp_path)})
    result = run_in_process(cfg, progress=False)
    if policy == "retry":  # the injected fault is transient: the re-send succeeds, all exact
        assert result["outcome"] == "completed"
        assert result["history"][0]["clients"] == [0, 1, 2, 3]
        assert result["history"][0]["rejected_replies"] == 0
        assert result["history"][0]["retried_replies"] == 1  # the failed first attempt counts
        exp = build_experiment(cfg)
        with np.load(tmp_path / "posterior.npz") as post:
            np.testing.assert_allclose(post["mean"], G.to_moments(_exact(exp))[0], rtol=1e-10)
    else:  # stop: one line why, and the result files still say so
        assert result["outcome"] == "stopped" and result["history"] == []
        assert "partition 1 failed" in result["reason"]


def test_make_apps_take_dotted_and_bare_keys_and_reject_unknown_ones():
    from clients import make_client_app
    from fedbayes_flwr.errors import ConfigError
    from strategies import make_server_app

    for overrides in ({"pvi.damping": 0.5}, {"algorithm": "pvi", "damping": 0.5}):
        make_server_app(overrides)
        make_client_app(overrides)
    for make in (make_server_app, make_client_app):
        with pytest.raises(ConfigError, match="unknown run-config key 'dampnig'") as err:
            make({"dampnig": 0.5})
        assert len(str(err.value).splitlines()) == 1
