"""Fed Zig-Zag's switching rate against the number of workers on the paper's Gaussian example
(seed 003, Section 6.1, Figs. 1-2): the mean rate grows as sqrt(M), and what that costs in ESS.

Model (the paper's): ``N = 50`` observations ``y_n ~ N(mu, alpha^2 I_d)`` with ``d = 10``,
``alpha = 1``, true mean ``mu_0 = (0.5, ..., 0.5)``, a flat prior (the server has no events, no
refreshment), so the posterior is ``N(ybar, alpha^2 I / N)``. The rows are split into ``M``
consecutive equal shards (``numpy.array_split``; ``M`` divides 50), worker ``m`` holding
``U_m(x) = sum_{n in m} |y_n - x|^2 / (2 alpha^2)`` (exact affine rates, no thinning). Fed Zig-Zag
through :func:`fedbayes_flwr.algorithms.pdmc.driver.simulate`.

**Theory** (Section 4.1): under the posterior, with ``v`` uniform, worker ``m``'s rate on
coordinate ``i`` is ``(v_i n_m (x_i - ybar_mi) / alpha^2)^+`` and ``x_i - ybar_mi`` is, over the
data, ``N(0, alpha^2 / n_m)``; summed over the ``M`` workers and ``d`` coordinates the expected
rate is ``d sqrt(N M) / (alpha sqrt(2 pi))``: exponent 1/2 in ``M`` (the paper's ``sigma_0
sqrt(N M)`` with the constant). Given one data set the expectation is also exact:
``sum_{m,i} (n_m / (2 alpha^2)) E|N(ybar_i - ybar_mi, alpha^2 / N)|`` (the "conditional theory"
column); the data-averaged line is what the figure shows.

**Runs.** ``--runs`` (20) independent runs per ``M``; run ``r`` draws its data from seed
``(seed, r)`` (the same data for every ``M``, so each run also has its own exponent) and ``K``
chains (``--chains``, 16) from ``x = 0`` with uniform velocities. Each chain runs ``--burn-in``
(2) units of process time, excluded (its events and gradients are not counted), then
``--process-time`` ``T`` (5) more, sampled every ``--delta`` (0.05). Reported per ``M``:

* the mean switching rate: events after burn-in per chain per unit time (mean and spread over
  runs), with the theory and the per-run conditional theory; the exponent is the least-squares
  slope of ``log(mean rate)`` on ``log M`` (also per run, and with its standard error);
* ESS (``tfp.mcmc`` through :class:`fedbayes_flwr.inference.posterior.SamplePosterior`, the run's chains
  pooled, mean over coordinates), and ESS per event, per full-data gradient and per gradient of
  the busiest worker (Remark 4.1, Fig. 2). A worker's gradient evaluation at one point counts
  ``n_m`` data-point gradients (what evaluating it from its rows costs; the library's quadratic
  uses the shard's mean, so its own cost does not grow with ``n_m``); "full-data gradients" are
  all workers' data-point gradients over ``N`` (the sequential cost), "busiest worker" the
  largest single worker's over ``N`` (the parallel cost: the exchange waits for everyone);
* a cross-check of the ESS that needs no autocorrelation estimate: the posterior mean ``ybar``
  is known, so ``1 / mean((chain mean - ybar)^2 N / alpha^2)`` over chains, coordinates and runs
  is the per-chain ESS of the mean, compared with tfp's per-chain ESS.

**Claim** (the issue's, computed as stated): the fitted exponent of the mean rate lies in
[0.4, 0.6]. Remark 4.1's prediction, reported not thresholded: ESS per event falls with ``M``.

The size is set to finish well within 10 minutes on one core (the committed results: 311 s on a
shared 2-core machine; ``M = 50`` dominates: ~200 events per unit time, 50 workers per exchange);
the paper's runs are longer. ``--quick``: 3 runs, ``T = 2``, results under the work dir;
``--replot``: redraw from the JSON.

Run: ``.venv/bin/python benchmarks/pdmc/pdmc_switching.py`` (options ``--runs``, ``--chains``,
``--process-time``, ``--burn-in``, ``--delta``, ``--workers``, ``--seed``, ``--results-dir``).
Writes ``benchmarks/results/pdmc/pdmc_switching.json`` (settings, every run, the summary; rewritten
after every ``M``) and ``pdmc_switching.png`` (log-log rate vs ``M`` with the theory line and the
fit; ESS per event and per gradient vs ``M``).

References
----------
The seed paper, "Federated Bayesian Computation via Piecewise Deterministic Markov Processes",
Section 4.1 (the sqrt(M) switching rate), Remark 4.1 (diffusive behaviour) and Section 6.1
(this example, Figs. 1-2); Bierkens, Fearnhead & Roberts (2019), "The Zig-Zag process and
super-efficient sampling for Bayesian analysis of big data".
"""

from __future__ import annotations

import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common
import numpy as np

NAME = "pdmc_switching"
D, N, ALPHA, MU0 = 10, 50, 1.0, 0.5
WORKERS = (1, 2, 5, 10, 25, 50)
EXPONENT_RANGE = (0.4, 0.6)


class Counted:
    """A worker's potential that counts its gradient evaluations (points, and data-point
    gradients: points times the shard's ``rows``); everything else is the wrapped one's."""

    def __init__(self, inner, rows: int):
        self.inner, self.rows, self.points = inner, int(rows), 0
        self.dim, self.quadratic = inner.dim, inner.quadratic
        self.hess_bound, self.hess_abs = inner.hess_bound, inner.hess_abs
        if inner.quadratic:
            self.hessian = inner.hessian

    def grad(self, x):
        self.points += x.shape[0]
        return self.inner.grad(x)

    @property
    def data_grads(self) -> int:
        return self.points * self.rows


def gradient_work(workers: list[Counted], n_total: int) -> dict:
    """Full-data gradient equivalents (all workers) and the busiest worker's, so far."""
    per = np.array([w.data_grads for w in workers], dtype=np.float64) / n_total
    return {"worker_points": int(sum(w.points for w in workers)),
            "full_grads": float(per.sum()), "busiest_worker_grads": float(per.max())}


def sub_seed(*keys: int) -> int:
    """A 32-bit seed for :func:`simulate` (its streams are ``[seed, exchange, worker]``)."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0])


def theory_rate(m: int) -> float:
    """Expected switching rate over posterior and data: ``d sqrt(N M) / (alpha sqrt(2 pi))``."""
    return D * math.sqrt(N * m) / (ALPHA * math.sqrt(2 * math.pi))


def conditional_rate(y: np.ndarray, m: int) -> float:
    """The posterior expected rate for this data set (``x ~ N(ybar, alpha^2 I / N)``, ``v``
    uniform): ``sum_{m,i} (n_m / 2 alpha^2) E|N(ybar_i - ybar_mi, alpha^2 / N)|``."""
    from scipy.stats import norm

    s = ALPHA / math.sqrt(len(y))
    total = 0.0
    for shard in np.array_split(y, m):
        mu = y.mean(0) - shard.mean(0)
        folded = s * math.sqrt(2 / math.pi) * np.exp(-0.5 * (mu / s) ** 2) + mu * (
            1 - 2 * norm.cdf(-mu / s))
        total += len(shard) / (2 * ALPHA**2) * folded.sum()
    return float(total)


def run_one(m: int, r: int, args) -> dict:
    from fedbayes_flwr.algorithms.pdmc import sampler as S
    from fedbayes_flwr.algorithms.pdmc.driver import simulate
    from fedbayes_flwr.inference import potentials as P
    from fedbayes_flwr.inference.posterior import SamplePosterior

    y = MU0 + ALPHA * np.random.default_rng([args.seed, r]).standard_normal((N, D))
    workers = [Counted(P.gaussian_mean_potential(shard, ALPHA**2), len(shard))
               for shard in np.array_split(y, m)]
    prior = P.gaussian_prior_potential(D, None)  # flat: U_0 = 0
    k = args.chains
    rng = np.random.default_rng([args.seed, r, m, 1])
    t0 = time.perf_counter()
    burn = simulate(workers, prior, "zigzag", np.zeros((k, D)),
                    S.initial_velocity("zigzag", rng, k, D), process_time=args.burn_in,
                    delta=args.burn_in, seed=sub_seed(args.seed, r, m, 0))
    before = gradient_work(workers, N)
    run = simulate(workers, prior, "zigzag", burn.x, burn.v, process_time=args.process_time,
                   delta=args.delta, seed=sub_seed(args.seed, r, m, 1))
    wall = time.perf_counter() - t0
    after = gradient_work(workers, N)
    work = {key: after[key] - before[key] for key in after}
    events = int(run.events.sum())
    ess = SamplePosterior(run.chains).ess()
    ybar = y.mean(0)
    z2 = (run.chains.mean(1) - ybar) ** 2 * N / ALPHA**2  # (K, d): 1 / ESS of one chain's mean
    return {"run": r, "workers": m, "rate": events / (k * args.process_time),
            "rate_per_chain": (run.events / args.process_time).tolist(),
            "conditional_theory_rate": conditional_rate(y, m),
            "events": events, "exchanges": run.exchanges, **work,
            "library_grad_evals": int(run.grad_evals),
            "samples_per_chain": int(run.chains.shape[1]),
            "ess": ess.tolist(), "ess_mean": float(ess.mean()), "ess_min": float(ess.min()),
            "ess_per_event": float(ess.mean() / events),
            "ess_per_full_grad": float(ess.mean() / work["full_grads"]),
            "ess_per_busiest_worker_grad": float(ess.mean() / work["busiest_worker_grads"]),
            "mean_sq_error_scaled": z2.tolist(),
            "posterior_mean_abs_error": float(np.abs(run.chains.reshape(-1, D).mean(0)
                                                     - ybar).max()),
            "wall_s": round(wall, 2)}


def fit_exponent(ms, rates) -> dict:
    """Least-squares slope of ``log rate`` on ``log M``, with its standard error."""
    x, yv = np.log(np.asarray(ms, float)), np.log(np.asarray(rates, float))
    a = np.vstack([x, np.ones_like(x)]).T
    (slope, icpt), *_ = np.linalg.lstsq(a, yv, rcond=None)
    resid = yv - a @ [slope, icpt]
    dof = max(len(x) - 2, 1)
    se = math.sqrt(resid @ resid / dof / np.sum((x - x.mean()) ** 2)) if len(x) > 2 else None
    return {"exponent": float(slope), "intercept": float(icpt), "std_error": se}


def summarise(rows: list[dict], workers, args) -> dict:
    per_m = {}
    for m in workers:
        rs = [r for r in rows if r["workers"] == m]
        if not rs:
            continue
        z2 = np.concatenate([np.ravel(r["mean_sq_error_scaled"]) for r in rs])
        ess_exact_chain = float(1.0 / z2.mean())
        per_m[m] = {
            "runs": len(rs),
            "rate": common.spread([r["rate"] for r in rs]),
            "theory_rate": theory_rate(m),
            "conditional_theory_rate": float(np.mean([r["conditional_theory_rate"] for r in rs])),
            "rate_over_conditional_theory": common.spread(
                [r["rate"] / r["conditional_theory_rate"] for r in rs]),
            **{key: common.spread([r[key] for r in rs])
               for key in ("ess_mean", "ess_min", "ess_per_event", "ess_per_full_grad",
                           "ess_per_busiest_worker_grad", "wall_s")},
            "ess_per_chain_tfp": float(np.mean([r["ess_mean"] for r in rs]) / args.chains),
            "ess_per_chain_from_exact_mean": ess_exact_chain,
            "events_per_run": float(np.mean([r["events"] for r in rs])),
            "full_grads_per_run": float(np.mean([r["full_grads"] for r in rs])),
        }
    ms = sorted(per_m)
    fit = fit_exponent(ms, [per_m[m]["rate"]["mean"] for m in ms])
    runs = sorted({r["run"] for r in rows})
    per_run = [fit_exponent(ms, [next(x["rate"] for x in rows if x["run"] == r
                                      and x["workers"] == m) for m in ms])["exponent"]
               for r in runs
               if all(any(x["run"] == r and x["workers"] == m for x in rows) for m in ms)]
    lo, hi = EXPONENT_RANGE
    epe = [per_m[m]["ess_per_event"]["mean"] for m in ms]
    return {"per_workers": {str(m): v for m, v in per_m.items()}, "fit": fit,
            "per_run_exponent": common.spread(per_run) if per_run else None,
            "theory_exponent": 0.5,
            "claim": {"exponent": fit["exponent"], "range": list(EXPONENT_RANGE),
                      "exponent_in_range": bool(lo <= fit["exponent"] <= hi),
                      "ess_per_event_decreasing_in_M": bool(np.all(np.diff(epe) < 0)),
                      "ess_per_event_first_over_last": epe[0] / epe[-1] if epe else None}}


def table(summary: dict) -> str:
    lines = ["   M  rate mean (sd)      theory  cond.theory  obs/cond   ESS/chain tfp|exact"
             "  ESS/event  ESS/full-grad  ESS/busiest-grad  wall s/run"]
    for m, s in summary["per_workers"].items():
        lines.append(
            f"{int(m):4d}  {s['rate']['mean']:8.2f} ({s['rate']['std']:5.2f})  "
            f"{s['theory_rate']:8.2f}  {s['conditional_theory_rate']:10.2f}  "
            f"{s['rate_over_conditional_theory']['mean']:7.3f}   "
            f"{s['ess_per_chain_tfp']:7.1f} | {s['ess_per_chain_from_exact_mean']:6.1f}  "
            f"{s['ess_per_event']['mean']:9.5f}  {s['ess_per_full_grad']['mean']:13.5f}  "
            f"{s['ess_per_busiest_worker_grad']['mean']:16.4f}  {s['wall_s']['mean']:9.2f}")
    f, c = summary["fit"], summary["claim"]
    pr = summary["per_run_exponent"]
    se = f"{f['std_error']:.3f}" if f["std_error"] is not None else "n/a"
    lines.append(f"fitted exponent of the mean rate: {f['exponent']:.4f} (se {se}; theory 0.5)"
                 + (f"; per run: mean {pr['mean']:.4f}, range [{pr['min']:.4f}, {pr['max']:.4f}]"
                    if pr else ""))
    lines.append(f"claim: exponent in [{c['range'][0]}, {c['range'][1]}]: "
                 f"{'PASS' if c['exponent_in_range'] else 'FAIL'}; ESS per event decreasing in M "
                 f"(Remark 4.1): {c['ess_per_event_decreasing_in_M']} "
                 f"(M={list(summary['per_workers'])[0]} / M={list(summary['per_workers'])[-1]}: "
                 f"{c['ess_per_event_first_over_last']:.1f}x)")
    return "\n".join(lines)


def plot(rows: list[dict], summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = summary["per_workers"]
    ms = np.array([int(m) for m in per])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    ax = axes[0]
    ax.scatter([r["workers"] for r in rows], [r["rate"] for r in rows], s=8, alpha=0.35,
               color="tab:gray", label="runs")
    ax.plot(ms, [per[str(m)]["rate"]["mean"] for m in ms], "o", color="tab:blue",
            label="mean over runs")
    grid = np.geomspace(ms.min(), ms.max(), 100)
    ax.plot(grid, [theory_rate(m) for m in grid], "k-", lw=1.2,
            label=r"theory $d\sqrt{NM}/(\alpha\sqrt{2\pi})$")
    f = summary["fit"]
    ax.plot(grid, np.exp(f["intercept"]) * grid ** f["exponent"], "--", color="tab:red",
            label=f"fit: exponent {f['exponent']:.3f}")
    common.workers_axes(ax, ms, "switching rate (events / unit time)")
    ax.set_title(f"Fed Zig-Zag, Gaussian d={D}, N={N}: mean switching rate")
    ax.legend(fontsize=8)
    common.plot_ess_per_work(axes[1], per, ms, "efficiency (Remark 4.1)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = common.argument_parser(__doc__, "3 runs, T = 2", "unused (no rounds)")
    parser.add_argument("--runs", type=int, default=None, help="runs per M (default 20)")
    parser.add_argument("--chains", type=int, default=16, help="chains per run")
    parser.add_argument("--process-time", type=float, default=None,
                        help="process time after burn-in (default 5; quick 2)")
    parser.add_argument("--burn-in", type=float, default=2.0)
    parser.add_argument("--delta", type=float, default=0.05, help="sample spacing")
    parser.add_argument("--workers", type=int, nargs="+", default=list(WORKERS))
    parser.add_argument("--replot", action="store_true",
                        help="redraw the plot and the table from the existing JSON; run nothing")
    args = common.resolve_common_args(parser.parse_args(), NAME)
    if args.replot:
        return common.replot(args, NAME, plot, table)
    if args.runs is None:
        args.runs = 3 if args.quick else 20
    if args.process_time is None:
        args.process_time = 2.0 if args.quick else 5.0
    bad = [m for m in args.workers if N % m]
    if bad:
        raise SystemExit(f"--workers must divide N = {N}: {bad}")
    results = common.start(NAME, args, {"runs": []}, model={"d": D, "N": N, "alpha": ALPHA,
                                                            "mu0": MU0, "prior": "flat"},
                           sampler="zigzag", workers=args.workers, num_runs=args.runs,
                           chains=args.chains, process_time=args.process_time,
                           burn_in=args.burn_in, delta=args.delta, x0="zeros",
                           refresh=0.0)
    for m in args.workers:
        t0 = time.perf_counter()
        for r in range(args.runs):
            results.doc["runs"].append(run_one(m, r, args))
        results.write()
        done = [x for x in results.doc["runs"] if x["workers"] == m]
        print(f"M={m:3d} ({time.perf_counter() - t0:6.1f}s): rate "
              f"{np.mean([x['rate'] for x in done]):8.2f} (theory {theory_rate(m):8.2f}), "
              f"ESS/event {np.mean([x['ess_per_event'] for x in done]):.5f}", flush=True)
    summary = summarise(results.doc["runs"], args.workers, args)
    results.doc["summary"] = summary
    results.doc["claim"] = summary["claim"]
    results.write()
    plot(results.doc["runs"], summary, os.path.join(args.results_dir, f"{NAME}.png"))
    print(table(summary))
    results.finish()


if __name__ == "__main__":
    main()
