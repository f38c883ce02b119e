"""Pair the begin and end records of a Chrome trace into spans.

| begin | end | matched within                                   |
|-------|-----|--------------------------------------------------|
| `B`   | `E` | the thread (pid, tid)                            |
| `b`   | `e` | the async id: category + `id` or `id2.global`, or process + category + `id2.local` |
| `S`   | `F` | the same, and the name (legacy async)            |

Each begin takes the duration up to its end (the innermost open one, as the format nests them); the
end's args are kept in the begin's as `end_args`, and the end is no row. What does not pair is counted.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from workbench.trace.kineto.values import decode_json, merge_json

PAIRS = (("B", "E"), ("b", "e"), ("S", "F"))
NO_BEGIN = "end events without a begin"
MERGED = "end events (merged into their begin)"
NO_END = "begin events without an end (kept, duration as written)"
NO_ID = "async records without an id (kept, not paired)"


def pair_spans(ph_codes: np.ndarray, ph_values: list[str], pid: np.ndarray, tid: np.ndarray, async_key: np.ndarray,
               ts: np.ndarray, dur: np.ndarray, args: pa.ChunkedArray,
               skipped: Counter[str]) -> tuple[np.ndarray, np.ndarray, pa.ChunkedArray]:
    """(rows to keep, durations, args) once each begin has met its end (see the module docstring).

    `async_key`: per row, the code of its async key (-1 for none); `skipped` gets the counts.
    """
    keep = np.ones(len(ts), dtype=bool)
    code = {p: i for i, p in enumerate(ph_values)}
    pairs = [(code.get(b, -2), code[e], b == "B") for b, e in PAIRS if e in code]
    no_id = np.isin(ph_codes, [code[p] for p in ("b", "n", "S", "T", "p") if p in code]) & (async_key < 0)
    skipped[NO_ID] += int(no_id.sum())
    if not pairs:
        return keep, dur, args
    dur = dur.copy()
    merged: dict[int, Any] = {}
    for begin, end, by_thread in pairs:
        rows = np.flatnonzero((ph_codes == begin) | (ph_codes == end))
        rows = rows[np.argsort(ts[rows], kind="stable")]
        stacks: dict[Any, list[int]] = {}
        for row in rows.tolist():
            key = (int(pid[row]), int(tid[row])) if by_thread else int(async_key[row])
            if ph_codes[row] == begin:
                if key != -1:
                    stacks.setdefault(key, []).append(row)
                continue
            keep[row] = False
            stack = stacks.get(key)
            if not stack:
                skipped[NO_BEGIN] += 1
                continue
            opened = stack.pop()
            dur[opened] = ts[row] - ts[opened]
            end_args = args[row].as_py()
            if end_args:
                merged[opened] = merge_json(args[opened].as_py(), {"end_args": decode_json(end_args)})
            skipped[MERGED] += 1
        skipped[NO_END] += sum(len(stack) for stack in stacks.values())
    if merged:
        values = args.to_pylist()
        for row, text in merged.items():
            values[row] = text
        args = pa.chunked_array([pa.array(values, pa.string())])
    return keep, dur, args

