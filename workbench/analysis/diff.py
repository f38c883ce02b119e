"""Diff of two traces (two runs, or two imported traces): per name and kind, count and time in each.

`trace_diff` is the table: one row per (name, kind) present in either trace, with its count and total
time in `a` (the control) and `b` (the test), the deltas, and a status: `new` (only in b), `vanished`
(only in a: what fusion or a change removed), `changed` or `unchanged`. `diff_summary` condenses it
for a report or `--json`; `aligned_pair` shifts both traces so their first profiled step starts at
0 ns, for side-by-side timelines (`workbench.analysis.steps.aligned_on_first_step`). Per-variant kernels,
fusions and unfused ops are `workbench.analysis.fusion.fusion_table`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.steps import aligned_on_first_step, steps_in
from workbench.trace import Trace

DIFF_COLUMNS = ("name", "kind", "count_a", "count_b", "time_a_ns", "time_b_ns", "delta_count", "delta_ns", "ratio",
                "status")
"""Columns of `trace_diff`, in order."""

STATUSES = ("new", "vanished", "changed", "unchanged")

DIFF_KINDS = ("op", "kernel", "memcpy", "memset", "runtime", "annotation", "hlo", "module", "layer")
"""Event kinds diffed by default (Python frames and `other` events are left out)."""


def trace_diff(a: Trace, b: Trace, kinds: tuple[str, ...] = DIFF_KINDS, *, window_a: tuple[int, int] | None = None,
               window_b: tuple[int, int] | None = None, per_step: bool = False) -> pd.DataFrame:
    """Per (name, kind): count and time in `a` and `b`, their deltas (b - a) and the status.

    | name | kind | count_a | count_b | time_a_ns | time_b_ns | delta_count | delta_ns | ratio | status |

    Time is the events' total duration (nested events each count theirs). Only events starting in a
    trace's window count when it has one; with `per_step` counts and times are divided by the trace's
    number of profiled steps (`steps.steps_in`), so runs of different lengths compare. `ratio` is
    time_b / time_a (NaN for new names). Sorted by the size of the time delta.
    """
    left = _totals(a, kinds, window_a, steps_in(a) if per_step else 1).rename(
        columns={"count": "count_a", "time_ns": "time_a_ns"})
    right = _totals(b, kinds, window_b, steps_in(b) if per_step else 1).rename(
        columns={"count": "count_b", "time_ns": "time_b_ns"})
    table = left.merge(right, on=["name", "kind"], how="outer")
    if table.empty:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("name", "kind", "status") else np.float64)
                             for c in DIFF_COLUMNS})
    for column in ("count_a", "count_b", "time_a_ns", "time_b_ns"):
        table[column] = table[column].fillna(0)
        if not per_step:
            table[column] = table[column].astype(np.int64)
    table["delta_count"] = table["count_b"] - table["count_a"]
    table["delta_ns"] = table["time_b_ns"] - table["time_a_ns"]
    with np.errstate(divide="ignore", invalid="ignore"):
        table["ratio"] = np.where(table["time_a_ns"] > 0, table["time_b_ns"] / table["time_a_ns"].clip(lower=1), np.nan)
    table["status"] = np.select(
        [table["count_a"] == 0, table["count_b"] == 0, (table["delta_count"] == 0) & (table["delta_ns"] == 0)],
        ["new", "vanished", "unchanged"], default="changed")
    order = table["delta_ns"].abs().sort_values(ascending=False, kind="stable").index
    return table.loc[order, list(DIFF_COLUMNS)].reset_index(drop=True)


def diff_summary(table: pd.DataFrame, top: int = 10) -> dict[str, Any]:
    """The gist of a `trace_diff` table as JSON-ready values.

    `{"names": {status: n}, "time_ns": {kind: {"a", "b", "delta"}}, "new": [...], "vanished": [...],
    "grew": [...], "shrank": [...]}`; the lists hold the `top` rows by time (`name, kind, count_a,
    count_b, time_a_ns, time_b_ns, delta_ns`). Kernel names that vanish while others appear are what a
    fusing compiler replaced.
    """
    names = {s: int((table["status"] == s).sum()) for s in STATUSES}
    by_kind = table.groupby("kind")[["time_a_ns", "time_b_ns"]].sum()
    time_ns = {str(k): {"a": _json_number(r["time_a_ns"]), "b": _json_number(r["time_b_ns"]),
                        "delta": _json_number(r["time_b_ns"] - r["time_a_ns"])} for k, r in by_kind.iterrows()}
    changed = table[table["status"] == "changed"]
    return {
        "names": names,
        "time_ns": time_ns,
        "new": _rows(table[table["status"] == "new"].nlargest(top, "time_b_ns")),
        "vanished": _rows(table[table["status"] == "vanished"].nlargest(top, "time_a_ns")),
        "grew": _rows(changed[changed["delta_ns"] > 0].nlargest(top, "delta_ns")),
        "shrank": _rows(changed[changed["delta_ns"] < 0].nsmallest(top, "delta_ns")),
    }


def aligned_pair(a: Trace, b: Trace) -> tuple[Trace, Trace]:
    """Both traces shifted so that each one's first profiled step starts at 0 ns (for aligned timelines);
    each keeps its shift in `metadata["aligned_offset_ns"]`."""
    return aligned_on_first_step(a), aligned_on_first_step(b)


def _totals(trace: Trace, kinds: tuple[str, ...], window: tuple[int, int] | None, steps: int) -> pd.DataFrame:
    """| name | kind | count | time_ns | of the events of `kinds` (starting in `window` when given)."""
    events = trace.events.select(["start_ns", "dur_ns", "name", "kind"]).to_pandas()
    keep = events["kind"].isin(kinds)
    if window is not None:
        keep &= (events["start_ns"] >= window[0]) & (events["start_ns"] < window[1])
    rows = events[keep]
    grouped = rows.groupby([rows["name"].astype(str), rows["kind"].astype(str)])["dur_ns"]
    totals = pd.DataFrame({"count": grouped.size(), "time_ns": grouped.sum()}).reset_index()
    if steps != 1:
        totals[["count", "time_ns"]] = totals[["count", "time_ns"]] / steps
    return totals


def _rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    columns = ["name", "kind", "count_a", "count_b", "time_a_ns", "time_b_ns", "delta_ns"]
    return [{c: (v if isinstance(v, str) else _json_number(v)) for c, v in row.items()}
            for row in table[columns].to_dict("records")]


def _json_number(value: Any) -> int | float | None:
    """A JSON-ready number: ints stay ints, NaN becomes None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return None if np.isnan(value) else (int(value) if value.is_integer() else value)
    return value
