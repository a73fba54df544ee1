"""Decentralized Metropolis-adjusted HMC on logistic regression at equal gradient budgets: marginal
W1 to a NUTS reference, test accuracy and NLL of the posterior predictive against iterations, for
decentralized HMC (the agents agree), decentralized MALA (the paper's), decentralized ULA and
centralized HMC.

Data: ``breast-cancer`` (``load_dataset("breast-cancer", "binary")``: 455 training and 114 test
rows, 30 standardised features) and a synthetic set (``load_dataset("synthetic", "binary",
synthetic="logistic", seed=--data-seed (0), synthetic_size=1250, synthetic_dim=5,
test_fraction=0.2)``: 1,000 training and 250 test rows, the Fed-PDMC benchmark's set). The model
is :class:`fedbayes_flwr.models.linear.LogisticRegression` (intercept appended LAST: ``d = 31``
and ``d = 6``), prior ``N(0, I)``. The training rows go to 5 agents on a ring (Metropolis
weights), split two ways: ``iid`` (a seeded permutation, then ``numpy.array_split``) and
``label-sorted`` (rows sorted by label, then split: most agents see one class only, the paper's
heterogeneous setting). Agent ``i`` holds its rows' negative log-likelihood plus a fifth of the
prior's (:class:`fedbayes_flwr.algorithms.dhmc.agents.LocalPotential`).

**Reference.** NUTS (:func:`fedbayes_flwr.evaluation.reference.nuts_reference`, ``tfp.mcmc``, target
acceptance 0.8) on the pooled posterior with the model's own TensorFlow density, 8 chains x
5,000 draws after 2,000 warm-up, cached on disk (the synthetic set's is the Fed-PDMC
benchmark's).

**Methods** (each 16 chains from the same starts: the Laplace approximation at the pooled MAP,
overdispersed by 2 in sd, so the comparison is about sampling, not about finding the mode;
``--warmup`` 500 iterations discarded, then ``--iterations`` 2,500 kept: the same number of
gradient evaluations per agent, and one iteration of all agents is one full-data gradient, as
one centralized iteration is; the Taylor energy's Hessian-vector product and centralized HMC's
potential value are not counted):

* ``dhmc``: :func:`fedbayes_flwr.algorithms.dhmc.loop.simulate`, leapfrog, Taylor energy, ``flood``
  decision (all agents move only if all their own tests accept), the step adapted by dual
  averaging in the warm-up (from 0.05, mean acceptance probability 0.6, the library's default
  warm-up with the test on).
* ``dhmc-exact``: the same with the exact local energy differences instead of the Taylor term
  (``energy="exact"``): one more pass over the local data per iteration, as the Taylor term's
  Hessian-vector product is (:func:`~fedbayes_flwr.algorithms.dhmc.loop.simulate` counts it as a second
  gradient evaluation and the Taylor term as none; here both get the same iterations).
* ``dhmc-local``: ``dhmc`` with each agent deciding alone (``local``).
* ``dmala``: the paper's decentralized MALA: symplectic-Euler step, Taylor energy, ``local``
  decision, the same adaptation.
* ``dula``: :func:`fedbayes_flwr.algorithms.dhmc.baselines.decentralized_ula`, independent noise scaled so
  the network average is ULA (DE-SGLD), the reference code's decay ``h_t = h_0 (230 / (230 +
  t))^0.55`` from ``h_0 = epsilon^2 / 2`` with ``epsilon`` the step centralized HMC adapted for
  the same problem (MALA's step in Langevin units; the same for every ``s`` and noise);
  ``dula-shared``: one shared noise draw;
  ``dula-ref``: the seed paper's code's noise (unscaled per agent: samples about ``exp(-m U)``).
* ``chmc``: :func:`fedbayes_flwr.algorithms.dhmc.baselines.centralized_hmc` on the pooled data, one
  leapfrog step, the same adaptation.

The Metropolis-adjusted decentralized methods run with ``s`` = 1, 5 and 10 mixing rounds per
exchange (an iteration has two exchanges), ULA with 1 and 5 (one exchange): ULA mixes and then
adds a fresh local step ``h m grad U_i``, so the agents' spread does not fall below about
``h m |grad U_i - mean_j grad U_j|`` however many rounds (no gradient tracking).

**Per run:** marginal W1 (:func:`~.sample_quality.marginal_w1`) to the reference over the
reference sd, mean over coordinates, for each agent's own samples (all chains and kept
iterations; mean and worst over agents) and for the agents' average iterate; the W1 that a
perfect sampler with the run's ESS would show (:func:`~.sample_quality.w1_noise_floor`,
median of 50 repeats, same scale); ESS of the agents' average per chain (across chains, never
agents); mean error and variance ratio against the reference; acceptance, local disagreement,
consensus error (relative to the reference variance), the step; test accuracy and NLL of the
posterior predictive (mean of the sigmoid over an agent's draws, every 5th iteration), mean over
agents, and of NUTS. Curves: the same (agent 1's W1, mean over agents' predictive) on the
cumulative draws at 8 checkpoints.

Run: ``.venv/bin/python benchmarks/dhmc/dhmc_logistic.py`` (a few minutes on one core, plus about a
minute for the breast-cancer reference the first time; ``--quick``: the synthetic set only,
fewer iterations, a smaller reference, results under the work dir; ``--replot``: redraw the
plots from the JSON). Writes
``benchmarks/results/dhmc/dhmc_logistic.json`` and ``dhmc_logistic_<data>_<split>.png`` (W1, NLL and
accuracy against gradient evaluations).

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Section 4 (DecentralizedMALA against
CentralizedHMC and DecentralizedULA); Parayil, Bai, George & Gurram (2020) and Gurbuzbalaban,
Gao, Hu & Zhu (2021) (decentralized Langevin); Hoffman & Gelman (2014), "The No-U-Turn Sampler".
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common
import numpy as np

NAME = "dhmc_logistic"
AGENTS, CHAINS = 5, 16
DATASETS = ("synthetic", "breast-cancer")
SPLITS = ("iid", "label-sorted")
ROUNDS = (1, 5, 10)  # Metropolis-adjusted methods
ULA_ROUNDS = (1, 5)  # ULA's bias does not fall beyond a few rounds (module docstring)
MH = ("dhmc", "dhmc-exact", "dhmc-local", "dmala")
ULA = ("dula", "dula-shared", "dula-ref")
DECENTRALIZED = (*MH, *ULA)
METHODS = (*DECENTRALIZED, "chmc")
STEP0 = 0.05
TARGET_ACCEPT = 0.6
THIN = 5  # predictive: every 5th kept iteration
CHECKPOINTS = 8
FLOOR_REPEATS = 50


def load(name: str, seed: int):
    from fedbayes_flwr.data import load_dataset

    if name == "breast-cancer":
        data = load_dataset("breast-cancer", "binary")
    else:
        data = load_dataset("synthetic", "binary", synthetic="logistic", seed=seed,
                            synthetic_size=1250, synthetic_dim=5, test_fraction=0.2)
    return data.x_train, data.y_train, data.x_test, data.y_test


def design(x):
    return np.concatenate([x, np.ones((len(x), 1))], axis=1)


def split(y, kind: str, seed: int) -> list[np.ndarray]:
    n = len(y)
    if kind == "iid":
        order = np.random.default_rng([seed, 5]).permutation(n)
    else:
        order = np.argsort(y, kind="stable")
    return [order[part] for part in np.array_split(np.arange(n), AGENTS)]


def laplace(x, y, prior_var: float = 1.0):
    """The pooled MAP (Newton) and the Laplace covariance."""
    xi = design(x)
    w = np.zeros(xi.shape[1])
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(xi @ w)))
        g = xi.T @ (p - y) + w / prior_var
        h = (xi * (p * (1 - p))[:, None]).T @ xi + np.eye(len(w)) / prior_var
        step = np.linalg.solve(h, g)
        w -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return w, np.linalg.inv(h)


def predictive_curves(samples, xt, yt, checkpoints) -> dict:
    """Samples ``(m, K, T, d)`` (or ``(K, T, d)``): accuracy and NLL of each agent's cumulative
    posterior predictive at ``checkpoints`` (kept iterations), mean over agents; the last point
    also per agent."""
    s = samples if samples.ndim == 4 else samples[None]
    thinned = s[:, :, THIN - 1::THIN]  # (m, K, T', d)
    probs = 1.0 / (1.0 + np.exp(-(thinned @ design(xt).T)))  # (m, K, T', n)
    csum = np.cumsum(probs.sum(axis=1), axis=1)  # (m, T', n)
    acc, nll = [], []
    for t in checkpoints:
        j = max(t // THIN, 1)
        p = np.clip(csum[:, j - 1] / (j * s.shape[1]), 1e-12, 1 - 1e-12)  # (m, n)
        ll = yt * np.log(p) + (1 - yt) * np.log1p(-p)
        acc.append(np.mean((p > 0.5) == yt, axis=1))
        nll.append(-np.mean(ll, axis=1))
    return {"accuracy": [float(a.mean()) for a in acc], "nll": [float(v.mean()) for v in nll],
            "accuracy_per_agent": acc[-1].tolist(), "nll_per_agent": nll[-1].tolist()}


def nuts_predictive(draws, xt, yt) -> dict:
    p = np.clip(np.mean(1.0 / (1.0 + np.exp(-(draws[::4] @ design(xt).T))), axis=0),
                1e-12, 1 - 1e-12)
    return {"accuracy": float(np.mean((p > 0.5) == yt)),
            "nll": float(-np.mean(yt * np.log(p) + (1 - yt) * np.log1p(-p)))}


def w1(samples, ref_sorted) -> np.ndarray:
    """Per-coordinate W1 between ``samples (..., d)`` and the reference, the same integral as
    :func:`~.sample_quality.marginal_w1` (``integral |F_a - F_b|`` on the merged sorted
    points) with the reference sorted once, ``ref_sorted (d, R)`` (checked equal in ``main``)."""
    a = np.sort(np.asarray(samples).reshape(-1, ref_sorted.shape[0]).T, axis=1)
    n, r = a.shape[1], ref_sorted.shape[1]
    merged = np.sort(np.concatenate([a, ref_sorted], axis=1), axis=1)
    out = np.empty(len(a))
    for j in range(len(a)):
        x = merged[j, :-1]
        fa = np.searchsorted(a[j], x, side="right") / n
        fb = np.searchsorted(ref_sorted[j], x, side="right") / r
        out[j] = np.dot(np.abs(fa - fb), np.diff(merged[j]))
    return out


def measure(samples, ref, ref_sorted, ref_sd, xt, yt, checkpoints, seed) -> dict:
    """W1, ESS, moments and predictive of ``samples (m, K, T, d)`` (``m = 1``: centralized)."""
    from fedbayes_flwr.evaluation.sample_quality import w1_noise_floor
    from fedbayes_flwr.inference.posterior import SamplePosterior

    m = samples.shape[0]
    d = samples.shape[-1]
    avg = samples.mean(axis=0)  # (K, T, d)
    w1_agents = np.array([np.mean(w1(samples[i], ref_sorted) / ref_sd) for i in range(m)])
    w1_avg = float(np.mean(w1(avg, ref_sorted) / ref_sd))
    ess = SamplePosterior(avg).ess()
    floor = w1_noise_floor(ref, np.clip(ess, 1, len(ref) - 1), np.random.default_rng(seed),
                           repeats=FLOOR_REPEATS)
    flat = samples.reshape(-1, d)
    ref_mean = ref.mean(0)
    w1_curve = [float(np.mean(w1(samples[0][:, :t], ref_sorted) / ref_sd)) for t in checkpoints]
    return {
        "w1_agent_mean": float(w1_agents.mean()), "w1_agent_worst": float(w1_agents.max()),
        "w1_avg": w1_avg, "w1_floor": float(np.mean(np.median(floor, axis=0) / ref_sd)),
        "ess_min": float(ess.min()), "ess_median": float(np.median(ess)),
        "mean_err_over_sd": float(np.mean(np.abs(flat.mean(0) - ref_mean) / ref_sd)),
        "var_ratio_mean": float(np.mean(flat.var(0) / ref_sd**2)),
        "w1_curve_agent1": w1_curve,
        **predictive_curves(samples, xt, yt, checkpoints),
    }


def run_method(method, pots, mixing, w0, rounds, args, eps_c, var_ref):
    """One run: ``(samples (m, K, T, d), info)``."""
    from fedbayes_flwr.algorithms.dhmc.baselines import PooledPotential, centralized_hmc, decentralized_ula
    from fedbayes_flwr.algorithms.dhmc.loop import simulate

    if method == "chmc":
        run = centralized_hmc(PooledPotential(pots), w0, STEP0, args.iterations,
                              warmup=args.warmup, seed=args.seed, target_accept=TARGET_ACCEPT)
        return run.samples[None], {"epsilon": run.epsilon, "accept_rate": run.accept_rate,
                                   "grad_evals": run.grad_evals}
    if method.startswith("dula"):
        noise = {"dula": "independent", "dula-shared": "shared", "dula-ref": "reference"}[method]
        run = decentralized_ula(pots, mixing, w0, eps_c**2 / 2, args.iterations,
                                rounds=rounds, seed=args.seed, noise=noise, warmup=args.warmup,
                                posterior_var=var_ref)
        return run.samples, {"step0": float(run.steps[0]), "step_last": float(run.steps[-1]),
                             "consensus": float(run.consensus.mean()),
                             "grad_evals": run.grad_evals}
    integrator = "euler" if method == "dmala" else "leapfrog"
    decision = "flood" if method in ("dhmc", "dhmc-exact") else "local"
    energy = "exact" if method == "dhmc-exact" else "taylor"
    run = simulate(pots, mixing, w0, STEP0, args.iterations, warmup=args.warmup, rounds=rounds,
                   seed=args.seed, integrator=integrator, energy=energy, adapt=True,
                   target_accept=TARGET_ACCEPT, posterior_var=var_ref, decision=decision)
    return run.samples, {"epsilon": run.epsilon, "accept_rate": run.accept_rate,
                         "disagreement": run.disagreement,
                         "consensus": float(run.consensus.mean()),
                         "consensus_max": float(run.consensus.max()),
                         "grad_evals": run.grad_evals}


def run_problem(dataset, split_kind, x, y, xt, yt, ref, args, results) -> list[dict]:
    from fedbayes_flwr.algorithms.decentralized import graphs as gossip
    from fedbayes_flwr.algorithms.decentralized import mixing as mixmat
    from fedbayes_flwr.algorithms.dhmc import agents as dhmc
    from fedbayes_flwr.inference import potentials as P
    from fedbayes_flwr.models import make_model

    model = make_model("logistic-regression")
    d = x.shape[1] + 1
    prior = P.gaussian_prior_potential(d, 1.0)
    parts = split(y, split_kind, args.data_seed)
    pots = [dhmc.LocalPotential(model.bounded_potential(x[i], y[i]), prior, AGENTS) for i in parts]
    mixing = mixmat.metropolis_weights(gossip.ring(AGENTS))
    w_map, cov = laplace(x, y)
    rng = np.random.default_rng([args.seed, 17])
    w0 = w_map + 2.0 * rng.standard_normal((CHAINS, d)) @ np.linalg.cholesky(cov).T
    ref_sd = ref.std(0)
    checkpoints = np.unique(np.geomspace(THIN * 4, args.iterations, CHECKPOINTS).astype(int))
    rows = []
    eps_c = None
    todo = [(None, "chmc")] + [(r, m) for r in ROUNDS for m in DECENTRALIZED
                               if m in MH or r in ULA_ROUNDS]
    ref_sorted = np.sort(ref.T, axis=1)
    for rounds, method in todo:
        t0 = time.perf_counter()
        samples, info = run_method(method, pots, mixing, w0, rounds, args, eps_c, ref_sd**2)
        wall = time.perf_counter() - t0
        if method == "chmc":
            eps_c = info["epsilon"]
        row = {"dataset": dataset, "split": split_kind, "method": method, "rounds": rounds,
               **info, "wall_s": round(wall, 2), "checkpoints": checkpoints.tolist(),
               "grad_evals_at_checkpoints": (checkpoints + args.warmup + 1).tolist(),
               **measure(samples, ref, ref_sorted, ref_sd, xt, yt, checkpoints,
                         args.seed + 1000 * len(rows))}
        rows.append(row)
        results.doc["runs"].append(row)
        results.write()
        print(f"  {dataset:13s} {split_kind:12s} s={row['rounds']!s:4s} {method:11s} "
              f"W1/sd agents {row['w1_agent_mean']:.3f} (worst {row['w1_agent_worst']:.3f}, "
              f"avg {row['w1_avg']:.3f}, floor {row['w1_floor']:.3f}) acc "
              f"{row['accuracy'][-1]:.3f} nll {row['nll'][-1]:.4f} "
              f"[{wall:.1f}s]", flush=True)
    return rows


def table(rows, nuts: dict) -> str:
    head = (f"{'data':13s} {'split':12s} {'s':>4s} {'method':11s} {'eps':>7s} {'accept':>6s} "
            f"{'disagr':>6s} {'consens':>8s} {'W1/sd':>6s} {'worst':>6s} {'avg':>6s} "
            f"{'floor':>6s} {'ESSmin':>7s} {'var/ref':>7s} {'acc':>6s} {'NLL':>7s}")
    lines = [head]
    for r in rows:
        eps = r.get("epsilon", r.get("step0"))
        lines.append(
            f"{r['dataset']:13s} {r['split']:12s} {r['rounds']!s:>4s} {r['method']:11s} "
            f"{eps:7.4f} {r.get('accept_rate', float('nan')):6.3f} "
            f"{r.get('disagreement', float('nan')):6.3f} {r.get('consensus', 0.0):8.2e} "
            f"{r['w1_agent_mean']:6.3f} {r['w1_agent_worst']:6.3f} {r['w1_avg']:6.3f} "
            f"{r['w1_floor']:6.3f} {r['ess_min']:7.0f} {r['var_ratio_mean']:7.3f} "
            f"{r['accuracy'][-1]:6.3f} {r['nll'][-1]:7.4f}")
    lines.append("NUTS predictive: " + "; ".join(
        f"{k}: acc {v['accuracy']:.3f} nll {v['nll']:.4f}" for k, v in nuts.items()))
    return "\n".join(lines)


def summary(rows) -> dict:
    """Per data set and split: every (method, s) ranked by the agents' mean W1 / sd."""
    out = {}
    for r in rows:
        key = f"{r['dataset']}/{r['split']}"
        name = r["method"] + ("" if r["rounds"] is None else f" s={r['rounds']}")
        out.setdefault(key, {"ranking": []})["ranking"].append((name, r["w1_agent_mean"]))
    for v in out.values():
        v["ranking"].sort(key=lambda item: item[1])
    return out


STYLE = {"dhmc": "tab:blue", "dhmc-exact": "tab:cyan", "dhmc-local": "tab:purple", "dmala": "tab:orange",
         "dula": "tab:green", "dula-shared": "tab:olive", "dula-ref": "tab:gray",
         "chmc": "black"}


def plot_title(dataset, split_kind, args) -> str:
    return (f"{dataset}, {split_kind} split over a ring of {AGENTS}: {CHAINS} chains, "
            f"{args.warmup} + {args.iterations} iterations (dotted: s=1, solid: s=5, "
            f"dashed: s=10)")


def plot(rows, nuts_pred, path, title) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 5.6))
    for r in rows:
        ls = {None: "-", 1: ":", 5: "-", 10: "--"}[r["rounds"]]
        label = r["method"] + ("" if r["rounds"] is None else f" s={r['rounds']}")
        x = r["grad_evals_at_checkpoints"]
        for ax, key in zip(axes, ("w1_curve_agent1", "nll", "accuracy"), strict=True):
            ax.plot(x, r[key], ls, marker=".", color=STYLE[r["method"]], label=label)
    axes[0].set_yscale("log")
    axes[0].set_title("agent 1: marginal W1 / sd to NUTS (mean over coords)", fontsize=9)
    axes[1].axhline(nuts_pred["nll"], color="red", ls=":", label="NUTS")
    axes[1].set_title("test NLL of the posterior predictive (mean over agents)", fontsize=9)
    axes[2].axhline(nuts_pred["accuracy"], color="red", ls=":", label="NUTS")
    axes[2].set_title("test accuracy (mean over agents)", fontsize=9)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("gradient evaluations per agent (warm-up included)")
        ax.grid(alpha=0.3)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=9, fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = common.argument_parser(__doc__, "synthetic only, 600 iterations, small reference",
                                    "unused (iterations: --iterations)")
    parser.add_argument("--iterations", type=int, default=None, help="kept iterations (2500)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up iterations (500)")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--datasets", nargs="+", default=None, choices=DATASETS)
    parser.add_argument("--cache-dir", default=None, help="NUTS reference cache")
    parser.add_argument("--replot", action="store_true",
                        help="redraw the plots from the existing JSON and stop")
    args = common.resolve_common_args(parser.parse_args(), NAME)
    if args.replot:
        doc = common.read_results(args, NAME)
        args.iterations, args.warmup = doc["iterations"], doc["warmup"]
        for dataset, split_kind in sorted({(r["dataset"], r["split"]) for r in doc["runs"]}):
            rows = [r for r in doc["runs"] if (r["dataset"], r["split"]) == (dataset, split_kind)]
            plot(rows, doc["nuts_predictive"][dataset],
                 os.path.join(args.results_dir, f"{NAME}_{dataset}_{split_kind}.png"),
                 plot_title(dataset, split_kind, args))
        return
    q = args.quick
    args.iterations = args.iterations or (600 if q else 2500)
    args.warmup = args.warmup if args.warmup is not None else (200 if q else 500)
    args.datasets = args.datasets or (["synthetic"] if q else list(DATASETS))
    ref_settings = ({"num_chains": 4, "num_draws": 1000, "num_warmup": 500} if q else
                    {"num_chains": 8, "num_draws": 5000, "num_warmup": 2000})

    from fedbayes_flwr.evaluation.reference import nuts_reference
    from fedbayes_flwr.models import make_model

    results = common.start(NAME, args, {"reference": {}, "nuts_predictive": {}, "runs": []},
                           agents=AGENTS, chains=CHAINS, graph="ring", rounds=list(ROUNDS),
                           iterations=args.iterations, warmup=args.warmup, step0=STEP0,
                           target_accept=TARGET_ACCEPT, prior="N(0, I)", splits=list(SPLITS),
                           methods=list(METHODS), data_seed=args.data_seed,
                           reference_settings=ref_settings)
    model = make_model("logistic-regression")
    all_rows, nuts_pred = [], {}
    for dataset in args.datasets:
        x, y, xt, yt = load(dataset, args.data_seed)
        t0 = time.perf_counter()
        ref = nuts_reference(model, x, y, model.prior(x.shape[1], 1.0, True), seed=0,
                             cache_dir=args.cache_dir, **ref_settings)
        draws = ref.draws
        nuts_pred[dataset] = nuts_predictive(draws, xt, yt)
        results.doc["reference"][dataset] = {
            "from_cache": ref.from_cache, "path": ref.path,
            "seconds_here": round(time.perf_counter() - t0, 1), "info": ref.info,
            "ess_min": float(ref.ess.min()), "rhat_max": float(ref.rhat.max()),
            "n_train": len(x), "n_test": len(xt), "d": x.shape[1] + 1}
        results.doc["nuts_predictive"][dataset] = nuts_pred[dataset]
        from fedbayes_flwr.evaluation.sample_quality import marginal_w1

        probe = draws[::7] * 1.1 + 0.01  # the fast W1 against the library's on a probe sample
        results.doc["reference"][dataset]["w1_check_max_abs_diff"] = float(np.max(np.abs(
            w1(probe, np.sort(draws.T, axis=1)) - marginal_w1(probe, draws))))
        results.write()
        print(f"{dataset}: NUTS reference ({'cache' if ref.from_cache else 'computed'}, "
              f"{len(draws)} draws, ESS min {ref.ess.min():.0f}, R-hat max {ref.rhat.max():.4f});"
              f" predictive acc {nuts_pred[dataset]['accuracy']:.3f} nll "
              f"{nuts_pred[dataset]['nll']:.4f}", flush=True)
        for split_kind in SPLITS:
            rows = run_problem(dataset, split_kind, x, y, xt, yt, draws, args, results)
            all_rows.extend(rows)
            plot(rows, nuts_pred[dataset],
                 os.path.join(args.results_dir, f"{NAME}_{dataset}_{split_kind}.png"),
                 plot_title(dataset, split_kind, args))
    results.doc["summary"] = summary(all_rows)
    print("\n" + table(all_rows, nuts_pred))
    for key, v in results.doc["summary"].items():
        print(f"{key}: closest to NUTS (W1/sd, agents' mean): " + ", ".join(
            f"{name} {val:.3f}" for name, val in v["ranking"][:5]))
    results.finish()


if __name__ == "__main__":
    main()
