"""Requests joined to the engine steps that served them, and each request's time split into where it went.

The engines name each step with the batch it ran (how many prefill and decode requests, how many tokens) but
not which requests were in it, so the join works on the common clock of the run (the generator's request times
and the engine trace's step times, both from the bundle's origin):

- a request's **steps** are those that ran while it was in flight (start before its end, end after its arrival);
- its **first step** is the step that computed its prompt. The engines schedule waiting requests first come,
  first served, so requests in arrival order take the prefill slots of the steps in start order: each the first
  step that starts after it arrived and still has a slot (a step has as many as it ran prefill requests). A
  slot that would end after the request's first token reached the client cannot be its own; the last prefill
  step before that token is taken instead;
- **queued** is arrival → the start of that step (waiting for a batch slot; with chunked prefill, the earlier
  chunks count here too); **prefill** is the step itself; **delivery** is its end → the first token at the
  client (sampling, detokenizing, the API server's streaming and the network: long when the API process is
  starved, as on a CPU shared with the engine); **decode** is first token → end;
- **stalled behind prefill** is the part of its decode spent in steps that carried another request's prefill:
  a prefill-only step whole, a mixed step by what it took beyond the median decode-only step (the stretch a
  prefill beside the decodes cost them).

Requests without a first token, or runs without steps, get nulls.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from workbench.trace.columns import floats

PHASE_SCHEMA = pa.schema([
    ("first_step", pa.int64()), ("last_step", pa.int64()), ("steps", pa.int64()), ("queued_ns", pa.int64()),
    ("prefill_ns", pa.int64()), ("delivery_ns", pa.int64()), ("decode_ns", pa.int64()), ("stalled_ns", pa.int64()),
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
    delivery, decode and stalled-behind-prefill times (ns)."""
    n = requests.num_rows
    arrival = floats(requests["arrival_ns"])
    first = floats(requests["first_token_ns"])
    end = floats(requests["end_ns"])
    nulls = {name: pa.nulls(n, pa.int64()) for name in PHASE_SCHEMA.names}
    if steps is None or not steps.num_rows or not n:
        return nulls
    order = np.argsort(steps["start_ns"].to_numpy(), kind="stable")
    start = steps["start_ns"].to_numpy()[order]
    stop = start + steps["dur_ns"].to_numpy()[order]
    index = steps["step"].to_numpy()[order]
    prefill = np.nan_to_num(floats(steps["prefill_requests"])[order]) > 0
    decode = np.nan_to_num(floats(steps["decode_requests"])[order]) > 0
    mode = np.asarray(steps["mode"].to_pylist(), dtype=object)[order]
    prefill |= (mode == "prefill") | (mode == "mixed")
    decode |= (mode == "decode") | (mode == "mixed")
    decode_only = decode & ~prefill
    typical = float(np.median(stop[decode_only] - start[decode_only])) if decode_only.any() else 0.0
    # What a prefill-carrying step cost the decodes beside it: a prefill-only step whole, a mixed one its excess.
    stall = np.where(prefill & ~decode, stop - start, np.where(prefill, np.maximum(stop - start - typical, 0), 0))
    out = {name: np.full(n, -1, dtype=np.int64) for name in PHASE_SCHEMA.names}
    known = ~np.isnan(first) & ~np.isnan(arrival) & ~np.isnan(end)
    made_by = _prefill_steps(arrival, first, start, stop, prefill,
                             np.nan_to_num(floats(steps["prefill_requests"])[order], nan=1.0))
    reach = np.maximum.accumulate(stop)  # no step before the first whose running end passes a time overlaps it
    for r in np.flatnonzero(~np.isnan(arrival) & ~np.isnan(end)):
        near = np.arange(np.searchsorted(reach, arrival[r], side="right"), np.searchsorted(start, end[r]))
        rows = near[stop[near] > arrival[r]]
        out["steps"][r] = len(rows)
        if len(rows):
            out["last_step"][r] = index[rows[-1]]
        if not known[r] or (made := made_by[r]) < 0:
            continue
        out["first_step"][r] = index[made]
        out["queued_ns"][r] = start[made] - arrival[r]
        out["prefill_ns"][r] = stop[made] - start[made]
        out["delivery_ns"][r] = first[r] - stop[made]
        out["decode_ns"][r] = end[r] - first[r]
        out["stalled_ns"][r] = int(stall[rows[start[rows] >= stop[made]]].sum())
    decided = out["first_step"] >= 0
    return {name: pa.array(values, pa.int64(), mask=(values < 0) if name in ("first_step", "last_step") else
                           (~decided if name not in ("steps",) else None))
            for name, values in out.items()}


def _prefill_steps(arrival: np.ndarray, first: np.ndarray, start: np.ndarray, stop: np.ndarray,
                   prefill: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Per request, the row (in start order) of the step that computed its prompt, -1 where none (module
    docstring: first come, first served over the steps' prefill slots; the last prefill step before the first
    token where that slot ends too late)."""
    rows = np.flatnonzero(prefill)
    left = np.maximum(slots[rows], 1).astype(np.int64)
    made = np.full(len(arrival), -1, dtype=np.int64)
    at = 0
    for r in np.argsort(np.nan_to_num(arrival, nan=np.inf), kind="stable"):
        if np.isnan(arrival[r]) or np.isnan(first[r]):
            continue
        while at < len(rows) and (start[rows[at]] < arrival[r] or left[at] == 0):
            at += 1
        if at < len(rows) and stop[rows[at]] <= first[r]:
            made[r] = rows[at]
            left[at] -= 1
            continue
        before = np.searchsorted(stop[rows], first[r], side="right") - 1
        if before >= 0 and start[rows[before]] >= arrival[r]:
            made[r] = rows[before]
    return made
