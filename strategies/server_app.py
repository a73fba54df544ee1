"""The ServerApp: builds the experiment from the run config and runs the chosen bundle.

``app`` reads Flower's run config (``flwr run``); :func:`make_server_app` bakes explicit settings
in, for ``flwr.simulation.run_simulation`` whose run config is empty, and serves nodes that hold
their own data (``num_features``, ``test_data``: see :func:`make_server_app`). Any registered algorithm
runs through :class:`strategies.base.BundleStrategy`; results go to ``output-dir`` as the run goes
(``result.json``, ``posterior.npz``, plots), and a stopped run still writes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from logging import WARNING

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid import InMemoryGrid

from fedbayes_flwr.errors import ConfigError, RunStopped
from fedbayes_flwr.models import Model, register_object
from fedbayes_flwr.runtime.checkpoint import resumed
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.experiment import build_experiment, server_experiment
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
                    progress: bool = True, *, model: Model | str | None = None,
                    num_features: int | None = None, test_data=None,
                    num_classes: int | None = None, output_dir: str | None = None,
                    on_record: Callable[[dict], None] | None = None) -> ServerApp:
    """A ServerApp whose run config is ``context.run_config`` updated by ``overrides``.

    A checkpoint is written to ``output-dir`` after every history row
    (:mod:`fedbayes_flwr.runtime.checkpoint`); the run-config key ``resume`` (a stored run's
    directory) continues the run stored there (its server state, history, and each
    partition's client state, sent back to the nodes), in that directory
    (:func:`fedbayes_flwr.runtime.checkpoint.resumed`).

    Parameters
    ----------
    overrides : dict, optional
        Run-config keys; checked now (an unknown key raises
        :class:`fedbayes_flwr.errors.ConfigError` naming it), not when the run starts. The
        ClientApp needs the same experiment-defining keys (every key but ``data``,
        ``client-delay``, ``output-dir`` and the server-only ones): each request carries them.
    engine : str, optional
        What ``result.json`` records; ``None`` (the default) reads it off the Grid
        (:func:`engine_of`).
    progress : bool
        Show progress (a bar on a terminal, one line per row otherwise).
    model : str or fedbayes_flwr.models.Model, optional
        A registered model name or a model object (registered under
        :func:`fedbayes_flwr.models.stable_name`, as the ClientApp does).
    num_features : int, optional
        For nodes that hold their own data (the ClientApp's ``load_data``): the columns of
        their ``x``. The server then loads no dataset: it needs only this dimension and, for
        test metrics, ``test_data``.
    test_data : tuple, dict or callable, optional
        With ``num_features``: the test set, ``(x, y)`` or a dict with ``x_test``, ``y_test``,
        or ``fn(context)`` returning either. Without it the rows carry no test metrics.
    num_classes : int, optional
        With ``num_features``: classes of a multi-class model (default: from the test labels);
        the nodes need the same.
    output_dir : str, optional
        Where ``result.json``, ``posterior.npz``, the plots and the checkpoint go (the
        run-config key ``output-dir``).
    on_record : callable, optional
        ``on_record(row)`` with each history row (a dict, as ``result.json`` stores it), after
        the files are written.
    """
    overrides = dict(overrides or {})
    if model is not None:
        overrides["model"] = register_object(model)
    if output_dir is not None:
        overrides["output-dir"] = output_dir
    if overrides:
        parse_run_config(overrides)
    if num_features is None and (test_data is not None or num_classes is not None):
        raise ConfigError("make_server_app: test_data and num_classes need num_features (the "
                          "nodes' data dimension)")
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        if isinstance(model, Model):  # a fresh process: register the object here too
            register_object(model, overrides["model"])
        config = parse_run_config({**dict(context.run_config), **overrides})
        for key, path in (("resume", config.resume), ("output-dir", config.output_dir)):
            if path and not os.path.isabs(path):  # under flwr run: the SuperLink's directory
                log(WARNING, "%s %r is relative: it is %s (under the directory of the process "
                    "running this ServerApp); pass an absolute path", key, path,
                    os.path.abspath(path))
        config, ckpt = resumed(config)
        if num_features is None:
            exp = build_experiment(config)
        else:
            test = test_data(context) if callable(test_data) else test_data
            exp = server_experiment(config, num_features, test, num_classes)
        strategy = strategy_for(exp)
        if ckpt is not None:
            strategy.resume(ckpt)
        recorder = Recorder(exp, engine or engine_of(grid), progress=progress, resume=ckpt,
                            posterior=strategy.posterior if ckpt is not None else None)
        strategy.on_checkpoint = recorder.checkpoint

        def record(update: int, arrays) -> None:
            row = recorder.record(update, strategy.posterior, strategy.round_logs[update])
            if on_record is not None:
                on_record(row)

        try:
            strategy.start(grid, num_rounds=config.num_rounds, evaluate_fn=record)
        except Interrupted:
            recorder.interrupt()
            return
        except RunStopped as err:
            pending = strategy.unrecorded()  # a sampler's draws since the last row: one more
            if pending is not None:
                record(pending[0], None)
            recorder.stop(err.reason, strategy.posterior)
            raise RuntimeError(f"run stopped: {err.reason}") from None  # the run's status: failed
        recorder.finish()
        if recorder.outcome == "failed":  # e.g. no update accepted: flwr run reports failed
            raise RuntimeError(recorder.reason)

    return app


app = make_server_app()
