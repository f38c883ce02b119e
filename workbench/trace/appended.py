"""Appending one trace's events to another's: rows a backend recorded itself (TensorRT's IProfiler layers,
ONNX Runtime's profile) added to the run's profiler trace on its time axis."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from workbench.trace.model import Trace
from workbench.trace.ranks.multirank import shift_trace


def append_trace(trace: Trace, extra: Trace, shift_ns: int) -> Trace:
    """`trace` with `extra`'s events moved by `shift_ns` and appended: `trace`'s rows keep their numbers,
    `extra`'s follow (their `parent` and `launcher` rows shifted to match). Memory and counters and the
    metadata are `trace`'s (a copy of the metadata, for the caller to add to)."""
    appended = shift_trace(extra, shift_ns).events
    rows = trace.events.num_rows
    for column in ("parent", "launcher"):
        values = appended[column]
        shifted = pc.if_else(pc.greater_equal(values, 0), pc.add(values, rows), values)
        appended = appended.set_column(appended.schema.get_field_index(column), column, shifted)
    events = pa.concat_tables([trace.events, appended]).unify_dictionaries()
    return Trace(events=events, memory=trace.memory, counters=trace.counters, metadata=dict(trace.metadata))
