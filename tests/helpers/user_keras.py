"""A Keras network as a model plugin, written as a user would (``model-modules``).

Loaded by ``model-modules = "tests.helpers.user_keras"``; importing it registers

``user-keras-mlp``
    a Keras 3 ``Sequential`` MLP 64-32-10 (ReLU hidden layer, 10 logits) for ``digits`` (8x8
    images, 64 features), with a categorical likelihood: the architecture of the built-in
    ``bnn-classifier`` with ``hidden-layers = '32'``. Its initialisers are seeded (He normal,
    zero biases), so every process that imports this module builds the same weights, PVI's start.

References
----------
He, Zhang, Ren & Sun (2015), "Delving deep into rectifiers", Section 2.2 (the He-normal
initialisation, as the built-in BNN's start).
"""

from __future__ import annotations

import keras

from fedbayes_flwr.models import KerasModel, register_model

__all__ = ["KERAS_MLP", "mlp"]


def mlp(features: int = 64, hidden: int = 32, classes: int = 10, seed: int = 0,
        dtype: str = "float32") -> keras.Model:
    """The Keras MLP ``features-hidden-classes`` (ReLU), seeded He-normal kernels."""
    return keras.Sequential([
        keras.Input((features,), dtype=dtype),
        keras.layers.Dense(hidden, activation="relu", dtype=dtype,
                           kernel_initializer=keras.initializers.HeNormal(seed=seed)),
        keras.layers.Dense(classes, dtype=dtype,
                           kernel_initializer=keras.initializers.HeNormal(seed=seed + 1)),
    ], name="user_mlp")


KERAS_MLP = KerasModel(mlp(), likelihood="categorical", name="user-keras-mlp")
register_model("user-keras-mlp", KERAS_MLP)
