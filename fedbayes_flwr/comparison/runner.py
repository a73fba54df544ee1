"""Run several algorithms on the same data and score them against one reference.

:func:`compare` is the Python entry point (the in-process and deployment engines, through
:func:`fedbayes_flwr.api.fit`); ``run_simulation.py --compare`` passes its own ``run_one``
for the Simulation Engine. Every algorithm gets the same common run-config keys, only its own
section's keys (``pvi.*`` go to the PVI algorithms...) and its own subfolder
``<output-dir>/<algorithm>``. One that refuses the model or fails is recorded with its one-line
reason and the others go on; ``compare.json`` and ``compare.md`` are rewritten after every
algorithm, so an interrupted comparison keeps what finished.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from fedbayes_flwr.algorithms import registry
from fedbayes_flwr.api import _register, _write_data, fit
from fedbayes_flwr.comparison.reference import ReferencePosterior, reference_posterior
from fedbayes_flwr.comparison.report import write_reference, write_report
from fedbayes_flwr.comparison.scores import score_run
from fedbayes_flwr.comparison.table import sort_rows
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.runtime.config import RunConfig, parse_run_config
from fedbayes_flwr.runtime.experiment import build_experiment

__all__ = ["Comparison", "RunOne", "algorithm_config", "compare", "resolve_algorithms"]

RunOne = Callable[[dict], tuple[dict, Any]]
"""``run_one(values) -> (result dict, posterior or None)``; raises on a refused config."""


class Comparison(NamedTuple):
    """What :func:`compare` produced.

    Attributes
    ----------
    reference : ReferencePosterior
    rows : list of dict
        One per algorithm, in the order run (see
        :func:`~fedbayes_flwr.comparison.scores.score_run`; a refused or failed one has
        ``outcome`` ``refused`` / ``error`` and ``reason``).
    output_dir : str
        Where ``compare.json``, ``compare.md``, ``compare.png`` and the subfolders are.
    """

    reference: ReferencePosterior
    rows: list[dict]
    output_dir: str

    def table(self) -> list[dict]:
        """The rows sorted as ``compare.md`` shows them (smallest posterior error first)."""
        return sort_rows(self.rows)

    @property
    def ran(self) -> int:
        """How many algorithms produced a result."""
        return sum(row.get("outcome") not in ("refused", "error") for row in self.rows)


def resolve_algorithms(spec: str | Sequence[str]) -> list[str]:
    """The algorithm names of ``spec``: ``"all"`` (every registered one), a comma-separated
    string or a sequence; a ConfigError names an unknown one."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    names = [n for n in names if n]
    if names == ["all"]:
        return list(registry.names())
    if not names:
        raise ConfigError("--compare needs at least one algorithm name (or 'all')")
    known = set(registry.names())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown algorithm {', '.join(map(repr, unknown))} in --compare; "
                          f"known: {', '.join(registry.names())}, or all")
    if len(set(names)) != len(names):
        raise ConfigError(f"--compare names an algorithm twice: {','.join(names)}")
    return names


def algorithm_config(values: Mapping[str, Any], algorithm: str) -> dict:
    """``values`` for ``algorithm``: the common keys and its own section's keys (``<bundle>.*``),
    without other sections' keys; ``algorithm`` set."""
    sections = set(registry.bundles())
    own = registry.get(algorithm).bundle.name
    out = {k: v for k, v in values.items()
           if "." not in k or k.split(".", 1)[0] == own or k.split(".", 1)[0] not in sections}
    out["algorithm"] = algorithm
    return out


def _fit_one(engine: str, progress: bool) -> RunOne:
    def run_one(values: dict):
        run = fit(values, engine=engine, progress=progress)
        return run.result, (None if run.posterior is None else run.posterior.wrapped)
    return run_one


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def compare(config: Mapping[str, Any], algorithms: str | Sequence[str] = "all", *,
            engine: str = "in-process", reference: str = "auto", progress: bool = True,
            run_one: RunOne | None = None, cache_dir: str | None = None) -> Comparison:
    """Run each of ``algorithms`` on ``config``'s data and score it against one reference.

    Parameters
    ----------
    config : mapping
        A run config as for :func:`fedbayes_flwr.fit` (``algorithm`` is ignored); keys of an
        algorithm section (``pvi.damping``) go only to that section's algorithms.
    algorithms : str or sequence of str
        ``"all"``, ``"pvi,dhmc,sgld"`` or a list of names.
    engine : str
        ``in-process`` or ``deployment`` (see :func:`fedbayes_flwr.fit`).
    reference : {"auto", "exact", "nuts", "none"}
        See :func:`~fedbayes_flwr.comparison.reference.reference_posterior`.
    progress : bool
        One ``[i/n] algorithm`` line per algorithm and each run's own progress.
    run_one : callable, optional
        Runs one algorithm's config (the CLI passes the Simulation Engine's); default
        :func:`fedbayes_flwr.fit` with ``engine``.
    cache_dir : str, optional
        Where a NUTS reference is cached.

    Returns
    -------
    Comparison
        The reference, one row per algorithm and the output directory, where
        ``compare.json``, ``compare.md`` and ``compare.png`` are written.

    References
    ----------
    Hoffman & Gelman (2014), JMLR 15 (the NUTS reference); Villani (2009), Chapter 6 (W1).
    """
    values = {k: v for k, v in dict(config).items() if k != "algorithm"}
    names = resolve_algorithms(algorithms)
    output_dir = os.path.abspath(str(values.get("output-dir", RunConfig.output_dir)))
    run_one = run_one or _fit_one(engine, progress)
    if not isinstance(values.get("model", ""), str):  # a Model object: registered once
        values["model"] = _register(values["model"])
    if "data" in values and not isinstance(values["data"], str):  # arrays: one data.npz
        values["data"] = _write_data(values["data"], output_dir)
    ref: ReferencePosterior | None = None
    experiment = None
    rows: list[dict] = []
    posteriors: dict = {}
    for i, name in enumerate(names):
        sub = {**algorithm_config(values, name), "output-dir": os.path.join(output_dir, name)}
        if progress:
            print(f"[{i + 1}/{len(names)}] {name}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            result, posterior = run_one(sub)
        except KeyboardInterrupt:
            raise
        except ValueError as err:  # ConfigError, DataError, a model the bundle refuses
            rows.append({"algorithm": name, "outcome": "refused", "reason": _one_line(err)})
        except Exception as err:  # noqa: BLE001 - one algorithm's crash must not end the others
            rows.append({"algorithm": name, "outcome": "error",
                         "reason": f"{type(err).__name__}: {_one_line(err)}"})
        else:
            wall = time.perf_counter() - start
            if experiment is None:  # the data, model and prior of every run: same for all
                experiment = build_experiment(parse_run_config(sub))
                ref = reference_posterior(experiment, reference, cache_dir=cache_dir)
                write_reference(output_dir, ref)
            assert ref is not None
            row = {"algorithm": name, **score_run(result, posterior, ref, experiment, wall)}
            if result.get("reason"):
                row["reason"] = str(result["reason"])
            rows.append(row)
            if posterior is not None:
                posteriors[name] = posterior
        if progress and rows[-1].get("reason") and rows[-1]["outcome"] in ("refused", "error"):
            print(f"  {name}: {rows[-1]['outcome']}: {rows[-1]['reason']}", file=sys.stderr)
        write_report(output_dir, ref, rows, values)
    final = ref or ReferencePosterior("none", None, None, None,
                                      {"reason": "no algorithm ran"})
    write_report(output_dir, final, rows, values, figure=True, posteriors=posteriors)
    return Comparison(final, rows, output_dir)
