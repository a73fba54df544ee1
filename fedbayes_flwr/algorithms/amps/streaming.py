"""Streaming and batched decentralised inference on top of the AMPS merge (any :class:`VBModel`).

Data arrive as ``batches_per_agent[i][b]``: agent ``i``'s ``b``-th sub-batch. ``lambda_0`` is the
prior, ``fit(x, lambda)`` a local mean-field fit (:meth:`fedbayes_flwr.inference.vb.base.VBModel.fit`)
from prior ``lambda``, and ``lambda_ib`` its result. Two schemes (Campbell & How 2014, Section
3.2, Figure 8):

**SDA-Bayes** (Broderick et al. 2013, Section 3): every agent processes its sub-batches serially
and updates one shared *distributed posterior* ``lambda`` after each: it fits from the current
``lambda`` and adds its contribution ``fit(x_ib, lambda) - lambda``, with no alignment. Simulated
synchronously: at step ``b`` every agent with a ``b``-th sub-batch fits from the same ``lambda^(b)``
and then all contributions are added,

    lambda^(0) = lambda_0,
    lambda^(b+1) = lambda^(b) + sum_i (fit(x_ib, lambda^(b)) - lambda^(b))
                 = (1 - N_b) lambda^(b) + sum_i fit(x_ib, lambda^(b)),

the naive merge (Campbell & How 2014, eq. 3) with ``lambda^(b)`` as its prior (:func:`amps.merge`
with ``perms=None``). With one agent this is sequential Bayesian updating; with several agents on
one step, components fitted in different orders are summed as if they were aligned.

**AMPS over batches** (Campbell & How 2014, Section 3.2): every sub-batch is fitted from the
prior; each agent merges its own sub-batch posteriors with AMPS, then AMPS merges the agents'
results (both merges against ``lambda_0``, the prior every fit started from)::

    lambda_i = (1 - B_i) lambda_0 + sum_b P_ib fit(x_ib, lambda_0),
    lambda   = (1 - N) lambda_0 + sum_i P_i lambda_i,

the permutations from :func:`amps.align` (``search="bipartite"`` or ``"swap"``; ``search=None``:
identity permutations, the naive merge). Each ``lambda_i - lambda_0`` is a sum of valid
contributions, so the second merge is again the paper's merge of ``N`` posteriors.

Timing (the paper's "time"): agents run in parallel, a merge waits for all its inputs. SDA-Bayes:
``local = sum_b max_i t_ib`` (the steps are synchronous), ``merge`` = the sums' time. AMPS:
``local = max_i sum_b t_ib``, ``merge = max_i (agent i's merge) + the final merge``.

References
----------
Broderick, Boyd, Wibisono, Wilson & Jordan (2013), "Streaming Variational Bayes", Section 3
(SDA-Bayes, eqs. (2)-(4)); Campbell & How (2014), "Approximate Decentralized Bayesian Inference",
eq. (3), eqs. (10)-(12) and Section 3.2 (the AMPS 1x10 / 10x1 / 10x10 vs SDA-Bayes experiment).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np

from fedbayes_flwr.algorithms.amps import merge as amps

__all__ = ["StreamResult", "amps_batches", "sda_bayes"]


class StreamResult(NamedTuple):
    """A scheme's posterior and what it cost.

    Attributes
    ----------
    params : NamedTuple
        The final posterior.
    agents : tuple
        Each agent's posterior (AMPS: its merged sub-batches; SDA-Bayes: empty, the agents share
        one posterior).
    fit_seconds : numpy.ndarray
        ``(N, B)`` wall time of every local fit (NaN where an agent has fewer sub-batches).
    local_seconds : float
        Local fitting time with the agents in parallel (module docstring).
    merge_seconds : float
        Merging (and aligning) time, agents in parallel.
    alignments : tuple
        The :class:`amps.Alignment` of every AMPS merge that aligned (agents' first, then the
        final one); empty for SDA-Bayes and naive merges.
    """

    params: Any
    agents: tuple
    fit_seconds: np.ndarray
    local_seconds: float
    merge_seconds: float
    alignments: tuple = ()

    @property
    def seconds(self) -> float:
        """``local_seconds + merge_seconds``."""
        return self.local_seconds + self.merge_seconds


def _check_batches(batches_per_agent) -> list[list]:
    agents = [list(batches) for batches in batches_per_agent]
    if not agents or any(not batches for batches in agents):
        raise ValueError("need at least one agent, and at least one sub-batch per agent")
    return agents


def _timed_fit(model, x, prior, rng, fit_kwargs):
    t0 = time.perf_counter()
    result = model.fit(x, prior, rng, **fit_kwargs)
    return result.params, time.perf_counter() - t0


def sda_bayes(model, prior, batches_per_agent, rng: np.random.Generator, *, restarts: int = 1,
              tol: float = 1e-6, max_iter: int = 500) -> StreamResult:
    """SDA-Bayes, agents simulated synchronously (module docstring).

    Parameters
    ----------
    model : VBModel
        The local model; ``model.fit`` must honour any valid posterior as its prior.
    prior : NamedTuple
        ``lambda_0``.
    batches_per_agent : sequence of sequence of array
        ``batches_per_agent[i][b]``, agent ``i``'s ``b``-th sub-batch (agents may have
        different numbers of sub-batches).
    rng : numpy.random.Generator
        Passed to every fit, in the order step ``b``, then agent ``i``.
    restarts, tol, max_iter
        Passed to ``model.fit``.

    Returns
    -------
    StreamResult
        ``params`` the distributed posterior after the last step.

    References
    ----------
    Broderick et al. (2013), Section 3; Campbell & How (2014), Section 3.2.
    """
    agents = _check_batches(batches_per_agent)
    fit_kwargs = {"restarts": restarts, "tol": tol, "max_iter": max_iter}
    steps = max(len(batches) for batches in agents)
    fit_seconds = np.full((len(agents), steps), np.nan)
    current, local, merging = prior, 0.0, 0.0
    for b in range(steps):
        fits = []
        for i, batches in enumerate(agents):
            if b < len(batches):
                params, fit_seconds[i, b] = _timed_fit(model, batches[b], current, rng, fit_kwargs)
                fits.append(params)
        local += float(np.nanmax(fit_seconds[:, b]))
        t0 = time.perf_counter()
        current = amps.merge(current, fits, None, model.symmetric)
        merging += time.perf_counter() - t0
    return StreamResult(current, (), fit_seconds, local, merging)


def amps_batches(model, prior, batches_per_agent, rng: np.random.Generator, *,
                 search: str | None = "bipartite", restarts: int = 1, tol: float = 1e-6,
                 max_iter: int = 500) -> StreamResult:
    """Fit every sub-batch from the prior, AMPS-merge within each agent, then across agents.

    Parameters
    ----------
    model : VBModel
        The local model.
    prior : NamedTuple
        ``lambda_0``, the prior of every fit and of both merges.
    batches_per_agent : sequence of sequence of array
        ``batches_per_agent[i][b]``, agent ``i``'s ``b``-th sub-batch.
    rng : numpy.random.Generator
        Passed to every fit, in the order agent ``i``, then sub-batch ``b``.
    search : {"bipartite", "swap"} or None, optional
        :func:`amps.align`'s search; ``None`` merges naively (identity permutations).
    restarts, tol, max_iter
        Passed to ``model.fit``.

    Returns
    -------
    StreamResult
        ``params`` the final merge, ``agents`` each agent's merged posterior.

    References
    ----------
    Campbell & How (2014), eqs. (10)-(12) and Section 3.2.
    """
    agents = _check_batches(batches_per_agent)
    if search is not None and search not in amps.SEARCHES:
        raise ValueError(f"unknown AMPS search {search!r}; choose one of "
                         f"{', '.join(amps.SEARCHES)} or None (naive)")
    fit_kwargs = {"restarts": restarts, "tol": tol, "max_iter": max_iter}
    fit_seconds = np.full((len(agents), max(len(batches) for batches in agents)), np.nan)
    posteriors, agent_merge, alignments = [], [], []
    for i, batches in enumerate(agents):
        fits = []
        for b, x in enumerate(batches):
            params, fit_seconds[i, b] = _timed_fit(model, x, prior, rng, fit_kwargs)
            fits.append(params)
        t0 = time.perf_counter()
        merged, alignment = _merge(model, prior, fits, search)
        agent_merge.append(time.perf_counter() - t0)
        posteriors.append(merged)
        if alignment is not None:
            alignments.append(alignment)
    t0 = time.perf_counter()
    final, alignment = _merge(model, prior, posteriors, search)
    final_merge = time.perf_counter() - t0
    if alignment is not None:
        alignments.append(alignment)
    local = float(np.max(np.nansum(fit_seconds, axis=1)))
    return StreamResult(final, tuple(posteriors), fit_seconds, local,
                        max(agent_merge) + final_merge, tuple(alignments))


def _merge(model, prior, posteriors: list, search: str | None):
    """``(merged, alignment or None)``; a single posterior is its own merge."""
    if len(posteriors) == 1:
        return posteriors[0], None
    if search is None or not model.symmetric:
        return amps.merge(prior, posteriors, None, model.symmetric), None
    alignment = amps.align(prior, posteriors, symmetric=model.symmetric, search=search)
    return amps.merge(prior, posteriors, alignment.perms, model.symmetric), alignment
