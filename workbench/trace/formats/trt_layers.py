"""TensorRT per-layer timings as Trace events: kind `layer`, one `module` span per engine execution.

TensorRT's `IProfiler.report_layer_time(layer_name, ms)` gives each layer's device time for one
execution, in execution order, and nothing else: no start times. `LayerTimes` collects those reports
per execution (the runtime calls `begin` before `execute_async_v3` and `end` after the stream is
synchronized, with `time.perf_counter_ns` host times, and notes the offset of that clock to the UTC epoch);
`layer_trace` lays each execution's layers out back to back from the host time the execution began, under a
`module` span for the execution, on the track `cuda:N/TensorRT layers`. `merge_layer_times` puts those
events on the time axis of the run's profiler trace (Kineto times are UTC epoch based) and appends them.
Starts are therefore synthesized (layer order and durations are TensorRT's, gaps between layers are
not represented); every event's `args` says so. With a fusion table (`workbench.analysis.trt_fusion`)
the layers also get their type, tactic, precision, fused ONNX nodes and input dims.

No torch or TensorRT here: the collector is plain Python so it can be filled by the runtime's
`trt.IProfiler` subclass and tested without a GPU.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.errors import WorkbenchError
from workbench.trace import schema
from workbench.trace.appended import append_trace
from workbench.trace.columns import dict_array, encode_strings
from workbench.trace.model import Trace
from workbench.trace.ranks.multirank import absolute_origin_ns

TRACK = "TensorRT layers"
"""Track suffix: events go to `<device>/TensorRT layers`."""

FORMAT = "tensorrt-iprofiler"
"""`metadata["source"]["format"]` of a layer trace."""

LAYERS_GAP_NS = 1_000_000
"""Gap left between a trace's last event and layer events placed after it when their clock is unknown."""

TIMING_NOTE = ("layer durations from TensorRT IProfiler.report_layer_time; starts laid out back to back "
               "from the host time of each execute_async_v3 call")

_DEVICE = re.compile(r"^cuda:(\d+)$")


@dataclass
class LayerTimes:
    """Per-execution layer reports: `executions` holds [start_ns, end_ns] host times (end -1 until
    `end` is called), `layers` (execution index, layer name, milliseconds) in report order.
    `epoch_offset_ns` is UTC epoch ns minus the host clock of those times (`time.time_ns() -
    time.perf_counter_ns()` when profiling began), None when unknown."""

    executions: list[list[int]] = field(default_factory=list)
    layers: list[tuple[int, str, float]] = field(default_factory=list)
    epoch_offset_ns: int | None = None

    def begin(self, start_ns: int) -> None:
        """Start a new execution at host time `start_ns`."""
        self.executions.append([int(start_ns), -1])

    def record(self, name: str, ms: float) -> None:
        """One `report_layer_time` call: layer `name` took `ms` milliseconds in the current execution."""
        if not self.executions:
            raise WorkbenchError(f"TensorRT reported layer {name!r} before any execution began")
        self.layers.append((len(self.executions) - 1, str(name), float(ms)))

    def end(self, end_ns: int) -> None:
        """Close the current execution at host time `end_ns`."""
        if not self.executions:
            raise WorkbenchError("no TensorRT execution to end")
        self.executions[-1][1] = int(end_ns)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for the bundle's raw/ folder)."""
        return {"format": FORMAT, "executions": self.executions, "epoch_offset_ns": self.epoch_offset_ns,
                "layers": [{"execution": e, "name": n, "ms": ms} for e, n, ms in self.layers]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerTimes:
        """The collector `to_dict` wrote; WorkbenchError naming what is malformed."""
        try:
            executions = [[int(start), int(end)] for start, end in data["executions"]]
            layers = [(int(item["execution"]), str(item["name"]), float(item["ms"])) for item in data["layers"]]
            offset = data.get("epoch_offset_ns")
            offset = None if offset is None else int(offset)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WorkbenchError(f"malformed TensorRT layer times: {type(exc).__name__}: {exc}") from exc
        bad = [e for e, _, _ in layers if not 0 <= e < len(executions)]
        if bad:
            raise WorkbenchError(f"TensorRT layer times refer to execution {bad[0]}, but only "
                                 f"{len(executions)} were recorded")
        return cls(executions, layers, offset)

    def total_ms(self) -> dict[str, float]:
        """Milliseconds per layer name summed over executions, slowest first."""
        totals: dict[str, float] = {}
        for _, name, ms in self.layers:
            totals[name] = totals.get(name, 0.0) + ms
        return dict(sorted(totals.items(), key=lambda item: -item[1]))


def _device_index(device: str) -> int:
    match = _DEVICE.match(device)
    if match is None:
        raise WorkbenchError(f"TensorRT layer events need a cuda:N device, got {device!r}")
    return int(match[1])


def _layer_details(layers: Any) -> dict[str, dict[str, Any]]:
    """Per layer name, the fusion-table fields worth carrying into `args` (and shapes/dtypes)."""
    if layers is None:
        return {}
    wanted = ("type", "onnx_nodes", "fused_ops", "tactic", "precision", "input_dtypes", "input_dims")
    records = layers.to_dict("records") if hasattr(layers, "to_dict") else list(layers)
    details = {}
    for row in records:
        details[str(row["name"])] = {k: row[k] for k in wanted if k in row and not _missing(row[k])}
    return details


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def layer_trace(times: LayerTimes, device: str = "cuda:0", *, engine: str = "TensorRT engine",
                layers: Any = None, origin_ns: int | None = None) -> Trace:
    """The collected timings as a Trace: per execution one `module` event named `engine` spanning the
    execution (host wall time, at least the sum of its layers) and one `layer` event per reported layer,
    laid out back to back from the execution's start, all on `<device>/TensorRT layers`.

    | start_ns | dur_ns | name | kind | device | track | pid | tid | parent | depth | shapes | dtypes | args |

    Each layer's `parent` is its execution's `module` row (depth 1). `pid` is the device index and `tid` 0
    (TensorRT runs the engine on one stream). `layers` is a fusion
    table (`trt_fusions`) whose rows, matched by layer name, add type, tactic, precision and fused ONNX
    nodes to `args` and input dims / dtypes to `shapes` / `dtypes`. Times count from `origin_ns` (default:
    the first execution's start). Reports with a negative or non-finite time are skipped and counted in
    `metadata["reader"]["skipped"]`.
    """
    index = _device_index(device)
    if not times.executions:
        raise WorkbenchError("no TensorRT executions were profiled: nothing to turn into layer events")
    details = _layer_details(layers)
    by_execution: list[list[tuple[str, int, float]]] = [[] for _ in times.executions]
    skipped = 0
    for execution, name, ms in times.layers:
        if not math.isfinite(ms) or ms < 0:
            skipped += 1
            continue
        by_execution[execution].append((name, round(ms * 1e6), ms))
    origin = min(start for start, _ in times.executions) if origin_ns is None else int(origin_ns)
    names: list[str] = []
    kinds: list[str] = []
    start: list[int] = []
    dur: list[int] = []
    shapes: list[str | None] = []
    dtypes: list[str | None] = []
    args: list[str] = []
    parent: list[int] = []
    for execution, ((begin, end), reports) in enumerate(zip(times.executions, by_execution, strict=True)):
        t0 = begin - origin
        module_row = len(names)
        parent.extend([-1, *[module_row] * len(reports)])
        busy = sum(d for _, d, _ in reports)
        wall = end - begin if end >= begin else 0
        names.append(engine)
        kinds.append("module")
        start.append(t0)
        dur.append(max(wall, busy))
        shapes.append(None)
        dtypes.append(None)
        args.append(json.dumps({"execution": execution, "layers": len(reports), "layer_ns": busy,
                                "wall_ns": wall if end >= begin else None, "timing": TIMING_NOTE}))
        cursor = t0
        for position, (name, d, ms) in enumerate(reports):
            extra = dict(details.get(name, {}))
            names.append(name)
            kinds.append("layer")
            start.append(cursor)
            dur.append(d)
            shapes.append(extra.pop("input_dims", None))
            dtypes.append(extra.pop("input_dtypes", None))
            args.append(json.dumps({"execution": execution, "index": position, "ms": ms,
                                    "start": "synthesized", **extra}, default=str))
            cursor += d
    return _trace(device, index, names, kinds, start, dur, parent, shapes, dtypes, args, origin, skipped,
                  len(times.executions))


def merge_layer_times(trace: Trace, times: LayerTimes, device: str, *, engine: str = "TensorRT engine",
                      layers: Any = None) -> Trace:
    """`trace` (a run's profiler trace) with the `layer_trace` of `times` appended: its rows keep their
    numbers, the layer trace's rows follow (their `parent` shifted to match).

    Placement on `trace`'s time axis: with `times.epoch_offset_ns` where the executions happened (the trace
    origin's absolute time is `absolute_origin_ns`; Kineto's clock is the UTC epoch), else starting
    `LAYERS_GAP_NS` after the trace's last event. `metadata["tensorrt_layers"]` says which (`placement`
    "clock" or "after trace"), with the layer trace's timing note, execution count and skipped reports.
    """
    extra = layer_trace(times, device, engine=engine, layers=layers, origin_ns=0)
    if times.epoch_offset_ns is not None:
        placement, shift = "clock", times.epoch_offset_ns - absolute_origin_ns(trace)
    else:
        events = trace.events
        end = pc.max(pc.add(events["start_ns"], events["dur_ns"])).as_py() if events.num_rows else None
        first = pc.min(extra.events["start_ns"]).as_py()
        placement, shift = "after trace", (end or 0) + LAYERS_GAP_NS - first
    merged = append_trace(trace, extra, shift)
    merged.metadata["tensorrt_layers"] = {
        "source": {"format": FORMAT}, "placement": placement, "shift_ns": shift, "timing": TIMING_NOTE,
        "executions": extra.metadata["executions"], "events": extra.events.num_rows,
        "skipped": extra.metadata["reader"]["skipped"]}
    return merged


def _trace(device: str, index: int, names: list[str], kinds: list[str], start: list[int], dur: list[int],
           parent: list[int], shapes: list[str | None], dtypes: list[str | None], args: list[str], origin: int,
           skipped: int, executions: int) -> Trace:
    n = len(names)
    parents = np.asarray(parent, dtype=np.int64)
    name_codes, name_labels = encode_strings(names)
    kind_codes = np.asarray([schema.KINDS.index(k) for k in kinds], dtype=np.int32)
    events = pa.table(
        {
            "start_ns": np.asarray(start, dtype=np.int64),
            "dur_ns": np.asarray(dur, dtype=np.int64),
            "name": dict_array(name_codes, name_labels),
            "kind": dict_array(kind_codes, list(schema.KINDS)),
            "device": dict_array(np.zeros(n, dtype=np.int32), [device]),
            "track": dict_array(np.zeros(n, dtype=np.int32), [f"{device}/{TRACK}"]),
            "pid": np.full(n, index, dtype=np.int64),
            "tid": np.zeros(n, dtype=np.int64),
            "corr": np.full(n, -1, dtype=np.int64),
            "parent": parents,
            "depth": (parents >= 0).astype(np.int16),
            "launcher": np.full(n, -1, dtype=np.int64),
            "flops": np.full(n, np.nan),
            "bytes": np.full(n, np.nan),
            "shapes": pa.array(shapes, pa.string()),
            "dtypes": pa.array(dtypes, pa.string()),
            "args": pa.array(args, pa.string()),
        },
        schema=schema.EVENTS,
    )
    metadata = {
        "source": {"format": FORMAT},
        "origin_ns": origin,
        "timing": TIMING_NOTE,
        "executions": executions,
        "reader": {"events": n, "memory": 0, "counters": 0,
                   "skipped": {"invalid_layer_time": skipped} if skipped else {}},
    }
    return Trace(events=events, metadata=metadata)
