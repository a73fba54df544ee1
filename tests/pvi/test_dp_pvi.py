"""DP-PVI (``pvi.dp = dp-sgd``): the DP-SGD local optimiser's clipping and noise, its gradient,
the refusals, ``dp = none`` being plain PVI bit for bit, and DP runs end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

import run_simulation
from fedbayes_flwr.algorithms.pvi import client as pvi_client
from fedbayes_flwr.algorithms.pvi import privacy
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference import vi
from fedbayes_flwr.inference.posterior import load_posterior
from fedbayes_flwr.models import make_model
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process
from fedbayes_flwr.runtime.experiment import build_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = {"model": "logistic-regression", "dataset": "breast-cancer", "num-clients": 10,
        "partition": "dirichlet", "partition-alpha": 0.5, "seed": 0}
# a cheap DP run: 2 rounds of 10 DP-SGD steps per client, lots of 5 rows on average
DP = {"pvi.dp": "dp-sgd", "pvi.damping": 0.1, "pvi.dp-delta": 1e-5, "pvi.batch-size": 5,
      "pvi.local-steps": 10, "pvi.learning-rate": 0.01, "pvi.mc-samples": 2}


# ---------------------------------------------------------------------------- clipping, noise
finite = st.integers(-10**6, 10**6).map(lambda i: i / 1e3)  # no denormals: TF flushes them


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 4)), elements=finite),
       arrays(np.float64, st.tuples(st.just(6), st.integers(1, 3), st.integers(1, 3)),
              elements=finite),
       st.floats(1e-3, 10.0))
def test_clipping_bounds_every_per_example_norm_over_all_parameters(a, b, clip):
    b = b[:a.shape[0]]
    clipped, norms = vi.clip_per_example((tf.constant(a), tf.constant(b)), clip)
    ca, cb = (c.numpy() for c in clipped)
    joint = np.sqrt(np.sum(ca**2, axis=1) + np.sum(cb**2, axis=(1, 2)))
    before = np.sqrt(np.sum(a**2, axis=1) + np.sum(b**2, axis=(1, 2)))
    np.testing.assert_allclose(norms.numpy(), before, rtol=1e-12)
    assert np.all(joint <= clip * (1 + 1e-12))  # the bound, over both tensors together
    small = before <= clip  # within the bound: untouched
    np.testing.assert_array_equal(ca[small], a[small])
    big = ~small  # beyond it: scaled onto the sphere, direction kept
    np.testing.assert_allclose(joint[big], clip, rtol=1e-12)
    np.testing.assert_allclose(ca[big] * before[big, None], a[big] * clip, rtol=1e-9, atol=1e-12)


def test_noise_has_the_stated_scale():
    """Zero gradients: the privatised sum is pure noise ``N(0, (sigma C)^2)`` in each of ``d``
    coordinates. ``(d - 1) s^2 / (sigma C)^2 ~ chi^2_{d-1}``; the test accepts the central
    ``1 - 1e-6`` of that law (a false alarm once in a million), and the mean by a two-sided
    z-test at the same level. With ``d = 200,000`` the band is about +-0.8% in the standard
    deviation, so it refuses a scale 2% off (checked below: the test has power)."""
    d, clip, sigma = 200_000, 0.3, 1.7
    grads = (tf.zeros([3, d], tf.float64),)
    (noise,) = vi.privatised_sum(grads, clip, sigma, tf.constant([4, 2], tf.int32))
    noise = noise.numpy()
    lo, hi = stats.chi2.ppf([0.5e-6, 1 - 0.5e-6], d - 1)
    statistic = (d - 1) * noise.var(ddof=1) / (sigma * clip)**2
    assert lo <= statistic <= hi, (lo, statistic, hi)
    assert not lo <= (d - 1) * noise.var(ddof=1) / (1.02 * sigma * clip)**2 <= hi
    z = noise.mean() / (sigma * clip / np.sqrt(d))
    assert abs(z) <= stats.norm.ppf(1 - 0.5e-6)
    # a different seed, a different draw; the same seed, the same one
    (again,) = vi.privatised_sum(grads, clip, sigma, tf.constant([4, 2], tf.int32))
    (other,) = vi.privatised_sum(grads, clip, sigma, tf.constant([4, 3], tf.int32))
    np.testing.assert_array_equal(again.numpy(), noise)
    assert not np.array_equal(other.numpy(), noise)


def _logistic_problem(n=12, d=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-x @ np.arange(1.0, d + 1)))).astype(np.float64)
    model = make_model("logistic-regression", 1.0, (), 2)
    prior = model.prior(d, 1.0, True)
    return model, x, y, prior


def test_dp_gradient_without_clipping_or_noise_is_the_free_energys():
    """``q = 1``, a clip no gradient reaches and ``sigma = 0``: the DP-SGD gradient is the plain
    gradient of the negative local free energy on the same draws (sign and scale)."""
    model, x, y, prior = _logistic_problem()
    d = prior.dim  # the features and the intercept
    mu = tf.constant(np.linspace(-0.5, 0.5, d))
    raw = tf.constant(np.full(d, -0.3))
    eps = tf.random.stateless_normal([4, d], seed=[1, 2], dtype=tf.float64)
    cavity = G.scale(prior, 0.7)
    args = (tf.constant(x), tf.constant(y), tf.constant(cavity.eta1), tf.constant(cavity.eta2))
    dp = vi.dp_sgd_gradient(model, (mu, raw), eps, *args, tf.constant(1.0, tf.float64),
                            tf.constant(1e9, tf.float64), tf.constant(0.0, tf.float64),
                            tf.constant([0, 0], tf.int32), True)
    with tf.GradientTape() as tape:
        tape.watch((mu, raw))
        loss = vi._objective(model, mu, raw, eps, args[0], args[1], args[2], args[3],
                             tf.constant(1.0, tf.float64), True)  # data_scale: n / batch, full batch
    plain = tape.gradient(loss, (mu, raw))
    for a, b in zip(dp, plain, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)


def test_dp_sgd_solve_is_reproducible_and_seeded():
    model, x, y, prior = _logistic_problem(n=30)
    config = vi.VIConfig(steps=15, learning_rate=0.05, mc_samples=2)
    dp = vi.DPSGDConfig(clip=1.0, noise_multiplier=1.0, sampling_rate=0.3)
    a = vi.fit_gaussian_dp_sgd([3, 4], model, x, y, prior, prior, config, dp)
    b = vi.fit_gaussian_dp_sgd([3, 4], model, x, y, prior, prior, config, dp)
    c = vi.fit_gaussian_dp_sgd([3, 5], model, x, y, prior, prior, config, dp)
    np.testing.assert_array_equal(a.eta1, b.eta1)
    np.testing.assert_array_equal(a.eta2, b.eta2)
    assert not np.array_equal(a.eta1, c.eta1)
    assert G.is_proper(a)


# ---------------------------------------------------------------------------- refusals
def _refusals(tmp_path):
    dp = "pvi.dp='dp-sgd' pvi.dp-noise-multiplier=1.0 pvi.dp-delta=1e-5 pvi.damping=0.5"
    return [
        (f"{dp} pvi.local-optimiser='fixed-point'", "pvi.local-optimiser: 'fixed-point'"),
        ("pvi.dp='dp-sgd' pvi.dp-epsilon=1.0 pvi.damping=0.5", "pvi.dp-epsilon: a target"),
        ("pvi.dp='dp-sgd' pvi.dp-noise-multiplier=1.0 pvi.dp-delta=1e-5", "pvi.damping: 'auto'"),
        (f"{dp} pvi.batch-size=500", "pvi.batch-size: 500 is larger than partition"),
        (f"{dp} pvi.schedule='asynchronous'", "pvi.schedule:"),
        ("pvi.dp='laplace'", "pvi.dp: unknown dp mode"),
        ("pvi.dp-epsilon=1.0", "pvi.dp-epsilon: set to 1 but pvi.dp is 'none'"),
        ("pvi.dp='dp-sgd' pvi.dp-delta=1e-5 pvi.damping=0.5", "pvi.dp-noise-multiplier: 0"),
    ]


def test_leaky_settings_are_refused_with_one_line_and_exit_2(tmp_path, capsys):
    for overrides, expected in _refusals(tmp_path):
        code = run_simulation.main(["--engine", "in-process", "--quiet", "--num-rounds", "1",
                                    "--output-dir", str(tmp_path / "out"),
                                    "--run-config", overrides])
        err = capsys.readouterr().err.strip()
        assert code == 2, overrides
        assert len(err.splitlines()) == 1, (overrides, err)
        assert err.startswith("error: ") and expected in err, (overrides, err)


def test_a_refusal_through_the_real_process(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "run_simulation.py"), "--run-config",
                           "pvi.dp='dp-sgd' pvi.dp-epsilon=1.0 pvi.damping=0.5"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: pvi.dp-epsilon: a target epsilon")


# ---------------------------------------------------------------------------- dp = none
@pytest.mark.parametrize("section", [{}, {"pvi.local-optimiser": "adam", "pvi.local-steps": 20,
                                          "pvi.damping": 0.5, "pvi.guard": False}])
def test_dp_none_is_plain_pvi_bit_for_bit(tmp_path, monkeypatch, section):
    """The DP code path is never entered with ``dp = none`` and the posterior is the one of a
    run whose config has no DP key at all (array_equal, not a tolerance)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the DP-SGD path was entered in a run without DP")

    monkeypatch.setattr(pvi_client, "private_optimum", refuse)
    monkeypatch.setattr(vi, "fit_gaussian_dp_sgd", refuse)
    posts, results = [], []
    for name, extra in (("absent", {}), ("none", {"pvi.dp": "none"})):
        config = parse_run_config({**KEYS, **section, **extra, "num-rounds": 2, "num-clients": 3,
                                   "output-dir": str(tmp_path / name)})
        assert config.section.dp == "none" and config.section.dp_rounds == 0
        results.append(run_in_process(config, progress=False))
        posts.append(load_posterior(tmp_path / name / "posterior.npz"))
    for key in ("mean", "std"):
        np.testing.assert_array_equal(getattr(posts[0], key)(), getattr(posts[1], key)())
    for row in results[1]["history"]:
        assert "dp_epsilon" not in row


# ---------------------------------------------------------------------------- DP runs
def test_calibrated_dp_run_stays_within_its_target(tmp_path):
    target = 1.0
    config = parse_run_config({**KEYS, **DP, "pvi.dp-epsilon": target, "num-rounds": 2,
                               "output-dir": str(tmp_path)})
    assert config.section.dp_rounds == 2  # the plan the clients calibrate for
    result = run_in_process(config, progress=False)
    assert result["outcome"] == "completed"
    spent = [row["dp_epsilon"] for row in result["history"]]
    assert len(spent) == 2 and 0 < spent[0] < spent[1] <= target
    assert result["final"]["dp_epsilon"] == spent[-1]
    assert result["final"]["dp_delta"] == 1e-5
    assert spent[-1] >= 0.999 * target  # the calibration spends (almost) all of it
    post = load_posterior(tmp_path / "posterior.npz")
    assert np.all(np.isfinite(post.mean())) and np.all(np.isfinite(post.std()))
    assert np.all(post.std() > 0)
    assert result["final"]["log_marginal_likelihood"] is None  # no free-energy query in DP
    # the server's number is the accountant's worst client, each calibrated for its own rows
    sizes = [len(p) for p in build_experiment(config).partitions]
    each = [privacy.epsilon(5 / n, privacy.calibrate(5 / n, 2 * 10, target, 1e-5), 2 * 10, 1e-5)
            for n in sizes]
    assert result["final"]["dp_epsilon"] == max(each)


def test_run_stops_before_a_round_would_pass_the_target(tmp_path):
    """A given noise multiplier with a target: the run stops (results kept, reason recorded)
    before the round that would take a client past it."""
    base = {**KEYS, **DP, "pvi.dp-noise-multiplier": 1.2, "num-rounds": 4,
            "output-dir": str(tmp_path)}
    config = parse_run_config(base)
    sizes = [len(p) for p in build_experiment(config).partitions]
    target = max(privacy.spent(config.section, n, 10, 2) for n in sizes)  # exactly 2 rounds
    result = run_in_process(parse_run_config({**base, "pvi.dp-epsilon": target}),
                            progress=False)
    assert result["outcome"] == "stopped"
    assert "pvi.dp-epsilon: round 3 would take partition" in result["reason"]
    assert [row["round"] for row in result["history"]] == [1, 2]
    assert result["final"]["dp_epsilon"] == pytest.approx(target, rel=1e-12)
    assert all(row["dp_epsilon"] <= target * (1 + 1e-12) for row in result["history"])
    assert os.path.isfile(tmp_path / "posterior.npz")


@pytest.mark.flower
@pytest.mark.deployment  # starts Ray: with the process tests (.ci/run)
def test_dp_pvi_through_the_simulation_engine_reports_epsilon(tmp_path):
    """DP-PVI through Flower's Simulation Engine: ``dp_epsilon`` and ``dp_delta`` come back in
    ``result.json`` and equal the in-process run's, as does the posterior (same seeds)."""
    run_config = ("pvi.dp='dp-sgd' pvi.dp-epsilon=2.0 pvi.dp-delta=1e-5 pvi.damping=0.2 "
                  "pvi.batch-size=5 pvi.local-steps=10 pvi.learning-rate=0.01 pvi.mc-samples=2")
    results = {}
    for engine in ("simulation", "in-process"):
        out = tmp_path / engine
        proc = subprocess.run(
            [sys.executable, "run_simulation.py", "--engine", engine, "--quiet",
             "--num-clients", "2", "--num-rounds", "2", "--output-dir", str(out),
             "--run-config", run_config],
            cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[engine] = json.loads((out / "result.json").read_text())
    sim, local = results["simulation"], results["in-process"]
    assert sim["outcome"] == local["outcome"] == "completed"
    assert 0 < sim["final"]["dp_epsilon"] <= 2.0 and sim["final"]["dp_delta"] == 1e-5
    assert [r["dp_epsilon"] for r in sim["history"]] == [r["dp_epsilon"] for r in local["history"]]
    a = load_posterior(tmp_path / "simulation" / "posterior.npz")
    b = load_posterior(tmp_path / "in-process" / "posterior.npz")
    np.testing.assert_allclose(a.mean(), b.mean(), rtol=1e-9, atol=1e-12)
