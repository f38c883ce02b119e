"""Bottleneck finder: ranked findings over a Trace, each with its evidence and a concrete next step.

| kind                  | what it looks at (per device unless said)                     | time_share of           |
|-----------------------|---------------------------------------------------------------|-------------------------|
| `device_idle`         | idle gaps on the union of device work, with their causes      | device span             |
|                       | (`workbench.analysis.idle`: sync, memcpy, host-bound, untraced)|                         |
| `launch_bound`        | stretches of >= `min_stretch` consecutive short device items  | device span             |
|                       | (< `short_kernel_ns`) with the device idle part of the time   |                         |
| `memcpy`              | memcpy on the device, by direction, pageable sources flagged  | device span             |
| `unfused_elementwise` | runs of >= `min_chain` consecutive elementwise kernels (host  | device span (trace span |
|                       | ops on a trace without device work) that a compiler would fuse| for host ops)           |
| `low_occupancy`       | kernels below `low_occupancy_pct` achieved occupancy (Kineto's| device span             |
|                       | estimate or Nsight Compute's metric, when the trace has it)   |                         |
| `dtype_cast`          | `aten::copy_` between dtypes, XLA `convert` ops               | trace span              |
| `recompilation`       | torch.compile recompiles (compile ids `F/N`, N >= 1), XLA     | trace span              |
|                       | functions compiled more than once                             |                         |
| `memory_bound`        | roofline rows with `bound == "memory"` (only when a roofline  | the roofline's time     |
|                       | DataFrame is given); its kernel rows alone when Nsight Compute| (its kernels' time)     |
|                       | measured some (`source` "ncu…"): measured DRAM traffic, not   |                         |
|                       | the shape estimates of the ops above them                     |                         |

A device's span is its first to last work (or the window); the trace span is the window or the
wall time of all events. `time_share` is the fraction of that span the finding's events take, in
[0, 1]; findings are ranked by it. Evidence is a plain JSON-ready dict (names, counts, ns) that can
be checked against the raw trace.

The detectors live in `workbench.analysis.findings.device` (device_idle, launch_bound, memcpy,
low_occupancy) and `workbench.analysis.findings.compiler` (unfused_elementwise, dtype_cast, recompilation,
memory_bound); the `Finding` record and what they share in `workbench.analysis.findings.finding`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import pyarrow.compute as pc

from workbench.analysis.breakdown import phase_window
from workbench.analysis.critical_path import CriticalPath, finding_path_share, path_summary, typical_path
from workbench.analysis.findings.compiler import dtype_casts, memory_bound, recompilation, unfused_elementwise
from workbench.analysis.findings.device import device_idle, launch_bound, low_occupancy, memcpy
from workbench.analysis.findings.finding import Finding, FindingContext, Thresholds, json_ready
from workbench.analysis.idle import busy_by_device
from workbench.analysis.roofline import roofline, run_device_spec
from workbench.hardware.device import DTYPES, DeviceSpec
from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE
from workbench.trace.store.bundle import Bundle

FINDING_COLUMNS = ("kind", "device", "time_share", "title", "suggestion", "evidence")
"""Columns of `findings_table`, in order."""

DEFAULT_THRESHOLDS = Thresholds()
"""The detectors' knobs unless a caller gives its own."""


def find_bottlenecks(trace: Trace, roofline: pd.DataFrame | None = None, *, window: tuple[int, int] | None = None,
                     thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Finding]:
    """Ranked findings (largest time_share first) over `trace`, inside `window` (ns) when given.

    Memory-bound findings need `roofline`, a per-op roofline DataFrame with `name`, a time column
    (`time_ns`, `device_ns`, `total_ns` or `dur_ns`) and `bound` ("compute" | "memory" | "latency"); with
    `kind` and `source` columns and rows measured by Nsight Compute, only its kernel rows count.
    """
    ctx = FindingContext(trace, window, thresholds)
    detectors: list[Callable[[FindingContext], list[Finding]]] = [
        device_idle, launch_bound, memcpy, unfused_elementwise, low_occupancy, dtype_casts, recompilation,
    ]
    findings = [f for detect in detectors for f in detect(ctx)]
    if roofline is not None:
        findings += memory_bound(roofline)
    findings = [f for f in findings if f.time_share >= thresholds.min_share]
    return sorted(findings, key=lambda f: (-f.time_share, f.kind, f.device or ""))


def findings_table(findings: list[Finding]) -> pd.DataFrame:
    """The findings as a DataFrame, in their order: | kind | device | time_share | title | suggestion | evidence |."""
    return pd.DataFrame([{c: getattr(f, c) for c in FINDING_COLUMNS} for f in findings], columns=list(FINDING_COLUMNS))


def analyze(trace: Trace, roofline: pd.DataFrame | None = None, *,
            path: CriticalPath | str | None = None) -> dict[str, Any]:
    """What `workbench analyze --json` prints: `{"findings": [...], "critical_path": {...}, "roofline": [...],
    "idle": {...}, "window"}`.

    Findings carry `path_share`, their share of a typical step's critical path where their kind maps onto it
    (`workbench.analysis.critical_path.finding_path_share`; None elsewhere), and rank by it, then by time_share;
    "critical_path" is that path's `path_summary` (`{"error": ...}` for a step past its bound). Covers the `measure`
    phase of a capture (its steady state, not compilation) and the whole trace of an import; `idle` is per device
    (`workbench.analysis.idle.idle_summary`), `roofline` the given DataFrame's records ([] without one). `path` is
    the trace's `typical_path` when the caller has it already (computed here otherwise).
    """
    window = phase_window(trace, PHASE_MEASURE)
    findings = [f.to_dict() for f in find_bottlenecks(trace, roofline, window=window)]
    busy = busy_by_device(trace, window)
    if path is None:
        path = typical_path(trace)
    if isinstance(path, str):  # no path: a step past its bound, or nothing to chain
        path, summary = None, {"error": path}
    else:
        summary = path_summary(path)
    for f in findings:
        f["path_share"] = None if path is None else finding_path_share(f, path)
    if path is not None:
        findings.sort(key=lambda f: -(f["path_share"] or 0.0))  # stable: by time_share where the path says nothing
    return {
        "findings": findings,
        "critical_path": summary,
        "roofline": [] if roofline is None else json_ready(roofline.to_dict("records")),
        "idle": {device: b.summary() for device, b in busy.items()},
        "window": None if window is None else {"phase": PHASE_MEASURE, "start_ns": window[0], "end_ns": window[1]},
    }


def analyze_run(bundle: Bundle, device: str | None = None, *,
                path: CriticalPath | str | None = None) -> dict[str, Any]:
    """`analyze` of a run bundle, with the roofline of its ops and kernels against its device
    (`roofline.run_device_spec`: `device` overrides what the run recorded), its kernels' work from the
    run's Nsight Compute metrics when it has them (`run_roofline`); adds "run" and "device" (the spec's
    name, None when no device figures are known: then "roofline" is empty). `path` as for `analyze`."""
    spec, table = run_roofline(bundle, device)
    return {"run": bundle.run_id, "device": spec.name if spec else None, **analyze(bundle.trace(), table, path=path)}


def run_roofline(bundle: Bundle, device: str | None = None) -> tuple[DeviceSpec | None, pd.DataFrame | None]:
    """The device spec of a run (`roofline.run_device_spec`) and the roofline of its work on it: XLA ops
    for an XLA trace (its host `op` events are the runtime's dispatch and buffers), else ops and kernels,
    the kernels Nsight Compute profiled with its counters (the bundle's `kernel_metrics` table); the run's
    precision is the dtype of work whose dtype the trace does not say. (None, None) when no device figures
    are known."""
    trace = bundle.trace()
    spec = run_device_spec(bundle.record, trace, device)
    if spec is None:
        return None, None
    precision = bundle.record.variant_precision
    kinds = ("hlo",) if pc.any(pc.equal(trace.events["kind"], "hlo")).as_py() else ("op", "kernel")
    return spec, roofline(trace, spec, kinds=kinds, default_dtype=precision if precision in DTYPES else None,
                          kernel_metrics=bundle.table("kernel_metrics"))
