"""Mean-field variational Bayes for exponential-family models with label symmetry (AMPS).

Each model fits a client's local posterior by coordinate ascent (CAVI) and returns it as a
NamedTuple of :mod:`fedbayes_flwr.expfam` blocks; AMPS (:mod:`fedbayes_flwr.amps`) merges them.
No flwr and no TensorFlow here: the updates are closed-form numpy.
"""

from .base import FitResult, VBModel
from .gmm import GMM
from .latent_feature import LatentFeature
from .lda import LDA

__all__ = ["GMM", "LDA", "FitResult", "LatentFeature", "VBModel"]
