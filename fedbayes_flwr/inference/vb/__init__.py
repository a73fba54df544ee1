"""Mean-field variational Bayes for exponential-family models with label symmetry (AMPS).

Each model fits a client's local posterior by coordinate ascent (CAVI) and returns it as a
NamedTuple of :mod:`fedbayes_flwr.inference.expfam` blocks; AMPS
(:mod:`fedbayes_flwr.algorithms.amps.merge`) merges them.
No flwr and no TensorFlow here: the updates are closed-form numpy.
"""

from fedbayes_flwr.inference.vb.base import FitResult, VBModel
from fedbayes_flwr.inference.vb.gmm import GMM
from fedbayes_flwr.inference.vb.latent_feature import LatentFeature
from fedbayes_flwr.inference.vb.lda import LDA

__all__ = ["GMM", "LDA", "FitResult", "LatentFeature", "VBModel"]
