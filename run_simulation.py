#!/usr/bin/env python
"""Run a federated Bayesian experiment: Flower's Simulation Engine or in-process.

Example::

    python run_simulation.py --algorithm pvi --model logistic-regression --dataset breast-cancer \\
        --num-clients 10 --partition dirichlet --partition-alpha 0.5 --num-rounds 10 --seed 0 \\
        --output-dir runs/demo --run-config "damping=0.5 schedule='sequential'"

``python run_simulation.py list [algorithms|models|datasets]`` names every algorithm, model and
dataset with one line each, from the registries (plugins named with ``--run-config
"algorithm-modules=... model-modules=..."`` included).

Bad input exits with status 2 and one line on stderr saying what is wrong; the cheap checks (the
run-config keys, the data file and its keys, the output directory) run before TensorFlow and Flower
are imported, so they answer in about a second. Algorithm keys take their section
(``pvi.damping=0.5``) or, for the chosen algorithm, the bare key (``damping=0.5``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

# Keep TensorFlow / Flower quiet and offline before anything imports them.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # 3: also the cuInit ERROR of a machine without GPU
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

EXIT_FAILED = 3  # the run finished but no update was accepted (its posterior is the prior)
EXIT_INTERRUPTED = 130  # Ctrl-C: the finished updates are kept (128 + SIGINT, as shells report)

# Flag -> run-config key (flags mirror the keys; --run-config can set any key).
FLAGS = {
    "algorithm": str, "model": str, "dataset": str, "data": str, "num-clients": int,
    "partition": str, "partition-alpha": float, "partition-classes": int, "num-rounds": int,
    "seed": int, "prior-scale": float, "noise-scale": float, "output-dir": str,
}


class _OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error (``error: ...``, exit 2) instead of the usage block."""

    def error(self, message: str):  # type: ignore[override]
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


LIST_KINDS = ("algorithms", "models", "datasets")


def parse_args(argv=None) -> argparse.Namespace:
    parser = _OneLineParser(
        description=__doc__.split("\n\n")[0],
        epilog="Every run-config key (see README) can be set with --run-config \"key=value ...\". "
               "`run_simulation.py list [algorithms|models|datasets]` describes every name in "
               "one line.")
    with _silenced_stderr_fd():  # a plugin module may import TensorFlow
        from fedbayes_flwr.algorithms import registry
        from fedbayes_flwr.data import DATASETS, HUB_PREFIX
        from fedbayes_flwr.models import registry as model_registry

        _load_plugins_for_help(sys.argv[1:] if argv is None else argv)
        algorithms = ", ".join(registry.names())
        models = ", ".join(model_registry.ALL_MODELS)
    extras = {"algorithm": f": one of {algorithms} (the registry; plugins with --run-config "
                           f"algorithm-modules=...)",
              "model": f": one of {models} (the registry; plugins with "
                       f"--run-config model-modules=...)",
              "dataset": f": one of {', '.join(DATASETS)}, or {HUB_PREFIX}<id> (a Hugging Face "
                         f"dataset); --data FILE.npz for your own arrays",
              "data": ": a .npz file with x_train, y_train (x_test, y_test, client_id optional)"}
    for flag, kind in FLAGS.items():
        parser.add_argument(f"--{flag}", type=kind, default=None,
                            help=f"run-config key '{flag}'{extras.get(flag, '')}")
    parser.add_argument("--engine", choices=("simulation", "in-process", "deployment"),
                        default="simulation",
                        help="Flower's Simulation Engine (default), the library alone, or a "
                             "Flower deployment on this machine (a SuperLink with TLS and "
                             "SuperNode authentication, one SuperNode per partition)")
    parser.add_argument("--run-config", action="append", default=[],
                        help="space-separated key=value overrides in Flower's syntax; may be "
                             "repeated (merged in order, a later value wins)")
    parser.add_argument("--num-cpus-per-client", type=float, default=1.0,
                        help="Ray resources per simulated client (default 1)")
    parser.add_argument("--num-gpus-per-client", type=float, default=0.0,
                        help="Ray GPUs per simulated client, fractions allowed (default 0)")
    parser.add_argument("--ray-address", metavar="HOST:PORT", default=None,
                        help="attach the Simulation Engine to a running Ray cluster (the head's "
                             "`ray start --head --port`); without it a private local Ray "
                             "instance is started and RAY_ADDRESS is ignored")
    parser.add_argument("--optimise-prior", action="store_true",
                        help="learn prior-scale by maximising the free energy (run-config "
                             "optimise-prior=true); the learned value is reported")
    parser.add_argument("--compare", metavar="ALG[,ALG...]", default=None,
                        help="in place of --algorithm: run each of these algorithms (or 'all') "
                             "on the same data, partition, seed and engine, each in its own "
                             "subfolder of --output-dir, and score them against one reference "
                             "posterior (compare.json, compare.md, compare.png)")
    parser.add_argument("--reference", choices=("auto", "exact", "nuts", "none"), default=None,
                        help="with --compare: the reference posterior (default auto: exact for "
                             "a conjugate model, NUTS on the pooled data for a small one, none "
                             "for a large one)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument("--resume", metavar="DIR", default=None,
                        help="continue the run stored in DIR (its checkpoint.npz and own run "
                             "config) up to --num-rounds updates in all; no other run-config "
                             "flags")
    return parser.parse_args(argv)


def _load_plugins_for_help(argv) -> None:
    """Import the plugins named in ``--run-config`` (``algorithm-modules``, ``model-modules``)
    so that ``--help`` lists their names; a bad name is reported later, by the run config's
    validation (one line, exit status 2), not here."""
    from fedbayes_flwr.algorithms import registry
    from fedbayes_flwr.models import load_model_modules
    from fedbayes_flwr.runtime.config import ConfigError, parse_override_string

    argv = [str(a) for a in argv]
    texts = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--run-config"]
    texts += [a.split("=", 1)[1] for a in argv if a.startswith("--run-config=")]
    for text in texts:
        try:
            values = parse_override_string(text)
            registry.load_modules(str(values.get("algorithm-modules", "")))
            load_model_modules(str(values.get("model-modules", "")))
        except ConfigError:
            continue


def catalogue(kind: str) -> list[tuple[str, str]]:
    """``(name, one line)`` for every registered algorithm, model or dataset (``kind`` one of
    :data:`LIST_KINDS`), read from the registries when called, so plugins loaded before show up."""
    if kind == "algorithms":
        from fedbayes_flwr.algorithms import registry

        return [(e.name, e.description or e.bundle.name) for e in registry.entries()]
    if kind == "models":
        from fedbayes_flwr.models import describe_model
        from fedbayes_flwr.models import registry as model_registry

        return [(name, describe_model(name)) for name in model_registry.ALL_MODELS]
    if kind == "datasets":
        from fedbayes_flwr.data import DATASET_DESCRIPTIONS, DATASETS, HUB_PREFIX

        return [*((name, DATASET_DESCRIPTIONS.get(name, "")) for name in DATASETS),
                (f"{HUB_PREFIX}<id>", "a Hugging Face dataset through flwr-datasets, e.g. "
                                      "hub:mnist (needs the network)"),
                ("--data FILE.npz", "your own arrays: x_train, y_train; x_test, y_test and "
                                    "client_id optional")]
    raise ValueError(f"unknown kind {kind!r}; choose one of {', '.join(LIST_KINDS)}")


def list_main(argv) -> int:
    """``run_simulation.py list [algorithms|models|datasets] [--run-config ...]``: print the
    names with one line each; exit 2 with one line when a plugin module cannot be imported."""
    parser = argparse.ArgumentParser(
        prog="run_simulation.py list",
        description="Name every algorithm, model and dataset a run can use, one line each, "
                    "from the registries.")
    parser.add_argument("kind", nargs="?", choices=LIST_KINDS,
                        help="what to list (default: all three)")
    parser.add_argument("--run-config", action="append", default=[],
                        help="load plugins first: \"algorithm-modules=... model-modules=...\"")
    args = parser.parse_args(argv)
    from fedbayes_flwr.algorithms import registry
    from fedbayes_flwr.models import load_model_modules
    from fedbayes_flwr.runtime.config import ConfigError, parse_override_string

    try:
        with _silenced_stderr_fd():  # a plugin module may import TensorFlow
            for text in args.run_config:
                values = parse_override_string(text)
                registry.load_modules(str(values.get("algorithm-modules", "")))
                load_model_modules(str(values.get("model-modules", "")))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for kind in (args.kind,) if args.kind else LIST_KINDS:
        rows = catalogue(kind)
        width = max(len(name) for name, _ in rows)
        print(f"{kind}:")
        for name, line in rows:
            print(f"  {name:<{width}}  {line}")
    return 0


def resume_overrides(args: argparse.Namespace, ckpt) -> dict:
    """The run config of ``--resume DIR``: the checkpoint's own, in DIR, with ``--num-rounds``;
    raises ConfigError when other run-config flags are given (the stored run defines them)."""
    from fedbayes_flwr.runtime.config import ConfigError

    given = [f"--{flag}" for flag in FLAGS if flag != "num-rounds"
             and getattr(args, flag.replace("-", "_")) is not None]
    given += ["--run-config"] * bool(args.run_config) + ["--optimise-prior"] * args.optimise_prior
    if given:
        raise ConfigError(f"--resume continues the stored run with its own config: drop "
                          f"{', '.join(given)} (only --num-rounds may change)")
    overrides = {**ckpt.run_config, "output-dir": os.path.abspath(args.resume),
                 "resume": os.path.abspath(args.resume)}
    if args.num_rounds is not None:
        overrides["num-rounds"] = args.num_rounds
    return overrides


def build_overrides(args: argparse.Namespace) -> dict:
    """The run-config overrides of the command line; raises ConfigError on a malformed item."""
    from fedbayes_flwr.runtime.config import parse_override_string

    overrides = {}
    for text in args.run_config:
        overrides.update(parse_override_string(text))
    for flag in FLAGS:
        value = getattr(args, flag.replace("-", "_"))
        if value is not None:
            overrides[flag] = value
    if args.optimise_prior:
        overrides["optimise-prior"] = True  # resolves to the algorithm's section (pvi.*)
    for key in ("data", "output-dir"):  # Ray workers do not share our working directory
        if overrides.get(key) and isinstance(overrides[key], str):  # else: the config's error
            overrides[key] = os.path.abspath(overrides[key])
    return overrides


@contextlib.contextmanager
def _stop_on_first_ctrl_c():
    """First Ctrl-C: ask the engines to stop at the next step boundary (the finished updates,
    their result files and plots are kept). A second Ctrl-C aborts at once. The previous
    handler is restored on exit."""
    import signal
    import threading

    from fedbayes_flwr.runtime.steps import clear_stop, request_stop

    clear_stop()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        request_stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def check_output_dir(path: str) -> None:
    """Raise ConfigError unless ``path`` is (or can become) a directory this process can write:
    no NUL byte, each name within the file system's limit, and a directory can be made in its
    nearest existing ancestor (probed with a temporary directory, removed at once), so
    ``/proc/1/nope`` or a read-only mount is refused before any data is loaded."""
    import tempfile

    from fedbayes_flwr.runtime.config import ConfigError

    if "\x00" in path:
        raise ConfigError(f"output-dir {path!r}: a path cannot hold a NUL byte")
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        raise ConfigError(f"output-dir {path!r}: {probe!r} is a file, not a directory")
    if probe and not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"output-dir {path!r}: {probe!r} is not writable")
    limit = os.pathconf(probe or "/", "PC_NAME_MAX")
    long = [p for p in path.split(os.sep) if len(os.fsencode(p)) > limit]
    if long:
        raise ConfigError(f"output-dir {path[:80]!r}...: the name {long[0][:40]!r}... is longer "
                          f"than the file system allows ({limit} bytes)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fedbayes-probe-", dir=probe or "/"))
    except OSError as err:
        raise ConfigError(f"output-dir {path!r}: cannot create a directory in {probe!r} "
                          f"({err.strerror or err})") from None


def check_inputs(config) -> None:
    """The checks that need neither TensorFlow nor Flower: the output directory and, for
    ``data``, the file and the keys the model needs (:func:`fedbayes_flwr.data.npz.check_npz_file`)
    and the memory guard on its column count (read from the file's header:
    :func:`fedbayes_flwr.runtime.experiment.check_memory_early`); raises ConfigError or DataError.
    The run config itself was validated by parsing it."""
    from fedbayes_flwr.data.npz import check_npz_file, npz_shape
    from fedbayes_flwr.models import model_spec

    check_output_dir(os.path.abspath(config.output_dir))
    if config.data:
        check_npz_file(config.data, model_spec(config.model).target)
        shape = npz_shape(config.data, "x_train")
        if shape is not None and len(shape) == 2:
            from fedbayes_flwr.runtime.experiment import check_memory_early

            check_memory_early(config, shape[1])  # a full covariance: refused before loading


RAY_CONNECT_TIMEOUT_S = 5.0  # a head on the local network answers in milliseconds


def check_ray_address(address: str, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Raise ConfigError unless ``address`` is HOST:PORT of a Ray head that answers within
    ``timeout`` seconds.

    The probe asks the head's GCS for its cluster id (one gRPC call, the first thing
    ``ray.init`` does). Without it a wrong address costs minutes: ``ray.init`` retries for a
    minute inside Flower's engine thread while the ServerApp waits for clients (node-timeout),
    and a bare TCP check is fooled by anything listening there.
    """
    import grpc
    from ray._private.ray_constants import GLOBAL_GRPC_OPTIONS
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    from fedbayes_flwr.runtime.config import ConfigError

    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray-address {address!r}: expected HOST:PORT of a Ray head (the "
                          f"--port of `ray start --head`), e.g. 192.168.1.10:6379")
    try:
        with grpc.insecure_channel(address, options=GLOBAL_GRPC_OPTIONS) as channel:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=timeout)
    except grpc.RpcError as err:
        code = err.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            why = "nothing answers there"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            why = f"no answer within {timeout:g} s"
        else:
            why = "something answers there but it is not a Ray head"
        detail = " ".join(str(err.details()).split())[:200]
        raise ConfigError(f"--ray-address {address!r}: {why} ({detail}); start a head with "
                          f"`ray start --head --port {port}` or check the address") from None


def ray_backend_config(num_cpus: float, num_gpus: float = 0.0,
                       ray_address: str | None = None) -> dict:
    """Flower's ``backend_config`` for the Ray backend.

    With ``ray_address`` the engine attaches to that running cluster (``ray.init(address=...)``;
    Ray refuses ``num_cpus``/``num_gpus`` in ``init_args`` then: the cluster's nodes declare their
    own). Without it, ``address="local"`` makes Ray start a private instance even when
    ``RAY_ADDRESS`` is set or a ``ray start`` head runs on this machine (plain ``ray.init()``
    would silently attach to either).
    """
    init_args = {"logging_level": "ERROR", "log_to_driver": True,
                 "address": ray_address if ray_address is not None else "local"}
    return {"client_resources": {"num_cpus": num_cpus, "num_gpus": num_gpus},
            "init_args": init_args}


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"warning: {message}\n"


def _silenced_stderr_fd():
    """File descriptor 2 to /dev/null for a block (:func:`fedbayes_flwr.runtime.quiet.silenced_stderr_fd`):
    TensorFlow's C++ start-up lines (oneDNN, cuInit, absl) are written there before
    TF_CPP_MIN_LOG_LEVEL applies."""
    from fedbayes_flwr.runtime.quiet import silenced_stderr_fd

    return silenced_stderr_fd()


def start_ray(init_args: dict) -> None:
    """Start (or attach to) Ray for Flower's Simulation Engine with quiet workers.

    Flower's Ray backend calls ``ray.init`` only when Ray is not initialised yet, with a
    ``runtime_env`` of its own (``PYTHONPATH`` alone); started here first, with the same
    ``PYTHONPATH`` and ``init_args``, every worker also gets
    :data:`fedbayes_flwr.runtime.quiet.WORKER_ENV` (``TF_CPP_MIN_LOG_LEVEL=3``) and, first on
    its ``PYTHONPATH``, :data:`fedbayes_flwr.runtime.quiet.WORKER_SITE`, whose
    ``sitecustomize`` runs :func:`fedbayes_flwr.runtime.quiet.quiet_worker` at interpreter
    start-up: the TensorFlow import of Flower's actor module then runs with standard error
    silenced, and the actors' "Manually terminating ClientAppActor" lines are dropped. Flower
    shuts Ray down at the end as before. Ray's FutureWarning about accelerator variables is not
    shown: this CLI relies on today's behaviour (an actor with no GPU sees none).
    """
    import warnings

    import ray

    from fedbayes_flwr.runtime.quiet import WORKER_ENV, WORKER_SITE

    if ray.is_initialized():
        return
    pythonpath = os.pathsep.join(sys.path)  # what Flower's backend passes its workers
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    runtime_env = {"env_vars": {"PYTHONPATH": f"{WORKER_SITE}{os.pathsep}{pythonpath}",
                                **WORKER_ENV}}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray",
                                category=FutureWarning)
        ray.init(runtime_env=runtime_env, **{"include_dashboard": False, **init_args})


def _run_engine(args, config, overrides, exp, ckpt) -> int | None:
    """Run the chosen engine; an exit status when it ends the CLI early, else ``None``."""
    with _stop_on_first_ctrl_c():
        if args.engine == "in-process":
            from fedbayes_flwr.runtime.checkpoint import CheckpointError
            from fedbayes_flwr.runtime.engine import run_in_process

            try:
                run_in_process(config, progress=not args.quiet, resume=ckpt)
            except CheckpointError as err:  # the stored state does not fit the bundle
                print(f"error: {err}", file=sys.stderr)
                return 2
        elif args.engine == "deployment":
            code = run_deployment(config, progress=not args.quiet)
            if code is not None:
                return code
        else:
            run_flower_simulation(overrides, exp.num_clients, args.num_cpus_per_client,
                                  progress=not args.quiet, num_gpus=args.num_gpus_per_client,
                                  ray_address=args.ray_address)
    return None


def main(argv=None, reap: bool = False) -> int:
    """The CLI. ``reap`` (the script entry point) starts
    :func:`fedbayes_flwr.deploy.watchdog.start_reaper` for the engines that start processes."""
    import warnings

    warnings.formatwarning = _one_line_warning  # e.g. the rows held out of a file without x_test
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["list"]:
        return list_main(argv[1:])
    args = parse_args(argv)
    if args.compare is not None:
        return compare_main(args, reap)
    if args.reference is not None:
        print("error: --reference goes with --compare (see --help)", file=sys.stderr)
        return 2
    from fedbayes_flwr.data import DataError
    from fedbayes_flwr.runtime.config import ConfigError

    try:  # first the cheap checks: no TensorFlow, no Flower yet
        ckpt = None
        if args.resume:
            from fedbayes_flwr.runtime.checkpoint import load as load_checkpoint

            ckpt = load_checkpoint(args.resume)
        overrides = resume_overrides(args, ckpt) if ckpt else build_overrides(args)
    except (ConfigError, DataError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run_main(args, overrides, ckpt, reap)


def _import_tensorflow() -> None:
    with _silenced_stderr_fd():  # TensorFlow's C++ start-up lines go to /dev/null, and so does
        import tensorflow as tf  # the cuInit ERROR of its device discovery without a GPU

        tf.config.list_physical_devices()


def run_main(args, overrides: dict, ckpt=None, reap: bool = False, report: bool = True) -> int:
    """One run of ``overrides`` on ``args.engine``: the CLI's exit status. ``report``: print
    the final metrics as JSON on standard output (``--compare`` prints its own table)."""
    from fedbayes_flwr.data import DataError
    from fedbayes_flwr.runtime.config import ConfigError, parse_run_config

    try:
        config = parse_run_config(overrides)
        check_inputs(config)
        overrides["output-dir"] = os.path.abspath(config.output_dir)
        config = config.replace(output_dir=overrides["output-dir"])
    except (ConfigError, DataError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    _import_tensorflow()
    from fedbayes_flwr.runtime.experiment import build_experiment

    try:
        exp = build_experiment(config)
        if args.ray_address is not None and args.engine == "simulation":
            check_ray_address(args.ray_address)
    except (ConfigError, DataError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.engine != "simulation":
        for flag, value, default in (("--ray-address", args.ray_address, None),
                                     ("--num-gpus-per-client", args.num_gpus_per_client, 0.0)):
            if value != default:
                print(f"warning: {flag} is ignored with --engine {args.engine}", file=sys.stderr)

    if reap and args.engine != "in-process":
        from fedbayes_flwr.deploy.watchdog import start_reaper

        start_reaper()
    from fedbayes_flwr.runtime.lock import OutputDirBusy, output_dir_lock

    held = output_dir_lock(config.output_dir)  # one run per output directory
    try:
        held.__enter__()
    except OutputDirBusy as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        code = _run_engine(args, config, overrides, exp, ckpt)
    finally:
        held.__exit__(None, None, None)
    if code is not None:
        return code
    result_file = os.path.join(config.output_dir, "result.json")
    if not os.path.exists(result_file):
        print(f"error: the run wrote no {result_file} (see the log above)", file=sys.stderr)
        return 1
    with open(result_file) as f:
        result = json.load(f)
    outcome = result.get("outcome")
    last = result["history"][-1]["round"] if result["history"] else 0
    if outcome == "interrupted":
        print(f"interrupted after update {last} of {config.num_rounds}; results in "
              f"{config.output_dir}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if outcome == "failed":  # the recorder printed the one-line reason
        return EXIT_FAILED
    if outcome == "stopped" and args.engine != "deployment":
        return 1  # the recorder, in this process, printed the one line saying why
    if outcome not in ("completed", "done", "time-limit"):
        why = result.get("reason", "see the log above")
        print(f"error: the run ended '{outcome}' after update {last} of {config.num_rounds}: "
              f"{why} (finished rows are in {result_file})", file=sys.stderr)
        return 1
    final = {k: v for k, v in result["final"].items() if isinstance(v, float)}
    diagnostics = (result["history"][-1].get("diagnostics") or {}) if result["history"] else {}
    final.update({k: diagnostics[k] for k in ("ess_min", "rhat_max")  # a sampler's
                  if isinstance(diagnostics.get(k), float) and diagnostics[k] == diagnostics[k]})
    if report:
        print(json.dumps({"output_dir": config.output_dir, "final": final}, indent=2))
    return 0


class _Tee:
    """A text stream writing to ``stream`` and keeping a copy (the one-line reason of a refused
    run in ``--compare``)."""

    def __init__(self, stream):
        self.stream, self.parts = stream, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __getattr__(self, name: str):  # fileno, encoding...: the real stream's
        return getattr(self.stream, name)

    def last_error(self) -> str | None:
        lines = [ln.strip() for ln in "".join(self.parts).splitlines()
                 if ln.strip().startswith("error: ")]
        return lines[-1][len("error: "):] if lines else None


def compare_main(args, reap: bool = False) -> int:
    """``--compare ALG[,ALG...]``: each algorithm through :func:`run_main` in its subfolder,
    scored by :func:`fedbayes_flwr.comparison.compare`; 0 when at least one algorithm ran."""
    from fedbayes_flwr.data import DataError
    from fedbayes_flwr.runtime.config import ConfigError, parse_run_config

    given = [flag for flag, value in (("--algorithm", args.algorithm), ("--resume", args.resume))
             if value is not None]
    try:
        if given:
            raise ConfigError(f"--compare runs its own algorithms: drop {', '.join(given)}")
        from fedbayes_flwr.comparison.runner import algorithm_config, resolve_algorithms

        overrides = build_overrides(args)
        names = resolve_algorithms(args.compare)
        refused, parsed = [], None
        for name in names:  # a refusal is the algorithm's; a bad common key is everybody's
            try:
                parsed = parse_run_config(algorithm_config(overrides, name))
                break
            except ConfigError as err:
                refused.append(f"{name}: {err}")
        if parsed is None:
            raise ConfigError(f"no algorithm of --compare accepts this run config: "
                              f"{'; '.join(refused)}")
        overrides["output-dir"] = os.path.abspath(parsed.output_dir)
        check_output_dir(overrides["output-dir"])
    except (ConfigError, DataError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    _import_tensorflow()
    if reap and args.engine != "in-process":
        from fedbayes_flwr.deploy.watchdog import start_reaper

        start_reaper()
    from fedbayes_flwr.api import load
    from fedbayes_flwr.comparison import compare
    from fedbayes_flwr.runtime.lock import OutputDirBusy, output_dir_lock

    def run_one(values: dict):
        tee = _Tee(sys.stderr)
        with contextlib.redirect_stderr(tee):  # type: ignore[type-var]
            code = run_main(args, dict(values), report=False)
        if code == EXIT_INTERRUPTED:
            raise KeyboardInterrupt
        if not os.path.exists(os.path.join(values["output-dir"], "result.json")):
            raise ConfigError(tee.last_error() or f"exit status {code}, no result written")
        run = load(values["output-dir"])
        return run.result, None if run.posterior is None else run.posterior.wrapped

    try:
        with output_dir_lock(overrides["output-dir"]):
            result = compare(overrides, names, reference=args.reference or "auto",
                             progress=not args.quiet, run_one=run_one)
    except OutputDirBusy as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; finished algorithms are in {overrides['output-dir']}/compare.json",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    with open(os.path.join(result.output_dir, "compare.md")) as f:
        print(f.read(), end="")
    print(f"results in {result.output_dir} (compare.json, compare.md, compare.png)")
    return 0 if result.ran else 1


class _DropDeprecationNotice:
    """Logging filter: drop Flower's "run_simulation is deprecated" notice. This CLI uses it on
    purpose: ``flwr run`` cannot carry explicit config objects into the apps (its run config
    comes from pyproject.toml) nor this CLI's own progress display and exit codes."""

    def filter(self, record) -> bool:
        return "DEPRECATED FEATURE" not in str(record.msg)


def quiet_flower_logs() -> None:
    """Flower's log lines without ANSI colours when stderr is not a terminal (log files), and
    without the deprecation notice explained in :class:`_DropDeprecationNotice`."""
    import logging

    from flwr.common.logger import update_console_handler

    update_console_handler(colored=sys.stderr.isatty())
    logging.getLogger("flwr").addFilter(_DropDeprecationNotice())


def run_deployment(config, progress: bool = True) -> int | None:
    """Run ``config`` on a one-machine Flower deployment (:mod:`fedbayes_flwr.deploy.run`): None
    when the run left a result to report, else the exit status (the reason is printed)."""
    from fedbayes_flwr.deploy import run as deployment
    from fedbayes_flwr.runtime.steps import Interrupted

    try:
        deployment.run_deployment(config.to_run_config(), progress=progress)
    except Interrupted:  # Ctrl-C: the run was stopped and every process with it
        if os.path.exists(os.path.join(config.output_dir, "result.json")):
            return None  # marked interrupted: reported below
        print("interrupted before the first update", file=sys.stderr)
        return EXIT_INTERRUPTED
    except deployment.DeploymentError as err:
        print(f"error: {err}", file=sys.stderr)
        try:
            with open(os.path.join(config.output_dir, "result.json")) as f:
                finished = json.load(f).get("outcome") not in (None, "running")
        except (OSError, ValueError):
            finished = False
        return None if finished else 1  # a recorded outcome (e.g. failed) has its own status
    return None


def run_flower_simulation(overrides: dict, num_clients: int, num_cpus: float,
                          progress: bool = True, num_gpus: float = 0.0,
                          ray_address: str | None = None) -> None:
    """Run the ServerApp and ClientApps in Flower's Simulation Engine (Ray): a private local Ray
    instance, or the running cluster at ``ray_address`` (see :func:`ray_backend_config`)."""
    if ray_address is None and os.environ.get("RAY_ADDRESS"):
        # a stray RAY_ADDRESS would silently move the run onto some other cluster
        print(f"warning: RAY_ADDRESS={os.environ.pop('RAY_ADDRESS')} is ignored (and unset): "
              "this run starts its own Ray instance; use --ray-address to attach to a cluster",
              file=sys.stderr)
    # Ray colours the "(pid=...)" prefix of forwarded actor lines: not in a log file
    os.environ.setdefault("RAY_COLOR_PREFIX", "1" if sys.stderr.isatty() else "0")
    from flwr.simulation import run_simulation

    quiet_flower_logs()

    from clients import make_client_app
    from strategies import make_server_app

    # Ray workers must import this repository's packages even when it is not installed.
    root = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    backend_config = ray_backend_config(num_cpus, num_gpus, ray_address)
    start_ray(backend_config["init_args"])
    run_simulation(
        server_app=make_server_app(overrides, "simulation", progress),
        client_app=make_client_app(overrides),
        num_supernodes=num_clients,
        backend_config=backend_config,
    )


if __name__ == "__main__":
    sys.exit(main(reap=True))
