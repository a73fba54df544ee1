"""fedbayes_flwr: federated Bayesian learning, the library half.

Pure maths, models, data and metrics. Imports TensorFlow / TFP but never Flower, except for
:mod:`fedbayes_flwr.codec`, the single module that converts library states to Flower records.
"""

import os
from importlib import metadata

# TensorFlow logs a screenful of CUDA/oneDNN notices at import; keep user output readable.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:  # the version is written once, in pyproject.toml
    __version__ = metadata.version("fedbayes-flwr")
except metadata.PackageNotFoundError:  # a source tree that was never installed (a FAB copy)
    __version__ = "0+unknown"
