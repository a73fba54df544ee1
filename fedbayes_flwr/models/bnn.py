"""Bayesian neural networks: a mean-field Gaussian over every weight and bias.

The parameter vector ``theta`` concatenates, layer by layer, the weight matrix (``fan_in x fan_out``,
row-major) then the bias. Hidden layers use ReLU. ``bnn-classifier`` has a softmax output over the
classes; ``bnn-regression`` a single output with Gaussian noise of known scale.

The local free energy is estimated by Monte Carlo with the reparameterisation trick on mini-batches
(:mod:`fedbayes_flwr.inference.vi`); predictions average the network over the posterior's fixed-seed
:meth:`~fedbayes_flwr.inference.posterior.Posterior.draws`, so every engine reports the same metrics.

References
----------
Blundell et al. (2015), "Weight Uncertainty in Neural Networks" (mean-field Gaussian BNN, MC ELBO);
Ashman et al. (2022), PVI, Section 5.3 (BNNs on MNIST with PVI).
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.evaluation.predictive import multiclass_classification_metrics, reliability_diagram
from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.gaussian import NaturalGaussian
from fedbayes_flwr.models.base import Model, Prediction
from fedbayes_flwr.models.nets_numpy import SoftmaxNetPotential

INIT_SEED = 12345
INIT_STD = 0.05  # Blundell et al. (2015) start at softplus(-3) ~ 0.05


def parse_hidden(text: str) -> tuple[int, ...]:
    """``"50,50"`` -> ``(50, 50)``; ``""`` -> no hidden layer."""
    try:
        sizes = tuple(int(s) for s in str(text).replace(" ", "").split(",") if s)
    except ValueError:
        raise ValueError(f"hidden-layers must be comma-separated integers, got {text!r}") from None
    if any(s < 1 for s in sizes):
        raise ValueError(f"hidden-layers must be positive, got {text!r}")
    return sizes


_ROWS = 2048
"""Test rows per chunk of :meth:`BNNClassifier.predictive`."""


class BNN(Model):
    """Base class of the two networks; ``num_outputs`` is fixed from the whole dataset."""

    mean_field_only = True

    def __init__(self, noise_scale: float = 1.0, hidden: tuple[int, ...] = (50,),
                 num_outputs: int = 1):
        super().__init__(noise_scale)
        self.hidden = tuple(hidden)
        self.num_outputs = int(num_outputs)

    @classmethod
    def build(cls, noise_scale: float = 1.0, hidden: tuple[int, ...] = (50,),
              num_outputs: int = 1) -> Model:
        return cls(noise_scale, tuple(hidden), num_outputs)

    def layer_sizes(self, num_features: int) -> list[int]:
        return [num_features, *self.hidden, self.num_outputs]

    def param_dim(self, num_features: int) -> int:
        sizes = self.layer_sizes(num_features)
        return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))

    def forward_tf(self, theta, x):
        """Network outputs, shape ``(S, B, num_outputs)``, for ``S`` parameter draws."""
        import tensorflow as tf

        sizes = self.layer_sizes(int(x.shape[-1]))
        s = tf.shape(theta)[0]
        h = x
        offset = 0
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            w = tf.reshape(theta[:, offset:offset + fan_in * fan_out], [s, fan_in, fan_out])
            offset += fan_in * fan_out
            b = theta[:, offset:offset + fan_out]
            offset += fan_out
            if i == 0:  # the inputs are shared by every draw: one (B, S fan_out) product, where
                # tiling x to (S, B, fan_in) cost S copies of the data (2.4 GB at S = 64, 6,000
                # rows of 784 pixels) and a batched product per draw
                h = tf.einsum("bi,sio->sbo", h, w) + b[:, None, :]
            else:
                h = tf.linalg.matmul(h, w) + b[:, None, :]
            if i < len(sizes) - 2:
                h = tf.nn.relu(h)
        return h

    def local_init(self, q: NaturalGaussian, num_features: int) -> NaturalGaussian:
        """Starting point of a local optimisation from the broadcast ``q``.

        A zero-mean network has no gradient through its ReLUs and a prior-wide q drowns the data
        term, so while ``q`` still has a zero mean (nothing learnt yet) the optimiser starts from a
        He-initialised mean drawn from a FIXED seed, the same on every client (so that all clients
        start in the same basin of the permutation-symmetric posterior), and standard deviations
        are capped at ``INIT_STD``. Once ``q`` has a non-zero mean the optimiser starts from ``q``
        itself: re-capping its standard deviations every round would hand back factors far too
        precise for the local step budget to undo (the free energy then falls round after round).
        Only the start changes; the objective is untouched.
        """
        mean, var = G.to_moments(q)
        if np.any(mean):  # something learnt: warm-start from q itself
            return q
        rng = np.random.default_rng(INIT_SEED)
        sizes = self.layer_sizes(num_features)
        parts = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            parts += [rng.normal(0.0, np.sqrt(2.0 / fan_in), fan_in * fan_out), np.zeros(fan_out)]
        return G.from_moments(np.concatenate(parts), np.minimum(var, INIT_STD**2))


class BNNClassifier(BNN):
    """Softmax classification network."""

    name = "bnn-classifier"
    target = "multiclass"
    synthetic = "softmax"
    task = "classification"

    def log_likelihood_rows_tf(self, theta, x, y):
        import tensorflow as tf
        import tensorflow_probability as tfp

        logits = self.forward_tf(theta, x)
        return tfp.distributions.Categorical(logits=logits).log_prob(tf.cast(y, tf.int32)[None, :])

    def gradient_potential(self, x, y):
        """The rows' softmax cross-entropy as a numpy potential for gradient-based samplers
        (decentralized HMC): :class:`fedbayes_flwr.models.nets_numpy.SoftmaxNetPotential`, with the
        parameter layout of :meth:`forward_tf` (``value``, ``grad`` and an exact ``hess_quad``
        over ``(K, d)`` batches)."""

        return SoftmaxNetPotential(x, y, self.layer_sizes(int(np.shape(x)[1])))

    def predictive(self, posterior, x) -> Prediction:
        """Class probabilities averaged over ``posterior.draws()``, shape ``(m, num_outputs)``."""
        import tensorflow as tf

        theta = tf.constant(posterior.draws())
        x = np.asarray(x)
        probs = [tf.reduce_mean(tf.nn.softmax(self.forward_tf(theta, tf.constant(x[i:i + _ROWS])),
                                              axis=-1), axis=0).numpy()
                 for i in range(0, max(x.shape[0], 1), _ROWS)]  # rows in chunks: peak memory
        # S x _ROWS x width instead of S x m x width (800 MB for 10,000 rows of a 100-unit net)
        return Prediction(prob=np.concatenate(probs, axis=0))

    def metrics(self, posterior, x, y):
        probs = self.predictive(posterior, x).prob
        probs = probs / probs.sum(axis=1, keepdims=True)
        return multiclass_classification_metrics(probs, y), reliability_diagram(probs, y)


class BNNRegression(BNN):
    """Regression network with Gaussian noise of scale ``noise-scale`` (one output)."""

    name = "bnn-regression"
    target = "real"
    synthetic = "sine"

    def __init__(self, noise_scale: float = 1.0, hidden: tuple[int, ...] = (50,),
                 num_outputs: int = 1):
        if int(num_outputs) != 1:
            raise ValueError(f"bnn-regression has one output, got num_outputs={num_outputs}")
        super().__init__(noise_scale, hidden, 1)

    @classmethod
    def build(cls, noise_scale: float = 1.0, hidden: tuple[int, ...] = (50,),
              num_outputs: int = 1) -> Model:
        return cls(noise_scale, tuple(hidden), 1)  # num_outputs counts classes: not used here

    def log_likelihood_rows_tf(self, theta, x, y):
        s2 = self.noise_scale**2
        mean = self.forward_tf(theta, x)[..., 0]
        return -0.5 * (y[None, :] - mean) ** 2 / s2 - 0.5 * np.log(2.0 * np.pi * s2)

    def predictive(self, posterior, x) -> Prediction:
        """Mean and variance (network spread plus noise) over ``posterior.draws()``."""
        import tensorflow as tf

        f = self.forward_tf(tf.constant(posterior.draws()), tf.constant(x))[..., 0].numpy()
        return Prediction(mean=f.mean(axis=0), var=f.var(axis=0) + self.noise_scale**2)
