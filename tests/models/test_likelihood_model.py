"""Models written as a TensorFlow log-likelihood (:class:`fedbayes_flwr.models.LikelihoodModel`)
and model plugins (:func:`fedbayes_flwr.models.register_model`, the ``model-modules`` key).

* A user-written logistic regression equals the built-in one: batched log density and gradient,
  per-datum gradients and the decentralized-HMC potential (value, gradient, ``v^T H v``).
* The plugin module :mod:`tests.helpers.user_models` (a probit and a Poisson regression), loaded
  through ``model-modules``, runs in-process with PVI, DSVGD, SGLD and DHMC and gives finite
  posteriors; PDMC takes the probit (it supplies ``rate_bound``) and refuses the Poisson model in
  one line.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.models import LikelihoodModel, make_model, register_model
from fedbayes_flwr.models import registry as R
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process
from tests.helpers import user_models as U

PLUGIN = "tests.helpers.user_models"


# ------------------------------------------------------------------ (a) equals the built-in model
@pytest.fixture(scope="module")
def cancer_shaped():
    """Breast-cancer-shaped synthetic data: 30 standardised, correlated features, 0/1 labels."""
    rng = np.random.default_rng(7)
    n, f = 120, 30
    mix = rng.normal(size=(f, f)) / np.sqrt(f)
    x = rng.normal(size=(n, f)) @ mix
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    w = rng.normal(size=f) / np.sqrt(f)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(x @ w + 0.3)))).astype(np.int64)
    theta = 0.4 * rng.normal(size=(5, f + 1))
    return x, y, theta


def _close(got, want):
    """Two float64 evaluations of the same expression (different op order): agreement to 1e-10,
    relative to the largest entry (a sum of 120 terms of size ~1 loses ~1e-14)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * max(1.0, np.max(np.abs(want))))


def test_user_logistic_equals_the_builtin(cancer_shaped):
    x, y, theta = cancer_shaped
    mine, builtin = U.user_logistic(), make_model("logistic-regression")
    p = x.shape[1] + 1
    assert mine.param_dim(x.shape[1]) == builtin.param_dim(x.shape[1]) == p
    prior = builtin.prior(x.shape[1], 1.5, diag=False)
    for kwargs in ({}, {"prior": prior, "data_scale": 3.0}):
        for got, want in zip(mine.log_density_and_grad(theta, x, y, **kwargs),
                             builtin.log_density_and_grad(theta, x, y, **kwargs), strict=True):
            _close(got, want)
    idx = np.arange(x.shape[0])
    _close(mine.per_datum_grads(theta[0], x, y, idx), builtin.per_datum_grads(theta[0], x, y, idx))
    _close(mine.per_datum_grads(theta[1], x, y, [3, 17]),
           builtin.per_datum_grads(theta[1], x, y, [3, 17]))

    ours, theirs = mine.gradient_potential(x, y), builtin.gradient_potential(x, y)
    v = np.random.default_rng(8).normal(size=theta.shape)
    _close(ours.value(theta), theirs.value(theta))
    _close(ours.grad(theta), theirs.grad(theta))
    _close(ours.hess_quad(theta, v), theirs.hess_quad(theta, v))
    assert ours.dim == theirs.dim == p
    assert mine.has_gradient_potential() and not mine.has_bounded_potential()
    assert mine.bounded_potential(x, y) is None


def test_bad_arguments_are_refused_in_one_line():
    for kwargs, match in (({"param_dim": 3, "task": "ordinal"}, "task must be one of"),
                          ({"param_dim": 0, "task": "binary"}, "param_dim"),
                          ({"param_dim": 3, "task": "binary", "predict": 1}, "predict")):
        with pytest.raises(ValueError, match=match) as err:
            LikelihoodModel(U.logistic_log_likelihood, **kwargs)
        assert "\n" not in str(err.value)


# ------------------------------------------------------------------ registration
def test_register_model_is_idempotent_and_refuses_clashes():
    R.load_model_modules(PLUGIN)
    assert {"user-probit", "user-poisson"} <= set(R.MODELS) <= set(R.ALL_MODELS)
    import fedbayes_flwr.models as M

    assert M.MODELS == R.MODELS  # read at access time, plugins included
    register_model("user-probit", U.PROBIT)  # the same object again: a no-op
    assert make_model("user-probit") is U.PROBIT
    cls = R.model_spec("user-probit")
    assert cls is U.PROBIT and type(U.PROBIT) is LikelihoodModel  # no class swapped in
    assert cls.name == "user-probit"
    assert (cls.target, cls.task, cls.synthetic) == ("binary", "classification", "logistic")
    assert R.model_spec("user-poisson").target == "real"
    with pytest.raises(ValueError, match="'user-probit' is already registered"):
        register_model("user-probit", U.user_logistic())
    with pytest.raises(ValueError, match="'logistic-regression' is already registered"):
        register_model("logistic-regression", U.user_logistic())
    with pytest.raises(ValueError, match="already registered as 'user-probit'"):
        register_model("another-probit", U.PROBIT)


def test_a_module_that_cannot_be_imported_is_one_config_error():
    with pytest.raises(ConfigError) as err:
        parse_run_config({"model-modules": "no.such.module", "model": "user-probit"})
    assert str(err.value).startswith("model-modules: cannot import 'no.such.module' (")
    assert "\n" not in str(err.value)


def test_config_validation_and_cli_help_see_plugins(capsys):
    config = parse_run_config({"model-modules": PLUGIN, "model": "user-poisson"})
    assert config.model == "user-poisson" and config.model_modules == PLUGIN
    with pytest.raises(ConfigError, match="unknown model 'no-such-model'.*user-probit"):
        parse_run_config({"model-modules": PLUGIN, "model": "no-such-model"})
    import run_simulation

    with pytest.raises(SystemExit):
        run_simulation.parse_args(["--run-config", f"model-modules='{PLUGIN}'", "--help"])
    assert "user-poisson" in "".join(capsys.readouterr().out.split())  # wrapped at hyphens


def test_copy_app_copies_model_plugins(tmp_path):
    from fedbayes_flwr.deploy.flwr_cli import copy_app

    copy_app(tmp_path, {"model-modules": PLUGIN})
    assert (tmp_path / "tests" / "helpers" / "user_models.py").is_file()


# ------------------------------------------------------------------ (b) runs through the engines
def _probit_data(path, seed=0):
    rng = np.random.default_rng(seed)
    from scipy.stats import norm

    x = rng.normal(size=(300, 3))
    y = (rng.random(300) < norm.cdf(x @ np.array([1.0, -0.5, 0.8]) + 0.2)).astype(np.int64)
    np.savez(path, x_train=x[:240], y_train=y[:240], x_test=x[240:], y_test=y[240:])
    return str(path)


def _poisson_data(path, seed=1):
    rng = np.random.default_rng(seed)
    x = 0.7 * rng.normal(size=(300, 3))
    y = rng.poisson(np.exp(x @ np.array([0.5, -0.3, 0.2]) + 0.5)).astype(np.float64)
    np.savez(path, x_train=x[:240], y_train=y[:240], x_test=x[240:], y_test=y[240:])
    return str(path)


SMALL = {  # a few rounds of each family: does it run, is the posterior finite
    "pvi": {"num-rounds": 2, "pvi.local-steps": 60, "pvi.mc-samples": 4},
    "dsvgd": {"num-rounds": 2, "dsvgd.num-particles": 8, "dsvgd.local-iterations": 20,
              "dsvgd.distillation-iterations": 20},
    # a smaller first step than the default 0.01: the Poisson gradient at a prior draw is large
    "sgld": {"num-rounds": 2, "sgld.num-chains": 4, "sgld.steps-per-round": 30,
             "sgld.step-scale": 1e-3},
    # num-rounds follows warm-up + iterations (the preset); a round is one HMC iteration
    "dhmc": {"dhmc.num-chains": 4, "dhmc.warmup": 20, "dhmc.iterations": 30,
             "dhmc.mixing-rounds": 3},
}


@pytest.mark.parametrize("model", ["user-probit", "user-poisson"])
@pytest.mark.parametrize("algorithm", list(SMALL))
def test_plugin_models_run_in_process(tmp_path, model, algorithm):
    make = _probit_data if model == "user-probit" else _poisson_data
    keys = {"algorithm": algorithm, "model-modules": PLUGIN, "model": model,
            "data": make(tmp_path / "data.npz"), "num-clients": 3, "partition": "iid",
            "seed": 3, "output-dir": str(tmp_path / "run"), **SMALL[algorithm]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_in_process(parse_run_config(keys), progress=False)
    assert result["outcome"] == "completed", result.get("reason")
    assert all(row["rejected_replies"] == 0 for row in result["history"])
    last = result["history"][-1]
    assert np.isfinite(last["test_nll"])
    assert np.isfinite(last["test_accuracy" if model == "user-probit" else "test_rmse"])
    with np.load(tmp_path / "run" / "posterior.npz") as post:
        arrays = {k: post[k] for k in post.files if post[k].dtype.kind == "f"}
    assert arrays and all(np.all(np.isfinite(a)) for a in arrays.values()), list(arrays)


def test_pdmc_takes_a_rate_bound_and_refuses_a_model_without_one(tmp_path):
    parse_run_config({"algorithm": "pdmc", "model-modules": PLUGIN, "model": "user-probit"})
    with pytest.raises(ConfigError) as err:
        parse_run_config({"algorithm": "pdmc", "model-modules": PLUGIN, "model": "user-poisson",
                          "pdmc.bounds": "exact"})  # auto runs it (tests/pdmc/test_pdmc_metropolis)
    assert "rate_bound" in str(err.value) and "\n" not in str(err.value)
    x = np.random.default_rng(2).normal(size=(20, 3))
    y = (x[:, 0] > 0).astype(np.int64)
    pot = U.PROBIT.bounded_potential(x, y)
    theta = np.random.default_rng(3).normal(size=(6, 4))
    v = np.random.default_rng(4).normal(size=(6, 4))
    # the bound holds: v^T H v <= v^T B v at every theta
    assert np.all(pot.hess_quad(theta, v) <= np.einsum("ki,ij,kj->k", v, pot.hess_bound, v))


def test_a_fresh_process_resumes_a_plugin_models_run(tmp_path):
    """The checkpoint's own ``model-modules`` is imported on resume (``checkpoint.load``), so a
    new process that never imported the plugin continues the run; the resumed run equals the
    uninterrupted one bit for bit (same seeds)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    keys = {"algorithm": "sgld", "model-modules": PLUGIN, "model": "user-probit",
            "data": _probit_data(tmp_path / "data.npz"), "num-clients": 2, "partition": "iid",
            "seed": 4, **SMALL["sgld"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sgld's preset fixes num-clients=1 (one notice)
        full = run_in_process(parse_run_config({**keys, "output-dir": str(tmp_path / "full")}),
                              progress=False)
        run_in_process(parse_run_config({**keys, "num-rounds": 1,
                                         "output-dir": str(tmp_path / "half")}), progress=False)
    proc = subprocess.run([sys.executable, os.path.join(root, "run_simulation.py"), "--engine",
                           "in-process", "--resume", str(tmp_path / "half"), "--num-rounds", "2",
                           "--quiet"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with np.load(tmp_path / "full" / "posterior.npz") as a, \
            np.load(tmp_path / "half" / "posterior.npz") as b:
        np.testing.assert_array_equal(a["samples"], b["samples"])
    assert len(full["history"]) == 2
