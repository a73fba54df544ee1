"""Stateless seeds derived from (run seed, algorithm, round, partition id).

A seed is an ``int32[2]`` array, the form TensorFlow's ``tf.random.stateless_*`` ops and TFP take.
It never depends on message order or node ids, so a run is reproducible in-process, in Flower's
Simulation Engine and in deployment.
"""

from __future__ import annotations

import zlib

import numpy as np


def derive_seed(run_seed: int, algorithm: str, server_round: int, partition_id: int,
                attempt: int = 0) -> np.ndarray:
    """Return the ``int32[2]`` seed of one client's work in one round.

    Parameters
    ----------
    run_seed : int
        The user's seed for the whole run (>= 0).
    algorithm : str
        A stable name of the stream (``"pvi"``, ``"pvi-order"``, ``"eval"``...).
    server_round : int
        The round (1-based; 0 for set-up).
    partition_id : int
        The client's partition id, or -1 for the server.
    attempt : int
        0 for a first attempt; a retried request (or the k-th exchange of one update) passes
        ``k`` and draws fresh numbers. 0 leaves the entropy (and every existing seed) unchanged.

    Returns
    -------
    numpy.ndarray
        ``int32`` array of shape ``(2,)``.
    """
    if run_seed < 0:
        raise ValueError(f"seed must be >= 0, got {run_seed}")
    entropy = [int(run_seed), zlib.crc32(algorithm.encode()), int(server_round), int(partition_id) + 1]
    if attempt:
        entropy.append(int(attempt))
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return state.view(np.int32).copy()


def numpy_rng(seed: np.ndarray) -> np.random.Generator:
    """A numpy generator from an ``int32[2]`` stateless seed (for host-side choices)."""
    return np.random.default_rng(np.asarray(seed, dtype=np.int64) & 0xFFFFFFFF)
