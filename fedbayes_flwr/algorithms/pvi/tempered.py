"""A model with its likelihood raised to a power ``a``: ``p(y | theta)^a``.

PVI's proximal local solve (:func:`fedbayes_flwr.algorithms.pvi.client.undamped_change` with
``pvi.proximal``) maximises ``a * E_q[log p(y_k | theta)] - KL(q || r)``; every local optimiser
(the closed form of conjugate models, Adam, the fixed-point and deterministic solvers) reads the
likelihood through the methods scaled here, so wrapping the model is all they need.
"""

from __future__ import annotations

from functools import lru_cache

from fedbayes_flwr.inference import gaussian as G

# what the local optimisers read of the likelihood; everything else is the wrapped model's
_SCALED = ("log_likelihood_tf", "log_likelihood_rows_tf", "expected_log_likelihood_tf")


class Tempered:
    """``model`` with every log-likelihood multiplied by ``power`` (its closed-form factor's
    natural parameters too); all other attributes are ``model``'s.

    Parameters
    ----------
    model : fedbayes_flwr.models.base.Model
        The model to temper.
    power : float
        ``a > 0``.

    References
    ----------
    Ashman et al. (2022), PVI, eq. (2) (the local free energy whose likelihood term is scaled);
    Khan & Rue (2023), "The Bayesian Learning Rule", Section 1.2 (a KL-proximal step is a
    tempered update against a geometric mixture of prior and current posterior).
    """

    def __init__(self, model, power: float):
        if not power > 0:
            raise ValueError(f"likelihood power must be > 0, got {power}")
        self.model, self.power = model, float(power)

    def __getattr__(self, name):
        value = getattr(self.model, name)
        if name in _SCALED:
            power = self.power

            def scaled(*args, **kwargs):
                return power * value(*args, **kwargs)

            return scaled
        return value

    def likelihood_factor(self, x, y):
        factor = self.model.likelihood_factor(x, y)
        return None if factor is None else G.scale(factor, self.power)


@lru_cache(maxsize=64)
def tempered(model, power: float):
    """The (cached) :class:`Tempered` ``model``; ``power = 1``: ``model`` itself. The cache keeps
    one object per ``(model, power)``, so compiled TensorFlow loops that take the model as an
    argument are traced once per power, not once per call."""
    return model if power == 1.0 else Tempered(model, power)
