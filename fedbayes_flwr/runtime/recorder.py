"""Results on disk as the run goes: metrics from the posterior interface, ``result.json``,
``posterior.npz`` and plots, rewritten at every evaluation point (``eval-every``), so a crash or a
stop keeps what was finished, and event-based samplers with thousands of updates do not do
quadratic I/O.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import numpy as np

from fedbayes_flwr.evaluation.sample_quality import kernel_stein_discrepancy
from fedbayes_flwr.inference.posterior import TracePosterior
from fedbayes_flwr.runtime.checkpoint import Checkpoint, save
from fedbayes_flwr.runtime.memory import format_bytes

OUTCOMES = ("running", "completed", "done", "time-limit", "stopped", "failed", "interrupted")
# The files a run writes; a reused output directory loses these (and only these) at the start.
RESULT_FILES = ("result.json", "posterior.npz", "metrics.png", "reliability.png", "trace.png",
                "posterior.png", "checkpoint.npz")
TRACE_MIN_DRAWS = 4  # fewer draws per chain (a warm-up record): no trace figure, no ESS


class Recorder:
    """Metrics per evaluation point; ``result.json`` written as the run goes."""

    def __init__(self, experiment, engine: str, output_dir: str | None = None,
                 progress: bool = True, resume=None, posterior=None):
        """``resume`` (a :class:`fedbayes_flwr.runtime.checkpoint.Checkpoint`) continues its history,
        counters and clock, and keeps the directory's files; ``posterior`` is its posterior."""
        self.exp = experiment
        self.engine = engine
        self.output_dir = output_dir or experiment.config.output_dir
        os.makedirs(self.output_dir, exist_ok=True)
        for name in RESULT_FILES if resume is None else ():  # no earlier run's files here
            path = os.path.join(self.output_dir, name)
            if os.path.isfile(path):
                os.remove(path)
        self.history: list[dict] = list(resume.history) if resume else []
        counters = resume.counters if resume else {}
        self.t0 = time.perf_counter() - float(counters.get("elapsed_s", 0.0))
        self.posterior = posterior
        self._diagram = None
        self.outcome: str = "running"
        self.reason: str | None = None
        self.accepted = int(counters.get("accepted", 0))
        self.rejected = int(counters.get("rejected", 0))
        self._progress = _Progress(experiment.config.num_rounds, enabled=progress,
                                   start=start_text(experiment))

    def record(self, update: int, posterior, log) -> dict:
        """Evaluate ``posterior`` on the test set, append the row, rewrite the result files.

        ``log`` is a :class:`fedbayes_flwr.runtime.steps.RoundLog` (the updates since the last row).
        """
        ds = self.exp.dataset
        metrics, diagram = (self.exp.model.metrics(posterior, ds.x_test, ds.y_test)
                            if len(ds.x_test) else ({}, None))  # no test set: no test metrics
        row = {"round": update, **metrics, **log.metrics,
               "bytes_down": log.bytes_down, "bytes_up": log.bytes_up,
               "elapsed_s": round(time.perf_counter() - self.t0, 4),
               "rejected_replies": len(log.rejected),
               "clients": list(log.clients)}
        if log.retried:
            row["retried_replies"] = log.retried
        if log.rejected:
            row["rejections"] = [r._asdict() for r in log.rejected]
        if log.virtual_time is not None:
            row["virtual_time"] = log.virtual_time
        diagnostics = {**posterior.diagnostics(), **log.diagnostics}
        if getattr(posterior, "stein_diagnostic", False):
            diagnostics["ksd"] = self._ksd(posterior)
        if diagnostics:
            row["diagnostics"] = diagnostics
        self.history.append(row)
        self.accepted += len(log.clients)
        self.rejected += len(log.rejected)
        if log.rejected and not log.clients:
            r = log.rejected[0]
            print(f"warning: update {update}: every reply was rejected ({len(log.rejected)}; "
                  f"first: partition {r.partition_id}, {r.field}: {r.reason})", file=sys.stderr,
                  flush=True)
        self.posterior = posterior
        self._diagram = diagram
        if log.outcome is not None:
            self.outcome = log.outcome
        self._write()
        self._progress.update(update, row)
        return row

    def _ksd(self, posterior) -> float:
        """IMQ kernel Stein discrepancy of a particle posterior's particles to the target
        posterior (the model's score on the pooled training rows; ``nan`` if not finite)."""
        x = np.asarray(posterior.samples, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            return float("nan")
        ds, model = self.exp.dataset, self.exp.model
        if not len(ds.x_train):
            return float("nan")
        prior = self.exp.prior
        with np.errstate(all="ignore"):
            _, scores = model.log_density_and_grad(x, ds.x_train, ds.y_train, prior=prior)
            value = kernel_stein_discrepancy(x, np.asarray(scores, dtype=np.float64))
        return round(value, 6) if np.isfinite(value) else float("nan")

    def checkpoint(self, update: int, server_state, client_states: tuple = (),
                   client_versions: tuple = (), virtual_time: float | None = None,
                   dead: tuple | list = ()) -> None:
        """Write ``checkpoint.npz`` (atomically) after the row of ``update``: the server and
        client states with this recorder's history (:mod:`fedbayes_flwr.runtime.checkpoint`); ``dead``:
        partitions the run left out (a resumed run leaves them out too)."""

        # the rows up to ``update`` (an asynchronous checkpoint lands after later rows)
        history = [row for row in self.history if row["round"] <= update]
        counters = {"accepted": sum(len(row["clients"]) for row in history),
                    "rejected": sum(row["rejected_replies"] for row in history),
                    "elapsed_s": history[-1]["elapsed_s"] if history else 0.0,
                    "virtual_time": virtual_time, "dead": [int(p) for p in dead]}
        save(self.output_dir, Checkpoint(
            self.exp.bundle.name, self.engine, self.exp.config.to_run_config(), update,
            server_state, tuple(client_states), tuple(client_versions), history, counters))

    def _warn_time_limit(self) -> None:
        """One line: the wall-clock cap ended the run, with what a sampler reached by then."""
        c = self.exp.config
        got = self.history[-1].get("diagnostics", {}) if self.history else {}
        reached = ""
        if "ess_min" in got:
            target = getattr(c.section, "target_ess", None)
            reached = (f": min ESS {got['ess_min']:.0f}" + (f" of {target:g}" if target else "")
                       + f", max R-hat {got.get('rhat_max', float('nan')):.3f}")
        print(f"warning: the time limit (max-seconds {c.max_seconds:g}) ended the run before its "
              f"stopping rule{reached}", file=sys.stderr, flush=True)

    def _write(self) -> None:
        c = self.exp.config
        posterior_file = "posterior.npz"
        if self.posterior is not None:
            self.posterior.save(os.path.join(self.output_dir, posterior_file))
        final = ({k: v for k, v in self.history[-1].items()
                  if k not in ("clients", "rejections", "diagnostics")} if self.history else {})
        if "prior_scale" in final:
            final["learned_prior_scale"] = final["prior_scale"]
        result = {"algorithm": c.algorithm, "bundle": self.exp.bundle.name, "model": c.model,
                  "dataset": self.exp.dataset.name, "num_clients": self.exp.num_clients,
                  "holdout_rows": int(getattr(self.exp.dataset, "holdout_rows", 0)),
                  "seed": c.seed, "engine": self.engine, "outcome": self.outcome,
                  "run_config": c.to_run_config(), "history": self.history, "final": final,
                  "posterior_file": posterior_file if self.posterior is not None else None}
        if self.reason:
            result["reason"] = self.reason
        write_json(os.path.join(self.output_dir, "result.json"), result)

    def stop(self, reason: str, posterior=None) -> None:
        """End a run that could not go on: the result files say ``stopped`` and why.

        ``posterior`` (the state when it stopped, possibly past the last recorded row) is
        written as ``posterior.npz``, so nothing computed is lost (a sampler's draws so far)."""
        self.outcome, self.reason = "stopped", reason
        if posterior is not None:
            self.posterior = posterior
        self.finish()
        last = self.history[-1]["round"] if self.history else 0
        print(f"run stopped after update {last} of {self.exp.config.num_rounds}: {reason} "
              f"(finished rows are in {os.path.join(self.output_dir, 'result.json')})",
              file=sys.stderr, flush=True)

    def interrupt(self) -> None:
        """End a run the user interrupted: keep the finished rows, write the plots."""
        self.outcome = "interrupted"
        self.reason = "interrupted by the user"
        self.finish()

    def finish(self) -> dict | None:
        """Write the final result file and the plots (written once, at the end of the run,
        however it ends), close the progress display; return the last row."""
        from fedbayes_flwr.evaluation.plots import (
            plot_history,
            plot_mixture_posterior,
            plot_reliability,
            plot_trace,
        )

        self._progress.close()
        if self.history and self.accepted == 0 and self.outcome in ("running", "completed",
                                                                    "done", "time-limit"):
            self.outcome = "failed"
            self.reason = (f"no update was accepted in {self.history[-1]['round']} updates "
                           f"({self.rejected} replies rejected): the posterior is the prior")
            print(f"error: {self.reason}", file=sys.stderr, flush=True)
        elif self.outcome == "running":
            self.outcome = "completed"
        if self.outcome == "time-limit":
            self._warn_time_limit()
        self._write()
        if not self.history:
            return None
        title = f"{self.exp.config.algorithm} / {self.exp.config.model} / {self.exp.dataset.name}"
        plot_history(self.history, os.path.join(self.output_dir, "metrics.png"), title)
        if self._diagram is not None:
            plot_reliability(self._diagram, os.path.join(self.output_dir, "reliability.png"),
                             title)
        chains = getattr(self.posterior, "chains", None)
        if isinstance(self.posterior, TracePosterior) and chains is not None \
                and chains.shape[1] >= TRACE_MIN_DRAWS:  # a sampler's draws (not particles)
            plot_trace(self.posterior, os.path.join(self.output_dir, "trace.png"), title)
        if self.posterior is not None and self.posterior.kind == "structured":
            plot_mixture_posterior(self.posterior, self.exp.dataset.x_test,
                                   os.path.join(self.output_dir, "posterior.png"), title)
        return self.history[-1]


def write_json(path: str, obj) -> None:
    """Write ``obj`` as JSON atomically (temp file + rename: a crash never leaves half a file);
    numpy scalars become Python numbers. Used for result.json and the benchmarks' JSON."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=_json_default)
    os.replace(tmp, path)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o)}")


PROGRESS_KEYS = ("test_accuracy", "test_nll", "test_rmse", "kl", "log_marginal_likelihood",
                 "heldout_loglik", "objective", "rejected_replies")
"""Keys of a row shown on the progress line (those present)."""
PROGRESS_DIAGNOSTICS = ("ess_min", "rhat_max")
"""Keys of a row's ``diagnostics`` shown too: a sampler's ESS and R-hat."""


def progress_text(row: dict) -> str:
    """The progress line's text for ``row``: its metrics (AMPS: held-out log-likelihood and
    objective) and, for a sampler, the minimum ESS and maximum R-hat over coordinates."""
    diagnostics = row.get("diagnostics") or {}
    shown = {k: row[k] for k in PROGRESS_KEYS if row.get(k) is not None}
    shown.update({k: diagnostics[k] for k in PROGRESS_DIAGNOSTICS
                  if isinstance(diagnostics.get(k), float) and math.isfinite(diagnostics[k])})
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in shown.items())


def start_text(exp) -> str:
    """The progress display's first line, shown as the run starts (before the first update,
    which may take minutes): the algorithm, clients, parameters and the memory estimate."""
    setup = exp.setup
    text = (f"{exp.config.algorithm}, {setup.num_clients} clients, {setup.prior.dim} "
            f"parameters, {exp.config.num_rounds} updates")
    hook = exp.bundle.memory_estimate
    estimate = None if hook is None else hook(setup)
    if estimate is not None:
        text += f", about {format_bytes(estimate.nbytes)} of arrays"
    return text


class _Progress:
    """A rich progress bar on a terminal; one plain line per row otherwise (logs, CI). Both
    show ``start`` at once (a first update may take minutes)."""

    def __init__(self, total: int, enabled: bool, start: str = ""):
        self.enabled = enabled
        self.bar = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = Console(stderr=True)
        if console.is_terminal:
            self.bar = Progress(TextColumn("update"), MofNCompleteColumn(), BarColumn(),
                                TextColumn("{task.description}"), console=console)
            self.task = self.bar.add_task(start, total=total)
            self.bar.start()
        elif start:
            print(f"started: {start}", file=sys.stderr, flush=True)

    def update(self, update: int, row: dict) -> None:
        if not self.enabled:
            return
        text = progress_text(row)
        if self.bar is not None:
            self.bar.update(self.task, completed=update, description=text)
        else:
            print(f"update {update}: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
