"""Every client draws its own noise: the seeds the engine hands out differ across partitions,
rounds and attempts (issue 31, mutant M21: the partition id left out of ``derive_seed``, so every
client of a round drew the same numbers and no test noticed).

The expectations are not computed with the library's seed functions: the engine's seeds are
recorded as it hands them to ``client_step`` and compared with each other, and the noise two
clients draw from them is compared directly.
"""

import itertools

import numpy as np
import pytest

from fedbayes_flwr.runtime import steps
from fedbayes_flwr.runtime.config import parse_run_config
from fedbayes_flwr.runtime.engine import iterate_in_process
from fedbayes_flwr.runtime.experiment import build_experiment
from fedbayes_flwr.seeds import derive_seed
from tests.helpers import mutants

#: The engine derives every bundle's client seeds in one place (runtime/steps.client_work), so one
#: cheap family is enough here (DSGLD's run costs 10 s of TensorFlow compilation for the same path).
RUNS = {
    "pvi": {"algorithm": "pvi", "model": "linear-regression", "dataset": "synthetic",
            "synthetic-size": 40, "num-rounds": 2},
}


def _recorded_seeds(monkeypatch, keys):
    """``{(action, round, partition, attempt): seed}`` for every client step of a short run."""
    seen = {}
    original = steps.client_seed

    def recording(run_seed, bundle, action, number, partition_id, attempt=0):
        seed = original(run_seed, bundle, action, number, partition_id, attempt)
        seen[(action, number, partition_id, attempt)] = tuple(int(s) for s in seed)
        return seed

    monkeypatch.setattr(steps, "client_seed", recording)
    exp = build_experiment(parse_run_config({"num-clients": 4, "partition": "iid", "seed": 3, **keys}))
    list(iterate_in_process(exp))
    return seen


def _check_distinct(seen):
    partitions = {key[2] for key in seen}
    assert len(partitions) >= 2, f"the run used partitions {partitions}: nothing to compare"
    clashes = [(a, b) for a, b in itertools.combinations(seen, 2) if seen[a] == seen[b]]
    assert not clashes, f"{len(clashes)} pairs of client steps share a seed, e.g. {clashes[:2]}"


@pytest.mark.parametrize("run", list(RUNS))
def test_engine_hands_every_client_step_its_own_seed(monkeypatch, run):
    _check_distinct(_recorded_seeds(monkeypatch, RUNS[run]))


def test_engine_seeds_mutant_fails(monkeypatch):
    mutants.apply(monkeypatch, "M21")
    with pytest.raises(AssertionError, match="share a seed"):
        _check_distinct(_recorded_seeds(monkeypatch, RUNS["pvi"]))


def test_clients_of_one_round_draw_independent_noise():
    """Standard normals drawn (numpy, from the seed's two 32-bit words) from the seeds of 64
    partitions in one round: their empirical correlation between partitions is that of
    independent vectors (|r| below 5 / sqrt(n) for each of the 2016 pairs, n = 1000 draws: a
    5-sigma bound, family-wise probability of a false alarm 2016 * 5.7e-7 = 1e-3)."""
    n = 1000
    draws = np.stack([np.random.default_rng(derive_seed(7, "pvi", 3, k).view(np.uint32))
                      .standard_normal(n) for k in range(64)])
    r = np.corrcoef(draws)[np.triu_indices(64, 1)]
    assert np.max(np.abs(r)) < 5 / np.sqrt(n), f"max |corr| {np.max(np.abs(r)):.3f}"


def test_seed_depends_on_every_key():
    """Distinct (run, stream, round, partition, attempt) give distinct seeds: 4 * 3 * 4 * 7 * 2
    = 672 keys, no two alike (a 64-bit state: a chance collision has probability 2e-14)."""
    keys = list(itertools.product([0, 1, 2, 99], ["pvi", "sgld", "pvi.evaluate"], [0, 1, 2, 10],
                                  [-1, 0, 1, 2, 3, 4, 100], [0, 1]))
    seeds = {tuple(derive_seed(*key)) for key in keys}
    assert len(seeds) == len(keys)
