"""The imports ``clients/client_app.py`` did on every message before issue 12, as a plugin.

Loaded with ``algorithm-modules=benchmarks.flower.eager_imports`` (it registers nothing):
``benchmarks/flower/deployment_split.py`` uses it, with the node-local partition cache off, to measure
the "before" column. Importing ``fedbayes_flwr.algorithms.pvi.bundle`` used to import
``fedbayes_flwr.inference.vi`` and with it TensorFlow (the per-message data loading and splitting of
"before" is the cache being off).
"""

from __future__ import annotations

import tensorflow  # noqa: F401
