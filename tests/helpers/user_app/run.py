"""Run the user app through Flower's Simulation Engine:
``python -m tests.helpers.user_app.run SETTINGS_JSON DATA_DIR OUTPUT_DIR``."""

from __future__ import annotations

import json
import sys

from flwr.simulation import run_simulation

from run_simulation import quiet_flower_logs, ray_backend_config

from . import client_app, server_app


def main(argv: list[str]) -> None:
    settings, data_dir, output_dir = json.loads(argv[0]), argv[1], argv[2]
    quiet_flower_logs()
    run_simulation(server_app=server_app.build(settings, data_dir, output_dir),
                   client_app=client_app.build(settings, data_dir),
                   num_supernodes=int(settings["num-clients"]),
                   backend_config=ray_backend_config(1.0))


if __name__ == "__main__":
    main(sys.argv[1:])
