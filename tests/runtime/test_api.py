"""The Python API (:mod:`fedbayes_flwr.api`): ``fit`` returns a :class:`Run`, ``load`` gives it
back from the files the run wrote.

* fit / load round trip, exact: the same posterior class, bitwise the same mean and std (and
  draws), the same history, for a Gaussian (PVI), particles (DSVGD), a trace (PDMC) and a
  structured posterior (AMPS on a mixture);
* ``posterior.sample(n, seed=...)`` is ``(n, d)`` and seeded; ``predict(x)`` is the model's
  predictive;
* ``data`` as a dict of arrays and ``model`` as a Model object run in-process;
* ``engine="deployment"`` (marked ``deployment``) gives the in-process posterior bitwise;
* bad inputs are one-line ConfigErrors: an unknown engine, objects with a Flower engine, the
  Simulation Engine, a ``data`` dict with unknown arrays, a directory without a run;
* ``import fedbayes_flwr`` does not import TensorFlow (the API is re-exported lazily).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import fedbayes_flwr
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.inference.posterior import (
    GaussianPosterior,
    SamplePosterior,
    StructuredPosterior,
    TracePosterior,
    load_posterior,
)
from fedbayes_flwr.models import LikelihoodModel
from fedbayes_flwr.runtime.recorder import TRACE_MIN_DRAWS

LINEAR = {"model": "linear-regression", "dataset": "synthetic", "num-clients": 3, "num-rounds": 2}
CASES = {
    "pvi": ({"algorithm": "pvi", **LINEAR}, GaussianPosterior),
    "dsvgd": ({"algorithm": "dsvgd", **LINEAR}, SamplePosterior),
    "pdmc": ({"algorithm": "pdmc", **LINEAR, "num-rounds": 6}, TracePosterior),  # >= 4 draws: a trace
    "amps-gmm": ({"algorithm": "amps", "model": "gmm", "dataset": "amps-mixture",
                  "num-clients": 3, "partition": "iid", "noise-scale": 0.3, "num-rounds": 1},
                 StructuredPosterior),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fit_then_load_gives_the_same_posterior_bitwise(tmp_path, case):
    config, kind = CASES[case]
    run = fedbayes_flwr.fit({**config, "output-dir": str(tmp_path / case)}, progress=False)
    assert run.outcome == "completed" and run.output_dir == str(tmp_path / case)
    assert run.final == run.result["final"] and run.history[-1]["round"] == run.final["round"]
    assert type(run.posterior.wrapped) is kind
    back = fedbayes_flwr.load(tmp_path / case)
    assert type(back.posterior.wrapped) is kind
    np.testing.assert_array_equal(back.posterior.mean(), run.posterior.mean())
    np.testing.assert_array_equal(back.posterior.std(), run.posterior.std())
    np.testing.assert_array_equal(back.posterior.sample(5, seed=3), run.posterior.sample(5, seed=3))
    assert (back.history, back.final, back.outcome, back.output_dir) == (
        run.history, run.final, run.outcome, run.output_dir)
    # the figures each kind gets: a sampler's trace, a 1-D merged mixture's posterior
    out = tmp_path / case
    assert (out / "trace.png").is_file() == (kind is TracePosterior)
    assert kind is not TracePosterior or run.posterior.chains.shape[1] >= TRACE_MIN_DRAWS
    assert (out / "posterior.png").is_file() == (case == "amps-gmm")
    if kind in (SamplePosterior, TracePosterior):  # draws export to ArviZ, as they are
        theta = back.posterior.to_arviz().posterior["theta"]
        np.testing.assert_array_equal(theta.values, back.posterior.chains)
    else:
        with pytest.raises(ValueError, match="no draws"):
            back.posterior.to_arviz()


def test_sample_is_n_by_d_and_seeded_and_predict_is_the_models(tmp_path):
    run = fedbayes_flwr.fit({"algorithm": "pvi", **LINEAR, "output-dir": str(tmp_path)},
                            progress=False)
    post = run.posterior
    draws = post.sample(7, seed=1)
    assert draws.shape == (7, post.dim) == (7, post.mean().shape[0])
    np.testing.assert_array_equal(post.sample(7, seed=1), draws)
    assert not np.array_equal(post.sample(7, seed=2), draws)
    stateless = np.array([4, 2], dtype=np.int32)  # the library's own seed form passes through
    np.testing.assert_array_equal(post.sample(3, seed=stateless), post.wrapped.sample(stateless, 3))
    with pytest.raises(ConfigError, match="seed"):
        post.sample(3, seed=-1)
    x = np.random.default_rng(0).normal(size=(4, post.dim))
    pred = post.predict(x)
    np.testing.assert_allclose(pred.mean, x @ post.mean())
    assert pred.var.shape == (4,) and np.all(pred.var > 0)
    np.testing.assert_array_equal(fedbayes_flwr.load(tmp_path).posterior.predict(x).var, pred.var)
    assert post.natural is post.wrapped.natural  # the wrapped posterior's own attributes


def _regression_data(n=90, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = x @ np.array([1.0, -0.5, 0.25]) + 0.3 * rng.normal(size=n)
    return {"x_train": x[:60], "y_train": y[:60], "x_test": x[60:], "y_test": y[60:]}


def test_data_as_a_dict_of_arrays(tmp_path):
    data = _regression_data()
    run = fedbayes_flwr.fit({"algorithm": "pvi", "model": "linear-regression", "data": data,
                             "num-clients": 2, "num-rounds": 2, "output-dir": str(tmp_path)},
                            progress=False)
    assert run.outcome == "completed" and run.result["dataset"] == "file:data.npz"
    with np.load(tmp_path / "data.npz") as saved:
        np.testing.assert_array_equal(saved["x_train"], data["x_train"])
    np.testing.assert_allclose(run.posterior.mean(), [1.0, -0.5, 0.25], atol=0.2)
    # a moved directory still finds its data file (predict rebuilds the experiment)
    moved = tmp_path.parent / (tmp_path.name + "-moved")
    tmp_path.rename(moved)
    back = fedbayes_flwr.load(moved)
    np.testing.assert_array_equal(back.posterior.predict(data["x_test"]).mean,
                                  run.posterior.predict(data["x_test"]).mean)


def _gaussian_log_likelihood(theta, x, y):
    import tensorflow as tf

    return -0.5 * (y - tf.linalg.matvec(x, theta)) ** 2 - 0.5 * np.log(2.0 * np.pi)


def _linear_predict(theta, x):
    import tensorflow as tf

    return tf.linalg.matvec(x, theta)


def test_a_model_object_runs_and_keeps_its_generated_name(tmp_path):
    model = LikelihoodModel(_gaussian_log_likelihood, param_dim=lambda f: f, task="regression",
                            predict=_linear_predict)
    config = {"algorithm": "pvi", "model": model, "data": _regression_data(),
              "num-clients": 2, "num-rounds": 2}
    run = fedbayes_flwr.fit({**config, "output-dir": str(tmp_path / "a")}, progress=False)
    name = run.result["model"]
    assert run.outcome == "completed" and name.startswith("app-likelihoodmodel-") and model.name == name
    np.testing.assert_allclose(run.posterior.mean(), [1.0, -0.5, 0.25], atol=0.2)
    again = fedbayes_flwr.fit({**config, "output-dir": str(tmp_path / "b")}, progress=False)
    assert again.result["model"] == name  # the same object is not registered twice
    back = fedbayes_flwr.load(tmp_path / "a")  # this process knows the generated name
    np.testing.assert_array_equal(back.posterior.mean(), run.posterior.mean())
    np.testing.assert_allclose(back.posterior.predict(np.eye(3)).mean, run.posterior.mean(),
                               atol=0.05)  # averaged over the posterior's predictive draws


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("engine, config, match", [
    ("flower", {}, "unknown engine 'flower'"),
    ("deployment", {"model": LikelihoodModel(_gaussian_log_likelihood, param_dim=3,
                                             task="regression")}, "needs registered names and files"),
    ("deployment", {"data": {"x_train": np.zeros((4, 2))}}, "data must be strings"),
    ("simulation", {}, "not available from the Python API"),
    ("in-process", {"data": {"x_train": np.zeros((4, 2)), "X_test": np.zeros((2, 2))}},
     "unknown arrays X_test"),
    ("in-process", {"model": 3}, "expected a model name or a Model"),
    ("in-process", {"num-rounds": "many"}, "num-rounds"),
])
def test_bad_inputs_are_one_line_config_errors(tmp_path, engine, config, match):
    with pytest.raises(ConfigError) as err:
        fedbayes_flwr.fit({**config, "output-dir": str(tmp_path)}, engine=engine, progress=False)
    assert match in _one_line(err)
    assert not (tmp_path / "result.json").exists()


def test_load_of_a_directory_without_a_run(tmp_path):
    with pytest.raises(ConfigError) as err:
        fedbayes_flwr.load(tmp_path)
    assert "no result.json" in _one_line(err)


def test_load_posterior_reads_every_saved_layout(tmp_path):
    rng = np.random.default_rng(1)
    trace = TracePosterior(rng.normal(size=(2, 5, 3)), extras={"skeleton_x": rng.normal(size=4)},
                           counts={"grad_evals": 10.0})
    trace.save(tmp_path / "t.npz")
    back = load_posterior(tmp_path / "t.npz")
    assert type(back) is TracePosterior and back.extras.keys() == {"skeleton_x"}
    np.testing.assert_array_equal(back.chains, trace.chains)
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(ValueError, match="not a saved posterior"):
        load_posterior(tmp_path / "other.npz")


def test_import_fedbayes_flwr_does_not_import_tensorflow():
    code = ("import json, sys, fedbayes_flwr; "
            "print(json.dumps(['tensorflow' in sys.modules, 'fedbayes_flwr.api' in sys.modules, "
            "callable(fedbayes_flwr.fit)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, False, True]


@pytest.mark.deployment  # starts a SuperLink and SuperNodes on 127.0.0.1 (about a minute)
def test_the_deployment_engine_gives_the_in_process_posterior(tmp_path):
    config = {"algorithm": "pvi", **LINEAR, "num-clients": 2}
    local = fedbayes_flwr.fit({**config, "output-dir": str(tmp_path / "local")}, progress=False)
    run = fedbayes_flwr.fit({**config, "output-dir": str(tmp_path / "dep")}, engine="deployment",
                            progress=False)
    assert run.outcome == "completed" and run.result["engine"] == "deployment"
    np.testing.assert_array_equal(run.posterior.mean(), local.posterior.mean())
    np.testing.assert_array_equal(run.posterior.std(), local.posterior.std())
