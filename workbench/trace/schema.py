"""Arrow schemas of the three Trace tables (see the Trace contract in docs/design.md).

All times are integer nanoseconds from the trace origin; units are in the column names.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1

TIME_LIMIT_NS = 2**62
"""Readers leave out records whose start or end (on the profiler's clock) is not within ±TIME_LIMIT_NS, and
count them: any two kept times are then less than 2**63 ns apart, so their difference fits int64."""

_dict_str = pa.dictionary(pa.int32(), pa.string())

EVENTS = pa.schema(
    [
        ("start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("name", _dict_str),
        ("kind", _dict_str),
        ("device", _dict_str),
        ("track", _dict_str),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("corr", pa.int64()),
        ("parent", pa.int64()),
        ("depth", pa.int16()),
        ("launcher", pa.int64()),
        ("flops", pa.float64()),
        ("bytes", pa.float64()),
        ("shapes", pa.string()),
        ("dtypes", pa.string()),
        ("args", pa.string()),
    ]
)

MEMORY = pa.schema(
    [
        ("ts_ns", pa.int64()),
        ("device", _dict_str),
        ("addr", pa.int64()),
        ("delta_bytes", pa.int64()),
        ("allocated_bytes", pa.int64()),
        ("reserved_bytes", pa.int64()),
        ("event", pa.int64()),
    ]
)

COUNTERS = pa.schema(
    [
        ("ts_ns", pa.int64()),
        ("device", _dict_str),
        ("name", _dict_str),
        ("value", pa.float64()),
    ]
)

KINDS = (
    "op",
    "kernel",
    "memcpy",
    "memset",
    "runtime",
    "annotation",
    "python",
    "hlo",
    "module",
    "layer",
    "other",
)
"""Every value the events `kind` column may take."""

KIND_CODES = {kind: code for code, kind in enumerate(KINDS)}
"""Each kind's integer code, as readers build the `kind` column (codes into `KINDS`) before encoding it."""

DEVICE_KINDS = frozenset({"kernel", "memcpy", "memset", "hlo", "module", "layer"})
"""Kinds that run on an accelerator (and so may have a `launcher`)."""

PHASE_LOAD, PHASE_COMPILE, PHASE_WARMUP, PHASE_MEASURE = "load", "compile", "warmup", "measure"
"""The workbench's lifecycle phase labels, as annotations in every trace it captures: preparing a variant,
its first (compiling) call, warm-up iterations, and the measured iterations (one `step N` each)."""

SETUP_PHASES = (PHASE_LOAD, PHASE_COMPILE)
"""The phases that make a variant runnable."""

LIFECYCLE_PHASES = (*SETUP_PHASES, PHASE_WARMUP, PHASE_MEASURE)
"""The phases of a variant's profiled lifecycle, in order."""

STEP_PREFIX = "step "
"""Label of a measured iteration: `step N` (0-based)."""


def step_label(n: int) -> str:
    """The label of the n-th (0-based) measured iteration."""
    return f"{STEP_PREFIX}{n}"
