"""Critical path of one profiled step over host threads and device streams, and what-if speedups on it.

Bounded: one step's events only (those overlapping its window, at most `critical_path_graph.MAX_STEP_EVENTS`); a
trace without steps is one step (`workbench.analysis.steps.step_windows`), so its whole trace is the step.

The graph (the approach of HTA's lightweight critical path analysis, extended): each host and device event of the
step has a start and an end node; a virtual source sits at the step's start. Edges:

| edge         | from → to                                        | its time                                  |
|--------------|--------------------------------------------------|-------------------------------------------|
| host chain   | each boundary of a thread's events to the next,  | the innermost open event's own time       |
|              | in nesting order (op start, child start, child   | ("cpu op"), or time in no traced event    |
|              | end, ... op end)                                 | ("untraced")                              |
| device span  | a kernel's (memcpy's, memset's) start → its end  | its duration                              |
| stream order | a stream's previous work end → its next start    | dispatch ("launch latency")               |
| launch       | runtime call start → the device work with its    | "launch latency"; a CUDA/HIP graph launch |
|              | correlation id                                   | reaches every kernel it replays           |
| wait         | waited work end → a sync call's end, or → the    | "wait": a device or context sync waits on |
|              | next work on a stream that waits on an event     | each stream's last work launched before   |
|              |                                                  | it, a stream sync on that stream's, an    |
|              |                                                  | event sync or stream wait on the work     |
|              |                                                  | before the event's record, a copy or      |
|              |                                                  | memset call on its own copy, a launch     |
|              |                                                  | blocked on a full queue (`QUEUE_FULL`) on |
|              |                                                  | the work that finished as it resumed      |
| handoff      | an idle thread's last node → the first of a      | "thread handoff": the time the other      |
|              | burst another thread of its process runs while   | thread took to start, and the idle one to |
|              | it idles (filling at least half the idle time),  | resume; with no wake-up records this is   |
|              | and the burst's last node → where it resumes     | how a wait on another thread shows        |

Streams of syncs and events come from the sync records beside the call (Kineto's `cuda_sync` device events with
`stream`, `wait_on_stream` and `wait_on_cuda_event_record_corr_id`; nsys's synchronization records with `streamId`),
matched by correlation id; a stream or event sync without a record waits on every stream of its process (only
work that ended before the call returned counts). nsys names no stream for event records, so its stream waits on
events are no edges.

Timing: every node has one *binding* incoming edge, the one whose source happened last; its weight is the lag
observed between the two. Other incoming edges weigh nothing: a dependency that did not hold the node back is taken
as free. So the longest path re-creates the observed times exactly (its length is the step's span) and idle time
that no dependency explains is on no edge. `CriticalPath.what_if` divides the durations of chosen events (a host
op's own time and that of the ops nested in it; a kernel's duration) by factors and recomputes the longest path
over the same edges (a Coz-style virtual speedup): a kernel off the path changes nothing until it becomes binding.
The graph itself is built in `workbench.analysis.critical_path_graph`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.critical_path_graph import BY_NAME_COLUMNS, SEGMENT_COLUMNS, SEGMENT_KINDS, StepGraph
from workbench.analysis.steps import STEP_NAME, step_windows
from workbench.errors import WorkbenchError
from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE

__all__ = ["BY_NAME_COLUMNS", "SEGMENT_COLUMNS", "SEGMENT_KINDS", "CriticalPath", "critical_path",
           "finding_path_share", "path_summary", "step_spans"]


@dataclass(frozen=True)
class CriticalPath:
    """The critical path of one step: its segments (`SEGMENT_COLUMNS`, in time order), its length and the step's.

    `length_ns` equals `step_ns` up to clock skew (edges against the clocks are dropped, counted in
    `dropped_edges`). `what_if` re-times the graph with some events sped up."""

    step: int
    start_ns: int
    step_ns: int
    length_ns: int
    segments: pd.DataFrame
    dropped_edges: int
    graph: StepGraph = field(repr=False)

    def what_if(self, speedups: Mapping[str | int, float]) -> int:
        """The path's length (ns) with the events named (str: every event of the step with that name) or given by
        row (int) made `factor` times faster (2 halves their time; 1 changes nothing). A host op's factor covers
        its own time and its nested ops' (an inner op's own factor wins); a kernel's covers its duration."""
        return self.graph.length(self.graph.factors(speedups))

    def by_name(self) -> pd.DataFrame:
        """Per (kind, name) on the path: segments, path ns and share, and for device work its device time in the
        step and share of all device time there (`BY_NAME_COLUMNS`), largest path share first. A kernel with a
        large device share and a small path share is one whose speedup the step would not see."""
        seg = self.segments
        if seg.empty:
            return pd.DataFrame(columns=list(BY_NAME_COLUMNS))
        table = (seg.groupby(["kind", "name"], sort=False)
                 .agg(segments=("dur_ns", "size"), path_ns=("dur_ns", "sum")).reset_index())
        table["share"] = table["path_ns"] / max(self.length_ns, 1)
        device = self.graph.device_time()
        total = float(sum(device.values()))
        on_device = table["kind"].isin(("kernel", "memcpy", "memset"))
        table["device_ns"] = [device.get(n, 0) if d else np.nan for n, d in zip(table["name"], on_device, strict=True)]
        table["device_share"] = np.where(on_device, table["device_ns"] / total if total else np.nan, np.nan)
        return table.sort_values("path_ns", ascending=False, ignore_index=True)[list(BY_NAME_COLUMNS)]


def step_spans(trace: Trace) -> pd.DataFrame:
    """The trace's steps (`step_windows`) with the host event spanning each: | step | start_ns | end_ns | row |
    (row -1 when no event spans the window). Where the step annotations are missing but torch's `ProfilerStep#N`
    are ops (Kineto of 2021 records them as `Operator`), those ops are the steps."""
    windows = step_windows(trace)
    events = trace.events.select(["start_ns", "dur_ns", "name", "kind", "device"]).to_pandas()
    names = events["name"].astype(str)
    spans = events[(events["device"].astype(str) == "cpu")
                   & (names.str.match(STEP_NAME) | (names == PHASE_MEASURE)).to_numpy()]
    keys = dict(zip(zip(spans["start_ns"], spans["start_ns"] + spans["dur_ns"], strict=True), spans.index,
                    strict=True))
    rows = [keys.get((s, e), -1) for s, e in zip(windows["start_ns"], windows["end_ns"], strict=True)]
    ops = spans[(spans["kind"].astype(str) == "op") & names[spans.index].str.match(STEP_NAME)]
    if all(r < 0 for r in rows) and not ops.empty:
        ops = ops.sort_values("start_ns")
        return pd.DataFrame({"step": np.arange(len(ops)), "start_ns": ops["start_ns"].to_numpy(),
                             "end_ns": (ops["start_ns"] + ops["dur_ns"]).to_numpy(), "row": ops.index.to_numpy()})
    return windows.assign(row=np.asarray(rows, dtype=np.int64))


def critical_path(trace: Trace, step: int | None = None) -> CriticalPath:
    """The critical path of step `step` (0-based, `step_spans` order) of `trace`; by default the step of median
    length (the typical one). Raises WorkbenchError for a step that does not exist or has too many events."""
    spans = step_spans(trace)
    if step is None:
        lengths = (spans["end_ns"] - spans["start_ns"]).to_numpy()
        step = int(np.argsort(lengths, kind="stable")[(len(lengths) - 1) // 2])
    if not 0 <= step < len(spans):
        raise WorkbenchError(f"no step {step}: the trace has {len(spans)} step(s), numbered from 0")
    window = spans.iloc[step]
    graph = StepGraph(trace, int(window["start_ns"]), int(window["end_ns"]), int(window["row"]))
    return CriticalPath(step=step, start_ns=graph.start_ns, step_ns=graph.end_ns - graph.start_ns,
                        length_ns=graph.length(), segments=graph.segments(), dropped_edges=graph.dropped,
                        graph=graph)


def typical_path(trace: Trace) -> CriticalPath | str:
    """The critical path of the trace's typical step (`critical_path(trace)`), or why it has none (a step past the
    path's bound, no events to chain): what the analysis and the dashboard's tab both draw on, computed once."""
    try:
        return critical_path(trace)
    except WorkbenchError as exc:
        return str(exc)


def path_summary(path: CriticalPath, top: int = 10, speedup: float = 2.0) -> dict[str, Any]:
    """The path's headline (what `workbench analyze` prints and `--json` carries under "critical_path"): the step,
    its span and the path's length, ns per segment kind, the `top` names by path share, and what-ifs: the device
    work with the most device time in the step (on the path or not) and the op or kernel with the largest path
    share, each with its shares of device time and of the path and what speeding it `speedup`× would save."""
    names = path.by_name()
    by_kind = path.segments.groupby("kind")["dur_ns"].sum()
    device = path.graph.device_time()
    total = float(sum(device.values()))
    top_ops = names[names["kind"].isin(("cpu op", "kernel", "memcpy", "memset"))]  # time a speedup divides
    shares = top_ops.groupby("name")["share"].sum()
    picks = [max(device, key=device.__getitem__)] if device else []
    if not top_ops.empty and top_ops.iloc[0]["name"] not in picks:
        picks.append(str(top_ops.iloc[0]["name"]))
    hints = []
    for name in picks:
        saved = path.length_ns - path.what_if({name: speedup})
        hints.append({"name": name, "path_share": float(shares.get(name, 0.0)),
                      "device_share": device[name] / total if name in device else None,
                      "speedup": speedup, "saves_ns": int(saved), "saves_share": saved / max(path.length_ns, 1)})
    return {"step": path.step, "start_ns": path.start_ns, "step_ns": path.step_ns, "length_ns": path.length_ns,
            "dropped_edges": path.dropped_edges,
            "by_kind": {kind: int(by_kind.get(kind, 0)) for kind in SEGMENT_KINDS if by_kind.get(kind, 0)},
            "top": [{"kind": r.kind, "name": r.name, "path_ns": int(r.path_ns), "share": float(r.share),
                     "device_share": None if pd.isna(r.device_share) else float(r.device_share)}
                    for r in names.head(top).itertuples(index=False)],
            "what_if": hints}


_NAMED_KINDS = {"memory_bound": ("top", "name"), "low_occupancy": ("top", "name"),
                "unfused_elementwise": ("top_patterns", "ops")}
"""Finding kinds whose evidence names the ops or kernels they concern: (evidence list, its name field)."""


def finding_path_share(finding: Mapping[str, Any], path: CriticalPath) -> float | None:
    """The share of the path a finding (a `Finding.to_dict()`) covers, for the kinds whose events map onto path
    segments: `memcpy` (the device's copies on the path), `launch_bound` (launch latency into the device),
    `device_idle` (launch latency into the device, host time and waits, while the path reaches the device at all),
    and the kinds that name their ops or kernels (`_NAMED_KINDS`: the path's time in the names their evidence lists,
    a lower bound where the list is a top few); None for other kinds."""
    kind, device = finding.get("kind"), finding.get("device")
    seg = path.segments
    if kind not in ("memcpy", "launch_bound", "device_idle", *_NAMED_KINDS) or seg.empty:
        return None
    on = path.graph.segment_devices(seg) == str(device)
    if kind in _NAMED_KINDS:
        field_name, key = _NAMED_KINDS[kind]
        names = {name for item in finding.get("evidence", {}).get(field_name, [])
                 for name in str(item.get(key, "")).split(" → ")}
        mine = seg["kind"].isin(("cpu op", "kernel", "memcpy", "memset")).to_numpy() & seg["name"].isin(names)
        if device:
            mine &= on
    elif kind == "memcpy":
        mine = seg["kind"].eq("memcpy").to_numpy() & on
    elif kind == "launch_bound":
        mine = seg["kind"].eq("launch latency").to_numpy() & on
    elif not on.any():
        return 0.0
    else:
        host = seg["kind"].isin(("cpu op", "untraced", "wait")).to_numpy()
        mine = (seg["kind"].eq("launch latency").to_numpy() & on) | host
    return float(seg["dur_ns"].to_numpy()[np.asarray(mine)].sum() / max(path.length_ns, 1))
