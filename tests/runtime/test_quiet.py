"""TensorFlow's start-up lines stay off the console of a Ray worker the CLI starts
(:mod:`fedbayes_flwr.runtime.quiet`: ``worker_site/sitecustomize.py`` first on its PYTHONPATH)."""

import os
import subprocess
import sys

from tests.flower.test_flower_simulation import tensorflow_lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = """
import logging, sys
import tensorflow as tf
tf.config.list_physical_devices("GPU")  # where cuInit is called on a machine without a GPU
print(tf.__version__, float(tf.constant(2.0) * 3.0))
logging.getLogger("flwr").warning("Manually terminating ClientAppActor")
logging.getLogger("flwr").warning("kept: a line the user needs")
"""


def _run(pythonpath: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT,
                          env={**env, "PYTHONPATH": pythonpath}, capture_output=True, text=True,
                          timeout=120)


def test_worker_start_up_silences_tensorflow_and_keeps_real_lines():
    """A process started as the CLI starts its Ray workers (the worker site folder first on
    PYTHONPATH, nothing else) imports TensorFlow without a start-up line; other lines stay."""
    from fedbayes_flwr.runtime.quiet import WORKER_SITE

    quiet = _run(os.pathsep.join((WORKER_SITE, ROOT)))
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stdout.split()[1] == "6.0"  # TensorFlow works after the quiet import
    assert not tensorflow_lines(quiet.stderr), quiet.stderr
    assert "kept: a line the user needs" in quiet.stderr
    # (without the worker site folder the same script prints the absl banner, oneDNN, cudart and cuInit lines:
    # checked by hand with TensorFlow 2.21; a second TensorFlow import here would double the cost)
