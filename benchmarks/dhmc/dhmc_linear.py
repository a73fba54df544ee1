"""Decentralized Metropolis-adjusted HMC on linear regression against the exact posterior: how the
number of mixing rounds, the step size, the decision rule, the integrator and the energy term
change bias, acceptance, the agents' disagreement, consensus and efficiency.

Data: ``load_dataset("synthetic", "real", synthetic="linear", seed=--data-seed (0),
synthetic_size=250, synthetic_dim=3)``: 200 training rows (the test rows are unused), noise
scale 1, prior ``N(0, I)``; the posterior is Gaussian and known exactly. The rows are split into
5 consecutive shards (``numpy.array_split``), agent ``i`` holding ``U_i`` = its rows' negative
log-likelihood plus a fifth of the prior's (:class:`fedbayes_flwr.algorithms.dhmc.agents.LocalPotential`).
Graphs: a ring of 5 (the main table), a path and the complete graph, Metropolis weights
(:mod:`fedbayes_flwr.algorithms.decentralized.graphs`; on the complete graph they average exactly, so
``s`` is moot there:
a control).

**Runs** (:func:`fedbayes_flwr.algorithms.dhmc.loop.simulate`): 16 chains started overdispersed around the
posterior (exact mean + 2 sd x N(0, 1), the same starts for every run), ``--warmup`` (200)
iterations discarded (the Metropolis test on, the library's default; the step adapted there by
dual averaging when "adapted"), then ``--iterations`` (2,000) kept. Factors: mixing rounds ``s``
in 1 2 5 10; step 0.04, 0.02 or adapted (dual averaging from 0.04 to mean acceptance probability
0.6, the agents' mean); decision ``local`` (each agent its own test) or ``flood`` (the agents
agree: all move only if every agent's own test accepts, the "agree" rule); integrator
``leapfrog`` (velocity Verlet) or ``euler`` (the paper's symplectic-Euler step, "decentralized
MALA"); energy ``taylor`` (the paper's second-order term) or ``exact`` (local potential
differences). Ring: all combinations with the Taylor energy; the exact energy for s in 1 10,
leapfrog (on a quadratic potential the Taylor term IS the exact local difference, so the two
make the same moves until a rounding difference flips one decision: a check, at twice the
gradient cost). Path and complete: leapfrog, Taylor, both decisions. **Step sweep** (ring,
flood and local, leapfrog and euler, s = 10 and s = 1): steps 0.08 0.06 0.04 0.02 0.01 0.005, to
show the bias against the step size. **Warm-up with the test off** (the paper's MH burn-in,
``warmup_metropolis=False``) and **a cold start** from 0 (about 20 posterior sd away), both on
the ring at s in 1 10, leapfrog: whether the warm-up matters and whether chains get stuck at
their start (counted: chains whose agents never moved during the warm-up).

**Per run:** pooled (all agents, chains, kept iterations) mean error over the posterior sd (max
over coordinates) and as a z-score against its Monte Carlo standard error (MCSE, from the ESS of
the agents' average per chain: independent chains, never agents); the variance ratio (pooled
variance / exact, mean over coordinates and the worst ``|ratio - 1|``), also of the agents'
average (without their spread) with its MCSE z-score; acceptance (fraction of agent-chain
moves); the LOCAL disagreement rate (fraction of iteration-chains where the agents' own tests
disagree, whatever the decision rule); the consensus error (agents' variance around their
average, relative to the posterior variance, mean over kept iterations); the fraction of agent
moves in the first and last quarter of the kept iterations (a falling rate shows drift); the
adapted step; ESS
per gradient evaluation (min over coordinates of the ESS of the agents' average, divided by
chains x gradient evaluations per agent per chain, warm-up included: one iteration of all agents
is one full-data gradient; the exact energy counts two).

**Tracker drift** (ring, step 0.04, s in 1 2 5 10, local and flood): the iteration rebuilt from
:mod:`fedbayes_flwr.algorithms.dhmc.agents` so that the gradient trackers can be read, reporting the
invariant's
error ``m |mean_i y_i - mean_i grad U_i(w_i)|`` (largest over chains and coordinates) in the first
and last tenth of the run. Under ``flood`` every agent takes the same branch (the tracker after
the move, or ``W^s y`` after a rejection) and the invariant holds to rounding; under ``local`` an
agent that rejects drops the increment it has already mixed into its neighbours' trackers, and
one that accepts keeps the increments of neighbours that rejected, so the error performs a random
walk while the agents disagree.

Run: ``.venv/bin/python benchmarks/dhmc/dhmc_linear.py`` (about 4 minutes on one core; ``--quick``:
500 iterations, fewer settings, results under the work dir; ``--replot``: redraw the plot from
the JSON). Writes
``benchmarks/results/dhmc/dhmc_linear.json`` and ``dhmc_linear.png`` (acceptance, disagreement,
consensus against s; variance ratio and mean error against the step).

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Algorithm 1 and Theorems 3.1-3.3 (consensus error
``O(epsilon^2)``, Taylor error ``O(epsilon^3)``); Neal (2011), "MCMC using Hamiltonian dynamics";
Hoffman & Gelman (2014), "The No-U-Turn Sampler" (dual averaging).
"""

from __future__ import annotations

import itertools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common
import numpy as np

NAME = "dhmc_linear"
AGENTS, FEATURES, SIZE = 5, 3, 250
CHAINS = 16
ROUNDS = (1, 2, 5, 10)
STEPS = (0.04, 0.02, "adapted")
ADAPT_FROM = 0.04
SWEEP = (0.08, 0.06, 0.04, 0.02, 0.01, 0.005)
TARGET_ACCEPT = 0.6


def load_problem(seed: int):
    from fedbayes_flwr.algorithms.dhmc import agents as dhmc
    from fedbayes_flwr.data import load_dataset
    from fedbayes_flwr.inference import potentials as P

    data = load_dataset("synthetic", "real", synthetic="linear", seed=seed,
                        synthetic_size=SIZE, synthetic_dim=FEATURES)
    x, y = data.x_train, data.y_train
    prior = P.gaussian_prior_potential(FEATURES, 1.0)
    pots = [dhmc.LocalPotential(P.linear_regression_potential(x[i], y[i], 1.0), prior, AGENTS)
            for i in np.array_split(np.arange(len(x)), AGENTS)]
    cov = np.linalg.inv(x.T @ x + np.eye(FEATURES))
    return pots, cov @ (x.T @ y), np.diag(cov), len(x)


def measure(run, mean, var) -> dict:
    """The per-run numbers (module docstring)."""
    from fedbayes_flwr.inference.posterior import SamplePosterior

    s = run.samples  # (m, K, T, d)
    avg = s.mean(axis=0)  # (K, T, d)
    d = s.shape[-1]
    flat, avg_flat = s.reshape(-1, d), avg.reshape(-1, d)
    ess = SamplePosterior(avg).ess()
    sq_ess = SamplePosterior((avg - avg_flat.mean(0)) ** 2).ess()
    sd = np.sqrt(var)
    err = flat.mean(0) - mean
    ratio = flat.var(0) / var
    avg_ratio = avg_flat.var(0) / var
    k = s.shape[1]
    moved = np.any(np.diff(s, axis=2) != 0, axis=-1).mean(axis=(0, 1))  # per iteration
    q = max(len(moved) // 4, 1)
    return {
        "moved_first_quarter": float(moved[:q].mean()) if len(moved) else float("nan"),
        "moved_last_quarter": float(moved[-q:].mean()) if len(moved) else float("nan"),
        "mean_err_over_sd": float(np.max(np.abs(err) / sd)),
        "mean_err_z": float(np.max(np.abs(err) / np.sqrt(var / ess))),
        "var_ratio_mean": float(ratio.mean()),
        "var_ratio_worst_dev": float(np.max(np.abs(ratio - 1))),
        "var_ratio": ratio.tolist(),
        "avg_var_ratio_mean": float(avg_ratio.mean()),
        "avg_var_ratio_z": float(np.max(np.abs(avg_ratio - 1) / np.sqrt(2 / sq_ess))),
        "accept_rate": run.accept_rate,
        "disagreement": run.disagreement,
        "consensus": float(np.mean(run.consensus)),
        "consensus_max": float(np.max(run.consensus)),
        "epsilon": run.epsilon,
        "ess_min": float(ess.min()),
        "grad_evals": int(run.grad_evals),
        "ess_per_grad": float(ess.min() / (k * run.grad_evals)),
    }


def start(mean, var, seed: int, kind: str) -> np.ndarray:
    """``(CHAINS, d)`` starts: ``overdispersed`` = exact mean + 2 sd x N(0, 1) per chain, or
    ``zero`` (about 20 posterior sd away)."""
    if kind == "zero":
        return np.zeros((CHAINS, FEATURES))
    rng = np.random.default_rng([seed, 99])
    return mean + 2.0 * np.sqrt(var) * rng.standard_normal((CHAINS, FEATURES))


KEEP_SAMPLES = {}  # (rounds, step, decision, energy) -> samples, for the energy check


def one(pots, mixing, mean, var, args, *, graph, rounds, step, decision, integrator, energy,
        section, warmup_metropolis=True, init="overdispersed") -> dict:
    from fedbayes_flwr.algorithms.dhmc.loop import simulate

    adapted = step == "adapted"
    w0 = start(mean, var, args.seed, init)
    t0 = time.perf_counter()
    run = simulate(pots, mixing, w0, ADAPT_FROM if adapted else step,
                   args.iterations, warmup=args.warmup, rounds=rounds, seed=args.seed,
                   integrator=integrator, energy=energy, adapt=adapted,
                   target_accept=TARGET_ACCEPT, posterior_var=var, decision=decision,
                   warmup_metropolis=warmup_metropolis)
    wall = time.perf_counter() - t0
    # chains whose agents never left the start during the warm-up / the whole run
    first, last = run.samples[:, :, 0], run.samples[:, :, -1]
    stuck = {"stuck_after_warmup": float(np.mean(np.all(first == w0, axis=(0, 2)))),
             "stuck_at_end": float(np.mean(np.all(last == w0, axis=(0, 2))))}
    extra = {}
    if graph == "ring" and integrator == "leapfrog" and section in ("ring", "energy") \
            and rounds in (1, 10):
        key = (rounds, step, decision)
        if energy == "taylor":
            KEEP_SAMPLES[key] = run.samples
        elif key in KEEP_SAMPLES:  # the Taylor run of the same settings came first
            diff = np.max(np.abs(run.samples - KEEP_SAMPLES[key]), axis=(0, 1, 3))
            off = np.flatnonzero(diff > 1e-8)
            extra = {"max_abs_diff_to_taylor_first_100": float(diff[:100].max()),
                     "first_iteration_apart_from_taylor":
                         int(off[0]) if off.size else None}
    return {"section": section, "graph": graph, "rounds": rounds, "step": step,
            "decision": decision, "integrator": integrator, "energy": energy,
            "warmup_metropolis": warmup_metropolis, "init": init, **stuck, **extra,
            **measure(run, mean, var), "wall_s": round(wall, 2)}


def tracker_drift(pots, mixing, w0, epsilon, iterations, rounds, decision, seed) -> dict:
    """The gradient tracker's invariant ``mean_i y_i = mean_i grad U_i(w_i)`` along a run: the
    iteration of :func:`fedbayes_flwr.algorithms.dhmc.loop.simulate` (fixed step, no warm-up) rebuilt from
    the agents' maths (:mod:`fedbayes_flwr.algorithms.dhmc.agents`) so the trackers can be read. Returns
    ``m max |mean y - mean g_last|`` (network-gradient units, largest over chains and
    coordinates) over the first and last tenth of the run, and the fraction of agent moves."""
    from fedbayes_flwr.algorithms.dhmc import agents as dhmc

    m = len(pots)
    k, d = w0.shape
    mix = np.linalg.matrix_power(mixing, rounds)
    states = [dhmc.init_agent(pot, w0) for pot in pots]
    errors, moves = [], []
    for it in range(iterations):
        p, log_u = dhmc.shared_draws(np.random.default_rng([seed, it]), k, d)
        begun = [dhmc.begin(st, pot, p, epsilon, m) for st, pot in zip(states, pots, strict=True)]
        z = np.tensordot(mix, np.stack([b[1] for b in begun]), axes=1)
        a = np.tensordot(mix, np.stack([b[2] for b in begun]), axes=1)
        tracked = [dhmc.track(b[0], pot, z[i])
                   for i, (b, pot) in enumerate(zip(begun, pots, strict=True))]
        y = np.tensordot(mix, np.stack([t[1] for t in tracked]), axes=1)
        y_kept = np.tensordot(mix, np.stack([t[0].y for t in tracked]), axes=1)
        outs = [dhmc.decide(t[0], a[i], y[i], log_u, epsilon, m) for i, t in enumerate(tracked)]
        decided = np.stack([o.accepted for o in outs])
        final = decided if decision == "local" else np.broadcast_to(decided.all(axis=0),
                                                                    decided.shape)
        states = [dhmc.apply(t[0], z[i], a[i], y[i], y_kept[i], final[i])
                  for i, t in enumerate(tracked)]
        gap = m * (np.mean([st.y for st in states], axis=0)
                   - np.mean([st.g_last for st in states], axis=0))
        errors.append(float(np.max(np.abs(gap))))
        moves.append(float(final.mean()))
    tenth = max(iterations // 10, 1)
    return {"tracker_error_first_tenth": float(np.mean(errors[:tenth])),
            "tracker_error_last_tenth": float(np.mean(errors[-tenth:])),
            "accept_first_tenth": float(np.mean(moves[:tenth])),
            "accept_last_tenth": float(np.mean(moves[-tenth:]))}


def settings(args) -> list[dict]:
    """Every run, in order."""
    rows = []
    rounds = (1, 10) if args.quick else ROUNDS
    steps = (0.04, "adapted") if args.quick else STEPS
    for s, step, dec, integ in itertools.product(rounds, steps, ("local", "flood"),
                                                 ("leapfrog", "euler")):
        rows.append(dict(section="ring", graph="ring", rounds=s, step=step, decision=dec,
                         integrator=integ, energy="taylor"))
    for s, step, dec in itertools.product((1, 10), steps, ("local", "flood")):
        rows.append(dict(section="energy", graph="ring", rounds=s, step=step, decision=dec,
                         integrator="leapfrog", energy="exact"))
    for g, s, step, dec in itertools.product(("path", "complete"), rounds, steps,
                                             ("local", "flood")):
        rows.append(dict(section="graphs", graph=g, rounds=s, step=step, decision=dec,
                         integrator="leapfrog", energy="taylor"))
    sweep = (0.08, 0.04, 0.01) if args.quick else SWEEP
    for s, dec, integ, step in itertools.product((10, 1), ("flood", "local"),
                                                 ("leapfrog", "euler"), sweep):
        if s == 1 and dec == "flood":
            continue  # flood at s = 1 mostly rejects; the ring table has it
        rows.append(dict(section="sweep", graph="ring", rounds=s, step=step, decision=dec,
                         integrator=integ, energy="taylor"))
    for s, step, dec in itertools.product((1, 10), (0.04, "adapted"), ("local", "flood")):
        rows.append(dict(section="warmup_test_off", graph="ring", rounds=s, step=step,
                         decision=dec, integrator="leapfrog", energy="taylor",
                         warmup_metropolis=False))
    for s, step, dec in itertools.product((1, 10), (0.04, "adapted"), ("local", "flood")):
        rows.append(dict(section="start_zero", graph="ring", rounds=s, step=step,
                         decision=dec, integrator="leapfrog", energy="taylor", init="zero"))
    return rows


def find(rows, **keys):
    for r in rows:
        if all(r[k] == v for k, v in keys.items()):
            return r
    return None


def fmt_step(step) -> str:
    return step if isinstance(step, str) else f"{step:g}"


def table(rows: list[dict], section: str) -> str:
    head = (f"{'graph':8s} {'s':>2s} {'step':>8s} {'decision':8s} {'integr.':8s} {'energy':6s} "
            f"{'eps':>6s} {'|err|/sd':>8s} {'z':>5s} {'var/ex':>6s} {'avg var':>7s} {'z':>5s} "
            f"{'accept':>6s} {'mv q1':>5s} {'mv q4':>5s} {'disagr':>6s} {'consens':>8s} "
            f"{'ESS/grad':>8s}")
    lines = [head]
    for r in rows:
        if r["section"] != section:
            continue
        lines.append(
            f"{r['graph']:8s} {r['rounds']:>2d} {fmt_step(r['step']):>8s} {r['decision']:8s} "
            f"{r['integrator']:8s} {r['energy']:6s} {r['epsilon']:6.4f} "
            f"{r['mean_err_over_sd']:8.3f} {r['mean_err_z']:5.1f} {r['var_ratio_mean']:6.3f} "
            f"{r['avg_var_ratio_mean']:7.3f} {r['avg_var_ratio_z']:5.1f} {r['accept_rate']:6.3f} "
            f"{r['moved_first_quarter']:5.3f} {r['moved_last_quarter']:5.3f} "
            f"{r['disagreement']:6.3f} {r['consensus']:8.2e} {r['ess_per_grad']:8.4f}")
    return "\n".join(lines)


def energy_check(rows: list[dict]) -> dict:
    """Exact vs Taylor energy, same settings: the largest differences."""
    diffs = {"accept_rate": 0.0, "disagreement": 0.0, "var_ratio_mean": 0.0, "pairs": 0,
             "max_abs_diff_first_100_iterations": 0.0, "first_iterations_apart": []}
    for r in rows:
        if r["section"] != "energy":
            continue
        t = find(rows, section="ring", graph="ring", rounds=r["rounds"], step=r["step"],
                 decision=r["decision"], integrator="leapfrog", energy="taylor")
        if t is None:
            continue
        diffs["pairs"] += 1
        diffs["max_abs_diff_first_100_iterations"] = max(
            diffs["max_abs_diff_first_100_iterations"],
            r.get("max_abs_diff_to_taylor_first_100", float("nan")))
        diffs["first_iterations_apart"].append(r.get("first_iteration_apart_from_taylor"))
        for key in ("accept_rate", "disagreement", "var_ratio_mean"):
            diffs[key] = max(diffs[key], abs(r[key] - t[key]))
    return diffs


def summary(rows: list[dict]) -> dict:
    out = {"energy_exact_minus_taylor_max_abs": energy_check(rows)}
    ring = [r for r in rows if r["section"] == "ring"]
    by_s = {}
    for dec in ("local", "flood"):
        for s in sorted({r["rounds"] for r in ring}):
            sel = [r for r in ring if r["decision"] == dec and r["rounds"] == s
                   and r["integrator"] == "leapfrog"]
            by_s[f"{dec}_s{s}"] = {
                "disagreement_mean": float(np.mean([r["disagreement"] for r in sel])),
                "consensus_mean": float(np.mean([r["consensus"] for r in sel])),
                "accept_mean": float(np.mean([r["accept_rate"] for r in sel])),
                "var_ratio_mean": float(np.mean([r["var_ratio_mean"] for r in sel]))}
    out["ring_leapfrog_by_decision_and_s"] = by_s
    return out


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    styles = {("local", "leapfrog"): ("o-", "tab:red"), ("flood", "leapfrog"): ("s-", "tab:blue"),
              ("local", "euler"): ("o:", "tab:orange"), ("flood", "euler"): ("s:", "tab:cyan")}
    for ax, key, label, log in ((axes[0, 0], "accept_rate", "acceptance", False),
                                (axes[0, 1], "disagreement", "local disagreement rate", False),
                                (axes[0, 2], "consensus", "consensus error / posterior var",
                                 True)):
        for (dec, integ), (style, color) in styles.items():
            for step, alpha in zip(("adapted", 0.04), (1.0, 0.45), strict=True):
                sel = sorted((r for r in rows if r["section"] == "ring" and r["decision"] == dec
                              and r["integrator"] == integ and r["step"] == step),
                             key=lambda r: r["rounds"])
                if sel:
                    ax.plot([r["rounds"] for r in sel], [max(r[key], 1e-16) for r in sel],
                            style, color=color, alpha=alpha,
                            label=f"{dec}, {integ}, step {fmt_step(step)}")
        for g, style in (("path", "^--"), ("complete", "v--")):
            sel = sorted((r for r in rows if r["section"] == "graphs" and r["graph"] == g
                          and r["decision"] == "local" and r["step"] == "adapted"),
                         key=lambda r: r["rounds"])
            if sel:
                ax.plot([r["rounds"] for r in sel], [max(r[key], 1e-16) for r in sel], style,
                        color="gray", label=f"{g}, local, leapfrog, adapted")
        ax.set_xscale("log")
        ax.set_xticks(ROUNDS)
        ax.set_xticklabels([str(s) for s in ROUNDS])
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("mixing rounds s")
        ax.set_title(label + " (ring of 5 unless marked)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=6)
    sweep_styles = {(10, "flood", "leapfrog"): ("s-", "tab:blue"),
                    (10, "flood", "euler"): ("s:", "tab:cyan"),
                    (10, "local", "leapfrog"): ("o-", "tab:purple"),
                    (10, "local", "euler"): ("o:", "tab:pink"),
                    (1, "local", "leapfrog"): ("o-", "tab:red"),
                    (1, "local", "euler"): ("o:", "tab:orange")}
    for ax, key, label in ((axes[1, 0], "var_ratio_mean", "pooled variance / exact"),
                           (axes[1, 1], "avg_var_ratio_mean",
                            "agents' average: variance / exact"),
                           (axes[1, 2], "mean_err_over_sd", "pooled |mean error| / sd (max)")):
        for (s, dec, integ), (style, color) in sweep_styles.items():
            sel = sorted((r for r in rows if r["section"] == "sweep" and r["rounds"] == s
                          and r["decision"] == dec and r["integrator"] == integ),
                         key=lambda r: r["step"])
            if sel:
                ax.plot([r["step"] for r in sel], [r[key] for r in sel], style, color=color,
                        label=f"s={s}, {dec}, {integ}")
        if key != "mean_err_over_sd":
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xticks(SWEEP)
        ax.set_xticklabels([f"{v:g}" for v in SWEEP], fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("step size epsilon")
        ax.set_title(label + " (ring, step sweep)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[1, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = common.argument_parser(__doc__, "500 iterations, fewer settings",
                                    "unused (iterations: --iterations)")
    parser.add_argument("--iterations", type=int, default=None, help="kept iterations (2000)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up iterations (200)")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--replot", action="store_true",
                        help="redraw the plot from the existing JSON and stop")
    args = common.resolve_common_args(parser.parse_args(), NAME)
    if args.replot:
        import json

        with open(os.path.join(args.results_dir, f"{NAME}.json")) as f:
            plot(json.load(f)["runs"], os.path.join(args.results_dir, f"{NAME}.png"))
        return
    args.iterations = args.iterations or (500 if args.quick else 2000)
    args.warmup = args.warmup if args.warmup is not None else (100 if args.quick else 200)

    from fedbayes_flwr.algorithms.decentralized import graphs as gossip
    from fedbayes_flwr.algorithms.decentralized import mixing as mixmat

    pots, mean, var, n = load_problem(args.data_seed)
    graphs = {g: mixmat.metropolis_weights(getattr(gossip, g)(AGENTS))
              for g in ("ring", "path", "complete")}
    results = common.start(
        NAME, args, {"runs": []}, data_seed=args.data_seed, n_train=n, d=FEATURES,
        agents=AGENTS, chains=CHAINS, iterations=args.iterations, warmup=args.warmup,
        adapt_from=ADAPT_FROM, target_accept=TARGET_ACCEPT, prior="N(0, I)", noise_var=1.0,
        exact_mean=mean.tolist(), exact_sd=np.sqrt(var).tolist(),
        spectral_gap={g: mixmat.spectral_gap(w) for g, w in graphs.items()})
    todo = settings(args)
    print(f"{len(todo)} runs; exact posterior mean {np.round(mean, 3).tolist()}, sd "
          f"{np.round(np.sqrt(var), 4).tolist()}", flush=True)
    rows = results.doc["runs"]
    for i, cfg in enumerate(todo):
        row = one(pots, graphs[cfg["graph"]], mean, var, args, **cfg)
        rows.append(row)
        results.write()
        if (i + 1) % 20 == 0:
            print(f"  {i + 1}/{len(todo)} runs ({time.perf_counter() - results.t0:.0f}s)",
                  flush=True)
    # the tracker's invariant under both decision rules (ring, step 0.04)
    drift = []
    grad_scale = float(np.sqrt(np.mean(1.0 / var)))  # typical |grad U| at the posterior
    w0 = start(mean, var, args.seed, "overdispersed")
    for s, dec in itertools.product((1, 2, 5, 10) if not args.quick else (1, 10),
                                    ("local", "flood")):
        out = tracker_drift(pots, graphs["ring"], w0, 0.04, args.warmup + args.iterations, s,
                            dec, args.seed)
        drift.append({"rounds": s, "decision": dec, "grad_scale": grad_scale, **out})
    results.doc["tracker_drift"] = drift
    results.doc["summary"] = summary(rows)
    for section in ("ring", "energy", "graphs", "sweep", "warmup_test_off", "start_zero"):
        print(f"\n== {section}\n" + table(rows, section))
    stuck = [r["stuck_after_warmup"] for r in rows]
    print(f"chains that never left their start during the warm-up: largest fraction over runs "
          f"{max(stuck):.3f} (start_zero: "
          f"{max(r['stuck_after_warmup'] for r in rows if r['section'] == 'start_zero'):.3f})")
    print("\n== tracker invariant m|mean y - mean g_last| (ring, step 0.04; typical |grad U| "
          f"{grad_scale:.1f}): first / last tenth of {args.warmup + args.iterations} "
          "iterations, acceptance first / last tenth")
    for r in drift:
        print(f"s={r['rounds']:2d} {r['decision']:5s} {r['tracker_error_first_tenth']:9.3g} / "
              f"{r['tracker_error_last_tenth']:9.3g}   {r['accept_first_tenth']:.3f} / "
              f"{r['accept_last_tenth']:.3f}")
    print("\nexact - taylor energy (max abs over pairs):",
          results.doc["summary"]["energy_exact_minus_taylor_max_abs"])
    plot(rows, os.path.join(args.results_dir, f"{NAME}.png"))
    results.finish()


if __name__ == "__main__":
    main()
