"""The 1-D Gaussian-mixture toy of DSVGD: each data row is one agent's local likelihood.

``mixture-1d``
    ``theta`` is a scalar (``param_dim = 1`` whatever the number of data columns). A data row of
    ``3 J`` numbers ``(w_1, m_1, v_1, ..., w_J, m_J, v_J)`` is the likelihood factor
    ``sum_j w_j N(theta | m_j, v_j)`` (``v_j`` a variance; a component with ``w_j = 0``
    contributes nothing, its mean and variance are ignored; every row needs one ``w_j > 0``).
    The prior is uniform on ``[-6, 6]``.

The rows are likelihood specifications, not observations: the dataset ``mixture-1d`` holds the
paper's two agents, and metrics compare the posterior with the exact global posterior ``q_opt``
by quadrature (:func:`fedbayes_flwr.evaluation.metrics.mixture_1d_kl`).

References
----------
Kassab & Simeone (2022), "Federated Generalized Bayesian Learning via Distributed Stein Variational
Gradient Descent", Section 7.1 and Figs. 2-3: ``p_1(theta) = p_0(theta) N(theta | 1, 4)``,
``p_2(theta) = p_0(theta) (N(theta | -3, 1) + N(theta | 3, 2))``, ``p_0 = U(-6, 6)``.
"""

from __future__ import annotations

import numpy as np

from fedbayes_flwr.evaluation.metrics import MIXTURE_1D_SUPPORT, mixture_1d_grid, mixture_1d_kl
from fedbayes_flwr.models.base import Model, Prediction


class MixtureLikelihood1D(Model):
    """Scalar ``theta`` under a uniform prior on ``[-6, 6]`` and Gaussian-mixture likelihood rows.

    ``log_likelihood_rows_tf`` is ``log sum_j w_j N(theta | m_j, v_j)`` per row, computed with
    log-sum-exp (zero-weight components enter as ``-inf`` terms, so rows that have them stay
    finite and so does the gradient).

    Prior: the model's own prior (``gaussian_prior = False``) is ``U(-6, 6)``:
    :meth:`log_prior_tf` is ``-log 12`` inside ``[-6, 6]`` (end points included) and ``-inf``
    outside, with zero gradient everywhere (DSVGD projects particles back into
    :attr:`support`, so only the inside matters; ``-inf`` makes an outside proposal of an
    accept/reject sampler impossible rather than merely unlikely). :meth:`prior` returns the
    Gaussian stand-in ``N(0, prior_scale^2)`` of the base class, used only by Gaussian-family
    algorithms (PVI, global VI); the benchmark sets ``prior-scale = sqrt(12)``, so that the
    stand-in has the uniform's variance ``12^2 / 12 = 12``.

    References
    ----------
    Kassab & Simeone (2022), Section 7.1 (the toy) and Fig. 3 (``KL(q || q_opt)``).
    """

    name = "mixture-1d"
    target = "none"
    synthetic = "mixture-1d"
    has_targets = False
    gaussian_prior = False
    support = MIXTURE_1D_SUPPORT

    def param_dim(self, num_features: int) -> int:
        return 1

    def log_likelihood_rows_tf(self, theta, x, y=None):
        """``log sum_j w_ij N(theta_s | m_ij, v_ij)``, shape ``(S, n)``, for rows ``x`` ``(n, 3 J)``."""
        import tensorflow as tf

        w, m, v = x[:, 0::3], x[:, 1::3], x[:, 2::3]  # (n, J)
        positive = w > 0
        v = tf.where(positive, v, tf.ones_like(v))  # a zero-weight component's v is ignored
        log_w = tf.where(positive, tf.math.log(tf.where(positive, w, tf.ones_like(w))),
                         tf.constant(-np.inf, x.dtype))
        t = theta[:, :1, None]  # (S, 1, 1)
        comp = (log_w - 0.5 * tf.math.log(2.0 * np.pi * v)
                - 0.5 * (t - m[None]) ** 2 / v[None])  # (S, n, J)
        return tf.reduce_logsumexp(comp, axis=2)

    def log_prior_tf(self, theta, prior=None):
        """Uniform ``U(low, high)`` on every coordinate: ``-P log(high - low)`` inside, ``-inf``
        outside (the Gaussian ``prior`` argument is ignored); zero gradient."""
        import tensorflow as tf

        low, high = self.support
        theta = tf.convert_to_tensor(theta, tf.float64)
        inside = tf.reduce_all((theta >= low) & (theta <= high), axis=1)
        p = tf.cast(tf.shape(theta)[1], tf.float64)
        return tf.where(inside, -p * np.log(high - low), tf.constant(-np.inf, tf.float64))

    def predictive(self, posterior, x) -> Prediction:
        raise NotImplementedError(
            "mixture-1d has no predictive: its data rows are likelihood specifications, not "
            "observations; use metrics() (KL to the exact posterior)")

    def log_q_on_grid(self, posterior, grid: np.ndarray) -> np.ndarray:
        """Log density of the posterior's 1-D density estimate ``q`` at ``grid`` (unnormalised on
        the truncated range: :func:`~fedbayes_flwr.evaluation.metrics.mixture_1d_kl` renormalises it).

        A Gaussian posterior (``posterior.gaussian``) is its own density ``N(mean, std^2)``; any
        other (particles, samples) the Gaussian KDE of ``posterior.draws()`` (all stored draws of
        a :class:`~fedbayes_flwr.inference.posterior.SamplePosterior`) with bandwidth
        ``kde_bandwidth(particles, "auto")`` (Scott's rule).
        """
        from fedbayes_flwr.algorithms.dsvgd.svgd import kde_bandwidth, kde_log_density

        grid = np.asarray(grid, dtype=np.float64).reshape(-1)
        if posterior.gaussian:
            mean, std = float(posterior.mean()[0]), float(posterior.std()[0])
            return -0.5 * ((grid - mean) / std) ** 2 - np.log(std)
        particles = np.asarray(posterior.draws(), dtype=np.float64)[:, :1]
        bandwidth = kde_bandwidth(particles, "auto")
        return kde_log_density(grid[:, None], particles, bandwidth)

    def metrics(self, posterior, x, y=None) -> tuple[dict[str, float], None]:
        """``{"kl": KL(q || q_opt), "mean": E_q[theta]}`` and no reliability diagram.

        ``q_opt ∝ U(-6, 6) prod_i (row i's likelihood)`` over the rows ``x``; ``q`` is
        :meth:`log_q_on_grid` truncated to ``[-6, 6]`` and renormalised there. Both are
        evaluated by the trapezoid rule on :func:`~fedbayes_flwr.evaluation.metrics.mixture_1d_grid`
        (4001 points); ``mean`` is the mean of that truncated ``q``.

        References
        ----------
        Kassab & Simeone (2022), Section 7.1, Fig. 3.
        """
        grid = mixture_1d_grid(self.support)
        log_q = self.log_q_on_grid(posterior, grid)
        kl = mixture_1d_kl(log_q, x, grid)
        q = np.exp(log_q - np.max(log_q))
        mean = float(np.trapezoid(grid * q, grid) / np.trapezoid(q, grid))
        return {"kl": kl, "mean": mean}, None
