"""Decentralized Metropolis-adjusted HMC on the seed paper's digit experiments (softmax regression
split by digit over a path, softmax regression on image quadrants, a one-hidden-layer BNN split in
two), against decentralized ULA and centralized HMC at equal iterations: test accuracy and NLL of
the running posterior predictive against iterations (the paper's curves).

Data: scikit-learn's 8x8 ``digits`` (``load_dataset("digits", "multiclass")``: 1,437 training and
360 test rows, 64 pixels scaled to [0, 1], 10 classes) standing in for the paper's MNIST. The
model is :class:`fedbayes_flwr.models.bnn.BNNClassifier`'s network through its numpy potential
(:class:`fedbayes_flwr.models.nets_numpy.SoftmaxNetPotential`: the softmax cross-entropy summed over an
agent's rows, exact gradient and Hessian quadratic form), prior ``N(0, PRIOR_SCALE^2 I)`` with
``PRIOR_SCALE = 1`` for every experiment and method (the reference code's precision 100 is for
54,000 MNIST rows and 784 pixels; on 1,437 digits it pulls the softmax MAP's test accuracy down
to 0.94 against 0.967 at scale 1). Agent ``i`` holds ``U_i = -log p(D_i | w) + |w|^2 / (2 m
PRIOR_SCALE^2)`` (:class:`fedbayes_flwr.algorithms.dhmc.agents.LocalPotential`, the prior split evenly).

Experiments (the reference code AdamCobb/dblmahmc, ``scripts/``):

* ``digit-split``: softmax regression (``d = 650``), 5 agents, agent ``i`` holds the training
  rows of digits ``2i`` and ``2i + 1``, on a PATH graph (0 - 1 - 2 - 3 - 4, Metropolis weights).
  The target is the ordinary posterior (every row once, prior once).
* ``quadrant``: softmax regression, 4 agents on a complete graph; each agent holds ALL training
  rows and labels, but only one 4x4 quadrant of each image (the other 48 pixels set to zero), as
  ``logistic_regression_partial_view.py`` does with MNIST's 14x14 quadrants. The network target
  ``prod_i U_i`` samples

      pi(w) propto p_0(w) prod_{i=1..4} prod_n p(y_n | x_n restricted to quadrant i, w),

  a product of experts: every label is counted four times, the prior once; it is NOT the
  posterior given the full images (the bias, seen by all four agents, is fitted to four copies of
  the labels). Every method samples this same target (centralized HMC runs on the sum of the four
  agents' potentials). Its predictive is evaluated, as the reference's metrics do, on the FULL
  test images (``softmax(x W + b)``, all quadrants at once). ``chmc-full``: centralized HMC on the
  ordinary posterior (full images, each label once), for comparison only.
* ``bnn``: one hidden layer of 100 ReLU units (``d = 7,510``), 2 agents holding digits 0-4 and
  5-9 (a complete graph of 2), as ``bnn_split_data.py``.

Methods (the same starts, warm-up and kept iterations; one iteration of every method costs one
full-data gradient summed over the agents):

* ``dhmc``: :func:`fedbayes_flwr.algorithms.dhmc.loop.simulate` with the bundle's defaults: leapfrog, exact
  energy, ``agree`` decision (every agent moves only if all accept; the step adapted on the
  agents' minimum acceptance probability, as the bundle does), ``mixing-rounds = auto`` (the
  least ``s`` with ``W^s`` keeping at most 1% of a disagreement: 34 on the path of 5, 1 on a
  complete graph), the step adapted by dual averaging in the warm-up from 0.01 (target
  acceptance 0.6, the Metropolis test on).
* ``dula``: :func:`fedbayes_flwr.algorithms.dhmc.baselines.decentralized_ula`, independent noise scaled so
  the network average runs ULA (DE-SGLD), the same mixing rounds, the reference code's decay
  ``h_t = h_0 (230 / (230 + t))^0.55`` from ``h_0 = epsilon_c^2 / 2`` (``epsilon_c`` the step
  centralized HMC adapted: MALA's step in Langevin units).
* ``chmc``: :func:`fedbayes_flwr.algorithms.dhmc.baselines.centralized_hmc` on the pooled potential, one
  leapfrog step per iteration, the same adaptation.
* ``dhmc-s10`` (``digit-split`` only): ``dhmc`` with the former fixed default of 10 mixing
  rounds. The path's Metropolis matrix has second eigenvalue 0.873, so ``W^10`` keeps 26% of a
  disagreement between agents: the agents' energy changes differ, agreed decisions accept only
  when all agree, and the step adapted on the minimum acceptance shrinks until the chains barely
  move.

On a complete graph the Metropolis weights are ``W = 11^T / m``: one round averages exactly,
the agents stay identical, and with the shared momenta ``dhmc`` makes exactly centralized HMC's
moves (the baselines' module docstring; the ``quadrant`` and ``bnn`` rows show it).

Starts: softmax regression, one prior draw per chain (seeded; stationary in the coordinates the
data do not constrain, e.g. the always-zero pixels); the BNN, one He draw per chain (weights
``N(0, 2 / fan_in)``, zero biases: a prior draw makes logits of sd ~25).

Recorded per method: at every ``thin``-th kept iteration, the test accuracy and NLL of the
running posterior predictive (the class probabilities averaged over all thinned draws so far,
pooled over chains), for each agent (the table and curves give the mean over agents; the worst
agent is in the JSON); ESS and R-hat across chains (never across agents) of the per-draw test
log-likelihood (a scalar meaningful for the BNN, whose parameters are not identifiable) and, for
softmax regression, of the parameters (agent 1's draws); acceptance rate, agents' disagreement,
consensus error (the agents' variance around their mean, relative to centralized HMC's
per-coordinate posterior variance, mean over kept iterations), step, wall time and iterations
per second.

Run: ``.venv/bin/python benchmarks/dhmc/dhmc_digits.py`` (4.5 CPU-minutes, one BLAS thread; 13
minutes wall measured with the 2 cores shared at load 7-11; ``--quick``:
a smoke run, results under the work dir; ``--replot``: redraw the plots from the JSON). Writes
``benchmarks/results/dhmc/dhmc_digits.json`` and ``dhmc_digits_<experiment>.png``.

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Section 4 (softmax regression on MNIST split by
digit over a ring/path and by image quadrant; a BNN with data split between two agents; accuracy
and NLL curves against DecentralizedULA and CentralizedHMC); Hinton (2002), "Training products of
experts by minimizing contrastive divergence" (products of experts); Parayil, Bai, George &
Gurram (2020) and Gurbuzbalaban, Gao, Hu & Zhu (2021) (decentralized Langevin).
"""

from __future__ import annotations

import os

# One BLAS thread: the machine has 2 shared cores, and the batched products here are small;
# threaded OpenBLAS under contention ran the BNN gradient 5-20x slower (measured).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import sys
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common  # noqa: E402
import numpy as np  # noqa: E402

NAME = "dhmc_digits"
EXPERIMENTS = {
    "digit-split": {"hidden": (), "agents": 5, "graph": "path"},
    "quadrant": {"hidden": (), "agents": 4, "graph": "complete"},
    "bnn": {"hidden": (100,), "agents": 2, "graph": "complete"},
}
METHODS = ("chmc", "dhmc", "dula")
PRIOR_SCALE = 1.0
ROUNDS_FIXED = 10
# Extra rows: dhmc with the former fixed default of 10 mixing rounds where the graph mixes
# slowly (the path's W^10 keeps 26% of a disagreement: second eigenvalue 0.873; the bundle's
# ``mixing-rounds = auto`` gives 34); centralized HMC on the ordinary posterior next to the
# quadrant experiment's product of experts.
EXTRA = {"digit-split": [f"dhmc-s{ROUNDS_FIXED}"], "quadrant": ["chmc-full"]}
STEP0 = 0.01
TARGET_ACCEPT = 0.6
# (chains, warm-up, kept iterations, thin) per model: full and --quick
SETTINGS = {"softmax": (8, 500, 2000, 10), "bnn": (4, 300, 1000, 10)}
QUICK = {"softmax": (4, 40, 100, 5), "bnn": (2, 20, 40, 5)}
QUADRANTS = ("top-left", "bottom-left", "bottom-right", "top-right")  # the reference's order


def quadrant_mask(name: str) -> np.ndarray:
    """``(64,)`` 0/1 mask of a 4x4 quadrant of the row-major 8x8 image."""
    top, left = name.startswith("top"), name.endswith("left")
    img = np.zeros((8, 8))
    img[(slice(0, 4) if top else slice(4, 8)), (slice(0, 4) if left else slice(4, 8))] = 1.0
    return img.reshape(-1)


def agent_data(experiment: str, x, y) -> list[tuple[np.ndarray, np.ndarray]]:
    if experiment == "digit-split":
        return [(x[(y == 2 * i) | (y == 2 * i + 1)], y[(y == 2 * i) | (y == 2 * i + 1)])
                for i in range(5)]
    if experiment == "quadrant":
        return [(x * quadrant_mask(q), y) for q in QUADRANTS]
    return [(x[y < 5], y[y < 5]), (x[y >= 5], y[y >= 5])]


def starts(sizes, chains: int, seed: int) -> np.ndarray:
    """``(K, d)``: prior draws (softmax regression) or He draws (hidden layers)."""
    rng = np.random.default_rng([seed, 17])
    if len(sizes) == 2:
        d = sizes[0] * sizes[1] + sizes[1]
        return PRIOR_SCALE * rng.standard_normal((chains, d))
    parts = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        parts += [rng.normal(0.0, np.sqrt(2.0 / fan_in), (chains, fan_in * fan_out)),
                  np.zeros((chains, fan_out))]
    return np.concatenate(parts, axis=1)


def predictive(samples, test_pot, thin: int) -> dict:
    """Running posterior predictive of ``samples (m, K, T, d)`` at every ``thin``-th kept
    iteration: accuracy and NLL per agent, and the per-draw test log-likelihood ``(m, K, T')``."""
    m, k, t, _ = samples.shape
    idx = np.arange(thin - 1, t, thin)
    y = test_pot.y
    rows = np.arange(len(y))
    acc = np.zeros((m, len(idx)))
    nll = np.zeros((m, len(idx)))
    draw_ll = np.zeros((m, k, len(idx)))
    for a in range(m):
        total = np.zeros((len(y), test_pot.sizes[-1]))
        for j, i in enumerate(idx):
            logits = test_pot.logits(samples[a, :, i])
            logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
            draw_ll[a, :, j] = logp[:, rows, y].mean(axis=1)
            total += np.exp(logp).sum(axis=0)
            prob = total / ((j + 1) * k)
            acc[a, j] = np.mean(prob.argmax(axis=1) == y)
            nll[a, j] = -np.mean(np.log(np.clip(prob[rows, y], 1e-300, None)))
    return {"iterations": (idx + 1).tolist(), "acc": acc, "nll": nll, "draw_ll": draw_ll}


def diagnostics(samples, draw_ll, softmax: bool) -> dict:
    """ESS / R-hat across chains (agent 1): of the per-draw test log-likelihood, and (softmax
    regression) of the parameters."""
    from fedbayes_flwr.inference.posterior import SamplePosterior

    post = SamplePosterior(draw_ll[0][..., None])
    out = {"ess_test_ll": float(post.ess()[0]), "rhat_test_ll": float(post.rhat()[0])}
    if softmax:
        params = SamplePosterior(samples[0])
        ess, rhat = params.ess(), params.rhat()
        out.update(ess_param_min=float(ess.min()), ess_param_median=float(np.median(ess)),
                   rhat_param_max=float(np.nanmax(rhat)),
                   rhat_param_median=float(np.nanmedian(rhat)))
    return out


def run_method(method, pots, mixing, w0, args, cfg, eps_c, var_ref):
    """``(samples (m, K, T, d), info)``."""
    from fedbayes_flwr.algorithms.decentralized import mixing as mixmat
    from fedbayes_flwr.algorithms.dhmc.baselines import PooledPotential, centralized_hmc, decentralized_ula
    from fedbayes_flwr.algorithms.dhmc.loop import simulate

    _, warmup, iterations, _ = cfg
    if method.startswith("chmc"):
        run = centralized_hmc(PooledPotential(pots), w0, STEP0, iterations, warmup=warmup,
                              seed=args.seed, target_accept=TARGET_ACCEPT)
        return run.samples[None], {"epsilon": run.epsilon, "accept_rate": run.accept_rate,
                                   "grad_evals": run.grad_evals}
    if method == "dula":
        run = decentralized_ula(pots, mixing, w0, eps_c**2 / 2, iterations,
                                rounds=mixmat.rounds_for(mixing),
                                seed=args.seed, noise="independent", warmup=warmup,
                                posterior_var=var_ref)
        return run.samples, {"step0": float(run.steps[0]), "step_last": float(run.steps[-1]),
                             "consensus": float(run.consensus.mean()),
                             "consensus_last": float(run.consensus[-1]),
                             "grad_evals": run.grad_evals}
    rounds = int(method.split("-s")[1]) if "-s" in method else mixmat.rounds_for(mixing)
    run = simulate(pots, mixing, w0, STEP0, iterations, warmup=warmup, rounds=rounds,
                   seed=args.seed, integrator="leapfrog", energy="exact", adapt=True,
                   target_accept=TARGET_ACCEPT, posterior_var=var_ref, decision="agree")
    return run.samples, {"epsilon": run.epsilon, "accept_rate": run.accept_rate,
                         "disagreement": run.disagreement,
                         "consensus": float(run.consensus.mean()),
                         "consensus_last": float(run.consensus[-1]),
                         "grad_evals": run.grad_evals}


def run_experiment(name, data, args, results) -> list[dict]:
    from fedbayes_flwr.algorithms.decentralized import graphs as gossip
    from fedbayes_flwr.algorithms.decentralized import mixing as mixmat
    from fedbayes_flwr.algorithms.dhmc import agents as dhmc
    from fedbayes_flwr.inference.potentials import DiagonalGaussian
    from fedbayes_flwr.models.nets_numpy import SoftmaxNetPotential

    spec = EXPERIMENTS[name]
    x, y, xt, yt = data
    sizes = (x.shape[1], *spec["hidden"], 10)
    softmax = not spec["hidden"]
    cfg = (QUICK if args.quick else SETTINGS)["softmax" if softmax else "bnn"]
    chains, warmup, iterations, thin = cfg
    m = spec["agents"]
    parts = agent_data(name, x, y)
    lik = [SoftmaxNetPotential(xi, yi, sizes) for xi, yi in parts]
    dim = lik[0].dim
    prior = DiagonalGaussian(1.0 / PRIOR_SCALE**2, dim=dim)
    pots = [dhmc.LocalPotential(p, prior, m) for p in lik]
    mixing = mixmat.metropolis_weights(gossip.make_graph(spec["graph"], m))
    test_pot = SoftmaxNetPotential(xt, yt, sizes)
    w0 = starts(sizes, chains, args.seed)
    todo = list(METHODS) + EXTRA.get(name, [])
    rows, eps_c, var_ref = [], None, None
    for method in todo:
        use = pots
        if method == "chmc-full":
            use = [dhmc.LocalPotential(SoftmaxNetPotential(x, y, sizes), prior, 1)]
        t0 = time.perf_counter()
        samples, info = run_method(method, use, mixing, w0, args, cfg, eps_c, var_ref)
        wall = time.perf_counter() - t0
        if method == "chmc":
            eps_c = info["epsilon"]
            var_ref = samples[0].reshape(-1, dim).var(axis=0) + 1e-12
        t1 = time.perf_counter()
        pred = predictive(samples, test_pot, thin)
        diag = diagnostics(samples, pred["draw_ll"], softmax)
        row = {"experiment": name, "method": method, "agents": int(samples.shape[0]),
               "chains": chains, "warmup": warmup, "iterations": iterations, "thin": thin,
               **info, "wall_s": round(wall, 2),
               "iterations_per_s": round((warmup + iterations) / wall, 1),
               "eval_s": round(time.perf_counter() - t1, 2),
               "curve_iterations": [warmup + i for i in pred["iterations"]],
               "accuracy": pred["acc"].mean(axis=0).tolist(),
               "nll": pred["nll"].mean(axis=0).tolist(),
               "final_accuracy": float(pred["acc"][:, -1].mean()),
               "final_nll": float(pred["nll"][:, -1].mean()),
               "final_accuracy_per_agent": pred["acc"][:, -1].tolist(),
               "final_nll_per_agent": pred["nll"][:, -1].tolist(),
               "final_accuracy_worst_agent": float(pred["acc"][:, -1].min()),
               "final_nll_worst_agent": float(pred["nll"][:, -1].max()),
               "mean_draw_test_ll": float(pred["draw_ll"].mean()), **diag}
        del samples, pred
        rows.append(row)
        results.doc["runs"].append(row)
        results.write()
        print(f"  {name:11s} {method:9s} acc {row['final_accuracy']:.3f} nll "
              f"{row['final_nll']:.4f} accept {row.get('accept_rate', float('nan')):.3f} "
              f"consensus {row.get('consensus', float('nan')):.2e} "
              f"[{wall:.1f}s, {row['iterations_per_s']:.0f} it/s]", flush=True)
    return rows


def table(rows) -> str:
    head = (f"{'experiment':11s} {'method':9s} {'m':>2s} {'K':>2s} {'iters':>10s} {'step':>8s} "
            f"{'accept':>6s} {'disagr':>6s} {'consens':>8s} {'acc':>6s} {'worst':>6s} "
            f"{'NLL':>7s} {'worst':>7s} {'ESS ll':>7s} {'Rhat ll':>7s} {'wall s':>7s} "
            f"{'it/s':>6s}")
    lines = [head]
    for r in rows:
        step = r.get("epsilon", r.get("step0", float("nan")))
        lines.append(
            f"{r['experiment']:11s} {r['method']:9s} {r['agents']:2d} {r['chains']:2d} "
            f"{str(r['warmup']) + '+' + str(r['iterations']):>10s} {step:8.2e} "
            f"{r.get('accept_rate', float('nan')):6.3f} "
            f"{r.get('disagreement', float('nan')):6.3f} "
            f"{r.get('consensus', float('nan')):8.2e} {r['final_accuracy']:6.3f} "
            f"{r['final_accuracy_worst_agent']:6.3f} {r['final_nll']:7.4f} "
            f"{r['final_nll_worst_agent']:7.4f} {r['ess_test_ll']:7.1f} "
            f"{r['rhat_test_ll']:7.3f} {r['wall_s']:7.1f} {r['iterations_per_s']:6.1f}")
    return "\n".join(lines)


STYLE = {"dhmc": "tab:blue", f"dhmc-s{ROUNDS_FIXED}": "tab:purple", "dula": "tab:green",
         "chmc": "black", "chmc-full": "tab:gray"}
TITLES = {
    "digit-split": "softmax regression, 5 agents x 2 digits on a path",
    "quadrant": "softmax regression, 4 agents x one 4x4 quadrant (complete graph); target: the "
                "product of experts, predictive on full images",
    "bnn": "BNN 64-100-10, 2 agents (digits 0-4 / 5-9)",
}


def plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for r in rows:
        for ax, key in zip(axes, ("accuracy", "nll"), strict=True):
            ax.plot(r["curve_iterations"], r[key], color=STYLE[r["method"]],
                    ls="--" if r["method"] == "chmc-full" else "-", label=r["method"])
    axes[0].set_title("test accuracy of the running predictive (mean over agents)", fontsize=9)
    axes[1].set_title("test NLL of the running predictive (mean over agents)", fontsize=9)
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("iteration (= gradient evaluations per agent; warm-up included)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    r0 = rows[0]
    fig.suptitle(f"digits, {TITLES[r0['experiment']]}: {r0['chains']} chains, "
                 f"{r0['warmup']} warm-up + {r0['iterations']} kept iterations", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = common.argument_parser(__doc__, "a smoke run: few chains and iterations",
                                    "unused (iterations are fixed per model, see SETTINGS)")
    parser.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS),
                        choices=list(EXPERIMENTS))
    parser.add_argument("--replot", action="store_true",
                        help="redraw the plots from the existing JSON and stop")
    args = common.resolve_common_args(parser.parse_args(), NAME)
    if args.replot:
        doc = common.read_results(args, NAME)
        for name in dict.fromkeys(r["experiment"] for r in doc["runs"]):
            plot([r for r in doc["runs"] if r["experiment"] == name],
                 os.path.join(args.results_dir, f"{NAME}_{name}.png"))
        return
    from fedbayes_flwr.data import load_dataset

    data = load_dataset("digits", "multiclass")
    results = common.start(
        NAME, args, {"runs": []}, experiments={k: {**v, "hidden": list(v["hidden"])}
                                               for k, v in EXPERIMENTS.items()},
        prior=f"N(0, {PRIOR_SCALE}^2 I)", step0=STEP0,
        mixing_rounds="auto (mixing.rounds_for: W^s keeps <= 1% of a disagreement)",
        target_accept=TARGET_ACCEPT, settings={k: dict(zip(
            ("chains", "warmup", "iterations", "thin"), v, strict=True))
            for k, v in (QUICK if args.quick else SETTINGS).items()},
        n_train=len(data.x_train), n_test=len(data.x_test),
        quadrant_target="prod_i p(y | x restricted to quadrant i, w) p0(w): every label counted "
                        "4 times (a product of experts), the prior once; predictive evaluated "
                        "on the FULL test images",
        blas_threads=os.environ.get("OPENBLAS_NUM_THREADS"), keep=True)
    # rerunning some experiments keeps the others' rows (the document is merged, not replaced)
    results.doc["runs"] = [r for r in results.doc.get("runs", [])
                           if r["experiment"] not in args.experiments]
    all_rows = []
    for name in args.experiments:
        rows = run_experiment(name, (data.x_train, data.y_train, data.x_test, data.y_test),
                              args, results)
        all_rows.extend(rows)
        plot(rows, os.path.join(args.results_dir, f"{NAME}_{name}.png"))
    print("\n" + table(all_rows))
    results.finish()


if __name__ == "__main__":
    main()
