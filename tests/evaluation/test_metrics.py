"""Tests for fedbayes_flwr.evaluation.predictive and fedbayes_flwr.evaluation.plots (pure numpy, fast)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from fedbayes_flwr.evaluation.plots import plot_curves, plot_history, plot_reliability
from fedbayes_flwr.evaluation.predictive import (
    binary_classification_metrics,
    multiclass_classification_metrics,
    regression_metrics,
    reliability_diagram,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_binary_hand_computed():
    p1 = np.array([0.9, 0.2, 0.6, 0.4])
    y = np.array([1, 0, 0, 1])
    out = binary_classification_metrics(p1, y, num_bins=5)
    assert set(out) == {"test_accuracy", "test_nll", "test_ece", "test_brier"}
    assert all(type(v) is float for v in out.values())
    assert out["test_accuracy"] == pytest.approx(0.5)
    # p(y) = 0.9, 0.8, 0.4, 0.4
    assert out["test_nll"] == pytest.approx(-(np.log(0.9) + np.log(0.8) + 2 * np.log(0.4)) / 4)
    assert out["test_brier"] == pytest.approx((0.01 + 0.04 + 0.36 + 0.36) / 4)
    # 5 bins of width 0.1 over [0.5, 1]; confidences 0.9, 0.8, 0.6, 0.6 (correct, correct, wrong,
    # wrong) -> bins [0.9,1]: |1-0.9|, [0.8,0.9): |1-0.8|, [0.6,0.7): |0-0.6| twice.
    assert out["test_ece"] == pytest.approx((0.1 + 0.2 + 2 * 0.6) / 4)


def test_binary_tie_predicts_class_one_and_nll_clipping():
    out = binary_classification_metrics(np.array([0.5, 1.0]), np.array([1, 0]))
    assert out["test_accuracy"] == pytest.approx(0.5)
    assert out["test_nll"] == pytest.approx((-np.log(0.5) - np.log(1e-12)) / 2)
    assert np.isfinite(out["test_nll"])


def test_multiclass_hand_computed():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.25, 0.5, 0.25]])
    y = np.array([0, 1, 1])
    out = multiclass_classification_metrics(probs, y)
    assert out["test_accuracy"] == pytest.approx(2 / 3)
    assert out["test_nll"] == pytest.approx(-(np.log(0.7) + np.log(0.3) + np.log(0.5)) / 3)
    brier = [0.09 + 0.04 + 0.01, 0.01 + 0.49 + 0.36, 0.0625 + 0.25 + 0.0625]
    assert out["test_brier"] == pytest.approx(np.mean(brier))
    # 10 bins over [1/3, 1] (width 1/15): 0.7, 0.6, 0.5 fall in distinct bins.
    assert out["test_ece"] == pytest.approx((0.3 + 0.6 + 0.5) / 3)


def test_ece_perfectly_calibrated_is_small():
    rng = np.random.default_rng(0)
    m, num_bins = 200_000, 10
    p1 = rng.uniform(size=m)
    y = (rng.uniform(size=m) < p1).astype(int)
    ece = binary_classification_metrics(p1, y, num_bins=num_bins)["test_ece"]
    counts = np.array(reliability_diagram(p1, y, num_bins=num_bins)["count"])
    n_b = counts[counts > 0]
    # Given the confidences, correctness in bin b is Bernoulli(conf_i), so acc_b - conf_b has
    # mean 0 (no bin-width bias: accuracy is compared with the *mean* confidence of the bin) and
    # sd sigma_b <= 0.5 / sqrt(n_b). Under the normal approximation E|acc_b - conf_b| =
    # sqrt(2/pi) sigma_b, so E[ECE] <= sum_b (n_b/m) sqrt(2/pi) 0.5/sqrt(n_b) ~= 0.0028 here
    # (n_b ~= 20k). The sd of ECE itself is <= sqrt(sum_b (n_b/m)^2 sigma_b^2) ~= 0.0011, so
    # bound + 4 * that sd is a conservative tolerance.
    mean_bound = float(np.sum(n_b / m * math.sqrt(2 / math.pi) * 0.5 / np.sqrt(n_b)))
    sd_bound = float(np.sqrt(np.sum((n_b / m) ** 2 * 0.25 / n_b)))
    assert mean_bound == pytest.approx(0.0028, abs=2e-4)
    assert ece < mean_bound + 4 * sd_bound


def test_ece_overconfident():
    # Always says p1 = 0.99; 70% of labels are 1 -> one bin, |0.7 - 0.99| = 0.29.
    y = np.array([1] * 70 + [0] * 30)
    p1 = np.full(100, 0.99)
    out = binary_classification_metrics(p1, y)
    assert out["test_accuracy"] == pytest.approx(0.7)
    assert out["test_ece"] == pytest.approx(0.29, abs=1e-12)


def test_binary_and_multiclass_agree():
    rng = np.random.default_rng(1)
    p1 = rng.uniform(size=500)
    p1[:5] = [0.5, 0.0, 1.0, 0.55, 0.95]
    y = rng.integers(0, 2, size=500)
    b = binary_classification_metrics(p1, y, num_bins=7)
    mc = multiclass_classification_metrics(np.stack([1 - p1, p1], axis=1), y, num_bins=7)
    assert b.keys() == mc.keys()
    for k in ("test_accuracy", "test_nll", "test_ece"):
        assert b[k] == pytest.approx(mc[k], rel=1e-12, abs=1e-12), k
    # Multiclass Brier sums over both classes: (p1 - y)^2 + ((1 - p1) - (1 - y))^2 = 2 (p1 - y)^2.
    assert mc["test_brier"] == pytest.approx(2 * b["test_brier"], rel=1e-12)


@pytest.mark.parametrize("shape", [(50,), (50, 3)])
def test_regression_matches_scipy(shape):
    rng = np.random.default_rng(2)
    mean = rng.normal(size=shape)
    var = rng.uniform(0.1, 2.0, size=shape)
    y = rng.normal(size=shape)
    out = regression_metrics(mean, var, y)
    logpdf = norm.logpdf(y, loc=mean, scale=np.sqrt(var))
    row = logpdf if logpdf.ndim == 1 else logpdf.sum(axis=1)
    assert out["test_nll"] == pytest.approx(-row.mean(), rel=1e-12)
    assert out["test_rmse"] == pytest.approx(np.sqrt(np.mean((y - mean) ** 2)), rel=1e-12)
    assert set(out) == {"test_rmse", "test_nll"}


def test_regression_hand_computed():
    out = regression_metrics(np.array([0.0, 1.0]), np.array([1.0, 1.0]), np.array([0.0, 3.0]))
    assert out["test_rmse"] == pytest.approx(math.sqrt(2.0))
    assert out["test_nll"] == pytest.approx(0.5 * math.log(2 * math.pi) + 0.5 * 4 / 2)


@pytest.mark.parametrize("multiclass", [False, True])
def test_reliability_diagram_consistent_with_ece(multiclass):
    rng = np.random.default_rng(3)
    m, num_bins = 1000, 8
    if multiclass:
        probs = rng.dirichlet(np.ones(4), size=m)
        y = rng.integers(0, 4, size=m)
        ece = multiclass_classification_metrics(probs, y, num_bins)["test_ece"]
        lo = 0.25
    else:
        probs = rng.uniform(size=m)
        y = rng.integers(0, 2, size=m)
        ece = binary_classification_metrics(probs, y, num_bins)["test_ece"]
        lo = 0.5
    d = reliability_diagram(probs, y, num_bins=num_bins)
    assert set(d) == {"bin_lower", "bin_upper", "confidence", "accuracy", "count"}
    assert all(len(v) == num_bins for v in d.values())
    assert sum(d["count"]) == m
    assert d["bin_lower"][0] == pytest.approx(lo)
    assert d["bin_upper"][-1] == pytest.approx(1.0)
    n = np.array(d["count"])
    gap = np.abs(np.array(d["accuracy"]) - np.array(d["confidence"]))
    assert np.nansum(n * gap) / m == pytest.approx(ece, rel=1e-12)


def test_reliability_diagram_empty_bins():
    d = reliability_diagram(np.array([0.99, 0.98]), np.array([1, 0]), num_bins=5)
    assert d["count"] == [0, 0, 0, 0, 2]
    assert all(math.isnan(v) for v in d["confidence"][:4] + d["accuracy"][:4])
    assert d["accuracy"][4] == pytest.approx(0.5)
    assert d["confidence"][4] == pytest.approx(0.985)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: binary_classification_metrics(np.array([0.2, 1.2]), np.array([0, 1])), "p1"),
        (lambda: binary_classification_metrics(np.array([0.2, 0.3]), np.array([0, 2])), "y"),
        (lambda: binary_classification_metrics(np.array([0.2, 0.3]), np.array([0])), "y"),
        (lambda: binary_classification_metrics(np.ones((2, 2)) / 2, np.array([0, 1])), "p1"),
        (lambda: binary_classification_metrics(np.array([np.nan]), np.array([0])), "p1"),
        (lambda: binary_classification_metrics(np.array([0.2]), np.array([0.5])), "y"),
        (lambda: binary_classification_metrics(np.array([0.2]), np.array([0]), 0), "num_bins"),
        (lambda: multiclass_classification_metrics(np.array([[0.5, 0.6]]), np.array([0])), "probs"),
        (lambda: multiclass_classification_metrics(np.array([0.5, 0.5]), np.array([0])), "probs"),
        (lambda: multiclass_classification_metrics(np.eye(3), np.array([0, 1, 3])), "y"),
        (lambda: regression_metrics(np.zeros(3), np.ones(2), np.zeros(3)), "var"),
        (lambda: regression_metrics(np.zeros(3), np.zeros(3), np.zeros(3)), "var"),
        (lambda: regression_metrics(np.zeros(3), np.ones(3), np.zeros((3, 1))), "y"),
        (lambda: reliability_diagram(np.array([[0.2, 0.2]]), np.array([0])), "p1_or_probs"),
    ],
)
def test_bad_inputs_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _assert_png(path):
    data = path.read_bytes()
    assert len(data) > 1000
    assert data.startswith(PNG_MAGIC)


def test_plot_history(tmp_path):
    history = [
        {"round": 1, "test_accuracy": 0.6, "test_nll": 0.9, "log_marginal_likelihood": None},
        {"round": 2, "test_accuracy": 0.7, "test_nll": None, "test_ece": 0.1},
        {"round": 3, "test_accuracy": 0.8, "test_nll": 0.5, "test_ece": float("nan")},
    ]
    path = tmp_path / "history.png"
    plot_history(history, path, title="demo")
    _assert_png(path)
    empty = tmp_path / "empty.png"
    plot_history([{"round": 1, "test_rmse": None}], str(empty))
    _assert_png(empty)


def test_plot_reliability_and_curves(tmp_path):
    rng = np.random.default_rng(4)
    p1 = rng.uniform(size=300)
    y = (rng.uniform(size=300) < p1).astype(int)
    path = tmp_path / "rel.png"
    plot_reliability(reliability_diagram(p1, y, num_bins=5), path, title="reliability")
    _assert_png(path)
    curves = {"pvi": [(1, 0.5), (2, 0.3), (3, None)], "fedavg": [(1.0, 0.6), (2.0, 0.55)]}
    cpath = tmp_path / "curves.png"
    plot_curves(curves, cpath, "round", "KL", title="bench", hline=("exact", 0.2))
    _assert_png(cpath)
