"""The critical path as a track of its own in an export (`workbench export --critical-path`), so the path a step
runs through shows under the lanes in Perfetto UI or chrome://tracing, as HTA overlays its critical path.

One annotation per segment of the typical step's path (`workbench.analysis.critical_path.typical_path`), named
"<segment kind>: <event name>", on a host track "critical path (step N)"; its args say the segment's kind, the row
of the event it stands for (-1 for untraced time) and its share of the path. The track's events tile the step:
their durations add up to the path's length.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from workbench.analysis.critical_path import typical_path
from workbench.trace import Trace
from workbench.trace.schema import EVENTS

PATH_PID = 2**31
"""The pid written for the path's track: past int32, so the export gives it a process of its own."""


def path_track(trace: Trace) -> tuple[pa.Table | None, dict[str, Any]]:
    """The path's segments as rows of the events schema, with what the export's summary says of them:
    {"track": its name, "segments": its rows}; (None, {"error": why}) when the trace's typical step has no path (a
    step past the path's bound, nothing to chain)."""
    path = typical_path(trace)
    if isinstance(path, str):
        return None, {"error": path}
    track = f"critical path (step {path.step})"
    seg = path.segments
    n = len(seg)
    rows = {
        "start_ns": seg["start_ns"].tolist(), "dur_ns": seg["dur_ns"].tolist(),
        "name": [f"{kind}: {name}" for kind, name in zip(seg["kind"], seg["name"], strict=True)],
        "kind": ["annotation"] * n, "device": ["cpu"] * n, "track": [track] * n, "pid": [PATH_PID] * n,
        "tid": [0] * n, "corr": [-1] * n, "parent": [-1] * n, "depth": [0] * n, "launcher": [-1] * n,
        "flops": [None] * n, "bytes": [None] * n, "shapes": [None] * n, "dtypes": [None] * n,
        "args": [json.dumps({"segment": kind, "event row": int(row), "share of path": round(float(share), 6)})
                 for kind, row, share in zip(seg["kind"], seg["row"], seg["share"], strict=True)],
    }
    return pa.Table.from_pydict(rows, schema=EVENTS), {"track": track, "segments": n}
