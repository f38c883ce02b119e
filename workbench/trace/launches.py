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
    """From each row in `start`, follow `parent` up to the first row where `wanted` holds (-1 if none).

    A few steps up one parent at a time (enough for the usual nesting); rows still climbing then jump by
    pointer doubling over the whole column, so a chain of any depth costs O(rows × log depth)."""
    rows = start.copy()
    for _ in range(_PLAIN_STEPS):
        climb = (rows >= 0) & ~wanted[np.maximum(rows, 0)]
        if not climb.any():
            return rows
        rows[climb] = parent[rows[climb]]
    # jump[r]: r itself where wanted (or -1), else a row further up the chain towards the first wanted one
    jump = np.where(wanted | (parent < 0), np.where(wanted, np.arange(len(parent)), -1), parent)
    for _ in range(64):  # 2**64 steps: more than any chain (parents come before their children, so no cycles)
        up = np.where(jump >= 0, jump[np.maximum(jump, 0)], -1)
        if (up == jump).all():
            break
        jump = up
    live = rows >= 0
    rows[live] = jump[rows[live]]
    return rows


_PLAIN_STEPS = 64
"""Parent steps `enclosing` takes one at a time before it switches to pointer doubling."""


def per_process(pid: np.ndarray, ids: np.ndarray, absent: int = -1) -> np.ndarray:
    """One int64 per (process, 32-bit id) for ids counted per process (CUPTI correlation ids); `absent` kept."""
    keys = (pid.astype(np.int64) << 32) | (ids.astype(np.int64) & 0xFFFFFFFF)
    return np.where(ids == absent, absent, keys)
