"""AMPS on the paper's synthetic latent features (Campbell & How 2014, Section 3.3, Fig. 9a-b):
feature-recovery error and held-out predictive log-likelihood, AMPS vs the naive merge, batch VB
and the single agents.

Data: the ``latent-features`` set (:mod:`fedbayes_flwr.data.amps_sets`; the CLI's data at the same
seed), drawn afresh for every seed: ``K = 5`` random binary features in ``D = 10`` dimensions,
inclusion probabilities ``U(0, 1)``, noise variance ``0.04``; 1,000 training and 300 held-out
observations. The model is :class:`fedbayes_flwr.inference.vb.latent_feature.LatentFeature` with the
paper's prior (``Beta(1, 1)``, ``eta0 = 0``) and ``nu0`` estimated by the server from the sum of
the agents' data moments (:meth:`~fedbayes_flwr.inference.vb.latent_feature.LatentFeature.data_moments`,
sent once); known noise variance; ``--restarts`` (default 3) restarts per fit, ``tol = 1e-6``.

Per seed: 5 agents get 200 consecutive training rows each (the rows are i.i.d.); every agent fits
from the prior, and its posterior's features are relabelled by a random permutation (coupled over
features and inclusion probabilities), so the merge cannot rely on restarts happening to agree.
The posteriors are merged by

* AMPS with iterative bipartite matching (``bipartite``;
:func:`fedbayes_flwr.algorithms.amps.merge.align`), the
  paper's choice for this model,
* AMPS with the pairwise-swap search (``swap``),
* the naive merge (identity permutations, eq. 3),

and batch VB fits all 1,000 rows at once (same restarts). Reported per method: the 2-norm error
of each feature's posterior mean after the best relabelling
(:func:`fedbayes_flwr.algorithms.amps.merge.matched_error`;
``feature_error`` is the mean over the 5 features, ``max_error`` the largest), the held-out
predictive log-likelihood of one random coordinate per test row given the other 9 (exact under
``q`` by enumerating ``z``: :meth:`~fedbayes_flwr.inference.vb.latent_feature.LatentFeature.heldout_loglik`,
the same coordinates for every method), the AMPS objective ``J`` and wall times (each agent's fit,
the merges, batch VB). Also the single agents (mean, min and max over the 5) and the same
held-out score under the generating parameters (the ceiling).

The issue's bar (acceptance 5), computed as stated: the feature-recovery error of AMPS
(bipartite), averaged over the seeds, is below the naive merge's and below the mean single
agent's; the predictive log-likelihood is reported. Per-seed counts are reported alongside.

Run: ``.venv/bin/python benchmarks/amps/amps_latent_features.py`` (20 seeds, about 2 minutes on one
core; ``--quick``: 3 seeds, results under the work dir; ``--seeds`` to choose, ``--seed`` the
first). Writes ``benchmarks/results/amps/amps_latent_features.json`` (per seed and summary, rewritten
after every seed), ``amps_latent_features.png`` (error and held-out log-likelihood per seed) and
``amps_latent_features_features.png`` (the first seed's feature means, like the paper's Fig. 9:
truth, batch VB, AMPS, naive and one agent).

References
----------
Campbell & How (2014), "Approximate Decentralized Bayesian Inference", Section 3.3 (the latent
feature model, its AMPS objective and the synthetic experiment) and Section 3.2 (iterative
bipartite matching).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common
import numpy as np

NAME = "amps_latent_features"
DATASET = "latent-features"
AGENTS = 5
RESTARTS = 3
MODEL = {"num_features": 5, "dim": 10, "noise_var": 0.04, "alpha": 1.0, "beta": 1.0}
MERGES = ("bipartite", "swap", "naive")
METHODS = (*MERGES, "batch")
LABELS = {"bipartite": "AMPS (bipartite)", "swap": "AMPS (swap)", "naive": "naive",
          "batch": "batch VB", "local": "single agents"}
TIE = 1e-9  # relative difference of J below which two results count as equal
PINNED = 1e12  # precision of the "true parameters" posterior used for the ceiling


def make_model(prior_precision: float = 1.0):
    from fedbayes_flwr.inference.vb.latent_feature import LatentFeature

    return LatentFeature(MODEL["num_features"], MODEL["dim"], MODEL["noise_var"], MODEL["alpha"],
                         MODEL["beta"], prior_precision)


def generating_params(seed: int, x_train):
    """The generating features and probabilities as a (pinned) posterior, or None when the
    regenerated data differ from the set's (then no ceiling is reported)."""
    from fedbayes_flwr.data.amps_sets import AMPS_SETS, LF_TEST, LF_TRAIN
    from fedbayes_flwr.data.latent_features import make_latent_features
    from fedbayes_flwr.inference import expfam
    from fedbayes_flwr.inference.vb.latent_feature import LatentFeatureParams

    rng = np.random.default_rng([seed, AMPS_SETS.index(DATASET)])
    x, features, probs = make_latent_features(rng, LF_TRAIN + LF_TEST)
    if not np.array_equal(x[:LF_TRAIN], x_train):
        return None
    prec = np.full(len(features), PINNED)
    return LatentFeatureParams(expfam.IsoGaussian(prec[:, None] * features, prec),
                               expfam.Beta(PINNED * probs, PINNED * (1 - probs)))


def score(model, params, x_test, truth, **extra) -> dict:
    from fedbayes_flwr.algorithms.amps import merge as amps
    from fedbayes_flwr.inference import expfam

    errors, perm = amps.matched_error(model.component_means(params), truth)
    return {"heldout_loglik": model.heldout_loglik(params, x_test),
            "feature_error": float(errors.mean()), "max_error": float(errors.max()),
            "errors": errors.tolist(),
            "probs_matched": expfam.mean(params.probs)[perm].tolist(), **extra}


def run_seed(seed: int, restarts: int):
    """Every method on the data of ``seed``: ``(row, posteriors)`` (``posteriors`` for the
    feature plot)."""
    from fedbayes_flwr.algorithms.amps import merge as amps
    from fedbayes_flwr.data.amps_sets import load_amps_set, truth
    from fedbayes_flwr.inference import expfam

    data = load_amps_set(DATASET, "none", seed)
    x, x_test = data.x_train, data.x_test
    features = truth(DATASET, seed)
    parts = np.array_split(x, AGENTS)
    base = make_model()
    nu0 = base.prior_precision_from_moments(np.sum([base.data_moments(p) for p in parts], axis=0))
    model = make_model(nu0)
    prior = model.prior()
    rng = np.random.default_rng([seed, 1])

    posts, local_s, relabels = [], [], []
    for part in parts:
        t0 = time.perf_counter()
        fit = model.fit(part, prior, rng, restarts=restarts)
        local_s.append(time.perf_counter() - t0)
        perm = rng.permutation(model.num_components)
        relabels.append(perm.tolist())
        posts.append(expfam.permute(fit.params, perm, model.symmetric))

    row = {"seed": seed, "n_train": len(x), "n_test": len(x_test), "prior_precision": nu0,
           "prior_heldout_loglik": model.heldout_loglik(prior, x_test),
           "agent_relabels": relabels,
           "local_fit_s": {"max": max(local_s), "mean": float(np.mean(local_s))}}
    ceiling = generating_params(seed, x)
    row["true_heldout_loglik"] = (None if ceiling is None
                                  else model.heldout_loglik(ceiling, x_test))
    merged = {}
    for search in ("bipartite", "swap"):
        t0 = time.perf_counter()
        found = amps.align(prior, posts, model.symmetric, search)
        merged[search] = amps.merge(prior, posts, found.perms, model.symmetric)
        seconds = time.perf_counter() - t0
        row[search] = score(model, merged[search], x_test, features, objective=found.objective,
                            merge_s=seconds, sweeps=found.sweeps,
                            evaluations=found.evaluations, perms=found.perms.tolist())
    t0 = time.perf_counter()
    merged["naive"] = amps.merge(prior, posts)
    seconds = time.perf_counter() - t0
    row["naive"] = score(model, merged["naive"], x_test, features,
                         objective=amps.objective(prior, posts), merge_s=seconds)

    t0 = time.perf_counter()
    batch = model.fit(x, prior, rng, restarts=restarts)
    merged["batch"] = batch.params
    row["batch"] = score(model, batch.params, x_test, features, fit_s=time.perf_counter() - t0,
                         elbo=batch.elbo, converged=bool(batch.converged))

    singles = [score(model, p, x_test, features) for p in posts]
    row["local"] = {key: {"mean": float(np.mean([s[key] for s in singles])),
                          "min": float(np.min([s[key] for s in singles])),
                          "max": float(np.max([s[key] for s in singles])),
                          "agents": [s[key] for s in singles]}
                    for key in ("heldout_loglik", "feature_error", "max_error")}
    b, s = row["bipartite"], row["swap"]
    row["swap_vs_bipartite"] = {
        "objective_gap": b["objective"] - s["objective"],
        "same_perms": bool(np.array_equal(b["perms"], s["perms"])),
        "same_objective": bool(abs(b["objective"] - s["objective"])
                               <= TIE * max(1.0, abs(b["objective"]))),
    }
    return row, {"model": model, "features": features, "agents": posts, **merged}


def summarise(rows: list[dict]) -> dict:
    def stats(values):
        v = np.asarray([float(x) for x in values])
        return {**common.spread(v), "median": float(np.median(v))}

    keys = ("heldout_loglik", "feature_error", "max_error")
    summary = {m: {k: stats(r[m][k] for r in rows)
                   for k in (*keys, "merge_s" if m != "batch" else "fit_s")}
               for m in METHODS}
    for m in MERGES:
        summary[m]["objective"] = stats(r[m]["objective"] for r in rows)
    summary["local"] = {k: {"mean_over_agents": stats(r["local"][k]["mean"] for r in rows),
                            "min_over_agents": stats(r["local"][k]["min"] for r in rows),
                            "max_over_agents": stats(r["local"][k]["max"] for r in rows)}
                        for k in keys}
    summary["local_fit_s"] = {"mean": stats(r["local_fit_s"]["mean"] for r in rows),
                              "max": stats(r["local_fit_s"]["max"] for r in rows)}
    summary["prior_heldout_loglik"] = stats(r["prior_heldout_loglik"] for r in rows)
    truth = [r["true_heldout_loglik"] for r in rows if r["true_heldout_loglik"] is not None]
    summary["true_heldout_loglik"] = stats(truth) if truth else None
    summary["swap_vs_bipartite"] = {
        "objective_gap": stats(r["swap_vs_bipartite"]["objective_gap"] for r in rows),
        "seeds_same_perms": int(sum(r["swap_vs_bipartite"]["same_perms"] for r in rows)),
        "seeds_same_objective": int(sum(r["swap_vs_bipartite"]["same_objective"] for r in rows)),
    }

    err = {m: np.array([r[m]["feature_error"] for r in rows]) for m in METHODS}
    local_err = np.array([r["local"]["feature_error"]["mean"] for r in rows])
    ll = {m: np.array([r[m]["heldout_loglik"] for r in rows]) for m in METHODS}
    local_ll = np.array([r["local"]["heldout_loglik"]["mean"] for r in rows])
    summary["criteria"] = {
        "seeds": len(rows),
        "amps_mean_feature_error": float(err["bipartite"].mean()),
        "swap_mean_feature_error": float(err["swap"].mean()),
        "naive_mean_feature_error": float(err["naive"].mean()),
        "single_agent_mean_feature_error": float(local_err.mean()),
        "batch_mean_feature_error": float(err["batch"].mean()),
        "amps_below_naive": bool(err["bipartite"].mean() < err["naive"].mean()),
        "amps_below_single_agents": bool(err["bipartite"].mean() < local_err.mean()),
        "seeds_amps_below_naive": int((err["bipartite"] < err["naive"]).sum()),
        "seeds_amps_below_single_agents": int((err["bipartite"] < local_err).sum()),
        "pass": bool(err["bipartite"].mean() < err["naive"].mean()
                     and err["bipartite"].mean() < local_err.mean()),
        "heldout_loglik_mean": {**{m: float(ll[m].mean()) for m in METHODS},
                                "single_agents": float(local_ll.mean())},
        "seeds_amps_heldout_above_naive": int((ll["bipartite"] > ll["naive"]).sum()),
    }
    return summary


def table(summary: dict) -> str:
    lines = ["method               feature error: mean [min, max]   largest: median   "
             "held-out LL/row: mean [min, max]"]

    def line(label, err, big, ll):
        return (f"{label:20s} {err['mean']:6.3f} [{err['min']:6.3f}, {err['max']:6.3f}]"
                f"        {big['median']:6.3f}     {ll['mean']:7.3f} [{ll['min']:7.3f}, "
                f"{ll['max']:7.3f}]")

    for m in METHODS:
        s = summary[m]
        lines.append(line(LABELS[m], s["feature_error"], s["max_error"], s["heldout_loglik"]))
    loc = summary["local"]
    lines.append(line("single agents (mean)", loc["feature_error"]["mean_over_agents"],
                      loc["max_error"]["mean_over_agents"],
                      loc["heldout_loglik"]["mean_over_agents"]))
    truth = summary["true_heldout_loglik"]
    lines.append(f"prior {summary['prior_heldout_loglik']['mean']:.3f}"
                 + (f"; generating parameters {truth['mean']:.3f}" if truth else "")
                 + " (held-out LL/row)")
    sv = summary["swap_vs_bipartite"]
    lines.append(f"J: bipartite {summary['bipartite']['objective']['mean']:.2f}, swap "
                 f"{summary['swap']['objective']['mean']:.2f}, naive "
                 f"{summary['naive']['objective']['mean']:.2f} (means); same J in "
                 f"{sv['seeds_same_objective']}/{summary['criteria']['seeds']} seeds (same "
                 f"permutations in {sv['seeds_same_perms']})")
    lines.append("time [ms] (mean): merges " + ", ".join(
        f"{m} {1e3 * summary[m]['merge_s']['mean']:.2f}" for m in MERGES)
        + f"; agent fit {1e3 * summary['local_fit_s']['mean']['mean']:.0f} (slowest "
        f"{1e3 * summary['local_fit_s']['max']['mean']:.0f}); batch VB fit "
        f"{1e3 * summary['batch']['fit_s']['mean']:.0f}")
    c = summary["criteria"]
    lines.append(f"acceptance 5: AMPS mean feature error {c['amps_mean_feature_error']:.3f} vs "
                 f"naive {c['naive_mean_feature_error']:.3f} (below in "
                 f"{c['seeds_amps_below_naive']}/{c['seeds']} seeds) and mean single agent "
                 f"{c['single_agent_mean_feature_error']:.3f} (below in "
                 f"{c['seeds_amps_below_single_agents']}/{c['seeds']}): "
                 f"{'PASS' if c['pass'] else 'FAIL'}")
    return "\n".join(lines)


def plot_seeds(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, key, label in ((axes[0], "feature_error", "mean feature 2-norm error"),
                           (axes[1], "heldout_loglik", "held-out log-lik / row")):
        common.plot_methods_by_seed(ax, rows, key, label, METHODS, LABELS)
    truth = [(r["seed"], r["true_heldout_loglik"]) for r in rows
             if r["true_heldout_loglik"] is not None]
    if truth:
        axes[1].plot(*zip(*truth, strict=True), "_", color="green", ms=12,
                     label="generating parameters")
    axes[0].set_yscale("log")
    for ax in axes:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    axes[0].set_title("feature recovery (best relabelling)")
    axes[1].set_title("predictive LL of a random coordinate given the other 9")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_features(post: dict, seed: int, path: str) -> None:
    """The first seed's feature means, relabelled to match the truth: one row per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedbayes_flwr.algorithms.amps import merge as amps

    model, features = post["model"], post["features"]
    shown = [("truth", features)]
    for key, label in (("batch", "batch VB"), ("bipartite", "AMPS (bipartite)"),
                       ("naive", "naive"), ("agent", "agent 1")):
        params = post["agents"][0] if key == "agent" else post[key]
        means = model.component_means(params)
        _, perm = amps.matched_error(means, features)
        shown.append((label, means[perm]))
    fig, axes = plt.subplots(len(shown), 1, figsize=(6, 1.6 * len(shown)))
    for ax, (label, means) in zip(axes, shown, strict=True):
        im = ax.imshow(means, cmap="RdBu_r", vmin=-1.5, vmax=1.5, aspect="auto")
        ax.set_ylabel(label, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks(range(len(means)))
        ax.tick_params(labelsize=6)
    fig.colorbar(im, ax=axes, shrink=0.6)
    fig.suptitle(f"seed {seed}: feature means (rows: features, columns: dimensions)", fontsize=9)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = common.argument_parser(__doc__, "3 seeds", "unused (one-shot merges, no rounds)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds (default 20)")
    parser.add_argument("--restarts", type=int, default=RESTARTS,
                        help="restarts per fit (agents and batch VB)")
    args = common.resolve_common_args(parser.parse_args(), NAME)
    if args.seeds is None:
        args.seeds = 3 if args.quick else 20
    results = common.start(NAME, args, {"seeds": []}, num_seeds=args.seeds,
                           restarts=args.restarts, agents=AGENTS, dataset=DATASET, model=MODEL)
    shown = None
    for s in range(args.seeds):
        t0 = time.perf_counter()
        row, post = run_seed(args.seed + s, args.restarts)
        if shown is None:
            shown = (row["seed"], post)
        results.doc["seeds"].append(row)
        results.write()
        print(f"seed {row['seed']:2d} ({time.perf_counter() - t0:.1f}s): feature error "
              + ", ".join(f"{m} {row[m]['feature_error']:.3f}" for m in METHODS)
              + f", agents {row['local']['feature_error']['mean']:.3f}; held-out LL "
              + ", ".join(f"{m} {row[m]['heldout_loglik']:.3f}" for m in METHODS)
              + f", agents {row['local']['heldout_loglik']['mean']:.3f}", flush=True)
    summary = summarise(results.doc["seeds"])
    results.doc["summary"] = summary
    results.doc["claim"] = summary["criteria"]
    results.write()
    plot_seeds(results.doc["seeds"], os.path.join(args.results_dir, f"{NAME}.png"))
    plot_features(shown[1], shown[0], os.path.join(args.results_dir, f"{NAME}_features.png"))
    print(table(summary))
    results.finish()


if __name__ == "__main__":
    main()
