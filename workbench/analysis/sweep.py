"""Sweeps: the runs of one experiment at several shapes (`capture --batch 1,2,4 --seq 128,512`, or a generation
sweep over batch, prompt and new tokens), as curves per variant.

`sweep_table` is the long table every other function here reads: one row per run with its series (the variant
without the sizes it ran at, `workbench.trace.store.records.series_name`), shape, latency, throughput, peak memory and
speedup over the reference at the same shape. `crossovers` finds the batch sizes where one variant starts to beat
another, `pareto` the runs that no other beats on both latency and throughput. Each works within a slice of equal
sequence length (and new tokens), since the work per item differs between slices.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.breakdown import memory_peaks
from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import RunInfo, display_name, number, series_name

SWEEP_COLUMNS = ("series", "label", "run", "status", "batch", "seq", "new", "p50_ms", "p99_ms", "items_per_s",
                 "tokens_per_s", "peak_bytes", "speedup")
"""The columns of `sweep_table`."""
CROSSOVER_COLUMNS = ("seq", "new", "winner", "loser", "batch_below", "batch_above", "crossover_batch",
                     "speedup_below", "speedup_above", "metric", "value")
"""The columns of `crossovers`."""
SLICE = ["seq", "new"]
"""The columns that split a sweep into slices of comparable work per item."""
HIGHER_IS_BETTER = frozenset({"items_per_s", "tokens_per_s"})
"""Metrics where more is better (the others, latencies, less)."""


def _new_tokens(record: RunInfo) -> int | None:
    """New tokens per sequence of a generation run (None for other runs)."""
    value = (record.variant if isinstance(record.variant, dict) else {}).get("new")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def run_shape(record: RunInfo) -> tuple[int | None, int | None, int | None]:
    """The shape a run ran at: (batch, seq, new tokens), None where it has none."""
    return record.batch, record.seq, _new_tokens(record)


def is_sweep(bundles: Sequence[Bundle]) -> bool:
    """Whether some variant among `bundles` ran at two or more shapes (read from run.json only)."""
    shapes: dict[str, set[tuple[int | None, ...]]] = {}
    for bundle in bundles:
        shapes.setdefault(series_name(bundle.record), set()).add(run_shape(bundle.record))
    return any(len(points) > 1 for points in shapes.values())


def sweep_table(bundles: Sequence[Bundle], reference: str = "eager") -> pd.DataFrame:
    """One row per run, ordered by series (as first seen), slice and batch; columns `SWEEP_COLUMNS`.

    `peak_bytes` is the trace's peak allocated memory (the largest over devices; None for a run that was not
    profiled); `speedup` the median latency of the `reference` series at the same batch, seq and new tokens
    over this run's (None where the reference did not run at that shape).
    """
    rows = []
    for bundle in bundles:
        record = bundle.record
        bench = record.benchmark or {}
        peaks = memory_peaks(bundle.trace()) if bundle.has_trace else {}
        rows.append({
            "series": series_name(record), "label": display_name(record), "run": bundle.run_id,
            "status": record.status, "batch": record.batch, "seq": record.seq, "new": _new_tokens(record),
            "p50_ms": record.p50_ms, "p99_ms": number(bench.get("p99")),
            "items_per_s": number(bench.get("items_per_s")),
            "tokens_per_s": number(bench.get("tokens_per_s")), "peak_bytes": max(peaks.values()) if peaks else None,
        })
    table = pd.DataFrame(rows, columns=list(SWEEP_COLUMNS[:-1]))
    for column in ("batch", "seq", "new", "peak_bytes"):
        table[column] = table[column].astype("Int64")
    for column in ("p50_ms", "p99_ms", "items_per_s", "tokens_per_s"):
        table[column] = table[column].astype(float)
    references = {_shape_key(row): row.p50_ms for row in table.itertuples() if row.series == reference}
    table["speedup"] = pd.Series([references.get(_shape_key(row), np.nan) for row in table.itertuples()],
                                 dtype=float) / table["p50_ms"]
    order = {series: i for i, series in enumerate(dict.fromkeys(table["series"]))}
    table = table.assign(_order=table["series"].map(order))
    return table.sort_values(["_order", *SLICE, "batch"], kind="stable").drop(columns="_order").reset_index(drop=True)


def _shape_key(row: object) -> tuple[object, ...]:
    """A row's shape as a hashable key (missing values as None)."""
    return tuple(None if pd.isna(value) else int(value) for value in (row.batch, row.seq, row.new))  # type: ignore[attr-defined]


def _slices(table: pd.DataFrame) -> list[tuple[tuple[object, object], pd.DataFrame]]:
    """The table's slices of equal seq and new tokens, each keyed by (seq, new) with missing values as None."""
    keys = table[SLICE].astype(object).where(table[SLICE].notna(), None)
    groups = keys.apply(tuple, axis=1) if len(table) else pd.Series([], dtype=object)
    return [(key, table[groups == key]) for key in dict.fromkeys(groups)]


def crossovers(table: pd.DataFrame, reference: str | None = "eager", metric: str = "p50_ms") -> pd.DataFrame:
    """Where one series starts to beat another as batch grows: one row per sign change of their `metric` between
    two batches both ran at (ok runs only), within each slice; columns `CROSSOVER_COLUMNS`.

    Pairs are every series against `reference` (every pair of series when it is None or not among them, as in a
    generation sweep). `winner` is the series that is
    better at `batch_above`, `loser` the other; `speedup_below` < 1 < `speedup_above` are the winner's advantage
    (the loser's latency over the winner's, or the winner's throughput over the loser's) at the two batches;
    `crossover_batch` is where that ratio crosses 1, interpolated linearly in log2(batch) and log(ratio), and
    `value` the metric both series have there (each interpolated linearly in log2(batch) and log(metric)).
    """
    rows = []
    higher = metric in HIGHER_IS_BETTER
    usable = table[(table["status"] == "ok") & table[metric].notna() & (table[metric] > 0) & table["batch"].notna()]
    for (seq, new), part in _slices(usable):
        by_series = {name: group.set_index("batch")[metric].astype(float) for name, group in part.groupby("series",
                                                                                                           sort=False)}
        names = list(by_series)
        pairs = [(a, reference) for a in names if a != reference] if reference in by_series else \
            [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
        for a, b in pairs:
            joined = pd.concat({"a": by_series[a], "b": by_series[b]}, axis=1).dropna().sort_index()
            # a's advantage over b: > 1 where a is better
            advantage = joined["a"] / joined["b"] if higher else joined["b"] / joined["a"]
            batches, logs = joined.index.to_numpy(dtype=float), np.log(advantage.to_numpy(dtype=float))
            log_a = np.log(joined["a"].to_numpy(dtype=float))
            for i in range(len(batches) - 1):
                if logs[i] * logs[i + 1] >= 0:
                    continue
                winner, loser, sign = (a, b, 1.0) if logs[i + 1] > 0 else (b, a, -1.0)
                t = logs[i] / (logs[i] - logs[i + 1])
                crossing = 2 ** (math.log2(batches[i]) + t * (math.log2(batches[i + 1]) - math.log2(batches[i])))
                rows.append({"seq": seq, "new": new, "winner": winner, "loser": loser,
                             "batch_below": int(batches[i]), "batch_above": int(batches[i + 1]),
                             "crossover_batch": crossing, "speedup_below": math.exp(sign * logs[i]),
                             "speedup_above": math.exp(sign * logs[i + 1]), "metric": metric,
                             "value": math.exp(log_a[i] + t * (log_a[i + 1] - log_a[i]))})
    return pd.DataFrame(rows, columns=list(CROSSOVER_COLUMNS))


def pareto(table: pd.DataFrame, latency: str = "p50_ms", throughput: str = "items_per_s") -> pd.DataFrame:
    """The ok runs with both figures, each marked `on_front` when no run of its slice is at least as good on
    both `latency` (lower) and `throughput` (higher) and better on one; ordered by slice, then latency."""
    usable = table[(table["status"] == "ok") & table[latency].notna() & table[throughput].notna()]
    marked = []
    for _, part in _slices(usable):
        lat, thr = part[latency].to_numpy(dtype=float), part[throughput].to_numpy(dtype=float)
        dominated = [bool(np.any((lat <= lat[i]) & (thr >= thr[i]) & ((lat < lat[i]) | (thr > thr[i]))))
                     for i in range(len(part))]
        marked.append(part.assign(on_front=np.logical_not(dominated)).sort_values(latency, kind="stable"))
    if not marked:
        return usable.assign(on_front=pd.Series(dtype=bool))
    return pd.concat(marked, ignore_index=True)


def sweep_summary(bundles: Sequence[Bundle], reference: str | None = "eager") -> dict[str, list[dict[str, Any]]]:
    """The sweep as JSON-ready records (missing figures as null), for `--json`: its `table` (`sweep_table`),
    `crossovers` of latency and the `pareto` front's runs."""
    table = sweep_table(bundles, reference or "")
    front = pareto(table)
    return {name: json.loads(frame.to_json(orient="records")) for name, frame in (
        ("table", table), ("crossovers", crossovers(table, reference)), ("pareto", front[front["on_front"]]))}
