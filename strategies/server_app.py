"""The ServerApp: builds the experiment from the run config and runs the chosen strategy.

``app`` reads Flower's run config (``flwr run``); :func:`make_server_app` bakes explicit settings
in, for ``flwr.simulation.run_simulation`` whose run config is empty. Results go to
``output-dir`` as the run goes (``result.json``, ``posterior.npz``, plots).
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedbayes_flwr.config import parse_run_config
from fedbayes_flwr.experiment import Recorder, build_experiment

from .pvi import PVIStrategy
from .pvi_async import AsyncPVIStrategy


def make_server_app(overrides: dict | None = None, engine: str = "simulation",
                    progress: bool = True) -> ServerApp:
    """A ServerApp whose run config is ``context.run_config`` updated by ``overrides``."""
    overrides = dict(overrides or {})
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        config = parse_run_config({**dict(context.run_config), **overrides})
        exp = build_experiment(config)
        cls = AsyncPVIStrategy if config.schedule == "asynchronous" else PVIStrategy
        strategy = cls(exp.prior, exp.num_clients, config.seed, exp.pvi_config,
                       config.optimise_prior)
        recorder = Recorder(exp, engine, progress=progress)

        def record(server_round: int, arrays) -> None:
            if server_round > 0:
                recorder.record(server_round, strategy.posterior, strategy.round_logs[server_round])

        strategy.start(grid, strategy.initial_arrays(), num_rounds=config.num_rounds,
                       evaluate_fn=record)
        recorder.finish()

    return app


app = make_server_app()
