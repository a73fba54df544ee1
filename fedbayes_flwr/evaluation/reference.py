"""Reference posteriors by long NUTS runs, cached on disk.

A sampler is checked against a reference sample of the same posterior: :func:`nuts_reference`
runs the No-U-Turn sampler (``tfp.mcmc.NoUTurnSampler`` with dual-averaging step-size adaptation)
on a model's log posterior ``log p(theta) + sum_n log p(y_n | theta, x_n)`` (the model's own
TensorFlow densities, :meth:`~fedbayes_flwr.models.Model.log_likelihood_tf` and
:meth:`~fedbayes_flwr.models.Model.log_prior_tf`), several chains, and caches the draws on disk
keyed on everything that determines them (model, data, prior, seed, settings), so tests and
benchmarks compute a reference once.

A run is compared with the reference by the marginal W1 and the tolerance calibrated from the
reference itself (:mod:`fedbayes_flwr.evaluation.sample_quality`: ``marginal_w1``,
``w1_noise_floor``, ``w1_bound``).

Cache
-----
Draws are stored as ``<cache_dir>/<model>-<key>.npz`` with ``key`` a SHA-256 of the model's
name, class and noise scale, the data (bytes of ``x`` and ``y`` as float64), the prior's natural
parameters, the seed and the sampler settings. ``cache_dir`` defaults to ``$FEDBAYES_CACHE/
reference`` when the environment variable ``FEDBAYES_CACHE`` is set, else
``~/.cache/fedbayes_flwr/reference``.

References
----------
Hoffman & Gelman (2014), "The No-U-Turn Sampler: Adaptively Setting Path Lengths in Hamiltonian
Monte Carlo", JMLR 15 (Algorithm 6: NUTS with dual averaging; Section 3.2: the step size);
Nesterov (2009), "Primal-dual subgradient methods for convex problems" (dual averaging);
Villani (2009), "Optimal Transport, Old and New", Chapter 6 (Wasserstein distances; in one
dimension ``W1(P, Q) = integral |F_P - F_Q|``); Geyer (1992), "Practical Markov chain Monte
Carlo", Statistical Science 7 (ESS, initial positive sequence); Gelman & Rubin (1992),
"Inference from iterative simulation using multiple sequences", Statistical Science 7 (R-hat);
the Fed-PDMC seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov
Processes", Section 6 (marginal W1 between Fed Zig-Zag runs and a long HMC reference).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from typing import NamedTuple

import numpy as np

from fedbayes_flwr.inference import gaussian as G
from fedbayes_flwr.inference.posterior import SamplePosterior

__all__ = ["CACHE_ENV", "Reference", "default_cache_dir", "nuts_reference", "reference_key"]

CACHE_ENV = "FEDBAYES_CACHE"
CACHE_VERSION = 1  # bump when the sampler's code changes what a key produces
INIT_RADIUS = 2.0  # chains start uniform in [-2, 2]^P (Stan's default initialisation)


class Reference(NamedTuple):
    """A NUTS reference sample.

    Attributes
    ----------
    chains : numpy.ndarray
        ``(C, S, P)`` draws after warm-up, chains kept apart.
    ess : numpy.ndarray
        ``(P,)`` effective sample size over all chains (``tfp.mcmc``, cross-chain).
    rhat : numpy.ndarray
        ``(P,)`` potential scale reduction.
    info : dict
        Settings and sampler diagnostics: ``step_size`` (adapted), ``accept_rate`` (mean
        acceptance probability while sampling), ``divergences``, ``mean_leapfrogs`` (per
        draw), ``seconds`` (of the run that made it), ``key``, the settings.
    path : str or None
        The cache file (None when not cached).
    from_cache : bool
        Whether the draws were read from the cache.
    """

    chains: np.ndarray
    ess: np.ndarray
    rhat: np.ndarray
    info: dict
    path: str | None
    from_cache: bool

    @property
    def draws(self) -> np.ndarray:
        """All draws pooled, ``(C * S, P)``."""
        return self.chains.reshape(-1, self.chains.shape[-1])


def default_cache_dir() -> str:
    """``$FEDBAYES_CACHE/reference`` if ``FEDBAYES_CACHE`` is set, else
    ``~/.cache/fedbayes_flwr/reference``."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return os.path.join(os.path.expanduser(root), "reference")
    return os.path.join(os.path.expanduser("~"), ".cache", "fedbayes_flwr", "reference")


def _digest(h, array) -> None:
    a = np.ascontiguousarray(np.asarray(array, dtype=np.float64))
    h.update(str(a.shape).encode())
    h.update(a.tobytes())


def reference_key(model, x, y, prior, settings: dict) -> str:
    """The cache key: a SHA-256 (hex) of the model (name, class, noise scale), the data, the
    prior's natural parameters and ``settings`` (JSON, sorted keys)."""
    h = hashlib.sha256()
    h.update(json.dumps({"version": CACHE_VERSION, "model": model.name,
                         "class": type(model).__name__,
                         "noise_scale": float(getattr(model, "noise_scale", 1.0))},
                        sort_keys=True).encode())
    _digest(h, x)
    if y is None:
        h.update(b"no-targets")
    else:
        _digest(h, y)
    if prior is None:
        h.update(b"model-prior")
    else:
        _digest(h, prior.eta1)
        _digest(h, prior.eta2)
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()


def _run_nuts(model, x, y, prior, num_params: int, settings: dict):
    """The NUTS run itself: ``(chains (C, S, P), info)``."""
    import tensorflow as tf
    import tensorflow_probability as tfp


    x_t = tf.constant(np.asarray(x, dtype=np.float64))
    y_t = (tf.zeros([x_t.shape[0]], tf.float64) if y is None
           else tf.constant(np.asarray(y, dtype=np.float64)))
    prior_dist = None if prior is None else G.to_tfp(prior)

    def target_log_prob(theta):  # (C, P) -> (C,)
        return model.log_likelihood_tf(theta, x_t, y_t) + model.log_prior_tf(theta, prior_dist)

    warmup, draws = settings["num_warmup"], settings["num_draws"]
    nuts = tfp.mcmc.NoUTurnSampler(target_log_prob, step_size=settings["init_step_size"],
                                   max_tree_depth=settings["max_tree_depth"])
    # adapt during the first 80% of the warm-up, then keep the final (averaged) step size
    kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
        nuts, num_adaptation_steps=int(0.8 * warmup),
        target_accept_prob=tf.constant(settings["target_accept"], tf.float64))
    rng = np.random.default_rng([settings["seed"], 0])
    low, high = -INIT_RADIUS, INIT_RADIUS
    if getattr(model, "support", None) is not None:  # a bounded prior: start inside it
        low, high = max(low, model.support[0]), min(high, model.support[1])
    init = rng.uniform(low, high, (settings["num_chains"], num_params))

    def trace(_, pkr):
        inner = pkr.inner_results
        return (tf.exp(tf.minimum(inner.log_accept_ratio, 0.0)), inner.has_divergence,
                inner.leapfrogs_taken, pkr.new_step_size)

    @tf.function(autograph=False, jit_compile=settings["jit_compile"])
    def sample(state, seed):
        return tfp.mcmc.sample_chain(num_results=draws, num_burnin_steps=warmup,
                                     current_state=state, kernel=kernel, trace_fn=trace,
                                     seed=seed)

    t0 = time.perf_counter()
    states, (accept, divergent, leapfrogs, step) = sample(
        tf.constant(init), tf.constant([settings["seed"], 1618], tf.int32))
    seconds = time.perf_counter() - t0
    chains = np.transpose(states.numpy(), (1, 0, 2))  # (S, C, P) -> (C, S, P)
    info = {"step_size": float(np.asarray(step)[-1]),
            "accept_rate": float(np.mean(accept)),
            "divergences": int(np.sum(divergent)),
            "mean_leapfrogs": float(np.mean(leapfrogs)),
            "seconds": round(seconds, 2)}
    return chains, info


def nuts_reference(model, x, y, prior, *, num_chains: int = 4, num_draws: int = 2000,
                   num_warmup: int = 1000, seed: int = 0, target_accept: float = 0.8,
                   max_tree_depth: int = 10, init_step_size: float = 0.1,
                   jit_compile: bool = True, cache_dir: str | None = None,
                   use_cache: bool = True) -> Reference:
    """A long NUTS sample of ``p(theta | x, y)`` for ``model``, cached on disk.

    Parameters
    ----------
    model : fedbayes_flwr.models.Model
        Its :meth:`~fedbayes_flwr.models.Model.log_likelihood_tf` and
        :meth:`~fedbayes_flwr.models.Model.log_prior_tf` define the target.
    x, y : numpy.ndarray
        The pooled data (``y`` None for models without targets).
    prior : fedbayes_flwr.inference.gaussian.NaturalGaussian or None
        The Gaussian prior (:meth:`~fedbayes_flwr.models.Model.prior`); None only for models
        with a prior of their own (``gaussian_prior = False``).
    num_chains, num_draws, num_warmup : int
        ``C`` chains, each with ``num_warmup`` adaptation steps (discarded) then ``num_draws``
        kept draws. Chains start uniform in ``[-2, 2]^P`` (intersected with the model's
        ``support`` when it has one).
    seed : int
        Seeds the initial points and TFP's stateless sampler: same key, same draws.
    target_accept : float
        Dual averaging's target mean acceptance probability (Hoffman & Gelman's ``delta``).
    max_tree_depth : int
        NUTS's cap: at most ``2^max_tree_depth`` leapfrog steps per draw.
    init_step_size : float
        Where the adaptation starts.
    jit_compile : bool
        Compile the whole run with XLA (slower start, much faster sampling on CPU).
    cache_dir : str, optional
        Where the draws are cached (default :func:`default_cache_dir`).
    use_cache : bool
        Read and write the cache (False: always sample, write nothing).

    Returns
    -------
    Reference
        Draws, ESS, R-hat and the sampler's diagnostics. A warning is issued when the
        maximum R-hat exceeds 1.01 or any transition diverged.

    References
    ----------
    Hoffman & Gelman (2014), "The No-U-Turn Sampler", JMLR 15, Algorithm 6; Gelman & Rubin
    (1992) (R-hat).
    """

    x = np.asarray(x, dtype=np.float64)
    num_params = int(model.param_dim(x.shape[1]))
    if prior is None and getattr(model, "gaussian_prior", True):
        raise ValueError(f"model {model.name!r} has a Gaussian prior: pass it")
    for name, value in (("num_chains", num_chains), ("num_draws", num_draws),
                        ("num_warmup", num_warmup), ("max_tree_depth", max_tree_depth)):
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    settings = {"num_chains": int(num_chains), "num_draws": int(num_draws),
                "num_warmup": int(num_warmup), "seed": int(seed),
                "target_accept": float(target_accept), "max_tree_depth": int(max_tree_depth),
                "init_step_size": float(init_step_size), "jit_compile": bool(jit_compile)}
    key = reference_key(model, x, y, prior, settings)
    path = None
    if use_cache:
        folder = cache_dir or default_cache_dir()
        path = os.path.join(folder, f"{model.name}-{key[:24]}.npz")
        if os.path.exists(path):
            with np.load(path) as saved:
                info = json.loads(str(saved["info"]))
                return Reference(saved["chains"], saved["ess"], saved["rhat"], info, path, True)
    chains, info = _run_nuts(model, x, y, prior, num_params, settings)
    post = SamplePosterior(chains)
    ess, rhat = post.ess(), post.rhat()
    info = {**info, **settings, "key": key, "model": model.name}
    if np.nanmax(rhat) > 1.01 or info["divergences"]:
        warnings.warn(f"NUTS reference: max R-hat {np.nanmax(rhat):.4f}, "
                      f"{info['divergences']} divergent transitions", RuntimeWarning,
                      stacklevel=2)
    if path is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"
        np.savez(tmp, chains=chains, ess=ess, rhat=rhat, info=json.dumps(info))
        os.replace(tmp, path)  # atomic: a concurrent reader sees all or nothing
    return Reference(chains, ess, rhat, info, path, False)


