"""The demo's summary table: per task kind, jobs, rewards, turns, stage times, throughput."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

__all__ = ["COLUMNS", "summarize", "summary_rows"]

COLUMNS = (
    "task",
    "jobs",
    "done",
    "failed",
    "mean reward",
    "mean turns",
    "p50 init s",
    "p50 run s",
    "p50 eval s",
    "jobs/s",
)


def _kind(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    return str(meta.get("demo_kind") or doc.get("task") or "?")


def _mean(values: list[float]) -> str:
    return f"{statistics.fmean(values):.2f}" if values else "-"


def _p50(docs: list[dict[str, Any]], stage: str) -> str:
    values = [t[f"{stage}_s"] for d in docs if f"{stage}_s" in (t := d.get("timing") or {})]
    return f"{statistics.median(values):.2f}" if values else "-"


def _row(kind: str, docs: list[dict[str, Any]], wall_s: float) -> list[str]:
    rewards = [float(d["reward"]) for d in docs if d.get("reward") is not None]
    turns = [float(d.get("num_turns") or 0) for d in docs]
    failed = sum(1 for d in docs if d.get("status") != "done")
    rate = f"{len(docs) / wall_s:.2f}" if wall_s > 0 else "-"
    return [
        kind,
        str(len(docs)),
        str(len(docs) - failed),
        str(failed),
        _mean(rewards),
        _mean(turns),
        _p50(docs, "init"),
        _p50(docs, "run"),
        _p50(docs, "eval"),
        rate,
    ]


def summary_rows(
    docs: Iterable[dict[str, Any]], wall_s: float, order: Iterable[str] = ()
) -> list[list[str]]:
    """One row per task kind (``order`` first, then as seen) and a final ``all`` row.

    ``jobs/s`` is jobs of that kind over the whole run's wall time, so the kinds' rates add
    up to the ``all`` row.
    """
    by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in order}
    everything = list(docs)
    for doc in everything:
        by_kind.setdefault(_kind(doc), []).append(doc)
    rows = [_row(kind, group, wall_s) for kind, group in by_kind.items() if group]
    return rows + [_row("all", everything, wall_s)]


def summarize(docs: Iterable[dict[str, Any]], wall_s: float, order: Iterable[str] = ()) -> str:
    """The summary as an aligned text table."""
    rows = [list(COLUMNS), *summary_rows(docs, wall_s, order)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]

    def fmt(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    lines = [fmt(rows[0]), rule, *(fmt(r) for r in rows[1:-1]), rule, fmt(rows[-1])]
    return "\n".join(lines)
