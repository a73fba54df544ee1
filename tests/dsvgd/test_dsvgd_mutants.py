"""P-DSVGD's server merge against its closed-form target (issue 31, mutant M07: the merge weight
``S`` instead of ``S - 1``, which the old test, checking only finiteness and shape, let through).

With ``S`` accepted uploads the server's SVGD loop runs towards (Kassab & Simeone 2022, Section 6)

    q^(i)(theta) ∝ KDE(theta^(i-1))^(1 - S) prod_{k in S} KDE(theta_k^(i)),

so its score is ``sum_k grad log KDE_k - (S - 1) grad log KDE_old``. The score is computed here by
central finite differences of that log density, written with scipy's ``logsumexp`` over the
Gaussian kernels (no library KDE code), and compared with the target the merge hands to its
SVGD loop. Step ``1e-5``: truncation error ``O(1e-10)`` times the third derivative (about
``1 / h^3 = 8`` here) and round-off ``1e-16 * |log q| / 1e-5 ~ 1e-9``, so ``atol = 1e-5`` holds
with a wide margin, while the mutant is off by one whole KDE score (order 1).
"""

import numpy as np
import pytest
from scipy.special import logsumexp

from fedbayes_flwr.algorithms.dsvgd import bundle as dsvgd
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import build_experiment
from tests.helpers import mutants

BANDWIDTH = 0.5


def _setup(bandwidth):
    return build_experiment(parse_run_config({
        "algorithm": "p-dsvgd", "model": "gaussian-mean", "dataset": "synthetic",
        "synthetic-dim": 2, "synthetic-size": 40, "num-clients": 4, "partition": "iid", "seed": 0,
        "dsvgd.num-particles": 12, "dsvgd.kde-bandwidth": str(bandwidth), "dsvgd.kde-floor": 0.0,
        "dsvgd.kernel": "isotropic",
    })).setup


def _log_kde(x, centres, h):
    """``log (1/N) sum_n N(x | c_n, h^2 I)`` for each row of ``x``."""
    sq = np.sum((x[:, None, :] - centres[None]) ** 2, axis=2)
    d = x.shape[1]
    return logsumexp(-sq / (2 * h * h), axis=1) - np.log(len(centres)) - 0.5 * d * np.log(
        2 * np.pi * h * h)


def _fd_score(log_density, x, step=1e-5):
    out = np.zeros_like(x)
    for j in range(x.shape[1]):
        e = np.zeros(x.shape[1])
        e[j] = step
        out[:, j] = (log_density(x + e) - log_density(x - e)) / (2 * step)
    return out


def _merge_target(monkeypatch, old, uploads, setup):
    """The score function :func:`server_merge` gives its SVGD loop (the loop itself not run)."""
    captured = {}

    def capture(start, make_target, iterations, setup, *args):
        d = start.shape[1]  # the target in the isotropic kernel's coordinates: x itself
        captured["target"] = make_target(dsvgd.Whitening(np.zeros(d), np.eye(d)))
        return start

    monkeypatch.setattr(dsvgd, "_loop", capture)
    dsvgd.server_merge(old, uploads, setup)
    return captured["target"]


def _clouds(rng, s):
    old = rng.normal(size=(12, 2))
    uploads = [old + rng.normal(0.3 * (k + 1), 0.2, size=(12, 2)) for k in range(s)]
    points = np.concatenate([old[:4], uploads[-1][:4], rng.normal(size=(4, 2))])
    return old, uploads, points


def _check_merge(monkeypatch, s, seed=0):
    rng = np.random.default_rng(seed)
    old, uploads, points = _clouds(rng, s)
    target = _merge_target(monkeypatch, old, uploads, _setup(BANDWIDTH))

    def log_q(x):
        return (sum(_log_kde(x, u, BANDWIDTH) for u in uploads)
                - (s - 1) * _log_kde(x, old, BANDWIDTH))

    want = _fd_score(log_q, points)
    got = target(points)
    np.testing.assert_allclose(got, want, atol=1e-5,
                               err_msg=f"merge target is not KDE(old)^(1 - S) prod KDE_k (S = {s})")
    return got, want


@pytest.mark.parametrize("s", [2, 3])
def test_p_dsvgd_merge_target_is_the_closed_form(monkeypatch, s):
    _check_merge(monkeypatch, s)


def test_p_dsvgd_merge_mutant_fails(monkeypatch):
    mutants.apply(monkeypatch, "M07")
    with pytest.raises(AssertionError, match="merge target"):
        _check_merge(monkeypatch, 2)


def test_p_dsvgd_merge_weight_on_the_default_bandwidth(monkeypatch):
    """The default ``auto`` bandwidth (shrunk, paired KDEs): the same weight ``S - 1`` on the KDEs
    the merge built (captured from ``_ratio``), the score again by finite differences."""
    setup = build_experiment(parse_run_config({
        "algorithm": "p-dsvgd", "model": "gaussian-mean", "dataset": "synthetic",
        "synthetic-dim": 2, "synthetic-size": 40, "num-clients": 4, "partition": "iid",
        "seed": 0, "dsvgd.num-particles": 12, "dsvgd.kde-floor": 0.0,
        "dsvgd.kernel": "isotropic"})).setup
    built = {}
    original = dsvgd._ratio

    def recording(*args, **kwargs):
        built["kdes"] = original(*args, **kwargs)
        return built["kdes"]

    monkeypatch.setattr(dsvgd, "_ratio", recording)
    old, uploads, points = _clouds(np.random.default_rng(1), 3)
    target = _merge_target(monkeypatch, old, uploads, setup)
    num, (den,) = built["kdes"]
    assert len(num) == 3

    def log_q(x):
        return sum(_log_kde(x, k.centres, k.bandwidth) for k in num) - 2 * _log_kde(
            x, den.centres, den.bandwidth)

    np.testing.assert_allclose(target(points), _fd_score(log_q, points), atol=1e-4)
