"""Models written only as a TensorFlow log-likelihood (:class:`fedbayes_flwr.models.LikelihoodModel`)
against a NUTS reference, family by family (issue 24, done-when 1 and 2).

**Problems.** Three small synthetic regressions on the same design (240 training rows, 3 standard
normal features, intercept last: ``d = 4``; 3 clients; prior ``N(0, I)``): the built-in
``logistic-regression`` (the calibration row), the plugin ``user-probit`` and ``user-poisson``
(:mod:`tests.helpers.user_models`, loaded through ``model-modules``). Each gets a NUTS reference
(:func:`fedbayes_flwr.evaluation.reference.nuts_reference`: 8 chains x 600 draws after 300
warm-up, cached in pytest's cache folder, computed when the cache is empty, as on a clean clone).

**Tolerances** (the same for every row of a family; the built-in row shows the family meets them):

* PVI (Gaussian VI): every posterior mean within ``K_MEAN = 0.1`` NUTS sd, every sd within
  ``1 +- SD_BAND = 0.1`` of NUTS's. Why: by Bernstein-von Mises the posterior is Gaussian up to
  ``O(n^{-1/2})`` in whitened units; the Laplace approximation's mode is off the mean by that
  order (here ``1 / sqrt(240) = 0.065`` sd times the skewness constant), and full-covariance
  Gaussian VI is closer: ``O(1 / n)`` in the mean and relatively in the covariance (Katsevich &
  Rigollet 2023, Theorems 1-2). 0.1 covers the Laplace-order term, NUTS's own Monte-Carlo error
  (``sd / sqrt(ESS) <= 0.022`` sd at ``ESS >= 2,000``; sd: ``sqrt(1 / (2 ESS)) <= 0.016``) and
  the Monte-Carlo error of the user models' stochastic local solver (``sqrt(K / (m T / 2)) =
  0.035`` sd: ``K = 3`` clients, ``m = 10`` draws per step, ``T = 500`` Adam steps, the second
  half Polyak-averaged; see :func:`test_user_logistic_equals_the_builtin_on_a_label_skewed_split`).
* SGLD (256 independent chains from prior draws, full batch, a constant step ``eps`` over 600
  steps, per model: below ``2 / L`` for the likelihood's curvature ``L`` at 99 % of the prior
  draws, which sets the Poisson problem's smaller step, prior scale and design scale; see
  ``SGLD_STEP``): marginal W1 within ``w1_bound(ref, n=256, quantile=0.99, factor=1.5)`` plus
  a bias allowance. Chains are independent and only their final states are kept, so the
  effective size is the chain count exactly (no ESS estimate, no slowly mixing tails: the
  project's factor 3 shrinks to 1.5, which covers the reference's own Monte-Carlo error). The
  bias is unadjusted Langevin's (Roberts & Tweedie 1996): on a Gaussian with variances ``v``
  the chain's stationary variance is ``v / (1 - eps / (4 v))``, at most ``delta = eps L / 4``
  relatively with ``L = 1 / lambda_min(Cov_NUTS)``, which moves a marginal by W1 ``<= sd
  sqrt(2 / pi) delta / 2``; the start-up transient adds ``exp(-T eps / (2 v_max))`` prior sd.
  The allowance is their sum, computed per row (0.01-0.02 sd here).
* Decentralized HMC (Metropolis-adjusted, so unbiased up to the agents' consensus error, which
  the acceptance test keeps small): marginal W1 within ``w1_bound(ref, ESS, 0.99, factor=3)``
  (the project's bound, :mod:`tests.pdmc.test_pdmc_reference`), ESS of the run's own chains.
* DSVGD is not here: it does not meet an honest particle tolerance (3 Monte-Carlo standard
  errors of ``N`` i.i.d. particles: mean within ``3 / sqrt(N)`` sd, sd within ``1 +-
  3 / sqrt(2 N)``) on the built-in row either: at ``N = 50`` one pass of ``dsvgd`` is 0.48 sd
  off (limit 0.42) with sd ratio 0.71; two passes meet it on the built-in row but leave the
  probit 1.36 sd off with sd ratio 2.07 and the Poisson 1.48 sd off (issue 26;
  ``benchmarks/models/likelihood_reference.py``, ``results/models/likelihood_reference_dsvgd.json``).

Power: each sampler row's draws shifted by ``SHIFT`` NUTS sd fail the same bound, and PVI's
tolerance fails on a reference shifted by 0.25 sd or with sd scaled by 1.2.

References
----------
Hoffman & Gelman (2014), "The No-U-Turn Sampler", JMLR 15; Katsevich & Rigollet (2023), "On the
approximation accuracy of Gaussian variational inference", arXiv:2301.02168, Theorems 1-2;
Polyak & Juditsky (1992), "Acceleration of stochastic approximation by averaging", SIAM J.
Control Optim. 30(4) (the averaged iterate's covariance ``H^-1 S H^-1 / N``); Welling & Teh
(2011), "Bayesian learning via stochastic gradient Langevin dynamics", ICML (the step schedule);
Roberts & Tweedie (1996), "Exponential convergence of Langevin distributions and their discrete
approximations", Bernoulli 2(4) (ULA's bias); Ba et al. (2021), "Understanding the variance
collapse of SVGD in high dimensions", ICLR.
"""

from __future__ import annotations

import os
import time
import warnings

import numpy as np
import pytest

import fedbayes_flwr
from fedbayes_flwr.evaluation import reference as R
from fedbayes_flwr.evaluation import sample_quality as SQ
from fedbayes_flwr.models import make_model
from fedbayes_flwr.models import registry as REG

pytestmark = pytest.mark.slow
PLUGIN = "tests.helpers.user_models"
MODELS = ("logistic-regression", "user-probit", "user-poisson")
N_TRAIN, N_TEST, FEATURES, CLIENTS = 240, 60, 3, 3

K_MEAN, SD_BAND = 0.1, 0.1  # PVI (module docstring)
SGLD_CHAINS, SGLD_FACTOR, SGLD_STEPS = 256, 1.5, 600
DHMC_FACTOR = 3.0
SHIFT = 0.75  # the power check's shift, in NUTS sd (DHMC's Poisson row: ESS 217, bound 0.5 sd)

FAMILIES = {
    # step-rule 'largest' and no proximal term: the deterministic path's default; the MC path's
    # default ('safe', proximal 1) takes quarter steps against the noise of its free energy and
    # needs ~10 rounds here instead of 3
    "pvi": {"algorithm": "pvi", "num-rounds": 3, "pvi.step-rule": "largest", "pvi.proximal": 0,
            "pvi.local-steps": 500, "pvi.mc-samples": 10},
    "sgld": {"algorithm": "sgld", "num-rounds": 3, "sgld.num-chains": SGLD_CHAINS,
             "sgld.steps-per-round": SGLD_STEPS // 3, "sgld.batch-size": 0,
             "sgld.step-decay": 0.0},
    "dhmc": {"algorithm": "dhmc", "dhmc.num-chains": 8, "dhmc.warmup": 150,
             "dhmc.iterations": 300},
}
# SGLD's constant step: below 2 / L at 99 % of the prior draws (L = the largest eigenvalue of
# the negative log posterior's Hessian there: 63 logistic, 269 probit (its bound Z^T Z), 1,044
# Poisson with prior scale 0.5 and the design halved; 33,000 for the Poisson problem at scale 1,
# where any step that is stable from a prior draw is too small to converge in 600 steps)
SGLD_STEP = {"logistic-regression": 1e-3, "user-probit": 1e-3, "user-poisson": 5e-4}
PRIOR_SCALE = {"logistic-regression": 1.0, "user-probit": 1.0, "user-poisson": 0.5}


def make_data(model: str, seed: int = 0) -> dict:
    """The model's synthetic problem: ``x`` standard normal, ``eta = x . (1, -0.5, 0.8) + 0.2``."""
    from scipy.stats import norm

    rng = np.random.default_rng(seed)
    n = N_TRAIN + N_TEST
    x = rng.normal(size=(n, FEATURES))
    eta = x @ np.array([1.0, -0.5, 0.8]) + 0.2
    u = rng.random(n)
    if model == "user-poisson":  # the design halved (SGLD_STEP)
        x = 0.5 * x
        y = rng.poisson(np.exp(0.6 * eta)).astype(np.float64)
    elif model == "user-probit":
        y = (u < norm.cdf(eta)).astype(np.int64)
    else:
        y = (u < 1.0 / (1.0 + np.exp(-eta))).astype(np.int64)
    return {"x_train": x[:N_TRAIN], "y_train": y[:N_TRAIN], "x_test": x[N_TRAIN:],
            "y_test": y[N_TRAIN:]}


def nuts(model_name: str, data: dict, cache_dir):
    model = make_model(model_name)
    return R.nuts_reference(model, data["x_train"], data["y_train"],
                            model.prior(FEATURES, PRIOR_SCALE[model_name], True), num_chains=8, num_draws=600,
                            num_warmup=300, seed=0, cache_dir=cache_dir)


def fit(model_name: str, family: str, data, output_dir, **extra):
    """``fedbayes_flwr.fit`` of one (model, family) row: ``(run, wall seconds, CPU seconds of
    this process)``."""
    keys = {"model-modules": PLUGIN, "model": model_name, "data": data,
            "num-clients": CLIENTS, "partition": "iid", "seed": 3,
            "prior-scale": PRIOR_SCALE.get(model_name, 1.0),
            "output-dir": str(output_dir), **FAMILIES[family], **extra}
    if family == "sgld":
        keys.setdefault("sgld.step-scale", SGLD_STEP[model_name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sgld's preset fixes num-clients=1 (one notice)
        start, cpu = time.perf_counter(), time.process_time()
        run = fedbayes_flwr.fit(keys, progress=False)
    assert run.outcome == "completed", run.result.get("reason")
    return run, time.perf_counter() - start, time.process_time() - cpu


@pytest.fixture(scope="module")
def cache_dir(request):
    """pytest's cache folder (or the user's, under ``$FEDBAYES_CACHE``): empty on a clean
    clone, where the references are computed and stored."""
    if os.environ.get(R.CACHE_ENV) or getattr(request.config, "cache", None) is None:
        return None  # default_cache_dir()
    return str(request.config.cache.mkdir("fedbayes_reference"))


@pytest.fixture(scope="module")
def problems(cache_dir):
    """``{model: (data, reference)}``, references checked: R-hat < 1.01, no divergence, ESS
    >= 2,000 (the Monte-Carlo errors the tolerances allow for)."""
    REG.load_model_modules(PLUGIN)
    out = {}
    for name in MODELS:
        data = make_data(name)
        ref = nuts(name, data, cache_dir)
        assert np.max(ref.rhat) < 1.01 and ref.info["divergences"] == 0, (name, ref.rhat)
        assert np.min(ref.ess) >= 2000, (name, ref.ess)
        out[name] = (data, ref)
    return out


def sgld_bias(draws, eps: float, prior_scale: float) -> float:
    """SGLD's bias allowance in NUTS sd (module docstring): Langevin's variance inflation
    ``delta = eps L / 4`` as a W1 ``sqrt(2 / pi) delta / 2``, plus the transient
    ``exp(-T eps / (2 v_max))`` of a start ``prior_scale / sd`` sd away."""
    eig = np.linalg.eigvalsh(np.cov(draws, rowvar=False))
    delta = eps / (4 * eig[0])
    assert delta < 0.1, delta  # the first-order expansion holds
    transient = np.exp(-SGLD_STEPS * eps / (2 * eig[-1])) * prior_scale / np.min(draws.std(0))
    return float(np.sqrt(2 / np.pi) * delta / 2 + transient)


def _pvi_errors(posterior, draws):
    mean, sd = draws.mean(0), draws.std(0)
    return np.abs(posterior.mean() - mean) / sd, posterior.std() / sd


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("model", MODELS)
def test_family_matches_nuts(problems, tmp_path, model, family):
    data, ref = problems[model]
    draws = ref.draws
    sd = draws.std(0)
    run, seconds, _ = fit(model, family, data, tmp_path / "run")
    post = run.posterior
    if family == "pvi":
        z, ratio = _pvi_errors(post, draws)
        print(f"{model} pvi ({seconds:.1f} s): |mean error| / sd {z.round(3)}, sd ratio "
              f"{ratio.round(3)} (tolerance {K_MEAN}, 1 +- {SD_BAND})")
        assert np.all(z <= K_MEAN), z
        assert np.all(np.abs(ratio - 1) <= SD_BAND), ratio
        # power: the same tolerance fails on a reference shifted by 0.25 sd or 20 % wider
        assert np.all(np.abs(post.mean() - (draws.mean(0) + 0.25 * sd)) / sd > K_MEAN)
        assert np.all(np.abs(post.std() / (1.2 * sd) - 1) > SD_BAND)
        return
    chains = post.wrapped.chains
    rng = np.random.default_rng(12)
    if family == "sgld":
        assert chains.shape[-2:] == (SGLD_CHAINS, draws.shape[1])  # final states only
        n = SGLD_CHAINS
        bias = sgld_bias(draws, SGLD_STEP[model], PRIOR_SCALE[model])
        bound = SQ.w1_bound(draws, n, rng, repeats=200, quantile=0.99,
                            factor=SGLD_FACTOR) + bias * sd
    else:
        n = post.wrapped.ess()
        bound = SQ.w1_bound(draws, n, rng, repeats=200, quantile=0.99, factor=DHMC_FACTOR)
    w1 = SQ.marginal_w1(chains, draws)
    print(f"{model} {family} ({seconds:.1f} s): n {np.round(n)}, W1 / sd {(w1 / sd).round(3)}, "
          f"bound / sd {(bound / sd).round(3)}")
    assert np.all(w1 <= bound), (w1 / sd, bound / sd)
    assert np.all(SQ.marginal_w1(chains + SHIFT * sd, draws) > bound)  # power


# ------------------------------------------------------------------ the DSVGD row (issue 26)
PARTICLES = 50
SVGD = {"algorithm": "svgd", "num-rounds": 3, "dsvgd.num-particles": PARTICLES}


@pytest.mark.parametrize("model", MODELS)
def test_svgd_with_the_plugins_gradients_matches_nuts(problems, tmp_path, model):
    """DSVGD's own row is left to issue 26: with its defaults it misses an honest tolerance on
    the built-in logistic model too (0.48 sd off, sd ratio 0.71:
    ``benchmarks/results/models/likelihood_reference_dsvgd.json``). What the plugin path owes
    DSVGD is right gradients; so the same SVGD update, centralised (one client), must meet the
    particle tolerance on every model: each mean within ``3 / sqrt(N)`` NUTS sd (the particle
    mean's sampling error is ``1 / sqrt(N)`` sd for N exact draws) and each sd within
    ``1 +- 3 / sqrt(2 N)`` (the sd's relative sampling error ``1 / sqrt(2 N)``), N = 50."""
    data, ref = problems[model]
    FAMILIES["svgd"] = SVGD
    try:
        run, seconds, _ = fit(model, "svgd", data, tmp_path / "run")
    finally:
        FAMILIES.pop("svgd")
    z, ratio = _pvi_errors(run.posterior, ref.draws)
    print(f"{model} svgd ({seconds:.1f} s): |mean error| / sd {z.round(3)}, sd ratio "
          f"{ratio.round(3)}")
    assert np.all(z <= 3 / np.sqrt(PARTICLES)), z
    assert np.all(np.abs(ratio - 1) <= 3 / np.sqrt(2 * PARTICLES)), ratio


def test_user_logistic_svgd_is_the_builtins_svgd(tmp_path):
    """The generic path gives the particle update the same maths: a user's logistic
    LikelihoodModel and the built-in logistic regression move the same SVGD particles (the
    gradients agree to 1e-14; after 3 rounds the particles to 1e-10). DSVGD itself is not
    compared: one round of it turns the gradients' 1e-14 difference into 0.47 in the particles
    (its KDE-ratio terms; issue 26)."""
    data = make_data("logistic-regression")
    FAMILIES["svgd"] = SVGD
    try:
        user, _, _ = fit("user-logistic", "svgd", data, tmp_path / "user")
        builtin, _, _ = fit("logistic-regression", "svgd", data, tmp_path / "builtin")
    finally:
        FAMILIES.pop("svgd")
    np.testing.assert_allclose(user.posterior.wrapped.samples, builtin.posterior.wrapped.samples,
                               rtol=0, atol=1e-10)


# ------------------------------------------------------------------ done-when 2: user = built-in
SKEWED = {"partition": "dirichlet", "partition-alpha": 0.3}  # label skew (README, Partitions)
# PVI's Monte-Carlo error on the user path (its local solver: T Adam steps of m reparameterised
# draws, the second half averaged; Polyak & Juditsky 1992): the averaged iterate's mean error
# has covariance H^-1 S H^-1 / (T / 2), where the gradient noise of m draws is S ~ H / m at the
# optimum (grad log p(mu + L e) ~ -H L e, Cov(L e) = H^-1), so the local posterior's mean is off
# by ~1 / sqrt(m T / 2) of its sd per coordinate; a synchronous round adds the K clients'
# independent factor errors: SIGMA_MC = sqrt(2 K / (m T)) = 0.035 posterior sd. The seed sweep
# (benchmarks/models/likelihood_reference.py, 5 seeds of the user path on this split) measures
# 0.027-0.033 sd for the three weights, as derived, but 0.086 for the intercept, the coordinate
# the label skew leaves to clients that see (almost) one class (the linearisation behind S fails
# where the sigmoid saturates), and 0.008-0.054 for the sd ratio. The tolerance is 4 times the
# larger of the derived and the measured error, per coordinate.
PVI_T, PVI_M = FAMILIES["pvi"]["pvi.local-steps"], FAMILIES["pvi"]["pvi.mc-samples"]
SIGMA_MC = float(np.sqrt(2 * CLIENTS / (PVI_M * PVI_T)))
SIGMA_SWEEP_MEAN = np.array([0.029, 0.033, 0.027, 0.086])  # the sweep's sd over seeds
SIGMA_SWEEP_SD = np.array([0.008, 0.017, 0.015, 0.054])


@pytest.fixture(scope="module")
def skewed_logistic():
    REG.load_model_modules(PLUGIN)
    data = make_data("logistic-regression")
    return data


@pytest.mark.parametrize("family", ["pvi", "dhmc"])
def test_user_logistic_equals_the_builtin_on_a_label_skewed_split(skewed_logistic, tmp_path,
                                                                  family):
    """``user-logistic`` (a ``LikelihoodModel`` loaded through ``model-modules``) against the
    built-in ``logistic-regression`` on a Dirichlet(0.3) label split, same seed and settings.

    PVI: the built-in solves the local problem deterministically (Gauss-Hermite expectations,
    Newton), the user path by Monte-Carlo Adam: means within 4 sigma built-in sd and sds within
    1 +- 4 sigma, sigma the larger of ``SIGMA_MC`` and the seed sweep's (above). DHMC: two
    Metropolis-adjusted chains of the same posterior (potentials equal to 1e-10,
    tests/models/test_likelihood_model.py): means within 4 sqrt(sd^2 / ESS_a + sd^2 / ESS_b),
    the bound for independent runs (the same seed makes them closer still), and sds within
    ``1 +- 4 sqrt(1 / (2 ESS_a) + 1 / (2 ESS_b))``."""
    data = skewed_logistic
    runs, cpu = {}, {}
    for name in ("logistic-regression", "user-logistic"):
        run, wall, cpu[name] = fit(name, family, data, tmp_path / name, **SKEWED)
        runs[name] = run, wall
    (builtin, t_b), (user, t_u) = runs["logistic-regression"], runs["user-logistic"]
    labels = [np.bincount(np.asarray(data["y_train"])[idx], minlength=2).tolist()
              for idx in _client_rows(builtin)]
    assert min(min(c) / sum(c) for c in labels) < 0.25, labels  # the split is label-skewed
    mean_b, sd_b = builtin.posterior.mean(), builtin.posterior.std()
    z = np.abs(user.posterior.mean() - mean_b) / sd_b
    ratio = user.posterior.std() / sd_b
    if family == "pvi":
        tol_mean = 4 * np.maximum(SIGMA_MC, SIGMA_SWEEP_MEAN)
        tol_sd = 4 * np.maximum(SIGMA_MC, SIGMA_SWEEP_SD)
    else:
        ess_b, ess_u = builtin.posterior.wrapped.ess(), user.posterior.wrapped.ess()
        tol_mean = 4 * np.sqrt(1 / ess_b + 1 / ess_u)
        tol_sd = 4 * np.sqrt(1 / (2 * ess_b) + 1 / (2 * ess_u))
    print(f"{family} labels per client {labels}: |mean diff| / sd {z.round(4)} (tolerance "
          f"{np.round(tol_mean, 3)}), sd ratio {ratio.round(4)} (1 +- {np.round(tol_sd, 3)}); "
          f"seconds user {t_u:.1f} / built-in {t_b:.1f} = {t_u / t_b:.2f} (CPU "
          f"{cpu['user-logistic']:.1f} / {cpu['logistic-regression']:.1f})")
    assert np.all(z <= tol_mean), z
    assert np.all(np.abs(ratio - 1) <= tol_sd), ratio


def _client_rows(run):
    from fedbayes_flwr.runtime.config import parse_run_config
    from fedbayes_flwr.runtime.experiment import build_experiment

    exp = build_experiment(parse_run_config(run.result["run_config"]))
    return [exp.partitions[k] for k in range(CLIENTS)]


# ------------------------------------------------------------------ the Simulation Engine
@pytest.mark.flower
def test_plugin_probit_pvi_through_the_simulation_engine_equals_in_process(tmp_path):
    """``user-probit`` loaded through ``model-modules`` by the CLI, the ServerApp and every
    ClientApp (Ray actors), PVI for 2 rounds: the posterior equals the in-process run's to 1e-6
    and every history row (metrics, bytes) is the same."""
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    data = make_data("user-probit")
    path = tmp_path / "data.npz"
    np.savez(path, **data)
    settings = {**FAMILIES["pvi"], "num-rounds": 2, "pvi.local-steps": 100}
    local, _, _ = fit("user-probit", "pvi", str(path), tmp_path / "local", **settings)
    run_config = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                          for k, v in {"model-modules": PLUGIN, **settings}.items()
                          if k not in ("algorithm", "num-rounds"))
    out = tmp_path / "flower"
    proc = subprocess.run(
        [sys.executable, os.path.join(root, "run_simulation.py"), "--engine", "simulation",
         "--quiet", "--output-dir", str(out), "--num-cpus-per-client", "1",
         "--algorithm", "pvi", "--model", "user-probit", "--data", str(path),
         "--num-clients", str(CLIENTS), "--partition", "iid", "--num-rounds", "2",
         "--seed", "3", "--run-config", run_config],
        capture_output=True, text=True, timeout=400, cwd=root,
        env={**os.environ, "PYTHONPATH": root})
    assert proc.returncode == 0, proc.stderr[-4000:]
    flower = json.loads((out / "result.json").read_text())
    assert flower["engine"] == "simulation" and flower["outcome"] == "completed"
    assert flower["run_config"]["model"] == "user-probit"
    with np.load(out / "posterior.npz") as a, np.load(tmp_path / "local" / "posterior.npz") as b:
        for key in ("mean", "cov"):
            np.testing.assert_allclose(a[key], b[key], rtol=0, atol=1e-6)

    def comparable(history):
        return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in history]

    assert comparable(flower["history"]) == comparable(local.history)
