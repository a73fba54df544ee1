"""The two logistic-regression cases of issue 26 (built here, held-out ones stand for them).

* ``skewed``: correlated features (equicorrelation ``rho = 0.8``, ``d = 10``), ``n = 2000`` rows,
  10 clients split by label (client ``k`` holds mostly one label: 90 % of its rows).
* ``small``: ``n = 300`` rows, ``d = 10`` (equicorrelation 0.5), 5 clients split by the
  quintiles of the first covariate.

Each is written as a ``.npz`` with ``client_id`` (partition ``natural``) under ``directory``.
"""

from __future__ import annotations

import os

import numpy as np

CASES = {
    "skewed": {"n": 2000, "d": 10, "rho": 0.8, "clients": 10, "split": "label", "seed": 1},
    "small": {"n": 300, "d": 10, "rho": 0.5, "clients": 5, "split": "covariate", "seed": 2},
}


def make_case(name: str, directory: str, d: int | None = None, rho: float | None = None) -> str:
    """Write case ``name`` (optionally with ``d`` features, equicorrelation ``rho``) to
    ``directory``; return the path."""
    spec = dict(CASES[name])
    if d is not None:
        spec["d"] = int(d)
    if rho is not None:
        spec["rho"] = float(rho)
    rng = np.random.default_rng(spec["seed"])
    n, dim, rho, k = spec["n"], spec["d"], spec["rho"], spec["clients"]
    cov = rho * np.ones((dim, dim)) + (1 - rho) * np.eye(dim)
    x = rng.multivariate_normal(np.zeros(dim), cov, size=n + 500)
    w = rng.normal(0, 1, dim) / np.sqrt(dim) * 2.0
    y = (rng.random(n + 500) < 1 / (1 + np.exp(-(x @ w + 0.3)))).astype(np.int64)
    x_test, y_test, x, y = x[n:], y[n:], x[:n], y[:n]
    if spec["split"] == "label":  # client k: 90 % of its rows with label k % 2
        ids = np.empty(n, np.int64)
        for label in (0, 1):
            rows = np.flatnonzero(y == label)
            rng.shuffle(rows)
            owners = np.arange(k)[np.arange(k) % 2 == label]
            # most rows of this label go to this label's clients, the rest to the others
            major = rng.random(rows.size) < 0.9
            ids[rows[major]] = rng.choice(owners, size=int(major.sum()))
            ids[rows[~major]] = rng.choice(np.setdiff1d(np.arange(k), owners),
                                           size=int((~major).sum()))
    else:
        ids = np.searchsorted(np.quantile(x[:, 0], np.linspace(0, 1, k + 1)[1:-1]), x[:, 0])
    suffix = "" if rho is None else f"_rho{spec['rho']:g}"
    path = os.path.join(directory, f"{name}_d{dim}{suffix}.npz")
    np.savez(path, x_train=x, y_train=y, x_test=x_test, y_test=y_test, client_id=ids)
    return path
