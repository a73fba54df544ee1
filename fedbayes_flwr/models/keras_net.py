"""A user's Keras 3 network as a model: :class:`KerasModel`.

``theta`` is the flat vector of the network's trainable weights, in the order of
``keras_model.trainable_variables``, each flattened row-major (for a ``Dense`` layer the kernel
``(fan_in, fan_out)`` then the bias: the layout of :class:`~.bnn.BNN`). The network is evaluated
statelessly with Keras 3's ``stateless_call``, the weights being slices of ``theta`` (no weight
copying per call), on a float64 clone of the network, in inference mode (``training=False``).
Everything else comes from :class:`~.likelihood.LikelihoodModel`: the per-row log-likelihood is
mapped over the rows of ``theta`` with ``tf.vectorized_map``, and autodiff gives the batched
log density and gradient, per-datum gradients and decentralized HMC's numpy potential.

Layers
------
Any layer that evaluates statelessly in inference mode: ``Dense``, ``EinsumDense``, activations,
``Flatten`` / ``Reshape``, ``Add`` / ``Concatenate`` in functional networks, ``LayerNormalization``.
Non-trainable variables are held constant at the values they have when the model is built:
``BatchNormalization`` uses its moving statistics as they are (they are never updated), frozen
layers (``trainable = False``) stay fixed (e.g. Bayesian last layers over a pretrained trunk).
``Dropout``, ``GaussianNoise`` and the like are identities (inference mode). Refused with a
one-line error: subclassed models (they cannot be cloned), stateful recurrent layers, several
inputs or outputs, a model that is not built. Weight regularisers are ignored (the prior
``N(0, prior_scale^2)`` on every weight takes their place).

References
----------
Chollet et al. (2015-), Keras 3 API, ``Layer.stateless_call`` and ``keras.models.clone_model``;
Blundell et al. (2015), "Weight Uncertainty in Neural Networks" (a Gaussian over every weight);
Ashman et al. (2022), "Partitioned Variational Inference", Section 5.3 (BNNs with PVI).
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.models.likelihood import LikelihoodModel

LIKELIHOODS = {"categorical": "multiclass", "bernoulli": "binary", "gaussian": "regression"}
"""``likelihood -> LikelihoodModel task``."""
INIT_STD = 0.05
"""PVI's starting standard deviations cap (as :data:`fedbayes_flwr.models.bnn.INIT_STD`)."""


def _as_float64(layer):
    """The clone of ``layer`` computing in float64 (``clone_model``'s ``clone_function``)."""
    config = layer.get_config()
    config["dtype"] = "float64"
    return layer.__class__.from_config(config)


class KerasModel(LikelihoodModel):
    """A Keras 3 network over the flat vector of its trainable weights.

    Parameters
    ----------
    keras_model : keras.Model
        A built ``keras.Sequential`` or functional model with one input (shape known, e.g. from
        ``keras.Input``; the data's ``f`` columns are reshaped to it) and one output of width
        ``C`` (``categorical``) or 1 (``bernoulli``, ``gaussian``). It is not modified: the
        model evaluates a float64 clone.
    likelihood : {"categorical", "bernoulli", "gaussian"}
        ``y ~ Categorical(logits = net(x))`` (``C`` classes), ``y ~ Bernoulli(logit = net(x))``
        or ``y ~ N(net(x), noise_scale^2)``.
    noise_scale : float, default 1.0
        The Gaussian likelihood's known noise scale (ignored otherwise).
    name : str, default "keras-model"
        The registry name (:func:`~fedbayes_flwr.models.registry.register_model` sets it).

    Raises
    ------
    ValueError
        One line naming what is wrong: not a Keras model, not built, subclassed, a stateful
        layer, several inputs or outputs, an unknown ``likelihood`` or an output width that does
        not fit it, a Keras backend other than TensorFlow.

    Notes
    -----
    The prior is ``N(0, prior_scale^2)`` on every weight (the base model's); PVI is mean-field
    only and starts, while nothing is learnt yet, from the network's own weights (seed its
    initialisers so every process builds the same ones) with standard deviations capped at
    :data:`INIT_STD`. :meth:`to_keras` puts a posterior's mean back into a copy of the network.
    PDMC refuses the model (no rate bounds).

    References
    ----------
    Keras 3 ``Layer.stateless_call``; Blundell et al. (2015), "Weight Uncertainty in Neural
    Networks", Section 3; Ashman et al. (2022), "Partitioned Variational Inference", Section 5.3.
    """

    name = "keras-model"
    mean_field_only = True

    def __init__(self, keras_model, *, likelihood: str, noise_scale: float = 1.0,
                 name: str = "keras-model"):
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"KerasModel: likelihood must be one of {', '.join(LIKELIHOODS)}, "
                             f"got {likelihood!r}")
        net, net64 = _checked_clone(keras_model)
        width = int(net64.outputs[0].shape[-1])
        if len(net64.outputs[0].shape) != 2:
            raise ValueError(f"KerasModel: the network's output must have shape (batch, width), "
                             f"got {tuple(net64.outputs[0].shape)}")
        if likelihood == "categorical" and width < 2:
            raise ValueError(f"KerasModel: a categorical likelihood needs one logit per class "
                             f"(width >= 2), the network's output has width {width}")
        if likelihood != "categorical" and width != 1:
            raise ValueError(f"KerasModel: a {likelihood} likelihood needs an output of width 1, "
                             f"the network's has width {width}")
        self.input_shape = tuple(int(s) for s in net64.inputs[0].shape[1:])
        self.num_inputs = int(np.prod(self.input_shape))
        self.output_width = width
        self.keras_likelihood = likelihood
        self.shapes = tuple(tuple(int(s) for s in v.shape) for v in net64.trainable_variables)
        self.sizes = tuple(int(np.prod(s)) for s in self.shapes)
        # the network's own weights: PVI's start (local_init), digested by stable_name
        self.initial_weights = np.concatenate(
            [np.asarray(v.numpy(), np.float64).reshape(-1) for v in net64.trainable_variables])
        self._net, self._net64 = net, net64
        super().__init__(self._log_likelihood, param_dim=self._checked_dim,
                         task=LIKELIHOODS[likelihood], predict=self._predict, name=name)
        if not noise_scale > 0:
            raise ValueError(f"noise-scale must be > 0, got {noise_scale}")
        self.noise_scale = float(noise_scale)

    # ---- the network as a function of theta --------------------------------------------------

    def _checked_dim(self, num_features: int) -> int:
        if num_features != self.num_inputs:
            raise ValueError(f"model {self.name!r}: the Keras network takes {self.num_inputs} "
                             f"input features (input shape {self.input_shape}), the data has "
                             f"{num_features}")
        return int(sum(self.sizes))

    def forward_tf(self, theta, x):
        """The network's ``(n, width)`` output at ONE weight vector ``theta`` ``(P,)``
        (``stateless_call`` in inference mode, the non-trainable variables as built)."""
        import tensorflow as tf

        weights = [tf.reshape(w, s) for w, s in zip(tf.split(theta, self.sizes), self.shapes,
                                                     strict=True)]
        constants = [v.value for v in self._net64.non_trainable_variables]
        x = tf.reshape(tf.cast(x, tf.float64), [-1, *self.input_shape])
        out, _ = self._net64.stateless_call(weights, constants, x, training=False)
        return out

    def _log_likelihood(self, theta, x, y):
        import tensorflow as tf

        out = self.forward_tf(theta, x)
        if self.keras_likelihood == "categorical":
            return -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(y, tf.int32),
                                                                   logits=out)
        if self.keras_likelihood == "bernoulli":
            return -tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=out[:, 0])
        s2 = self.noise_scale**2
        return -0.5 * (y - out[:, 0]) ** 2 / s2 - 0.5 * np.log(2.0 * np.pi * s2)

    def _predict(self, theta, x):
        import tensorflow as tf

        out = self.forward_tf(theta, x)
        if self.keras_likelihood == "categorical":
            return tf.nn.softmax(out, axis=-1)
        if self.keras_likelihood == "bernoulli":
            return tf.sigmoid(out[:, 0])
        return out[:, 0]

    def check_classes(self, classes: int) -> None:
        """Refuse (one-line ``ValueError``) data with more classes than the network has logits;
        the experiment calls it with the number of classes of its labels."""
        if self.keras_likelihood == "categorical" and int(classes) > self.output_width:
            raise ValueError(f"model {self.name!r}: the data has {int(classes)} classes, the "
                             f"Keras network has {self.output_width} output logits")
        if self.keras_likelihood == "bernoulli" and int(classes) > 2:
            raise ValueError(f"model {self.name!r}: a bernoulli likelihood takes labels 0/1, "
                             f"the data has {int(classes)} classes")

    def local_init(self, q: NaturalGaussian, num_features: int) -> NaturalGaussian:
        """PVI's start: ``q`` once it has a non-zero mean; before, the network's own weights
        with ``q``'s standard deviations capped at :data:`INIT_STD` (the role of
        :meth:`fedbayes_flwr.models.bnn.BNN.local_init`: a zero-mean ReLU net has no gradient)."""
        mean, var = G.to_moments(q)
        if np.any(mean):
            return q
        return G.from_moments(self.initial_weights.copy(), np.minimum(var, INIT_STD**2))

    # ---- serving ------------------------------------------------------------------------------

    def to_keras(self, posterior):
        """A copy of the user's network (its own dtype) holding ``posterior``'s mean weights.

        Parameters
        ----------
        posterior : object with ``mean()``, or array_like
            A posterior (``Run.posterior``, any family's posterior object) or a ``(P,)`` weight
            vector.

        Returns
        -------
        keras.Model
            A clone of the network given to :class:`KerasModel`, its non-trainable variables as
            built and its trainable ones set from the mean, ready for ``predict``.
        """
        import keras

        array = isinstance(posterior, np.ndarray | list | tuple)  # ndarray.mean is no posterior's
        mean = posterior if array or not callable(getattr(posterior, "mean", None)) \
            else posterior.mean()
        mean = np.asarray(mean, dtype=np.float64).reshape(-1)
        if mean.shape != (sum(self.sizes),):
            raise ValueError(f"model {self.name!r}: the posterior mean has {mean.size} "
                             f"parameters, the Keras network {sum(self.sizes)}")
        copy = keras.models.clone_model(self._net)
        copy.set_weights(self._net.get_weights())
        for var, part, shape in zip(copy.trainable_variables,
                                    np.split(mean, np.cumsum(self.sizes)[:-1]), self.shapes,
                                    strict=True):
            var.assign(part.reshape(shape).astype(var.dtype))
        return copy


def _layers(model):
    """Every layer of ``model``, nested models' layers included."""
    for layer in getattr(model, "layers", []):
        yield layer
        yield from _layers(layer)


def _checked_clone(keras_model):
    """``(keras_model, its float64 clone)`` after the checks of :class:`KerasModel`."""
    try:
        import keras
    except ImportError:  # pragma: no cover - keras ships with the project's TensorFlow
        raise ValueError("KerasModel needs Keras 3 (pip install keras)") from None
    if keras.backend.backend() != "tensorflow":
        raise ValueError(f"KerasModel needs Keras's TensorFlow backend, KERAS_BACKEND is "
                         f"{keras.backend.backend()!r}")
    if not isinstance(keras_model, keras.Model):
        raise ValueError(f"KerasModel takes a keras.Model (Sequential or functional), got "
                         f"{type(keras_model).__name__}")
    if not keras_model.built:
        raise ValueError(f"KerasModel: the Keras model {keras_model.name!r} is not built; give "
                         f"it an input shape (keras.Input((f,)) as its first layer, or "
                         f"model.build((None, f)))")
    if not (isinstance(keras_model, keras.Sequential)
            or type(keras_model).__name__ == "Functional"):
        raise ValueError(f"KerasModel takes a Sequential or functional Keras model, got the "
                         f"subclassed {type(keras_model).__name__}")
    inputs, outputs = list(keras_model.inputs or []), list(keras_model.outputs or [])
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(f"KerasModel: the network must have one input and one output, "
                         f"{keras_model.name!r} has {len(inputs)} and {len(outputs)}")
    shape = tuple(inputs[0].shape[1:])
    if not shape or any(s is None for s in shape):
        raise ValueError(f"KerasModel: the network's input shape must be known, got "
                         f"{tuple(inputs[0].shape)}")
    for layer in _layers(keras_model):
        if getattr(layer, "stateful", False):
            raise ValueError(f"KerasModel: layer {layer.name!r} ({type(layer).__name__}) is "
                             f"stateful; stateful layers are not supported")
    if not keras_model.trainable_variables:
        raise ValueError(f"KerasModel: the Keras model {keras_model.name!r} has no trainable "
                         f"weights")
    net64 = keras.models.clone_model(keras_model, input_tensors=keras.Input(shape, dtype="float64"),
                                     clone_function=_as_float64, recursive=True)
    net64.set_weights([np.asarray(w).astype(v.dtype) for w, v in
                       zip(keras_model.get_weights(), net64.weights, strict=True)])
    return keras_model, net64
