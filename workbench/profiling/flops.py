"""Joining torch.profiler's per-op FLOP totals into a trace's `flops` column.

Kineto's exported JSON has no FLOPs; `key_averages()` has them only as a total per op name. The
join spreads each name's total evenly over that name's `op` events, so one event's value is an
average over its calls (exact when all calls have the same shapes, approximate otherwise), while
sums over a name stay exact. Values a reader found in the file are kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pyarrow as pa

from workbench.trace.model import Trace

FLOPS_SOURCE = {
    "source": "torch.profiler key_averages",
    "attribution": "each op name's total FLOPs spread evenly over its op events (a per-call average)",
}
"""Recorded in the trace metadata under "flops" when FLOPs were attached."""


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Codes (-1 for null) and values of a dictionary column whose chunks share one dictionary."""
    array = column.combine_chunks()
    return array.indices.fill_null(-1).to_numpy().astype(np.int64), array.dictionary.to_pylist()


def attach_flops(trace: Trace, op_flops: Mapping[str, float]) -> Trace:
    """A copy of `trace` in which each `op` event named in `op_flops` whose `flops` is NaN (or null)
    gets an equal share of its name's total; the metadata's "flops" entry says so."""
    events = trace.events
    if not op_flops or events.num_rows == 0:
        return trace
    keys = events.select(["name", "kind"]).unify_dictionaries()
    names, name_values = _codes(keys["name"])
    kinds, kind_values = _codes(keys["kind"])
    is_op = kinds == (kind_values.index("op") if "op" in kind_values else -2)
    calls = np.bincount(names[is_op & (names >= 0)], minlength=len(name_values))
    totals = np.array([op_flops.get(name, np.nan) for name in name_values] + [np.nan], dtype=np.float64)
    per_call = totals / np.append(np.maximum(calls, 1), 1)  # code -1 (null name) picks the trailing NaN
    share = np.where(is_op, per_call[names], np.nan)
    flops = events["flops"].combine_chunks().to_numpy(zero_copy_only=False).astype(np.float64)
    flops = np.where(np.isnan(flops), share, flops)
    events = events.set_column(events.schema.get_field_index("flops"), "flops", pa.array(flops, pa.float64()))
    return replace(trace, events=events, metadata={**trace.metadata, "flops": FLOPS_SOURCE})
