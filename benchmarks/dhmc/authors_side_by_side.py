"""Decentralized MALA side by side with the authors' code (issue 27, item 3).

The project's ``dmala`` (and ``dhmc``) against ``decentralised_MALA`` of the authors' public
repository ``AdamCobb/dblmahmc`` (Kungurtsev, Cobb, Javidi & Jalaian), on one problem where the
exact posterior is known, run alternately on the same machine: wall seconds per iteration, the
error of the pooled mean in exact-posterior standard deviations (largest over the coordinates),
the variance ratio to the exact posterior, the acceptance rate and the machine's load average
(``os.getloadavg()``) at the time of each run.

**Problem** (the same arrays for both codes): linear regression, ``d = 4``, 250 training rows
``x ~ N(0, I)``, ``w ~ N(0, I)``, ``y = x w + N(0, 1)`` from ``numpy.random.default_rng(0)``
(and 50 more rows as a test set the engine requires and nothing uses), noise scale 1, prior
``N(0, I)``, no intercept. The rows are cut into 4 consecutive shards (``numpy.array_split``),
one per agent; agent ``i``'s log posterior is its rows' log-likelihood plus a quarter of the
prior's (both codes). The exact posterior is ``N(mu, Sigma)``, ``Sigma = (X^T X + I)^{-1}``,
``mu = Sigma X^T y``, computed here in numpy.

**Settings** (both codes): 4 agents on a ring, mixing weights 1/3 (self and each neighbour:
the Metropolis-Hastings weights of a ring of 4), 1 consensus (mixing) round and 1
gradient-tracking round per iteration, step 0.04, 500 burn-in iterations with the Metropolis
test off (the authors' ``MH_step``; the project's ``dhmc.warmup-metropolis=false``), then 3,000
kept iterations with the test on, no step adaptation, **one chain** (the authors' code runs one
chain: one iterate per agent), so the per-iteration costs compare like for like. The authors'
agents start at 0 (their scripts); the project's library loop starts at 0 too, its in-process
engine at one prior draw (``w0`` is not a run-config key); the slowest drift here (the
authors', ``h^2 lambda_min / m`` = 0.04^2 x 209 / 4 = 0.084 per iteration along the posterior's
widest direction, ``lambda_min`` the posterior precision's least eigenvalue) shrinks the start's
distance by 0.92 per iteration, so 500 burn-in iterations leave ``0.92^500`` (about ``1e-19``)
of it: the start does not
matter. Statistics pool every agent's kept iterates (their ``samples (agents, steps, d)``; the
project's ``agent_samples``); the ESS is that of the agents' average (one chain, the project's
``SamplePosterior.ess`` for both codes). The engine refuses fewer than 2 chains (its ESS and
R-hat are across chains): it runs 2, vectorised, and its chain 0 is scored; its seconds per
iteration cover both chains (numpy over a chain axis of 2: about the cost of one).

**Runs**, alternated ``--pairs`` times (default 2; seed ``pair``, the data fixed):

* ``authors``: their ``inference.decentralised_MALA`` with their ``util.scheduler`` (one step
  per milestone) and their linear-regression model (``Net`` and ``define_local_log_posterior``
  read from their ``scripts/linear_regression.py``), in a separate virtual environment with
  torch (CPU) and float32 tensors, as their scripts use.
* ``project dmala`` and ``project dhmc`` through the library loop
  (``fedbayes_flwr.algorithms.dhmc.loop.simulate``: all agents vectorised, no transport; the
  like-for-like one-function comparison), then through the in-process engine
  (``run_in_process``: every agent's client step per exchange, as the Simulation Engine
  sequences them; plots off; timed after an untimed 2-iteration run, as ``iteration_cost.py``).
  ``dmala`` = the symplectic-Euler step with local decisions and the exact energy (the default),
  ``dhmc`` = one leapfrog step with agreed decisions. The engine reads the data from an
  ``.npz`` file with ``client_id`` (``partition=natural``), so its shards are the ones above.

Every run is its own process, with one thread (``OMP_NUM_THREADS`` and friends = 1,
``torch.set_num_threads(1)``); the seconds are the sampler call's alone (imports and set-up
excluded), divided by 3,500 iterations.

**What the authors' code needed to run** (none of it is vendored: the benchmark extracts their
``scripts/`` from a git mirror, a bare repository or a checkout given by ``--authors-repo``,
into ``--scratch``, and writes the shim and the driver there):

1. ``hamiltorch`` (the authors' sampler library) is not on the package registry. A small local
   shim package ``hamiltorch`` is written to the scratch folder, implementing, from
   hamiltorch's public semantics, exactly what the ``decentralised_MALA`` path and the
   linear-regression posterior call: ``samplers.gibbs(params, mass=None)`` (a unit-normal
   momentum, drawn through ``torch.distributions.Normal(...).sample()`` as hamiltorch does),
   ``samplers.collect_gradients(log_prob, params)`` (``params.grad =
   torch.autograd.grad(log_prob, params)[0]``), ``util.has_nan_or_inf``,
   ``util.flatten`` / ``util.unflatten`` / ``util.make_functional`` (the model's own forward
   called on a stand-in holding the given tensors as its parameters, as hamiltorch does; unlike
   hamiltorch's, a parameter that is None, ``bias=False``, stays None), ``set_random_seed`` and
   ``__version__``.
   Their ``scripts/util.py`` and ``scripts/inference.py`` define ``leapfrog`` (their first-order
   Euler step with a passed gradient), ``params_grad`` and ``scheduler`` themselves; those are
   used as they are. Not shimmed (not on this path): ``sample_model``, ``predict_model``.
2. ``linear_regression.py`` loads Boston housing with ``sklearn.datasets.load_boston``, removed
   from scikit-learn in 1.2: the benchmark supplies its own data (above); pandas and scikit-learn
   are then not needed.
3. ``if args.inference == 'dMALA' or 'DULA':`` is always true (a non-empty string), so the
   script runs the decentralized branch even for ``--inference HMC``; and its set-up is
   hard-coded (Boston's 13 features plus a bias, a "partial view" feature split, a fully
   connected ``W = 11^T / 4``, output precision 10, milestones 1/5/10 rounds). So the script is
   not run: a driver (written to the scratch folder) does what its dMALA branch does with this
   benchmark's settings: their ``Net`` with ``layer_sizes=[4, 1]`` and ``bias=False`` (the
   project's model has no intercept), their ``define_local_log_posterior`` with
   ``prec_agent=1``, ``out_prec=1``, ``n_agents=4`` on the agent's own rows, their
   ``scheduler`` for 1 round, ``MH_step = lambda x: 0 if x < 500 else 1``, their
   ``decentralised_MALA(..., burn=500)``.
4. The script saves to ``../exp/`` (not in the repository) and scores with ``metrics_reg``
   (``hamiltorch.predict_model``): the driver saves the samples as ``.npy`` instead.
5. ``inference.py`` imports ``tqdm``: installed in the separate environment (with torch and
   numpy). Their progress bar and the prints every 100 iterations stay on (their code's cost);
   the output goes to a log file.

Nothing in their sampler is changed. What it does, for the reader of the numbers (measured,
not fixed): each agent draws its own momentum ``p_i ~ N(0, I)`` and steps
``w_i + h p_i + h^2 g_i`` with ``g_i`` the tracked **average** of the local gradients,
``(1/m) sum_j grad log p_j``; the agents' average then moves by ``h pbar + h^2 gbar`` with
``pbar ~ N(0, I / m)``: a Langevin step of size ``h^2 / m`` with twice Langevin's drift, whose
stationary law is about ``pi^2`` (variance ratio 1/2). Their accept test is the second-order
surrogate ``log rho = -h^2 (aleph + |g_i|^2) / 2`` (``aleph`` the tracked ``-p^T H p``), which
is not a Metropolis-Hastings ratio for that proposal and does not correct the doubled drift. The
stored samples are each agent's value after its accept step, before the consensus round, so
their pooled variance adds the agents' spread (the ``consensus`` column) to the average's.

Run: ``/path/to/.venv/bin/python benchmarks/dhmc/authors_side_by_side.py`` (``--pairs``,
``--scratch``, ``--authors-repo``, ``--no-engine``; the first run builds the environment, about a
minute). Writes ``benchmarks/results/dhmc/authors_side_by_side.json`` and ``.md``.

References
----------
Kungurtsev, Cobb, Javidi & Jalaian (2023), "Decentralized Bayesian Learning with
Metropolis-Adjusted Hamiltonian Monte Carlo", Algorithm 1; code: ``AdamCobb/dblmahmc``
(``scripts/inference.py``, ``decentralised_MALA``); hamiltorch (``AdamCobb/hamiltorch``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "dhmc")
NAME = "authors_side_by_side"
MIRROR = "/work/.mirror/AdamCobb+dblmahmc/repo"
WHEEL = "/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
DIM, ROWS, TEST_ROWS, AGENTS = 4, 250, 50, 4
STEP, BURN, KEEP = 0.04, 500, 3000
NOISE, PRIOR = 1.0, 1.0
DATA_SEED = 0
ENGINE_CHAINS = 2  # the engine's least (ESS and R-hat across chains); chain 0 is scored
ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                               "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}

# ------------------------------------------------------------------ the hamiltorch shim
SHIM = {
    "__init__.py": '''"""A local stand-in for hamiltorch (not installable here): only what the authors'
decentralised_MALA path and linear-regression posterior call (benchmarks/dhmc/authors_side_by_side.py)."""
from . import samplers, util
from .util import set_random_seed

__version__ = "shim (authors_side_by_side)"
''',
    "samplers.py": '''"""hamiltorch.samplers: gibbs and collect_gradients (hamiltorch's semantics)."""
import torch


def gibbs(params, sampler=None, log_prob_func=None, jitter=None, normalizing_const=1.,
          softabs_const=None, mass=None, metric=None):
    """A momentum draw N(0, mass) shaped like params (mass None: the identity)."""
    if mass is None:
        dist = torch.distributions.Normal(torch.zeros_like(params), torch.ones_like(params))
    elif mass.dim() == 2:
        dist = torch.distributions.MultivariateNormal(torch.zeros_like(params), mass)
    elif mass.dim() == 1:
        dist = torch.distributions.Normal(torch.zeros_like(params), mass ** 0.5)
    else:
        raise NotImplementedError("shim: block masses are not on this path")
    return dist.sample()


def collect_gradients(log_prob, params, pass_grad=None):
    """Store d log_prob / d params in params.grad and return params."""
    if isinstance(log_prob, tuple):
        log_prob[0].backward()
        params_list = list(log_prob[1])
        params = torch.cat([p.flatten() for p in params_list])
        params.grad = torch.cat([p.grad.flatten() for p in params_list])
    elif pass_grad is not None:
        params.grad = pass_grad(params) if callable(pass_grad) else pass_grad
    else:
        params.grad = torch.autograd.grad(log_prob, params)[0]
    return params
''',
    "util.py": '''"""hamiltorch.util: the helpers the authors' scripts call, hamiltorch's semantics."""
import random

import numpy as np
import torch


def set_random_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)


def has_nan_or_inf(value):
    """True when a tensor (summed) or a number is NaN or infinite."""
    if torch.is_tensor(value):
        value = torch.sum(value)
        return bool(torch.isnan(value)) or bool(torch.isinf(value))
    value = float(value)
    return value != value or value in (float("inf"), float("-inf"))


def flatten(model):
    """The model's parameters as one flat vector."""
    return torch.cat([p.flatten() for p in model.parameters()])


def unflatten(model, flattened_params):
    """A flat vector cut into tensors shaped like the model's parameters."""
    if flattened_params.dim() != 1:
        raise ValueError("Expecting a 1d flattened_params")
    out, at = [], 0
    for p in model.parameters():
        out.append(flattened_params[at:at + p.numel()].view(p.shape))
        at += p.numel()
    return out


INTERNAL = {"_backend", "_parameters", "_buffers", "_backward_hooks", "_forward_hooks",
            "_forward_pre_hooks", "_modules"}


def make_functional(model):
    """fmodel(*args, params=[tensors in model.parameters() order]) runs the model's forward with
    them: as hamiltorch does, each (sub)module's own forward is called on a stand-in object that
    holds the given tensors as its parameters (a parameter that is None, e.g. bias=False, stays
    None and takes no tensor)."""
    box = [None]

    def build(module, offset):
        scope = type("Scope", (), {})()
        for name, attr in module.__dict__.items():
            if name not in INTERNAL:
                setattr(scope, name, attr)
        names = [n for n, p in module._parameters.items() if p is not None]
        for name, p in module._parameters.items():
            if p is None:
                setattr(scope, name, None)
        following = offset + len(names)
        for name, child in module.named_children():
            following, fchild = build(child, following)
            setattr(scope, name, fchild)
        forward = type(module).forward

        def fmodule(*args, **kwargs):
            for name, p in zip(names, box[0][offset:offset + len(names)]):
                setattr(scope, name, p)
            return forward(scope, *args, **kwargs)

        return following, fmodule

    _, inner = build(model, 0)

    def fmodel(*args, params=None, **kwargs):
        box[0] = list(model.parameters()) if params is None else params
        return inner(*args, **kwargs)

    return fmodel
''',
}

# ------------------------------------------------------------------ the driver (their dMALA)
DRIVER = '''"""Runs the authors' decentralised_MALA as scripts/linear_regression.py's dMALA branch does,
with the benchmark's data and settings (benchmarks/dhmc/authors_side_by_side.py)."""
import argparse, ast, contextlib, io, json, os, re, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "shim"), os.path.join(HERE, "authors", "scripts")]
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import hamiltorch
import inference
from util import scheduler

a = argparse.ArgumentParser()
for k in ("--data", "--out"):
    a.add_argument(k)
for k in ("--seed", "--burn", "--steps"):
    a.add_argument(k, type=int)
a.add_argument("--step", type=float)
a.add_argument("--prior-prec", type=float)
a.add_argument("--out-prec", type=float)
args = a.parse_args()
torch.set_num_threads(1)

# their Net and define_local_log_posterior, read from their script (not run: load_boston)
src = open(os.path.join(HERE, "authors", "scripts", "linear_regression.py")).read()
tree = ast.parse(src)
keep = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))
        and n.name in ("Net", "define_local_log_posterior")]
assert len(keep) == 2, [n.name for n in keep]
ns = {"torch": torch, "nn": nn, "F": F, "hamiltorch": hamiltorch}
exec(compile(ast.Module(body=keep, type_ignores=[]), "linear_regression.py", "exec"), ns)

data = np.load(args.data)
x, y, cid = data["x_train"], data["y_train"], data["client_id"]
N_agents = int(cid.max()) + 1
net = ns["Net"]([x.shape[1], 1], bias=False)
ns.update(net=net, crit=nn.MSELoss(reduction="sum"),
          log_regression=hamiltorch.util.make_functional(net))
hamiltorch.set_random_seed(args.seed)
funcs = []
for i in range(N_agents):
    X = torch.tensor(x[cid == i], dtype=torch.float)
    Y = torch.tensor(y[cid == i], dtype=torch.float).view(-1, 1)
    funcs.append(ns["define_local_log_posterior"](X, Y, prec_agent=args.prior_prec,
                                                  out_prec=args.out_prec, n_agents=N_agents))
W = torch.tensor(data["mixing"], dtype=torch.float)
params_init = torch.zeros_like(hamiltorch.util.flatten(net).clone())
param_local = [m for m in torch.zeros(N_agents, params_init.shape[0])]
consensus_step_scheduler = lambda n: scheduler(n, milestones=[1], steps_per_milestones=[1])
gradient_tracking_scheduler = lambda n: scheduler(n, milestones=[1], steps_per_milestones=[1])
MH_step = lambda n: 0 if n < args.burn else 1

log = io.StringIO()
with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    t0 = time.perf_counter()
    samples = inference.decentralised_MALA(
        param_local, W, funcs, None, args.step, args.steps,
        consensus_step_scheduler=consensus_step_scheduler,
        gradient_tracking_scheduler=gradient_tracking_scheduler, grad_est=None,
        local_grad_prev=None, MH_step=MH_step, burn=args.burn)
    wall = time.perf_counter() - t0
text = log.getvalue()
with open(args.out + ".log", "w") as fh:
    fh.write(text)
rates = [float(r) for r in re.findall(r"Acceptance Rate ([0-9.]+)", text)]
np.save(args.out + ".npy", samples.numpy().astype(np.float64))
json.dump({"sampler_wall_s": wall, "acceptance_per_agent": rates,
           "torch": torch.__version__, "hamiltorch": hamiltorch.__version__,
           "threads": torch.get_num_threads()}, open(args.out + ".json", "w"))
'''


# ------------------------------------------------------------------ problem
def make_data(path: str) -> dict:
    """Write the problem's ``.npz`` (module docstring) and return its exact posterior."""
    rng = np.random.default_rng(DATA_SEED)
    n = ROWS + TEST_ROWS
    x = rng.standard_normal((n, DIM))
    w = rng.standard_normal(DIM)
    y = x @ w + NOISE * rng.standard_normal(n)
    xt, yt, xs, ys = x[:ROWS], y[:ROWS], x[ROWS:], y[ROWS:]
    client = np.zeros(ROWS, dtype=np.int64)
    for i, rows in enumerate(np.array_split(np.arange(ROWS), AGENTS)):
        client[rows] = i
    ring = np.zeros((AGENTS, AGENTS))
    for i in range(AGENTS):  # self and both neighbours 1/3 (Metropolis-Hastings, degree 2)
        ring[i, [i, (i - 1) % AGENTS, (i + 1) % AGENTS]] = 1.0 / 3.0
    np.savez(path, x_train=xt, y_train=yt, x_test=xs, y_test=ys, client_id=client, mixing=ring)
    prec = xt.T @ xt / NOISE**2 + np.eye(DIM) / PRIOR**2
    cov = np.linalg.inv(prec)
    return {"mean": cov @ (xt.T @ yt) / NOISE**2, "var": np.diag(cov), "true_w": w}


def measure(samples: np.ndarray, exact: dict) -> dict:
    """``samples (agents, T, d)``: pooled mean error (exact sd), variance ratio, ESS."""
    from fedbayes_flwr.inference.posterior import SamplePosterior

    d = samples.shape[-1]
    flat = samples.reshape(-1, d)
    sd = np.sqrt(exact["var"])
    ratio = flat.var(axis=0) / exact["var"]
    avg = samples.mean(axis=0)  # the agents' average: one chain
    ess = SamplePosterior(avg[None]).ess()
    avg_ratio = avg.var(axis=0) / exact["var"]
    return {"mean_err_sd": float(np.max(np.abs(flat.mean(axis=0) - exact["mean"]) / sd)),
            "var_ratio_mean": float(ratio.mean()), "var_ratio": ratio.round(4).tolist(),
            "avg_var_ratio_mean": float(avg_ratio.mean()),
            "ess_min": float(np.min(ess)),
            "consensus": float(np.mean(samples.var(axis=0) / exact["var"]))}


# ------------------------------------------------------------------ scratch: their code, venv
def extract_authors(repo: str, dest: str) -> str:
    """Their ``scripts/`` into ``dest/authors`` from a (bare) git repository or a checkout;
    returns the commit (or ``checkout``)."""
    out = os.path.join(dest, "authors")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    git = ["git", "--git-dir", repo] if not os.path.isdir(os.path.join(repo, "scripts")) else None
    if git:
        commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        archive = subprocess.run([*git, "archive", "HEAD", "scripts"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    else:
        shutil.copytree(os.path.join(repo, "scripts"), os.path.join(out, "scripts"))
        commit = "checkout"
    for name, text in SHIM.items():
        os.makedirs(os.path.join(dest, "shim", "hamiltorch"), exist_ok=True)
        with open(os.path.join(dest, "shim", "hamiltorch", name), "w") as fh:
            fh.write(text)
    with open(os.path.join(dest, "driver.py"), "w") as fh:
        fh.write(DRIVER)
    return commit


def ensure_venv(dest: str, wheel: str) -> str:
    """``dest/venv`` with torch (CPU), numpy and tqdm; returns its python."""
    python = os.path.join(dest, "venv", "bin", "python")
    ok = os.path.exists(python) and subprocess.run(
        [python, "-c", "import torch, numpy, tqdm"], capture_output=True).returncode == 0
    if not ok:
        subprocess.run(["python3.11", "-m", "venv", os.path.join(dest, "venv")], check=True)
        torch = wheel if os.path.exists(wheel) else "torch"
        subprocess.run([python, "-m", "pip", "install", "-q", torch, "numpy", "tqdm"], check=True)
    return python


# ------------------------------------------------------------------ one run of each kind
def run_authors(python: str, dest: str, data: str, seed: int) -> dict:
    out = os.path.join(dest, f"authors_seed{seed}")
    subprocess.run([python, os.path.join(dest, "driver.py"), "--data", data, "--out", out,
                    "--seed", str(seed), "--burn", str(BURN), "--steps", str(KEEP),
                    "--step", str(STEP), "--prior-prec", str(1 / PRIOR**2),
                    "--out-prec", str(1 / NOISE**2)],
                   env={**os.environ, **ONE_THREAD}, check=True)
    with open(out + ".json") as fh:
        info = json.load(fh)
    info["samples"] = np.load(out + ".npy")
    info["acceptance"] = float(np.mean(info.pop("acceptance_per_agent")))
    return info


def child(kind: str, algorithm: str, seed: int, data: str, out: str) -> None:
    """One project run in this process (``--child``): the library loop or the engine."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if kind == "loop":
        from fedbayes_flwr.algorithms.dhmc import agents as dhmc
        from fedbayes_flwr.algorithms.dhmc.loop import simulate
        from fedbayes_flwr.inference import potentials as P

        z = np.load(data)
        x, y, cid = z["x_train"], z["y_train"], z["client_id"]
        prior = P.gaussian_prior_potential(DIM, PRIOR**2)
        pots = [dhmc.LocalPotential(P.linear_regression_potential(x[cid == i], y[cid == i],
                                                                  NOISE**2), prior, AGENTS)
                for i in range(AGENTS)]
        euler = algorithm == "dmala"
        t0 = time.perf_counter()
        run = simulate(pots, z["mixing"], np.zeros((1, DIM)), STEP, KEEP, warmup=BURN,
                       rounds=1, seed=seed, integrator="euler" if euler else "leapfrog",
                       energy="exact", adapt=False, decision="local" if euler else "agree",
                       warmup_metropolis=False)
        wall = time.perf_counter() - t0
        samples, accept = run.samples[:, 0], run.accept_rate
    else:
        import fedbayes_flwr.evaluation.plots as plots
        from fedbayes_flwr.runtime.config import parse_run_config
        from fedbayes_flwr.runtime.engine import run_in_process

        for name in ("plot_history", "plot_trace", "plot_reliability", "plot_mixture_posterior"):
            setattr(plots, name, lambda *a, **k: None)
        keys = {"algorithm": algorithm, "model": "linear-regression", "data": data,
                "partition": "natural", "num-clients": AGENTS, "seed": seed,
                "noise-scale": NOISE, "prior-scale": PRIOR, "eval-every": 10**6,
                "dhmc.graph": "ring", "dhmc.num-chains": ENGINE_CHAINS, "dhmc.adapt": False,
                "dhmc.step-size": STEP, "dhmc.mixing-rounds": 1,
                "dhmc.warmup-metropolis": False, "dhmc.mass-matrix": "none"}
        run_in_process(parse_run_config({**keys, "dhmc.warmup": 2, "dhmc.iterations": 2,
                                         "output-dir": tempfile.mkdtemp()}), progress=False)
        where = tempfile.mkdtemp()
        t0 = time.perf_counter()
        result = run_in_process(parse_run_config({**keys, "dhmc.warmup": BURN,
                                                  "dhmc.iterations": KEEP,
                                                  "output-dir": where}), progress=False)
        wall = time.perf_counter() - t0
        with np.load(os.path.join(where, "posterior.npz")) as post:
            samples = post["agent_samples"][:, 0]  # chain 0 scored (module docstring)
        accept = result["history"][-1].get("acceptance_rate")
        shutil.rmtree(where, ignore_errors=True)
    np.save(out + ".npy", samples)
    with open(out + ".json", "w") as fh:
        json.dump({"sampler_wall_s": wall, "acceptance": accept}, fh)


def run_project(kind: str, algorithm: str, seed: int, data: str, dest: str) -> dict:
    out = os.path.join(dest, f"project_{kind}_{algorithm}_seed{seed}")
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, algorithm,
                    str(seed), data, out], cwd=ROOT, env=env, check=True)
    with open(out + ".json") as fh:
        info = json.load(fh)
    info["samples"] = np.load(out + ".npy")
    return info


# ------------------------------------------------------------------ report
def table(rows: list) -> str:
    head = ("| order | code | sampler | seed | ms / iteration | max mean error (sd) | "
            "variance ratio (mean; per coordinate) | agents' average: variance ratio | "
            "acceptance | ESS (min) | consensus / post. var | load 1 min |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        per = ", ".join(f"{v:.2f}" for v in r["var_ratio"])
        lines.append(f"| {r['order']} | {r['code']} | {r['sampler']} | {r['seed']} | "
                     f"{1e3 * r['s_per_iteration']:.2f} | {r['mean_err_sd']:.2f} | "
                     f"{r['var_ratio_mean']:.2f}; {per} | {r['avg_var_ratio_mean']:.2f} | {acc} | "
                     f"{r['ess_min']:.0f} | {r['consensus']:.3f} | "
                     f"{r['load_start'][0]:.1f} |")
    return head + "\n".join(lines) + "\n"


def summarise(rows: list) -> dict:
    """Per sampler: the median seconds per iteration, the ratio to the authors' run of the same
    pair (each pair ran back to back, so the load hit both alike), the accuracy averaged over
    the pairs."""
    authors = {r["pair"]: r["s_per_iteration"] for r in rows if r["code"] == "authors"}
    out = {}
    for name in dict.fromkeys(r["sampler"] for r in rows):
        mine = [r for r in rows if r["sampler"] == name]
        ratios = [r["s_per_iteration"] / authors[r["pair"]] for r in mine]
        out[name] = {"ms_per_iteration_median": 1e3 * float(np.median(
                         [r["s_per_iteration"] for r in mine])),
                     "ratio_to_authors_per_pair": [round(x, 3) for x in ratios],
                     "ratio_to_authors_median": float(np.median(ratios)),
                     **{f"{k}_mean": float(np.mean([r[k] for r in mine]))
                        for k in ("mean_err_sd", "var_ratio_mean", "avg_var_ratio_mean",
                                  "consensus")},
                     "acceptance_mean": (None if mine[0]["acceptance"] is None else
                                         float(np.mean([r["acceptance"] for r in mine])))}
    return out


def summary_table(summary: dict) -> str:
    head = ("| sampler | ms / iteration (median) | time ratio to the authors' run of the pair "
            "(median; per pair) | max mean error (sd), mean | variance ratio, mean | agents' "
            "average: variance ratio, mean | acceptance, mean |\n|---|---|---|---|---|---|---|\n")
    lines = []
    for name, v in summary.items():
        per = ", ".join(f"{x:.2f}" for x in v["ratio_to_authors_per_pair"])
        acc = "-" if v["acceptance_mean"] is None else f"{v['acceptance_mean']:.2f}"
        lines.append(f"| {name} | {v['ms_per_iteration_median']:.2f} | "
                     f"{v['ratio_to_authors_median']:.2f}; {per} | {v['mean_err_sd_mean']:.2f} | "
                     f"{v['var_ratio_mean_mean']:.2f} | {v['avg_var_ratio_mean_mean']:.2f} | "
                     f"{acc} |")
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--scratch", default=os.path.join(tempfile.gettempdir(),
                                                          "fedbayes_authors_side_by_side"))
    parser.add_argument("--authors-repo", default=MIRROR,
                        help="their repository: a bare git dir (the mirror) or a checkout")
    parser.add_argument("--torch-wheel", default=WHEEL)
    parser.add_argument("--no-engine", action="store_true", help="skip the in-process engine")
    parser.add_argument("--results-dir", default=RESULTS)
    parser.add_argument("--child", nargs=5, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, algorithm, seed, data, out = args.child
        child(kind, algorithm, int(seed), data, out)
        return
    sys.path.insert(0, ROOT)
    dest = os.path.abspath(args.scratch)
    os.makedirs(dest, exist_ok=True)
    commit = extract_authors(os.path.abspath(args.authors_repo), dest)
    python = ensure_venv(dest, args.torch_wheel)
    data = os.path.join(dest, "data.npz")
    exact = make_data(data)
    project = [("loop", "dmala"), ("loop", "dhmc")]
    if not args.no_engine:
        project += [("engine", "dmala"), ("engine", "dhmc")]
    rows, env = [], {}
    for pair in range(args.pairs):
        for code, kind, algorithm in [("authors", "driver", "dMALA"),
                                      *[("project", k, a) for k, a in project]]:
            load = os.getloadavg()
            if code == "authors":
                info = run_authors(python, dest, data, pair)
                env = {k: info[k] for k in ("torch", "hamiltorch", "threads")}
            else:
                info = run_project(kind, algorithm, pair, data, dest)
            row = {"order": len(rows) + 1, "pair": pair, "code": code,
                   "sampler": "dMALA (theirs)" if code == "authors" else f"{algorithm} ({kind})",
                   "seed": pair, "s_per_iteration": info["sampler_wall_s"] / (BURN + KEEP),
                   "sampler_wall_s": round(info["sampler_wall_s"], 3),
                   "acceptance": info["acceptance"], "load_start": list(load),
                   **measure(info["samples"], exact), "load_end": list(os.getloadavg())}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "var_ratio"}), flush=True)
    summary = summarise(rows)
    doc = {"benchmark": NAME, "authors_commit": commit, "authors_env": env,
           "settings": {"dim": DIM, "rows": ROWS, "agents": AGENTS, "graph": "ring, weights 1/3",
                        "mixing_rounds": 1, "tracking_rounds": 1, "step": STEP, "burn_in": BURN,
                        "kept": KEEP, "chains": 1, "noise_scale": NOISE, "prior_scale": PRIOR,
                        "data_seed": DATA_SEED, "threads": 1},
           "exact": {"mean": exact["mean"].tolist(), "sd": np.sqrt(exact["var"]).tolist()},
           "cpus": os.cpu_count(), "runs": rows, "summary": summary}
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, f"{NAME}.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    md = (f"Linear regression d = {DIM}, {ROWS} rows, {AGENTS} agents on a ring (weights 1/3), 1 "
          f"mixing + 1 tracking round, step {STEP}, {BURN} burn-in (test off) + {KEEP} kept, 1 "
          f"chain (engine: 2, chain 0 scored), 1 thread, {os.cpu_count()} CPUs; authors' code "
          f"at {commit[:7]}.\n\n" + table(rows) + "\n" + summary_table(summary))
    with open(os.path.join(args.results_dir, f"{NAME}.md"), "w") as fh:
        fh.write(md)
    print(md)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
