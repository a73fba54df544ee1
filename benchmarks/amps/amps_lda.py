"""AMPS on LDA (Campbell & How 2014, Section 3.2, Figs. 7-8): held-out log-likelihood, topic
recovery and time, AMPS vs the naive merge, batch VB and the single agents, then AMPS vs SDA-Bayes.

Data: the ``lda-corpus`` set (:mod:`fedbayes_flwr.data.amps_sets`), drawn afresh for every trial
(trial ``t`` is the set at seed ``seed + t``): ``V = 100`` words, ``K = 10`` topics, 80 words per
document, ``alpha = 1/K``, ``eta = 0.1``; 1,000 training documents and 200 test documents. The
model is :class:`fedbayes_flwr.inference.vb.lda.LDA` with the same hyperparameters (well specified), one
start per fit (the paper's setting; ``--restarts`` to change), ``tol = 1e-6``.

Part 1 (Fig. 7), for N = 5, 10, 50 agents: the training documents are split evenly over the
agents (200 / 100 / 20 each); every agent fits from the prior; the posteriors are merged by AMPS
(iterative bipartite matching, the paper's LDA search) and naively (identity permutations);
batch VB fits all 1,000 documents at once. Reported per method: the held-out log-likelihood per
word (Wang et al. 2011: 90% of each test document observed, 10% scored, the same split for every
method), the mean per-topic 2-norm error of the topic means after the best relabelling
(:func:`fedbayes_flwr.algorithms.amps.merge.matched_error`), and the time: agents in parallel, so local = the
slowest agent's fit, plus the merge (for AMPS the alignment).

Part 2 (Fig. 8): AMPS 1x10, 10x1 and 10x10 (agents x sub-batches per agent) against SDA-Bayes in
the same settings (:mod:`fedbayes_flwr.algorithms.amps.streaming`), the 1,000 documents split evenly over all
sub-batches. Every setting and scheme draws its fits' starts from the same seed, so the
comparisons are paired: AMPS 1x10 and 10x1 fit the same sub-batches from the same starts and
merge them the same way (one agent's merge of 10 sub-batch posteriors is the same problem as 10
agents' merge), so their posteriors coincide and only their times differ (one agent fits
serially); SDA 10x1 is the naive merge of AMPS 10x1's fits.

Run: ``.venv/bin/python benchmarks/amps/amps_lda.py`` (20 trials, about 3 minutes on one core;
``--quick``: 2 trials, results under the work dir; ``--trials`` to choose). Writes
``benchmarks/results/amps/amps_lda.json`` and ``amps_lda.png`` (held-out log-likelihood, error and time
against the number of agents; AMPS vs SDA-Bayes).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common

import common
import numpy as np

AGENTS = (5, 10, 50)
STREAM_SETTINGS = ((1, 10), (10, 1), (10, 10))
HELDOUT_SEED = 0


def heldout(model, params, x_test) -> float:
    return model.heldout_loglik(params, x_test, seed=HELDOUT_SEED)


def topic_error(model, params, topics) -> float:
    from fedbayes_flwr.algorithms.amps import merge as amps

    return float(np.mean(amps.matched_error(model.component_means(params), topics)[0]))


def score(model, params, x_test, topics, seconds, **extra) -> dict:
    return {"heldout_loglik": heldout(model, params, x_test),
            "topic_error": topic_error(model, params, topics), "seconds": seconds, **extra}


def trial(seed: int, restarts: int) -> dict:
    """Both parts on the corpus of ``seed``."""
    from fedbayes_flwr.algorithms.amps import merge as amps
    from fedbayes_flwr.algorithms.amps import streaming
    from fedbayes_flwr.data.amps_sets import LDA_SHAPE, load_amps_set, truth
    from fedbayes_flwr.inference.vb.lda import LDA

    data = load_amps_set("lda-corpus", "none", seed)
    x, x_test, topics = data.x_train, data.x_test, truth("lda-corpus", seed)
    model = LDA(LDA_SHAPE["num_topics"], LDA_SHAPE["vocab_size"])
    prior = model.prior()
    rng = np.random.default_rng([seed, 1])
    fit = {"restarts": restarts}
    out = {"seed": seed, "prior_heldout_loglik": heldout(model, prior, x_test)}

    t0 = time.perf_counter()
    batch = model.fit(x, prior, rng, **fit)
    out["batch"] = score(model, batch.params, x_test, topics, time.perf_counter() - t0,
                         sweeps=batch.iterations)
    out["true_topics_heldout_loglik"] = heldout(
        model, type(prior)(type(prior.topics)(topics * 1e8)), x_test)

    out["agents"] = {}
    for n in AGENTS:
        parts = np.array_split(x, n)
        fits, fit_s = [], []
        for part in parts:
            t0 = time.perf_counter()
            fits.append(model.fit(part, prior, rng, **fit).params)
            fit_s.append(time.perf_counter() - t0)
        local = max(fit_s)
        t0 = time.perf_counter()
        al = amps.align(prior, fits, symmetric=model.symmetric, search="bipartite")
        merged = amps.merge(prior, fits, al.perms, model.symmetric)
        amps_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        naive = amps.merge(prior, fits, None, model.symmetric)
        naive_s = time.perf_counter() - t0
        singles = [score(model, f, x_test, topics, s) for f, s in zip(fits, fit_s, strict=True)]
        out["agents"][str(n)] = {
            "amps": score(model, merged, x_test, topics, local + amps_s, local_s=local,
                          merge_s=amps_s, objective_gain=al.objective - al.naive_objective,
                          align_sweeps=al.sweeps),
            "naive": score(model, naive, x_test, topics, local + naive_s, local_s=local,
                           merge_s=naive_s),
            "single": {key: [s[key] for s in singles]
                       for key in ("heldout_loglik", "topic_error", "seconds")},
        }

    out["streaming"] = {}
    for n, b in STREAM_SETTINGS:
        parts = np.array_split(x, n * b)
        batches = [parts[i * b:(i + 1) * b] for i in range(n)]
        for name, scheme in (("amps", streaming.amps_batches), ("sda", streaming.sda_bayes)):
            # one seed for every setting and scheme: paired comparisons (module docstring)
            result = scheme(model, prior, batches, np.random.default_rng([seed, 2]), **fit)
            out["streaming"][f"{name}{n}x{b}"] = score(
                model, result.params, x_test, topics, result.seconds,
                local_s=result.local_seconds, merge_s=result.merge_seconds)
    return out


def summarise(trials: list[dict]) -> dict:
    """Mean / std / min / max over trials of every method's numbers."""
    def stats(values):
        return common.spread([float(v) for v in values])

    keys = ("heldout_loglik", "topic_error", "seconds")
    summary = {"batch": {k: stats(t["batch"][k] for t in trials) for k in keys},
               "prior_heldout_loglik": stats(t["prior_heldout_loglik"] for t in trials),
               "true_topics_heldout_loglik": stats(t["true_topics_heldout_loglik"]
                                                   for t in trials),
               "agents": {}, "streaming": {}}
    for n in map(str, AGENTS):
        rows = [t["agents"][n] for t in trials]
        entry = {m: {k: stats(r[m][k] for r in rows) for k in keys} for m in ("amps", "naive")}
        # the spread over single agents: every agent of every trial, and the per-trial mean
        entry["single"] = {k: stats(v for r in rows for v in r["single"][k]) for k in keys}
        entry["single_trial_mean"] = {k: stats(np.mean(r["single"][k]) for r in rows)
                                      for k in keys}
        entry["amps_beats_every_agent"] = float(np.mean(
            [r["amps"]["heldout_loglik"] > max(r["single"]["heldout_loglik"]) for r in rows]))
        entry["amps_beats_naive"] = float(np.mean(
            [r["amps"]["heldout_loglik"] > r["naive"]["heldout_loglik"] for r in rows]))
        entry["amps_beats_batch"] = float(np.mean(
            [r["amps"]["heldout_loglik"] > t["batch"]["heldout_loglik"]
             for r, t in zip(rows, trials, strict=True)]))
        summary["agents"][n] = entry
    for name in trials[0]["streaming"]:
        summary["streaming"][name] = {k: stats(t["streaming"][name][k] for t in trials)
                                      for k in keys}
    return summary


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    ns = [int(n) for n in summary["agents"]]
    for ax, key, label in ((axes[0], "heldout_loglik", "held-out log-lik / word"),
                           (axes[1], "topic_error", "topic 2-norm error"),
                           (axes[2], "seconds", "time [s] (local + merge)")):
        for method, style in (("amps", "o-"), ("naive", "s--"), ("single", "^:")):
            m = [summary["agents"][str(n)][method][key]["mean"] for n in ns]
            s = [summary["agents"][str(n)][method][key]["std"] for n in ns]
            ax.errorbar(ns, m, yerr=s, fmt=style, capsize=3,
                        label="single agents" if method == "single" else method.upper()
                        if method == "amps" else method)
        b = summary["batch"][key]
        ax.axhline(b["mean"], color="black", ls="--", lw=1, label="batch VB")
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("agents")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    names = list(summary["streaming"])
    m = [summary["streaming"][k]["heldout_loglik"]["mean"] for k in names]
    s = [summary["streaming"][k]["heldout_loglik"]["std"] for k in names]
    for i, name in enumerate(names):
        axes[3].errorbar([i], [m[i]], yerr=[s[i]], fmt="o" if name.startswith("amps") else "s",
                         color="tab:blue" if name.startswith("amps") else "tab:orange",
                         capsize=3)
    axes[3].set_xticks(range(len(names)), [k.upper() for k in names], rotation=45, fontsize=7)
    axes[3].grid(alpha=0.3)
    axes[3].set_ylabel("held-out log-lik / word")
    axes[3].set_title("AMPS vs SDA-Bayes")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(summary: dict) -> str:
    def cell(entry):
        return (f"{entry['heldout_loglik']['mean']:8.4f} ± {entry['heldout_loglik']['std']:.4f}"
                f"  {entry['topic_error']['mean']:.4f}  {entry['seconds']['mean']:7.3f}")

    lines = ["method            held-out/word         error   time[s]",
             f"batch VB        {cell(summary['batch'])}"]
    for n, entry in summary["agents"].items():
        for method in ("amps", "naive", "single"):
            lines.append(f"N={n:<3s} {method:7s} {cell(entry[method])}")
    for name, entry in summary["streaming"].items():
        lines.append(f"{name.upper():15s} {cell(entry)}")
    return "\n".join(lines)


def main():
    parser = common.argument_parser(__doc__, "2 trials", "unused (one-shot merges, no rounds)")
    parser.add_argument("--trials", type=int, default=None, help="trials (default 20)")
    parser.add_argument("--restarts", type=int, default=1, help="starts per local fit")
    args = common.resolve_common_args(parser.parse_args(), "amps_lda")
    if args.trials is None:
        args.trials = 2 if args.quick else 20
    results = common.start("amps_lda", args, {"trials": []}, num_trials=args.trials,
                           restarts=args.restarts, agents=list(AGENTS),
                           streaming_settings=[f"{n}x{b}" for n, b in STREAM_SETTINGS])
    for t in range(args.trials):
        t0 = time.perf_counter()
        row = trial(args.seed + t, args.restarts)
        results.doc["trials"].append(row)
        results.write()
        a = row["agents"]
        print(f"trial {t:2d} ({time.perf_counter() - t0:.1f}s): batch "
              f"{row['batch']['heldout_loglik']:.3f}; "
              + "; ".join(f"N={n} amps {a[n]['amps']['heldout_loglik']:.3f} naive "
                          f"{a[n]['naive']['heldout_loglik']:.3f}" for n in a), flush=True)
    summary = summarise(results.doc["trials"])
    results.doc["summary"] = summary
    plot(summary, os.path.join(args.results_dir, "amps_lda.png"))
    print(table(summary))
    results.finish()


if __name__ == "__main__":
    main()
