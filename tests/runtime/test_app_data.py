"""The apps' node-data path without Flower's engines: a node built from ``load_data`` arrays and
a server built from the dimension agree on the experiment (same fingerprint) unless their
settings differ, a model object gets one stable name, and misuse fails in one line."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from clients import make_client_app
from clients.handler import check_same_experiment
from fedbayes_flwr.data import DataError
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.models import LogisticRegression, make_model, register_object, stable_name
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import (
    EXPECT,
    fingerprint,
    node_experiment,
    server_experiment,
)
from strategies import make_server_app
from tests.helpers.flower_utils import task_identity

RNG = np.random.default_rng(0)
X = RNG.normal(size=(30, 3))
Y = (X[:, 0] > 0).astype(np.int64)


def _expected(config):
    exp = server_experiment(config, 3, (X, Y))
    return {f"{EXPECT}{k}": v for k, v in
            fingerprint(exp.bundle.name, exp.setup, config.to_run_config()).items()}


def test_node_and_server_experiments_agree_and_a_different_setting_is_named():
    config = parse_run_config({"num-clients": 3, "pvi.damping": 0.5})
    node = node_experiment(config, 2, {"x_train": X, "y_train": Y})
    check_same_experiment(node, _expected(config))  # no mismatch
    assert node.client_data(2).x.shape == (30, 3) and node.client_data(0).x.shape == (0, 3)
    other = node_experiment(parse_run_config({"num-clients": 3}), 2, (X, Y))
    with pytest.raises(ValueError, match=r"pvi.damping: server 0.5, this client 'auto'"):
        check_same_experiment(other, _expected(config))


def test_client_app_with_load_data_answers_from_its_own_rows():
    seen = []

    def load_data(context):
        seen.append(int(context.node_config["partition-id"]))
        return X[:10], Y[:10]

    app = make_client_app({"num-clients": 2}, model=LogisticRegression.build(),
                          load_data=load_data)
    context = Context(1, 7, {"partition-id": 1}, RecordDict(), {})
    exp = app.experiment(context, 1)
    assert exp.client_data(1).x.shape == (10, 3) and exp.dataset.name == "app-data"
    assert app.experiment(context, 1) is exp and seen == [1]  # loaded once per process
    with task_identity():
        reply = app._partition(Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=7,
                                       message_type="query.partition"), context)
    assert reply.content["config"]["partition-id"] == 1


def test_model_objects_get_one_stable_name():
    a, b = LogisticRegression.build(), LogisticRegression.build()
    assert stable_name(a) == stable_name(b)
    name = register_object(a)
    # an equal object registered before (here or by another test) keeps the name
    assert register_object(b) == name and stable_name(make_model(name)) == name
    assert register_object("linear-regression") == "linear-regression"


def test_misuse_fails_in_one_line():
    with pytest.raises(ConfigError, match="need num_features"):
        make_server_app({"num-clients": 2}, test_data=(X, Y))
    config = parse_run_config({"num-clients": 2})
    with pytest.raises(DataError, match="features"):
        server_experiment(config, 4, (X, Y))
    with pytest.raises(DataError, match="expected"):
        node_experiment(config, 0, X)
    with pytest.raises(ValueError, match="partition id 2"):
        node_experiment(config, 2, (X, Y))


def test_fit_and_the_apps_give_a_model_object_the_same_name(tmp_path):
    """``fit(model=obj)`` and ``make_server_app(model=obj)`` name an object alike, and so does a
    process that builds an equal object afresh (a Ray actor's ClientApp)."""
    from fedbayes_flwr import fit
    from tests.helpers.user_models import user_logistic

    used, fresh = user_logistic("likelihood-model"), user_logistic("likelihood-model")
    expected = stable_name(fresh)  # what another process computes for the same model
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    data = {"x_train": x, "y_train": (x[:, 0] > 0).astype(float)}
    run = fit({"algorithm": "pvi", "model": used, "data": data, "num-clients": 2,
               "num-rounds": 1, "output-dir": str(tmp_path)}, progress=False)
    assert run.result["model"] == used.name == expected
    make_server_app({"num-clients": 2}, model=used, num_features=2)
    assert register_object(used) == expected
