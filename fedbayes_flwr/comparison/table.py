"""The comparison's rows as a table: their order and their Markdown."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["COLUMNS", "markdown_table", "sort_rows"]

COLUMNS = (("algorithm", "algorithm"), ("mean_error", "mean error (ref sd)"),
           ("std_ratio_min", "sd ratio min"), ("std_ratio_max", "sd ratio max"),
           ("w1", "W1 (ref sd)"), ("ksd", "KSD"), ("test_accuracy", "test acc"),
           ("test_nll", "test NLL"), ("test_ece", "ECE"), ("test_rmse", "RMSE"),
           ("bytes", "bytes"), ("exchanges", "exchanges"), ("wall_s", "wall s"),
           ("outcome", "outcome"))


def _key(row: dict) -> tuple:
    failed = row.get("outcome") in ("refused", "error")
    posterior = row.get("w1") if row.get("w1") is not None else row.get("mean_error")
    nll = row.get("test_nll")
    return (failed, posterior is None, posterior if posterior is not None else math.inf,
            nll if nll is not None else math.inf, row.get("algorithm", ""))


def sort_rows(rows: list[dict]) -> list[dict]:
    """Rows by posterior error (``w1``, else ``mean_error``), then test NLL; refused last."""
    return sorted(rows, key=_key)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value).replace("|", "\\|")


def markdown_table(rows: list[dict]) -> str:
    """The rows as a Markdown table (columns that no row fills are left out)."""
    used = [(k, title) for k, title in COLUMNS if any(row.get(k) is not None for row in rows)]
    lines = ["| " + " | ".join(t for _, t in used) + " |",
             "|" + "|".join("---" for _ in used) + "|"]
    lines += ["| " + " | ".join(_cell(row.get(k)) for k, _ in used) + " |"
              for row in sort_rows(rows)]
    return "\n".join(lines) + "\n"
