"""Kinds and tracks of Chrome-trace JSON converted from an XSpace (JAX's `<host>.trace.json.gz`).

`jax.profiler.trace` writes the same profile twice: `<host>.xplane.pb` and a Chrome-trace JSON whose
processes are the XSpace's planes (`process_name` `/host:CPU`, `/device:GPU:0`) and whose threads are
its lines. Those events have no category; their args are the XSpace event stats as strings
(`hlo_op`, `hlo_module`, `step_num`). The rows of such processes are classified by the XSpace
reader's own rules (`workbench.trace.xspace.reader`, `workbench.trace.xspace.device`), so both files of a
run give the same kinds, tracks and steps: `hlo` / `module` for XLA ops and modules, `python` for
Python frames (on `<track>/python tracer`), `annotation` for step and TraceAnnotation ranges, `op`
for the runtime's ranges, and device lines by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench.trace.kineto.tracks import Lanes
from workbench.trace.kineto.values import decode_json
from workbench.trace.schema import KIND_CODES
from workbench.trace.xspace.device import line_kind, plane_device, stream_event_kind, stream_types, sub_plane
from workbench.trace.xspace.xla_host import (
    CORRELATION,
    HOST_PLANE,
    PYTHON_LANE,
    host_kind,
    mark_annotations,
    xla_cpu_modules,
)

_PLANE_PREFIXES = ("/host:", "/device:")


def plane_processes(process_names: dict[int, str]) -> dict[int, str]:
    """The pids whose process is an XSpace plane, and the plane's name."""
    return {pid: name for pid, name in process_names.items() if name.startswith(_PLANE_PREFIXES)}


def classify(planes: dict[int, str], thread_names: dict[tuple[int, int], str], pid: np.ndarray, tid: np.ndarray,
             names: list[str], args: list[str | None], kind: np.ndarray, lanes: Lanes) -> np.ndarray:
    """Set the kind, device and track of the rows of plane processes, in place; return the mask of the
    host ranges whose kind waits for nesting (`finish`)."""
    undecided = np.zeros(len(kind), dtype=bool)
    for plane_pid, plane in planes.items():
        rows = np.flatnonzero(pid == plane_pid)
        device = plane_device(plane, {}, None)
        for thread in np.unique(tid[rows]).tolist():
            line_rows = rows[tid[rows] == thread]
            line = thread_names.get((plane_pid, thread), str(thread))
            if device is not None:
                _device_line(line_rows, device, "/".join([device, *sub_plane(plane), line]), line, names, args,
                             kind, lanes)
                continue
            where = ["cpu"] if plane == HOST_PLANE else ["cpu", plane.strip("/")]
            track = "/".join([*where, line])
            labels = []
            for row in line_rows.tolist():
                stats = _stats(args[row])
                event_kind = "runtime" if CORRELATION in stats else \
                    host_kind(names[row], stats) if plane == HOST_PLANE else "other"
                undecided[row] = event_kind is None
                kind[row] = KIND_CODES[event_kind or "op"]
                labels.append(f"{track}{PYTHON_LANE}" if event_kind == "python" else track)
            lanes.name_lane(line_rows, "cpu", labels)
    return undecided


def _device_line(rows: np.ndarray, device: str, track: str, line: str, names: list[str], args: list[str | None],
                 kind: np.ndarray, lanes: Lanes) -> None:
    """Rows of one line of a device plane: kind by line name, or per event on a stream line."""
    by_line = line_kind(line)
    if by_line is not None:
        kind[rows] = KIND_CODES[by_line]
    else:
        types = stream_types(line)
        kind[rows] = [KIND_CODES[stream_event_kind(names[r], _stats(args[r]), types)] for r in rows.tolist()]
    lanes.name_lane(rows, device, [track] * len(rows))


def finish(kind: np.ndarray, undecided: np.ndarray, names: list[str], args: list[str | None], parent: np.ndarray,
           depth: np.ndarray) -> tuple[np.ndarray, list[str], list[str | None]]:
    """Once nested: ranges around an annotation or a jitted call become annotations, and XLA:CPU's
    `ThunkExecutor::Execute` ranges around ops their module (both as the XSpace reader does).
    Returns the kinds, names and args (JSON normalized as the XSpace reader writes it where changed)."""
    kind = mark_annotations(kind, undecided, np.asarray(names, dtype=object), parent, depth)
    xla_cpu_modules(kind, names, args, parent)
    return kind, names, args


def _stats(text: str | None) -> dict[str, Any]:
    value = decode_json(text) if text else {}
    return value if isinstance(value, dict) else {}
