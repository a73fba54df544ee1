"""Fed Zig-Zag on the paper's logistic regression (seed 003, Section 6.2, Fig. 3): marginal W1 to
a NUTS reference per number of workers, against a bound calibrated by the run's ESS, and ESS per
event and per gradient against ``M`` (Remark 4.1).

Data: ``load_dataset("synthetic", "binary", synthetic="logistic", seed=--data-seed (0),
synthetic_size=1250, synthetic_dim=5, test_fraction=0.2)``: 1,000 training rows (the test rows
are unused) with 5 standard normal features and labels ``Bernoulli(sigmoid(x.w + b))`` for
``w, b ~ N(0, 1)``; with the intercept (the model's last coordinate) ``d = 6``, the paper's
``N = 1000, d = 6``. Prior ``N(0, I)`` (the paper's). The rows are split into ``M`` consecutive
shards (``numpy.array_split``), worker ``m`` holding its rows' negative log-likelihood with the
standard Zig-Zag logistic bounds (:class:`fedbayes_flwr.inference.potentials.Logistic`, thinning);
the server holds the prior (exact events). No refreshment.

**Reference.** NUTS (:func:`fedbayes_flwr.evaluation.reference.nuts_reference`: ``tfp.mcmc`` NUTS with
dual-averaging step size, target acceptance 0.8) on the same posterior with the model's own
TensorFlow log density: 8 chains x 5,000 draws after 2,000 warm-up (``--ref-chains``,
``--ref-draws``), cached on disk (``--cache-dir``, default ``$FEDBAYES_CACHE/reference`` or
``~/.cache/fedbayes_flwr/reference``). The paper used a long HMC run (Blackjax).

**Runs.** For each ``M`` (``--workers``, default 1 2 4 8 16): ``--runs`` (20) independent Fed
Zig-Zag runs up to process time ``T = 100`` (``--process-time``, the paper's), burn-in 10
(``--burn-in``, excluded: its events and gradients are not counted either), sampled every 0.1
(``--delta``). The runs are independent chains of one :func:`~fedbayes_flwr.algorithms.pdmc.driver.simulate`
call (its chains share nothing but the loop; each starts from its own ``N(0, I)`` draw with a
uniform velocity and has its own randomness), on one data set as in the paper.

Per run: the marginal W1 of each coordinate to the reference
(:func:`~.sample_quality.marginal_w1`), the run's ESS (``tfp.mcmc``, one chain) and the
**bound** (:func:`~.sample_quality.w1_bound`): 3x the 99th percentile, over 200 repeats,
of the W1 between as many i.i.d. reference draws as the run's ESS in that coordinate and the rest
of the reference (the factor: W1 weighs the whole marginal, the ESS is the mean's and is itself
estimated; 3x on W1 tolerates an effective size 9x smaller than the ESS; see
:mod:`fedbayes_flwr.evaluation.reference`). The 20 runs pooled are also compared, with their pooled ESS:
a tighter check of bias. Per ``M``: events per unit time, ESS (mean over coordinates) per event,
per full-data gradient and per gradient of the busiest worker (a worker's gradient at one point
counts its ``n_m`` rows; "full-data" = all workers' over ``N``, the sequential cost; "busiest" =
the largest worker's over ``N``, the parallel cost; the gradient counts are summed over the
vectorised chains, so a run's share is the total over ``--runs``).

**Claims** (the issue's, computed as stated): every run's W1 is within its bound in every
coordinate, for every ``M``; Remark 4.1's prediction that ESS per event falls with ``M`` (reported
as whether the mean over runs decreases at every step, and the ratio first / last).

Run: ``.venv/bin/python benchmarks/pdmc/pdmc_logistic.py --runs 8`` (the committed results: 342 s on
a shared 2-core machine with the reference cached; the NUTS reference takes about a minute more
the first time). The default, the paper's 20 runs, takes roughly twice as long: the runs are
chains of one loop, and each exchange's thinning waits for the slowest chain, so the cost grows
with the number of runs. ``--quick``: 4 runs, T = 20, burn-in 5, M in 1 4, a smaller reference,
results under the work dir. ``--replot``: redraw from the JSON. Writes
``benchmarks/results/pdmc/pdmc_logistic.json`` (settings, the reference's diagnostics, every run, the
summary) and ``pdmc_logistic.png`` (W1 per M with the bounds, W1 / bound, ESS per event and per
gradient vs M).

References
----------
The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov Processes",
Section 6.2 (this experiment, Fig. 3) and Remark 4.1; Bierkens, Fearnhead & Roberts (2019), "The
Zig-Zag process and super-efficient sampling for Bayesian analysis of big data", Section 3
(logistic bounds); Hoffman & Gelman (2014), "The No-U-Turn Sampler".
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common
import numpy as np
from pdmc_switching import Counted, gradient_work, sub_seed

NAME = "pdmc_logistic"
WORKERS = (1, 2, 4, 8, 16)
FEATURES, N_TRAIN = 5, 1000
D = FEATURES + 1
BOUND = {"factor": 3.0, "quantile": 0.99, "repeats": 200}


def load_data(seed: int):
    from fedbayes_flwr.data import load_dataset

    data = load_dataset("synthetic", "binary", synthetic="logistic", seed=seed,
                        synthetic_size=1250, synthetic_dim=FEATURES, test_fraction=0.2)
    assert data.x_train.shape == (N_TRAIN, FEATURES)
    return data.x_train, data.y_train


def run_workers(m: int, x, y, ref_draws, args) -> tuple[list[dict], dict]:
    from fedbayes_flwr.algorithms.pdmc import sampler as S
    from fedbayes_flwr.algorithms.pdmc.driver import simulate
    from fedbayes_flwr.evaluation.sample_quality import marginal_w1, w1_bound, w1_noise_floor
    from fedbayes_flwr.inference import potentials as P
    from fedbayes_flwr.inference.posterior import SamplePosterior
    from fedbayes_flwr.models import make_model

    model = make_model("logistic-regression")
    workers = [Counted(model.bounded_potential(xs, ys), len(xs))
               for xs, ys in zip(np.array_split(x, m), np.array_split(y, m), strict=True)]
    prior = P.gaussian_prior_potential(D, 1.0)
    k = args.runs
    rng = np.random.default_rng([args.seed, m, 1])
    t0 = time.perf_counter()
    burn = simulate(workers, prior, "zigzag", rng.standard_normal((k, D)),
                    S.initial_velocity("zigzag", rng, k, D), process_time=args.burn_in,
                    delta=args.burn_in, seed=sub_seed(args.seed, m, 0))
    before = gradient_work(workers, N_TRAIN)
    run = simulate(workers, prior, "zigzag", burn.x, burn.v,
                   process_time=args.process_time - args.burn_in, delta=args.delta,
                   seed=sub_seed(args.seed, m, 1))
    wall = time.perf_counter() - t0
    after = gradient_work(workers, N_TRAIN)
    work = {key: (after[key] - before[key]) / k for key in after}  # a run's share
    rows = []
    for j in range(k):
        chain = run.chains[j]
        ess = SamplePosterior(chain[None]).ess()
        w1 = marginal_w1(chain, ref_draws)
        floor = w1_noise_floor(ref_draws, ess, np.random.default_rng([args.seed, m, j, 2]),
                               repeats=BOUND["repeats"])
        bound = BOUND["factor"] * np.quantile(floor, BOUND["quantile"], axis=0)  # = w1_bound
        typical = np.median(floor, axis=0)
        events = int(run.events[j])
        rows.append({"workers": m, "run": j, "w1": w1.tolist(), "bound": bound.tolist(),
                     "ratio": (w1 / bound).tolist(), "within": bool(np.all(w1 <= bound)),
                     "floor_median": typical.tolist(), "w1_over_floor_median":
                         (w1 / typical).tolist(),
                     "ess": ess.tolist(), "ess_mean": float(ess.mean()),
                     "ess_min": float(ess.min()), "events": events,
                     "rate": events / (args.process_time - args.burn_in),
                     "ess_per_event": float(ess.mean() / events),
                     "ess_per_full_grad": float(ess.mean() / work["full_grads"]),
                     "ess_per_busiest_worker_grad":
                         float(ess.mean() / work["busiest_worker_grads"]),
                     "mean": chain.mean(0).tolist(), "sd": chain.std(0).tolist()})
    pooled_ess = SamplePosterior(run.chains).ess()
    pooled_w1 = marginal_w1(run.chains, ref_draws)
    pooled_bound = w1_bound(ref_draws, pooled_ess, np.random.default_rng([args.seed, m, 3]),
                            repeats=BOUND["repeats"], quantile=BOUND["quantile"],
                            factor=BOUND["factor"])
    pooled = {"workers": m, "ess": pooled_ess.tolist(), "w1": pooled_w1.tolist(),
              "bound": pooled_bound.tolist(), "ratio": (pooled_w1 / pooled_bound).tolist(),
              "within": bool(np.all(pooled_w1 <= pooled_bound)),
              "winners": run.winners.tolist(), "exchanges": run.exchanges, **work,
              "library_grad_evals_per_run": run.grad_evals / k, "wall_s": round(wall, 2),
              "samples_per_run": int(run.chains.shape[1])}
    return rows, pooled


def summarise(rows: list[dict], pooled: list[dict]) -> dict:
    per_m = {}
    for p in pooled:
        m = p["workers"]
        rs = [r for r in rows if r["workers"] == m]
        ratio = np.array([r["ratio"] for r in rs])
        w1 = np.array([r["w1"] for r in rs])
        per_m[m] = {
            "runs": len(rs),
            "runs_within": int(sum(r["within"] for r in rs)),
            "coordinates_outside": int((ratio > 1).sum()),
            "max_ratio": float(ratio.max()), "median_ratio": float(np.median(ratio)),
            # W1 over the floor's median: ~1 when the ESS is the marginal's effective size
            "w1_over_floor_median": {
                "median": float(np.median([r["w1_over_floor_median"] for r in rs])),
                "max": float(np.max([r["w1_over_floor_median"] for r in rs]))},
            "w1_mean_per_coordinate": w1.mean(0).tolist(),
            "w1_max": float(w1.max()),
            "bound_median_per_coordinate": np.median([r["bound"] for r in rs], axis=0).tolist(),
            "pooled_within": p["within"], "pooled_max_ratio": float(max(p["ratio"])),
            "pooled_w1": p["w1"],
            **{key: common.spread([r[key] for r in rs])
               for key in ("rate", "ess_mean", "ess_min", "ess_per_event", "ess_per_full_grad",
                           "ess_per_busiest_worker_grad")},
            "full_grads_per_run": p["full_grads"],
            "busiest_worker_grads_per_run": p["busiest_worker_grads"],
            "wall_s": p["wall_s"]}
    ms = sorted(per_m)
    epe = [per_m[m]["ess_per_event"]["mean"] for m in ms]
    claim = {"all_runs_within_bound": bool(all(per_m[m]["runs_within"] == per_m[m]["runs"]
                                               for m in ms)),
             "runs_within": int(sum(per_m[m]["runs_within"] for m in ms)),
             "runs": int(sum(per_m[m]["runs"] for m in ms)),
             "max_ratio": float(max(per_m[m]["max_ratio"] for m in ms)),
             "pooled_all_within": bool(all(per_m[m]["pooled_within"] for m in ms)),
             "ess_per_event_decreasing_in_M": bool(np.all(np.diff(epe) < 0)),
             "ess_per_event_first_over_last": float(epe[0] / epe[-1]),
             "bound": BOUND}
    return {"per_workers": {str(m): per_m[m] for m in ms}, "claim": claim}


def table(summary: dict) -> str:
    lines = ["   M  rate   ESS/run (min)  ESS/event  ESS/full-grad  ESS/busiest-grad  "
             "runs within  max W1/bound  W1/floor-median med (max)  pooled max W1/bound  "
             "mean W1 per coordinate"]
    for m, s in summary["per_workers"].items():
        lines.append(
            f"{int(m):4d} {s['rate']['mean']:6.1f}  {s['ess_mean']['mean']:6.1f} "
            f"({s['ess_min']['mean']:5.1f})  {s['ess_per_event']['mean']:9.5f}  "
            f"{s['ess_per_full_grad']['mean']:13.5f}  "
            f"{s['ess_per_busiest_worker_grad']['mean']:16.5f}  {s['runs_within']:5d}/"
            f"{s['runs']:<5d}  {s['max_ratio']:12.3f}  "
            f"{s['w1_over_floor_median']['median']:15.2f} ({s['w1_over_floor_median']['max']:5.2f})"
            f"    {s['pooled_max_ratio']:19.3f}  "
            + " ".join(f"{v:.4f}" for v in s["w1_mean_per_coordinate"]))
    c = summary["claim"]
    lines.append(f"claim: every run within its bound in every coordinate: "
                 f"{'PASS' if c['all_runs_within_bound'] else 'FAIL'} ({c['runs_within']}/"
                 f"{c['runs']} runs, max W1/bound {c['max_ratio']:.3f}; pooled runs within: "
                 f"{c['pooled_all_within']})")
    lines.append(f"Remark 4.1: ESS per event decreasing in M: {c['ess_per_event_decreasing_in_M']}"
                 f" (first / last M: {c['ess_per_event_first_over_last']:.2f}x)")
    return "\n".join(lines)


def plot(rows: list[dict], summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = summary["per_workers"]
    ms = [int(m) for m in per]
    pos = np.arange(len(ms))
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    width = 0.8 / D
    for i in range(D):
        data = [[r["w1"][i] for r in rows if r["workers"] == m] for m in ms]
        at = pos - 0.4 + width * (i + 0.5)
        ax.boxplot(data, positions=at, widths=width * 0.9, showfliers=True,
                   flierprops={"markersize": 2}, boxprops={"color": f"C{i}"},
                   medianprops={"color": f"C{i}"}, whiskerprops={"color": f"C{i}"},
                   capprops={"color": f"C{i}"})
        ax.plot(at, [per[str(m)]["bound_median_per_coordinate"][i] for m in ms], "_",
                color=f"C{i}", ms=10, mew=2,
                label=f"x{i + 1}" if i < D - 1 else "intercept")
    ax.set_xticks(pos, [str(m) for m in ms])
    ax.set_yscale("log")
    ax.set_xlabel("workers M")
    ax.set_ylabel("marginal W1 to NUTS")
    ax.set_title("W1 per run (boxes) and the median bound (bars)", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    ax = axes[1]
    ax.boxplot([[v for r in rows if r["workers"] == m for v in r["ratio"]] for m in ms],
               positions=pos, flierprops={"markersize": 3})
    ax.axhline(1.0, color="tab:red", ls="--", lw=1, label="bound")
    ax.set_xticks(pos, [str(m) for m in ms])
    ax.set_xlabel("workers M")
    ax.set_ylabel("W1 / bound (every run and coordinate)")
    ax.set_title("W1 over its calibrated bound", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    common.plot_ess_per_work(axes[2], per, ms, "efficiency (mean +- sd over runs; Remark 4.1)",
                             spread_bars=True)
    fig.suptitle(f"Fed Zig-Zag, logistic regression N={N_TRAIN}, d={D}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = common.argument_parser(__doc__, "4 runs, T = 20, M in 1 4, smaller reference",
                                    "unused (no rounds)")
    parser.add_argument("--runs", type=int, default=None, help="runs per M (default 20)")
    parser.add_argument("--process-time", type=float, default=None,
                        help="process time per run, burn-in included (default 100)")
    parser.add_argument("--burn-in", type=float, default=None, help="default 10 (quick 5)")
    parser.add_argument("--delta", type=float, default=0.1, help="sample spacing")
    parser.add_argument("--workers", type=int, nargs="+", default=None,
                        help="values of M (default 1 2 4 8 16)")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--ref-chains", type=int, default=None, help="default 8 (quick 4)")
    parser.add_argument("--ref-draws", type=int, default=None,
                        help="kept draws per chain (default 5000, quick 2000)")
    parser.add_argument("--ref-warmup", type=int, default=None, help="default 2000 (quick 1000)")
    parser.add_argument("--cache-dir", default=None, help="NUTS reference cache")
    parser.add_argument("--replot", action="store_true",
                        help="redraw the plot and the table from the existing JSON; run nothing")
    args = common.resolve_common_args(parser.parse_args(), NAME)
    if args.replot:
        return common.replot(args, NAME, plot, table)
    q = args.quick
    args.runs = args.runs or (4 if q else 20)
    args.process_time = args.process_time or (20.0 if q else 100.0)
    args.burn_in = args.burn_in if args.burn_in is not None else (5.0 if q else 10.0)
    args.workers = args.workers or ([1, 4] if q else list(WORKERS))
    args.ref_chains = args.ref_chains or (4 if q else 8)
    args.ref_draws = args.ref_draws or (2000 if q else 5000)
    args.ref_warmup = args.ref_warmup or (1000 if q else 2000)
    if not 0 <= args.burn_in < args.process_time:
        raise SystemExit("--burn-in must be in [0, --process-time)")

    from fedbayes_flwr.evaluation.reference import nuts_reference
    from fedbayes_flwr.models import make_model

    x, y = load_data(args.data_seed)
    results = common.start(NAME, args, {"runs": [], "pooled": []}, data_seed=args.data_seed,
                           n_train=N_TRAIN, d=D, prior="N(0, I)", sampler="zigzag",
                           workers=args.workers, num_runs=args.runs,
                           process_time=args.process_time, burn_in=args.burn_in,
                           delta=args.delta, refresh=0.0, bound=BOUND)
    model = make_model("logistic-regression")
    t0 = time.perf_counter()
    ref = nuts_reference(model, x, y, model.prior(FEATURES, 1.0, True),
                         num_chains=args.ref_chains, num_draws=args.ref_draws,
                         num_warmup=args.ref_warmup, seed=0, cache_dir=args.cache_dir)
    draws = ref.draws
    results.doc["reference"] = {
        "sampler": "NUTS (tfp.mcmc, dual-averaging step size)", "from_cache": ref.from_cache,
        "path": ref.path, "seconds_here": round(time.perf_counter() - t0, 1),
        "info": ref.info, "ess": ref.ess.tolist(), "rhat": ref.rhat.tolist(),
        "mean": draws.mean(0).tolist(), "sd": draws.std(0).tolist()}
    results.write()
    print(f"NUTS reference ({'cache' if ref.from_cache else 'computed'}, "
          f"{len(draws)} draws): ESS {np.round(ref.ess).astype(int).tolist()}, max R-hat "
          f"{ref.rhat.max():.4f}; mean {np.round(draws.mean(0), 3).tolist()}, sd "
          f"{np.round(draws.std(0), 3).tolist()}", flush=True)
    for m in args.workers:
        t0 = time.perf_counter()
        rows, pooled = run_workers(m, x, y, draws, args)
        results.doc["runs"].extend(rows)
        results.doc["pooled"].append(pooled)
        results.write()
        print(f"M={m:2d} ({time.perf_counter() - t0:6.1f}s): runs within bound "
              f"{sum(r['within'] for r in rows)}/{len(rows)}, max W1/bound "
              f"{max(max(r['ratio']) for r in rows):.3f}, ESS/event "
              f"{np.mean([r['ess_per_event'] for r in rows]):.5f}", flush=True)
    summary = summarise(results.doc["runs"], results.doc["pooled"])
    results.doc["summary"] = summary
    results.doc["claim"] = summary["claim"]
    results.write()
    plot(results.doc["runs"], summary, os.path.join(args.results_dir, f"{NAME}.png"))
    print(table(summary))
    results.finish()


if __name__ == "__main__":
    main()
