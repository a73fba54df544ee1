"""The ServerApp: builds the experiment from the run config and runs the chosen bundle.

``app`` reads Flower's run config (``flwr run``); :func:`make_server_app` bakes explicit settings
in, for ``flwr.simulation.run_simulation`` whose run config is empty. Any registered algorithm
runs through :class:`strategies.base.BundleStrategy`; results go to ``output-dir`` as the run goes
(``result.json``, ``posterior.npz``, plots), and a stopped run still writes them.
"""

from __future__ import annotations

import os
from logging import WARNING

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid import InMemoryGrid

from fedbayes_flwr.errors import RunStopped
from fedbayes_flwr.runtime.checkpoint import resumed
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import build_experiment
from fedbayes_flwr.runtime.recorder import Recorder
from fedbayes_flwr.runtime.steps import Interrupted

from .base import BundleStrategy


def strategy_for(exp) -> BundleStrategy:
    """The generic strategy for an experiment's bundle and setup."""
    c = exp.config
    return BundleStrategy(exp.bundle, exp.setup, eval_every=c.eval_every,
                          max_seconds=c.max_seconds, max_retries=c.max_retries,
                          run_config=c.to_run_config(), node_timeout=c.node_timeout,
                          round_timeout=c.round_timeout)


def engine_of(grid: Grid) -> str:
    """``simulation`` when ``grid`` is the Simulation Engine's in-memory Grid (``flwr run`` on a
    simulation connection, ``flwr.simulation.run_simulation``), else ``deployment`` (a ServerApp
    started by a SuperLink talks to it over its Runtime API)."""
    return "simulation" if isinstance(grid, InMemoryGrid) else "deployment"


def make_server_app(overrides: dict | None = None, engine: str | None = None,
                    progress: bool = True) -> ServerApp:
    """A ServerApp whose run config is ``context.run_config`` updated by ``overrides``.

    A checkpoint is written to ``output-dir`` after every history row
    (:mod:`fedbayes_flwr.runtime.checkpoint`); the run-config key ``resume`` (a stored run's
    directory) continues the run stored there (its server state, history, and each
    partition's client state, sent back to the nodes), in that directory
    (:func:`fedbayes_flwr.runtime.checkpoint.resumed`).

    ``engine`` is what ``result.json`` records; ``None`` (the default) reads it off the Grid
    (:func:`engine_of`).

    ``overrides`` are checked now (an unknown key raises
    :class:`fedbayes_flwr.errors.ConfigError` naming it), not when the run starts.
    """
    overrides = dict(overrides or {})
    if overrides:
        parse_run_config(overrides)
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        config = parse_run_config({**dict(context.run_config), **overrides})
        for key, path in (("resume", config.resume), ("output-dir", config.output_dir)):
            if path and not os.path.isabs(path):  # under flwr run: the SuperLink's directory
                log(WARNING, "%s %r is relative: it is %s (under the directory of the process "
                    "running this ServerApp); pass an absolute path", key, path,
                    os.path.abspath(path))
        config, ckpt = resumed(config)
        exp = build_experiment(config)
        strategy = strategy_for(exp)
        if ckpt is not None:
            strategy.resume(ckpt)
        recorder = Recorder(exp, engine or engine_of(grid), progress=progress, resume=ckpt,
                            posterior=strategy.posterior if ckpt is not None else None)
        strategy.on_checkpoint = recorder.checkpoint

        def record(update: int, arrays) -> None:
            recorder.record(update, strategy.posterior, strategy.round_logs[update])

        try:
            strategy.start(grid, num_rounds=config.num_rounds, evaluate_fn=record)
        except Interrupted:
            recorder.interrupt()
            return
        except RunStopped as err:
            recorder.stop(err.reason, strategy.posterior)
            raise RuntimeError(f"run stopped: {err.reason}") from None  # the run's status: failed
        recorder.finish()
        if recorder.outcome == "failed":  # e.g. no update accepted: flwr run reports failed
            raise RuntimeError(recorder.reason)

    return app


app = make_server_app()
