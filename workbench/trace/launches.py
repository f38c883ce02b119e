"""Launch links: the host op behind each piece of device work, found through correlation ids and nesting.

Shared by the readers whose device work and launching runtime calls carry the same correlation id,
with the runtime calls nested in the host ops of their thread (Kineto JSON, XSpace).
"""

from __future__ import annotations

import numpy as np

from workbench.trace import schema
from workbench.trace.columns import lookup
from workbench.trace.schema import KIND_CODES


def launchers(kind: np.ndarray, corr: np.ndarray, parent: np.ndarray, ext: np.ndarray | None = None, *,
              absent: int = -1) -> np.ndarray:
    """Row of the host op that launched each device event (-1 if unknown).

    Kernel → runtime call with the same correlation id → its innermost enclosing op (or, with no
    op around it, its innermost annotation such as a record_function range). Device events whose
    runtime call is not in the trace fall back to the op with the same external id (`ext`: Kineto's
    External id). `absent` marks a row without an id in `corr` and `ext`; ids are compared as given, so
    a reader whose ids repeat across processes passes ids made unique per process.
    """
    launcher = np.full(len(kind), -1, dtype=np.int64)
    is_op = kind == KIND_CODES["op"]
    device = np.isin(kind, [KIND_CODES[k] for k in schema.DEVICE_KINDS])
    runtime = np.flatnonzero((kind == KIND_CODES["runtime"]) & (corr != absent))
    op_of_runtime = enclosing(parent[runtime], parent, is_op)
    no_op = op_of_runtime < 0
    op_of_runtime[no_op] = enclosing(parent[runtime[no_op]], parent, kind == KIND_CODES["annotation"])
    targets = np.flatnonzero(device & (corr != absent))
    launcher[targets] = lookup(corr[targets], corr[runtime], op_of_runtime)
    if ext is not None:
        todo = np.flatnonzero(device & (launcher < 0) & (ext != absent))
        ops = np.flatnonzero(is_op & (ext != absent))
        launcher[todo] = lookup(ext[todo], ext[ops], ops)
    return launcher


def enclosing(start: np.ndarray, parent: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """From each row in `start`, follow `parent` up to the first row where `wanted` holds (-1 if none)."""
    rows = start.copy()
    for _ in range(np.iinfo(np.int16).max):
        climb = (rows >= 0) & ~wanted[np.maximum(rows, 0)]
        if not climb.any():
            break
        rows[climb] = parent[rows[climb]]
    return rows


def per_process(pid: np.ndarray, ids: np.ndarray, absent: int = -1) -> np.ndarray:
    """One int64 per (process, 32-bit id) for ids counted per process (CUPTI correlation ids); `absent` kept."""
    keys = (pid.astype(np.int64) << 32) | (ids.astype(np.int64) & 0xFFFFFFFF)
    return np.where(ids == absent, absent, keys)
