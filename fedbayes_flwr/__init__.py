"""fedbayes_flwr: federated Bayesian learning, the library half.

Pure maths, models, data and metrics. Imports TensorFlow / TFP but never Flower, except for
:mod:`fedbayes_flwr.codec`, the single module that converts library states to Flower records.
"""

import os

# TensorFlow logs a screenful of CUDA/oneDNN notices at import; keep user output readable.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
