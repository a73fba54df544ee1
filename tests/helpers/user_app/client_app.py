"""A user's ClientApp: each node reads its own ``partition-<id>.npz`` (arrays ``x``, ``y``) from
a data directory; nothing from the project's datasets."""

from __future__ import annotations

import functools
import os

import numpy as np

from clients import make_client_app

from .model import MODEL


def load_partition(data_dir: str, context) -> tuple[np.ndarray, np.ndarray]:
    """This node's rows: ``<data_dir>/partition-<partition-id>.npz``."""
    pid = int(context.node_config["partition-id"])
    with np.load(os.path.join(data_dir, f"partition-{pid}.npz")) as f:
        return f["x"], f["y"]


def build(settings: dict, data_dir: str):
    """The ClientApp for ``settings`` (the same run-config keys as the server's)."""
    return make_client_app(settings, model=MODEL,
                           load_data=functools.partial(load_partition, data_dir))
