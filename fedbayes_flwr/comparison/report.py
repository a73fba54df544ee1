"""``compare.json``, ``compare.md`` and ``compare.png`` of a comparison.

``compare.json``: ``reference`` (``kind``, ``mean``, ``std``, ``draws_file`` — ``reference.npz``
beside it — and ``diagnostics``), ``algorithms`` (one row per algorithm, in the order run) and
``run_config``. ``compare.md``: the same rows as a table a person reads, smallest posterior
error first (by ``w1``, then ``mean_error``; by ``test_nll`` when there is no reference), the
refused and failed ones last with their reasons. Files are replaced atomically.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from fedbayes_flwr.comparison.reference import ReferencePosterior
from fedbayes_flwr.comparison.table import markdown_table
from fedbayes_flwr.runtime.recorder import write_json

__all__ = ["write_reference", "write_report"]

def _reference_json(ref: ReferencePosterior | None) -> dict:
    if ref is None:
        return {"kind": "pending", "diagnostics": {}}
    out: dict = {"kind": ref.kind, "diagnostics": ref.diagnostics}
    if ref.mean is not None and ref.std is not None:
        out.update({"mean": ref.mean.tolist(), "std": ref.std.tolist(),
                    "draws_file": "reference.npz"})
    return out


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    """JSON-ready: numpy scalars and arrays to Python, non-finite floats to None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_reference(output_dir: str, reference: ReferencePosterior) -> None:
    """``reference.npz`` (``draws``, ``mean``, ``std``) when the reference has draws."""
    if reference.draws is not None and reference.mean is not None and reference.std is not None:
        os.makedirs(output_dir, exist_ok=True)
        np.savez(os.path.join(output_dir, "reference.npz"), draws=reference.draws,
                 mean=reference.mean, std=reference.std)


def write_report(output_dir: str, reference: ReferencePosterior | None, rows: list[dict],
                 run_config: dict, figure: bool = False,
                 posteriors: dict | None = None) -> None:
    """Write ``compare.json``, ``compare.md`` (and ``compare.png`` when ``figure``);
    ``posteriors`` (``{algorithm: posterior}``) feed the figure's marginals. The reference's
    draws are written once, by :func:`write_reference`."""
    os.makedirs(output_dir, exist_ok=True)
    config = {k: v for k, v in run_config.items() if isinstance(v, str | int | float | bool)}
    doc = {"reference": _reference_json(reference), "algorithms": rows, "run_config": config}
    write_json(os.path.join(output_dir, "compare.json"), _plain(doc))
    ref_line = ("reference: " + (reference.kind if reference else "pending")
                + ("" if reference is None or "reason" not in reference.diagnostics
                   else f" ({reference.diagnostics['reason']})"))
    if reference is not None and reference.kind == "nuts":
        d = reference.diagnostics
        ref_line += (f" (min ESS {d['ess_min']:.0f}, max R-hat {d['rhat_max']:.4f}, "
                     f"{d['divergences']} divergences"
                     + ("" if d["converged"] else "; NOT converged: read the errors with care")
                     + ")")
    if reference is not None and "w1_floor" in reference.diagnostics:
        ref_line += (f"; a perfect sampler's W1 is about {reference.diagnostics['w1_floor']:.3f} "
                     f"ref sd (the W1 column's floor)")
    reasons = [f"- {r['algorithm']}: {r['outcome']}: {r['reason']}" for r in rows
               if r.get("reason")]
    text = (f"# Comparison\n\n{ref_line}\n\n{markdown_table(rows)}"
            + ("\n" + "\n".join(reasons) + "\n" if reasons else ""))
    _atomic_write(os.path.join(output_dir, "compare.md"), text)
    if figure and reference is not None:
        from fedbayes_flwr.comparison.figure import save_comparison_figure

        save_comparison_figure(os.path.join(output_dir, "compare.png"), reference, rows,
                               posteriors or {})
