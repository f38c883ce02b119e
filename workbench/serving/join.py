"""Requests joined to the engine steps that served them, and each request's time split into where it went.

The engines name each step with the batch it ran (how many prefill and decode requests, how many tokens) but
not which requests were in it, so the join works on the common clock of the run (the generator's request times
and the engine trace's step times, both from the bundle's origin):

- a request's **steps** are those that ran while it was in flight (start before its end, end after its arrival);
- its **first step** is the last step carrying a prefill that ended before its first token arrived: the step
  that computed its prompt and produced that token;
- **queued** is arrival → the start of that step (waiting for a batch slot; with chunked prefill, the earlier
  chunks count here too); **prefill** is that step's start → the first token (the step, then sampling,
  detokenizing and streaming); **decode** is first token → end;
- **stalled behind prefill** is the part of its decode spent in steps that carried another request's prefill:
  a prefill-only step whole, a mixed step by what it took beyond the median decode-only step (the stretch a
  prefill beside the decodes cost them).

Requests without a first token, or runs without steps, get nulls.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

PHASE_SCHEMA = pa.schema([
    ("first_step", pa.int64()), ("last_step", pa.int64()), ("steps", pa.int64()), ("queued_ns", pa.int64()),
    ("prefill_ns", pa.int64()), ("decode_ns", pa.int64()), ("stalled_ns", pa.int64()),
])
"""Columns the join adds to the `requests` table."""


def with_phases(requests: pa.Table, steps: pa.Table | None) -> pa.Table:
    """`requests` with the PHASE_SCHEMA columns (see the module docstring); nulls where `steps` is None."""
    columns = request_phases(requests, steps)
    for name in PHASE_SCHEMA.names:
        if name in requests.column_names:
            requests = requests.drop_columns([name])
        requests = requests.append_column(PHASE_SCHEMA.field(name), columns[name])
    return requests


def request_phases(requests: pa.Table, steps: pa.Table | None) -> dict[str, pa.Array]:
    """Per request, its first and last step, how many steps ran while it was in flight, and its queued, prefill,
    decode and stalled-behind-prefill times (ns)."""
    n = requests.num_rows
    arrival = _ints(requests["arrival_ns"])
    first = _ints(requests["first_token_ns"])
    end = _ints(requests["end_ns"])
    nulls = {name: pa.nulls(n, pa.int64()) for name in PHASE_SCHEMA.names}
    if steps is None or not steps.num_rows or not n:
        return nulls
    order = np.argsort(steps["start_ns"].to_numpy(), kind="stable")
    start = steps["start_ns"].to_numpy()[order]
    stop = start + steps["dur_ns"].to_numpy()[order]
    index = steps["step"].to_numpy()[order]
    prefill = np.nan_to_num(_ints(steps["prefill_requests"])[order]) > 0
    decode = np.nan_to_num(_ints(steps["decode_requests"])[order]) > 0
    mode = np.asarray(steps["mode"].to_pylist(), dtype=object)[order]
    prefill |= (mode == "prefill") | (mode == "mixed")
    decode |= (mode == "decode") | (mode == "mixed")
    decode_only = decode & ~prefill
    typical = float(np.median(stop[decode_only] - start[decode_only])) if decode_only.any() else 0.0
    # What a prefill-carrying step cost the decodes beside it: a prefill-only step whole, a mixed one its excess.
    stall = np.where(prefill & ~decode, stop - start, np.where(prefill, np.maximum(stop - start - typical, 0), 0))
    out = {name: np.full(n, -1, dtype=np.int64) for name in PHASE_SCHEMA.names}
    known = ~np.isnan(first) & ~np.isnan(arrival) & ~np.isnan(end)
    prefill_stops = stop[prefill]
    prefill_rows = np.flatnonzero(prefill)
    for r in np.flatnonzero(~np.isnan(arrival) & ~np.isnan(end)):
        live = (start < end[r]) & (stop > arrival[r])
        rows = np.flatnonzero(live)
        out["steps"][r] = len(rows)
        if len(rows):
            out["last_step"][r] = index[rows[-1]]
        if not known[r]:
            continue
        at = np.searchsorted(prefill_stops, first[r], side="right") - 1
        if at < 0 or start[prefill_rows[at]] < arrival[r]:
            continue
        made = prefill_rows[at]
        out["first_step"][r] = index[made]
        out["queued_ns"][r] = start[made] - arrival[r]
        out["prefill_ns"][r] = first[r] - start[made]
        out["decode_ns"][r] = end[r] - first[r]
        during = live & (start >= stop[made]) & (start < end[r])
        out["stalled_ns"][r] = int(stall[during].sum())
    decided = out["first_step"] >= 0
    return {name: pa.array(values, pa.int64(), mask=(values < 0) if name in ("first_step", "last_step") else
                           (~decided if name not in ("steps",) else None))
            for name, values in out.items()}


def _ints(column: pa.ChunkedArray) -> np.ndarray:
    """An integer column as float64 with NaN for nulls (so missing times stay visible)."""
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
