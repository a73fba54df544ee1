"""A user's ServerApp: the data's dimension and a test set from ``<data_dir>/test.npz``."""

from __future__ import annotations

import json
import os

import numpy as np

from strategies import make_server_app

from .model import MODEL, NUM_FEATURES


def build(settings: dict, data_dir: str, output_dir: str):
    """The ServerApp for ``settings``; results in ``output_dir``, and every history row also
    appended to ``<output_dir>/rows.jsonl`` by the ``on_record`` callback."""

    def test_data(context):
        with np.load(os.path.join(data_dir, "test.npz")) as f:
            return f["x"], f["y"]

    def on_record(row: dict) -> None:
        with open(os.path.join(output_dir, "rows.jsonl"), "a") as f:
            f.write(json.dumps(row, default=float) + "\n")

    return make_server_app(settings, "simulation", False, model=MODEL,
                           num_features=NUM_FEATURES, test_data=test_data,
                           output_dir=output_dir, on_record=on_record)
