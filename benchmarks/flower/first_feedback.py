"""How long the CLI takes to report bad input: the first feedback a new user gets.

Runs ``run_simulation.py`` as a user would (a fresh process each time) with input that the cheap
checks reject before TensorFlow and Flower are imported: a missing ``--data`` file, a data file
without the key the model needs, an unknown run-config key. Writes the wall times (median, min,
max over ``--repeats``), the exit status and the one error line to
``benchmarks/results/flower/first_feedback.json``. ``--before PATH`` also times another copy of
the script (e.g. a checkout from before the checks moved) on the same inputs.

    python benchmarks/flower/first_feedback.py --repeats 5 [--before /path/to/old/run_simulation.py]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "flower", "first_feedback.json")


def cases(work: str) -> dict[str, list[str]]:
    import numpy as np

    keys_only = os.path.join(work, "x_only.npz")
    np.savez(keys_only, x_train=np.zeros((4, 2)))  # no y_train for logistic regression
    out = os.path.join(work, "out")
    return {"missing --data file": ["--data", os.path.join(work, "missing.npz"), "--output-dir", out],
            "data file without y_train": ["--data", keys_only, "--output-dir", out],
            "unknown run-config key": ["--run-config", "no-such-key=1", "--output-dir", out]}


def time_case(script: str, argv: list[str], repeats: int) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    times, last = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        last = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True,
                              env=env, cwd=os.path.dirname(os.path.abspath(script)), timeout=300)
        times.append(time.perf_counter() - t0)
    assert last is not None
    return {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
            "max_s": round(max(times), 3), "times_s": [round(t, 3) for t in times],
            "exit_status": last.returncode,
            "stderr_first_line": (last.stderr.strip().splitlines() or [""])[0][:200]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", metavar="PATH", help="another run_simulation.py to time")
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args()
    scripts = {"after": os.path.join(ROOT, "run_simulation.py")}
    if args.before:
        scripts["before"] = os.path.abspath(args.before)
    with tempfile.TemporaryDirectory() as work:
        todo = cases(work)
        results = {label: {name: time_case(script, argv, args.repeats)
                           for name, argv in todo.items()}
                   for label, script in scripts.items()}
    doc = {"benchmark": "first_feedback", "repeats": args.repeats, "scripts": scripts,
           "results": results,
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "python": sys.version.split()[0],
                       "load_average": [round(x, 2) for x in os.getloadavg()]},
           "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output + ".tmp", "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(args.output + ".tmp", args.output)
    for label, rows in results.items():
        for name, row in rows.items():
            print(f"{label:6s} {name:28s} median {row['median_s']:6.2f} s  "
                  f"(min {row['min_s']:.2f}, max {row['max_s']:.2f})  exit {row['exit_status']}")


if __name__ == "__main__":
    main()
