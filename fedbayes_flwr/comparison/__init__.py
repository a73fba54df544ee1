"""Compare several algorithms on one data set against a reference posterior.

:func:`compare` (also ``fedbayes_flwr.compare``) runs each algorithm with the same data,
partition, seed and common run-config keys, each in its own subfolder of ``output-dir``, then
scores every posterior against one reference (:func:`reference_posterior`: exact for a
conjugate model, NUTS on the pooled data for a small one, none for a large one) and writes
``compare.json``, ``compare.md`` and ``compare.png`` (:func:`write_report`). The CLI's
``run_simulation.py --compare ALG[,ALG...]`` is the same with the Flower engines.
"""

from fedbayes_flwr.comparison.reference import ReferencePosterior, reference_posterior
from fedbayes_flwr.comparison.report import write_report
from fedbayes_flwr.comparison.runner import Comparison, algorithm_config, compare, resolve_algorithms
from fedbayes_flwr.comparison.scores import score_run

__all__ = ["Comparison", "ReferencePosterior", "algorithm_config", "compare", "reference_posterior",
           "resolve_algorithms", "score_run", "write_report"]
