"""The rules both XLA readers share for host threads: which host event is an XLA op, a module, Python, a
step or an op, which undecided ranges are annotations, and XLA:CPU's module runs. The XSpace reader
(`workbench.trace.xspace.reader`) and the reader of JAX's own Chrome trace (`workbench.trace.kineto.xla`) apply
them, so the same run yields the same ops and steps from either file.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from workbench.trace.schema import KIND_CODES

HOST_PLANE = "/host:CPU"
"""The XSpace plane (and Chrome-trace process) of the host's threads."""
CORRELATION = "correlation_id"
"""The stat linking a launch to its device work."""
STEP_STATS = ("step_num", "_r")
"""Stats marking a step annotation (StepTraceAnnotation)."""
RUNTIME_NAME = re.compile(r"::|\(")
"""A host event named like a C++ function or a call is an op."""
LAUNCH = "PjitFunction("
"""The host event of a jitted call."""
PYTHON_LANE = "/python tracer"
"""The line of the Python tracer's events."""
CPU_MODULE_RANGE = "ThunkExecutor::Execute"
"""XLA:CPU's range around a module's ops."""


def host_kind(name: str, stats: dict[str, Any]) -> str | None:
    """The kind of a host-thread event, or None for a range that is an annotation or an op by nesting."""
    if "hlo_op" in stats:
        return "hlo"
    if "hlo_module" in stats:
        return "module"
    if name.startswith("$"):
        return "python"
    if any(s in stats for s in STEP_STATS):
        return "annotation"
    return "op" if RUNTIME_NAME.search(name) else None


def xla_cpu_modules(kind: np.ndarray, name: list[str], args: list[str | None], parent: np.ndarray) -> None:
    """Make each XLA:CPU module run a `module` event, in place. XLA:CPU writes no module span: its ops
    run inside a `ThunkExecutor::Execute` range, which is renamed after the ops' `hlo_module` (the
    original name kept in args as `xla_cpu_range`), like the `XLA Modules` line of a TPU or GPU."""
    hlo_rows = np.flatnonzero((kind == KIND_CODES["hlo"]) & (parent >= 0))
    modules: dict[int, dict[str, Any]] = {}
    for row in hlo_rows:
        up = int(parent[row])
        if up in modules or name[up] != CPU_MODULE_RANGE or args[row] is None:
            continue
        stats = json.loads(args[row])
        if "hlo_module" in stats:
            modules[up] = {key: stats[key] for key in ("hlo_module", "program_id") if key in stats}
    for up, stats in modules.items():
        kind[up] = KIND_CODES["module"]
        name[up] = str(stats["hlo_module"])
        own = json.loads(args[up]) if args[up] else {}
        args[up] = json.dumps({**own, **stats, "xla_cpu_range": CPU_MODULE_RANGE}, ensure_ascii=False)


def mark_annotations(kind: np.ndarray, undecided: np.ndarray, name: np.ndarray, parent: np.ndarray,
                 depth: np.ndarray) -> np.ndarray:
    """Mark as `annotation` the undecided ranges with an annotation or a jitted call inside."""
    kind = kind.copy()
    launch = np.array([str(s).startswith(LAUNCH) for s in name], dtype=bool)
    by_level = np.argsort(depth, kind="stable")  # grouped once: a deep chain costs levels + rows, not their product
    bounds = np.searchsorted(depth[by_level], np.arange(int(depth.max()) + 2 if len(depth) else 0))
    for level in range(len(bounds) - 2, 0, -1):
        rows = by_level[bounds[level]:bounds[level + 1]]
        marks = (kind[rows] == KIND_CODES["annotation"]) | launch[rows]
        up = parent[rows[marks]]
        up = up[(up >= 0) & undecided[np.maximum(up, 0)]]
        kind[up] = KIND_CODES["annotation"]
    return kind
