"""The Python API: :func:`fit` runs an experiment and returns a :class:`Run`; :func:`load` reads
one back from the files a run wrote.

``fit`` takes the run config as a dict with the same kebab-case keys as the CLI's
``--run-config`` (``algorithm``, ``model``, ``dataset``, ``num-clients``, ``num-rounds``, the
algorithm's own keys...). With the in-process engine two keys may also hold objects: ``model`` a
:class:`fedbayes_flwr.models.Model` (registered under a generated name) and ``data`` a dict of
arrays (written as ``data.npz`` in the output directory, :mod:`fedbayes_flwr.data.npz`).

A :class:`Run` holds the posterior as a :class:`FittedPosterior`: the library's posterior object
(:mod:`fedbayes_flwr.inference.posterior`, the same one ``posterior.npz`` stores) with the run's
model, so that ``sample(n, seed=...)`` and ``predict(x)`` need no seed arrays and no model.

This module imports TensorFlow (through the runtime); ``import fedbayes_flwr`` does not: the
package re-exports :func:`fit`, :func:`load`, :class:`Run` and :class:`FittedPosterior` lazily.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedbayes_flwr.deploy import run as deploy_run
from fedbayes_flwr.errors import ConfigError
from fedbayes_flwr.evaluation.diagnostics import to_inference_data
from fedbayes_flwr.inference.posterior import Posterior, StructuredPosterior, load_posterior
from fedbayes_flwr.models import Model, register_object
from fedbayes_flwr.models.base import Prediction
from fedbayes_flwr.runtime.config import RunConfig, parse_run_config
from fedbayes_flwr.runtime.engine import run_in_process_with_posterior
from fedbayes_flwr.runtime.experiment import Experiment, build_experiment
from fedbayes_flwr.runtime.lock import output_dir_lock
from fedbayes_flwr.seeds import derive_seed

__all__ = ["ENGINES", "DATA_KEYS", "DATA_FILE", "FittedPosterior", "Run", "fit", "load"]

ENGINES = ("in-process", "deployment", "simulation")
"""The engines :func:`fit` knows; ``simulation`` is refused (see :func:`fit`)."""
DATA_KEYS = ("x_train", "y_train", "x_test", "y_test", "client_id")
"""The arrays a ``data`` dict may hold (the keys of a user ``.npz`` file)."""
DATA_FILE = "data.npz"
"""Where :func:`fit` writes a ``data`` dict, under the output directory."""


class FittedPosterior:
    """A run's posterior with the run's model: sample, mean, std, predict.

    Parameters
    ----------
    posterior : Posterior
        The library's posterior object (:class:`~fedbayes_flwr.inference.posterior.GaussianPosterior`,
        :class:`~fedbayes_flwr.inference.posterior.SamplePosterior`, ...), kept as
        :attr:`wrapped`; attributes not defined here (``ess``, ``rhat``, ``cov``, ``chains``,
        ``natural``...) are its own.
    experiment : callable
        Returns the run's :class:`~fedbayes_flwr.runtime.experiment.Experiment` (called, once,
        by :meth:`predict` only: a loaded run builds its model when first asked).

    Notes
    -----
    :meth:`sample` takes ``(n, seed=...)``, the library's ``Posterior.sample`` takes
    ``(seed, n)`` with an ``int32[2]`` seed; this class is the convenience over it and is not a
    :class:`~fedbayes_flwr.inference.posterior.Posterior` itself: pass :attr:`wrapped` to library
    functions that want one.
    """

    def __init__(self, posterior: Posterior, experiment):
        self.wrapped = posterior
        self._experiment = experiment
        self._model: Model | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never recurse while unpickling or before __init__
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def __repr__(self) -> str:
        return f"FittedPosterior({type(self.wrapped).__name__}, dim={self.dim})"

    @property
    def kind(self) -> str:
        """``"gaussian"``, ``"samples"`` or ``"structured"`` (the wrapped posterior's kind)."""
        return self.wrapped.kind

    @property
    def dim(self) -> int:
        """Number of parameters ``d``."""
        return self.wrapped.dim

    def mean(self) -> np.ndarray:
        """Posterior mean, shape ``(d,)``."""
        return self.wrapped.mean()

    def std(self) -> np.ndarray:
        """Marginal posterior standard deviations, shape ``(d,)``."""
        return self.wrapped.std()

    def sample(self, n: int, seed: int | np.ndarray = 0) -> np.ndarray:
        """``n`` draws of ``theta``, shape ``(n, d)``.

        Parameters
        ----------
        n : int
            Number of draws.
        seed : int or numpy.ndarray
            An integer ``>= 0`` (mapped to a stateless seed by
            :func:`fedbayes_flwr.seeds.derive_seed`) or an ``int32[2]`` stateless seed as the
            library takes it. The same seed gives the same draws.
        """
        if isinstance(seed, np.ndarray) and seed.shape == (2,):
            stateless = seed.astype(np.int32)
        elif isinstance(seed, int | np.integer) and not isinstance(seed, bool) and seed >= 0:
            stateless = derive_seed(int(seed), "api-sample", 0, -1)
        else:
            raise ConfigError(f"sample: seed must be an integer >= 0 or an int32[2] array, "
                              f"got {seed!r}")
        return self.wrapped.sample(stateless, int(n))

    def predict(self, x) -> Prediction:
        """The posterior predictive on inputs ``x`` (the model's ``predictive``).

        Returns
        -------
        Prediction
            ``mean`` and ``var`` (regression) or ``prob`` (classification), one row per input.
        """
        if self._model is None:
            self._model = self._experiment().model
        return self._model.predictive(self.wrapped, np.asarray(x, dtype=np.float64))

    def save(self, path: str | os.PathLike) -> None:
        """Write the posterior to an ``.npz`` file (as a run's ``posterior.npz``)."""
        self.wrapped.save(path)

    def to_arviz(self) -> Any:
        """The draws as an ArviZ ``InferenceData`` (sample posteriors: PDMC, decentralized HMC,
        SGLD, particles), for ArviZ's own diagnostics and plots (``arviz.summary``,
        ``arviz.plot_trace``, ...); see
        :func:`fedbayes_flwr.evaluation.diagnostics.to_inference_data`.

        Raises
        ------
        ValueError
            The posterior has no draws (Gaussian or structured).

        References
        ----------
        Kumar et al. (2019), "ArviZ a unified library for exploratory analysis of Bayesian
        models in Python", JOSS 4(33).
        """
        return to_inference_data(self.wrapped)


@dataclasses.dataclass(frozen=True)
class Run:
    """What one run produced.

    Attributes
    ----------
    posterior : FittedPosterior or None
        The posterior of the last row (``None`` when the run recorded no row).
    history : list of dict
        One row per evaluation point (``round``, the test metrics, bytes, diagnostics...).
    final : dict
        The last row, as ``result.json``'s ``final``.
    output_dir : str
        Where ``result.json``, ``posterior.npz`` and the plots are.
    outcome : str
        ``completed``, ``done``, ``time-limit``, ``stopped``, ``failed`` or ``interrupted``.
    result : dict
        The whole ``result.json`` (run config, engine, reason of a stop...).
    """

    posterior: FittedPosterior | None
    history: list[dict]
    final: dict
    output_dir: str
    outcome: str
    result: dict = dataclasses.field(repr=False, compare=False)


def fit(config: Mapping[str, Any], *, engine: str = "in-process", progress: bool = True) -> Run:
    """Run the experiment of ``config`` and return its :class:`Run`.

    Parameters
    ----------
    config : mapping
        The run config: the CLI's kebab-case keys (``docs/getting-started.md``, "Run-config keys"). With the
        in-process engine, ``model`` may be a :class:`~fedbayes_flwr.models.Model` instance
        (registered with :func:`~fedbayes_flwr.models.register_object` under its stable
        ``app-<class>-<digest>`` name, which becomes its ``name``, as the Flower apps'
        ``make_server_app(model=...)`` / ``make_client_app(model=...)`` register it; the same
        instance passed again keeps its name) and
        ``data`` a dict of arrays with the keys of :data:`DATA_KEYS` (``x_train`` required;
        written to ``<output-dir>/data.npz``).
    engine : str
        ``"in-process"`` (the default) or ``"deployment"`` (a one-machine Flower deployment,
        :func:`fedbayes_flwr.deploy.run.run_deployment`: registered names and files only).
        ``"simulation"`` is refused: the Simulation Engine's apps (``strategies/``,
        ``clients/``) sit above the library; run ``run_simulation.py --engine simulation`` and
        :func:`load` its output directory.
    progress : bool
        Show progress (a bar on a terminal, one line per row otherwise).

    Returns
    -------
    Run
        The history, the final row, the outcome and the posterior; the result files are in
        ``output-dir`` (made absolute).

    Raises
    ------
    ConfigError
        One line: an unknown engine or key, a bad value, objects given to a Flower engine, a
        ``data`` dict with unknown keys; :class:`~fedbayes_flwr.runtime.lock.OutputDirBusy`
        when another live run holds ``output-dir`` (:mod:`fedbayes_flwr.runtime.lock`).
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES[:2])}")
    if engine == "simulation":
        raise ConfigError("engine 'simulation' is not available from the Python API (its Flower "
                          "apps sit above the library): run run_simulation.py --engine "
                          "simulation, then fedbayes_flwr.load(output_dir)")
    values = dict(config)
    objects = [key for key in ("model", "data") if not isinstance(values.get(key, ""), str)]
    if objects and engine != "in-process":
        raise ConfigError(f"engine {engine!r} needs registered names and files: "
                          f"{', '.join(objects)} must be strings (objects work in-process only)")
    output_dir = os.path.abspath(str(values.get("output-dir", RunConfig.output_dir)))
    values["output-dir"] = output_dir
    if isinstance(values.get("model"), Model):
        values["model"] = _register(values["model"])
    elif "model" in values and not isinstance(values["model"], str):
        raise ConfigError(f"run-config key 'model': expected a model name or a Model, got "
                          f"{type(values['model']).__name__}")
    with output_dir_lock(output_dir):  # one run per output directory (OutputDirBusy)
        if "data" in values and not isinstance(values["data"], str):
            values["data"] = _write_data(values["data"], output_dir)
        run_config = parse_run_config(values)
        if engine == "deployment":
            deploy_run.run_deployment(run_config.to_run_config(), progress=progress)
            return load(output_dir)
        result, posterior = run_in_process_with_posterior(run_config, progress=progress)
    return _run(result, output_dir, posterior, lambda: build_experiment(run_config))


def load(output_dir: str | os.PathLike) -> Run:
    """The :class:`Run` stored in ``output_dir`` (its ``result.json`` and ``posterior.npz``).

    The posterior is the same kind of object as the fitted one, with bitwise the same
    :meth:`~FittedPosterior.mean` and :meth:`~FittedPosterior.std`
    (:func:`fedbayes_flwr.inference.posterior.load_posterior`). The run's experiment (data and
    model) is built only when needed: by :meth:`FittedPosterior.predict`, and at load for a
    structured (AMPS) posterior.

    Parameters
    ----------
    output_dir : str or os.PathLike
        A run's output directory (any engine's).

    Raises
    ------
    ConfigError
        One line: the directory holds no ``result.json``, or a run config this process cannot
        rebuild when the experiment is needed (a model registered in another process: import
        its ``model-modules``, or register it again under the same name).
    """
    output_dir = os.path.abspath(os.fspath(output_dir))
    path = os.path.join(output_dir, "result.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{output_dir}: no result.json (not a run's output directory)")
    with open(path) as f:
        result = json.load(f)
    experiment = _experiment_of(result, output_dir)
    posterior = None
    if result.get("posterior_file"):
        file = os.path.join(output_dir, result["posterior_file"])
        try:
            posterior = load_posterior(file)
        except ValueError:  # a structured file: rebuilt on the model's own blocks
            exp = experiment()
            template = exp.bundle.posterior(exp.bundle.init_server(exp.setup), exp.setup)
            if not isinstance(template, StructuredPosterior):
                raise
            posterior = load_posterior(file, template)
    return _run(result, output_dir, posterior, experiment)


def _run(result: dict, output_dir: str, posterior: Posterior | None, experiment) -> Run:
    return Run(posterior=None if posterior is None else FittedPosterior(posterior, experiment),
               history=list(result["history"]), final=dict(result["final"]),
               output_dir=output_dir, outcome=str(result["outcome"]), result=result)


def _experiment_of(result: dict, output_dir: str):
    """A function building the stored run's experiment (once), its data file found in
    ``output_dir`` if :func:`fit` wrote it there and the directory has moved since."""
    cache: list[Experiment] = []

    def experiment() -> Experiment:
        if not cache:
            values = dict(result["run_config"])
            stored = os.path.join(str(values.get("output-dir", "")), DATA_FILE)
            if values.get("data") == stored:
                values["data"] = os.path.join(output_dir, DATA_FILE)
            values["output-dir"] = output_dir
            try:
                cache.append(build_experiment(parse_run_config(values)))
            except ValueError as err:  # ConfigError, DataError, an unknown model
                raise ConfigError(f"{output_dir}: cannot rebuild the run's experiment: "
                                  f"{err}") from None
        return cache[0]

    return experiment


def _register(model: Model) -> str:
    """The registry name of ``model`` (:func:`~fedbayes_flwr.models.registry.register_object`:
    its own if this very object is registered, else the stable ``app-<class>-<digest>`` that
    the Flower apps compute for the same model)."""
    try:
        return register_object(model)
    except ValueError as err:
        raise ConfigError(f"run-config key 'model': {err}") from None


def _write_data(data, output_dir: str) -> str:
    """Write a dict of arrays as ``<output_dir>/data.npz`` (:mod:`fedbayes_flwr.data.npz`)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"run-config key 'data': expected a .npz path or a dict of arrays, got "
                          f"{type(data).__name__}")
    unknown = sorted(set(map(str, data)) - set(DATA_KEYS))
    if unknown:
        raise ConfigError(f"run-config key 'data': unknown arrays {', '.join(unknown)}; known: "
                          f"{', '.join(DATA_KEYS)}")
    if "x_train" not in data:
        raise ConfigError("run-config key 'data': the dict needs 'x_train'")
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, DATA_FILE)
    arrays: dict[str, Any] = {str(k): np.asarray(v) for k, v in data.items() if v is not None}
    np.savez(path, **arrays)
    return path
