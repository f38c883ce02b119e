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
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from workbench.analysis.breakdown import device_time_launched_ns, phase_window
from workbench.analysis.compare import ELEMENTWISE_OPS, FUSED_NAME
from workbench.analysis.idle import (
    DEVICE_WORK_KINDS,
    DeviceBusy,
    HostActivity,
    busy_by_device,
    covered_ns,
    idle_gaps,
    merge_intervals,
    names_where,
)
from workbench.analysis.roofline import roofline, run_device_spec
from workbench.errors import WorkbenchError
from workbench.hardware.device import DTYPES, DeviceSpec
from workbench.trace import Trace
from workbench.trace.bundle import Bundle

FINDING_COLUMNS = ("kind", "device", "time_share", "title", "suggestion", "evidence")
"""Columns of `findings_table`, in order."""

ELEMENTWISE_KERNEL = re.compile(r"elementwise_kernel", re.IGNORECASE)
"""Kernel names of PyTorch's generic elementwise kernels (`vectorized_elementwise_kernel`, ...)."""

XLA_CONVERT = re.compile(r"^convert(?:[._]\w*)?$|^convert_element_type", re.IGNORECASE)
"""XLA ops that change an array's dtype."""

TORCH_COMPILE = re.compile(r"^(?:_compile\.compile_inner|entire_frame_compile)(?: \(dynamo_timed\))?$")
"""Spans of one torch.compile (Dynamo) frame compilation."""

COMPILE_ID = re.compile(r"compile_id=(\d+)/(\d+)|^Torch-Compiled Region: (\d+)/(\d+)$")
"""Dynamo compile ids `frame/attempt` (attempt >= 1 is a recompilation) in annotation and region names."""

XLA_COMPILE = re.compile(r"^backend_compile(?:_and_load)?$")
"""JAX's span around one XLA compilation."""

JAX_FUNCTION = re.compile(r"^PjitFunction\((.*)\)$")
"""JAX's span around one call of a jitted function."""

OCCUPANCY_KEYS = ("sm__warps_active.avg.pct_of_peak_sustained_active", "est. achieved occupancy %")
"""Kernel args holding achieved occupancy in %: Nsight Compute's metric, then Kineto's estimate."""

MEMCPY_DIRECTIONS = (
    ("host_to_device", re.compile(r"HtoD|Host-to-Device", re.IGNORECASE)),
    ("device_to_host", re.compile(r"DtoH|Device-to-Host", re.IGNORECASE)),
    ("device_to_device", re.compile(r"DtoD|Device-to-Device", re.IGNORECASE)),
    ("peer_to_peer", re.compile(r"PtoP|Peer", re.IGNORECASE)),
)
"""Copy directions by the names Kineto (`Memcpy HtoD (Pageable -> Device)`) and Nsight
(`[CUDA memcpy Host-to-Device]`) give memcpy events."""

PAGEABLE = re.compile(r"pageable", re.IGNORECASE)
PAGEABLE_ARG = re.compile(r'"(?:src|dst)Kind"\s*:\s*"Pageable"')
"""Pageable host memory in a copy's name (Kineto) or in its source/destination kind (Nsight args)."""

_EVENT_COLUMNS = ["start_ns", "dur_ns", "name", "kind", "device", "pid", "parent", "depth", "launcher", "bytes",
                  "dtypes"]


@dataclass(frozen=True)
class Thresholds:
    """Knobs of the detectors."""

    short_kernel_ns: int = 10_000
    """Device work shorter than this is at the scale of a kernel launch (~5-10 µs)."""
    min_stretch: int = 20
    """Consecutive short device items that make a launch-bound stretch."""
    min_stretch_idle: float = 0.2
    """Idle fraction of a stretch below which the device keeps up (queue full): not launch-bound."""
    min_chain: int = 3
    """Consecutive elementwise kernels (or host ops) that make an unfused chain."""
    low_occupancy_pct: float = 25.0
    """Achieved occupancy (%) below which a kernel counts as low-occupancy."""
    min_share: float = 0.0
    """Findings with a smaller time_share are left out."""


@dataclass(frozen=True)
class Finding:
    """One bottleneck: its kind, the share of time it concerns, the evidence and what to try next."""

    kind: str
    time_share: float
    evidence: dict[str, Any]
    suggestion: str
    title: str = ""
    device: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: `{"kind", "time_share", "evidence", "suggestion", "title", "device"}`."""
        return {"kind": self.kind, "time_share": float(self.time_share), "evidence": _plain(self.evidence),
                "suggestion": self.suggestion, "title": self.title, "device": self.device}


@dataclass
class _Context:
    """What the detectors share: events (in the window), busy intervals per device, reference spans."""

    trace: Trace
    window: tuple[int, int] | None
    thresholds: Thresholds
    events: pd.DataFrame = field(init=False)
    busy: dict[str, DeviceBusy] = field(init=False)
    host: HostActivity = field(init=False)
    trace_span_ns: int = field(init=False)

    def __post_init__(self) -> None:
        events = self.trace.events.select(_EVENT_COLUMNS).to_pandas()  # name stays categorical: regexes per name
        events["row"] = np.arange(len(events))
        for column in ("kind", "device"):
            events[column] = events[column].astype(str)
        events["end_ns"] = events["start_ns"] + events["dur_ns"]
        if self.window is not None:
            events = events[(events["start_ns"] >= self.window[0]) & (events["start_ns"] < self.window[1])]
            self.trace_span_ns = max(self.window[1] - self.window[0], 1)
        else:
            self.trace_span_ns = max(int(events["end_ns"].max() - events["start_ns"].min()), 1) if len(events) else 1
        self.events = events
        self.busy = busy_by_device(self.trace, self.window)
        self.host = HostActivity(self.trace)

    def named(self, pattern: re.Pattern[str]) -> pd.Series:
        """Which events' names match `pattern` (from their start)."""
        return pd.Series(names_where(self.events["name"], lambda n: n.str.match(pattern)), index=self.events.index)

    def device_work(self, device: str) -> pd.DataFrame:
        """The device's work events, in time order."""
        work = self.events[(self.events["device"] == device) & self.events["kind"].isin(DEVICE_WORK_KINDS)]
        return work.sort_values(["start_ns", "row"], kind="stable")


def find_bottlenecks(trace: Trace, roofline: pd.DataFrame | None = None, *, window: tuple[int, int] | None = None,
                     thresholds: Thresholds = Thresholds()) -> list[Finding]:
    """Ranked findings (largest time_share first) over `trace`, inside `window` (ns) when given.

    Memory-bound findings need `roofline`, a per-op roofline DataFrame with `name`, a time column
    (`time_ns`, `device_ns`, `total_ns` or `dur_ns`) and `bound` ("compute" | "memory" | "latency"); with
    `kind` and `source` columns and rows measured by Nsight Compute, only its kernel rows count.
    """
    ctx = _Context(trace, window, thresholds)
    detectors: list[Callable[[_Context], list[Finding]]] = [
        _device_idle, _launch_bound, _memcpy, _unfused_elementwise, _low_occupancy, _dtype_casts, _recompilation,
    ]
    findings = [f for detect in detectors for f in detect(ctx)]
    if roofline is not None:
        findings += _memory_bound(roofline)
    findings = [f for f in findings if f.time_share >= thresholds.min_share]
    return sorted(findings, key=lambda f: (-f.time_share, f.kind, f.device or ""))


def findings_table(findings: list[Finding]) -> pd.DataFrame:
    """The findings as a DataFrame, in their order: | kind | device | time_share | title | suggestion | evidence |."""
    return pd.DataFrame([{c: getattr(f, c) for c in FINDING_COLUMNS} for f in findings], columns=list(FINDING_COLUMNS))


def analyze(trace: Trace, roofline: pd.DataFrame | None = None) -> dict[str, Any]:
    """What `workbench analyze --json` prints: `{"findings": [...], "roofline": [...], "idle": {...}, "window"}`.

    Covers the `measure` phase of a capture (its steady state, not compilation) and the whole trace of
    an import; `idle` is per device (`workbench.analysis.idle.idle_summary`), `roofline` the given
    DataFrame's records ([] without one).
    """
    window = phase_window(trace, "measure")
    findings = find_bottlenecks(trace, roofline, window=window)
    busy = busy_by_device(trace, window)
    return {
        "findings": [f.to_dict() for f in findings],
        "roofline": [] if roofline is None else _plain(roofline.to_dict("records")),
        "idle": {device: b.summary() for device, b in busy.items()},
        "window": None if window is None else {"phase": "measure", "start_ns": window[0], "end_ns": window[1]},
    }


def analyze_run(bundle: Bundle, device: str | None = None) -> dict[str, Any]:
    """`analyze` of a run bundle, with the roofline of its ops and kernels against its device
    (`roofline.run_device_spec`: `device` overrides what the run recorded), its kernels' work from the
    run's Nsight Compute metrics when it has them (`run_roofline`); adds "run" and "device" (the spec's
    name, None when no device figures are known: then "roofline" is empty)."""
    spec, table = run_roofline(bundle, device)
    return {"run": bundle.run_id, "device": spec.name if spec else None, **analyze(bundle.trace(), table)}


def run_roofline(bundle: Bundle, device: str | None = None) -> tuple[DeviceSpec | None, pd.DataFrame | None]:
    """The device spec of a run (`roofline.run_device_spec`) and the roofline of its work on it: XLA ops
    for an XLA trace (its host `op` events are the runtime's dispatch and buffers), else ops and kernels,
    the kernels Nsight Compute profiled with its counters (the bundle's `kernel_metrics` table); the run's
    precision is the dtype of work whose dtype the trace does not say. (None, None) when no device figures
    are known."""
    trace = bundle.trace()
    spec = run_device_spec(bundle.info, trace, device)
    if spec is None:
        return None, None
    variant = bundle.info.get("variant")
    precision = variant.get("precision") if isinstance(variant, dict) else None
    kinds = ("hlo",) if pc.any(pc.equal(trace.events["kind"], "hlo")).as_py() else ("op", "kernel")
    return spec, roofline(trace, spec, kinds=kinds, default_dtype=precision if precision in DTYPES else None,
                          kernel_metrics=bundle.table("kernel_metrics"))


# -- detectors --------------------------------------------------------------------------------------

_IDLE_ADVICE = {
    "host-bound": "The host cannot feed the device: move input preparation off the step (DataLoader workers, "
                  "pin_memory, preprocessing on the device), cut small host ops and launches (torch.compile, "
                  "CUDA graphs via torch.compile(mode='reduce-overhead')), or raise the batch size.",
    "sync": "The host waits on the device and then has nothing queued: remove synchronizations from the step "
            "(.item(), .cpu(), .tolist(), printing tensors, torch.cuda.synchronize, data-dependent shapes such "
            "as nonzero/boolean masks) or defer them to the end of the step.",
    "memcpy": "The host is busy issuing copies while the device waits: use pinned memory with "
              "non_blocking=True, copy once per step in bulk, and overlap copies with compute on a side stream.",
    "untraced": "The host did something the profiler did not record (Python, data loading, another process): "
                "profile with Python stacks (with_stack=True) or Nsight's OS-runtime trace to see what.",
}


def _device_idle(ctx: _Context) -> list[Finding]:
    gaps = idle_gaps(ctx.trace, ctx.window, ctx.busy, ctx.host)
    findings = []
    for device, busy in ctx.busy.items():
        mine = gaps[gaps["device"] == device]
        if mine.empty:
            continue
        by_cause = {"sync": int(mine["sync_ns"].sum()), "memcpy": int(mine["memcpy_ns"].sum()),
                    "host-bound": int(mine["runtime_ns"].sum() + mine["host_ns"].sum()),
                    "untraced": int(mine["untraced_ns"].sum())}
        cause = max(by_cause, key=by_cause.__getitem__)
        summary = busy.summary()
        top = [{"start_ns": int(g.start_ns), "dur_ns": int(g.dur_ns), "cause": g.cause,
                "host": ctx.host.top(int(g.start_ns), int(g.end_ns), device, top=3)}
               for g in mine.head(3).itertuples(index=False)]
        share = busy.idle_ns / max(busy.span_ns, 1)
        largest = mine.iloc[0]
        findings.append(Finding(
            kind="device_idle", device=device, time_share=_share(share),
            evidence={**summary, "device": device, "largest_gap_cause": largest["cause"], "cause_ns": by_cause,
                      "gaps_by_cause": mine["cause"].value_counts().to_dict(), "top_gaps": top},
            suggestion=_IDLE_ADVICE[cause],
            title=f"{device} idle {share:.1%} of its span; largest gap {_ms(summary['largest_gap_ns'])} at "
                  f"{_ms(summary['largest_gap_start_ns'])} ({largest['cause']}); mostly {cause}",
        ))
    return findings


def _launch_bound(ctx: _Context) -> list[Finding]:
    t = ctx.thresholds
    findings = []
    for device, busy in ctx.busy.items():
        work = ctx.device_work(device)
        start, end = work["start_ns"].to_numpy(), work["end_ns"].to_numpy()
        short = (work["dur_ns"] < t.short_kernel_ns).to_numpy()
        kernels = (work["kind"] == "kernel").to_numpy()
        edges = np.flatnonzero(np.diff(np.concatenate([[0], short.astype(np.int8), [0]])))
        stretches = []
        for a, b in zip(edges[::2], edges[1::2], strict=True):
            if b - a < t.min_stretch:
                continue
            wall = int(end[a:b].max() - start[a])
            s, e = merge_intervals(start[a:b], end[a:b])
            busy_ns = int((e - s).sum())
            if wall > 0 and 1 - busy_ns / wall >= t.min_stretch_idle:
                stretches.append({"start_ns": int(start[a]), "end_ns": int(start[a] + wall), "items": int(b - a),
                                  "busy_ns": busy_ns})
        if not stretches:
            continue
        stretch_ns = sum(s["end_ns"] - s["start_ns"] for s in stretches)
        short_kernels = work[short & kernels]
        host = ctx.host.of_device(device)
        launches = host[(host["kind"] == "runtime") & host["name"].str.contains("Launch")
                        & (host["start_ns"] >= busy.span_start_ns) & (host["start_ns"] < busy.span_end_ns)]
        share = stretch_ns / max(busy.span_ns, 1)
        findings.append(Finding(
            kind="launch_bound", device=device, time_share=_share(share),
            evidence={"device": device, "threshold_ns": t.short_kernel_ns, "kernels": int(kernels.sum()),
                      "short_kernels": len(short_kernels), "stretches": len(stretches), "stretch_ns": stretch_ns,
                      "stretch_busy_ns": sum(s["busy_ns"] for s in stretches), "span_ns": busy.span_ns,
                      "longest_stretch": max(stretches, key=lambda s: s["end_ns"] - s["start_ns"]),
                      "top_short_kernels": _top_names(short_kernels),
                      "launch_calls": len(launches),
                      "mean_launch_ns": int((launches["end_ns"] - launches["start_ns"]).mean()) if len(launches)
                      else None},
            suggestion="Many short kernels leave the device waiting on launches: capture the step in a CUDA graph "
                       "(torch.compile(mode='reduce-overhead') or torch.cuda.graphs), fuse small ops "
                       "(torch.compile, jax.jit), or give each kernel more work (larger batch).",
            title=f"{device}: {len(stretches)} launch-bound stretches of short kernels (< "
                  f"{t.short_kernel_ns / 1000:g} µs), {_ms(stretch_ns)}; {len(short_kernels)} of "
                  f"{int(kernels.sum())} kernels are short",
        ))
    return findings


def _memcpy(ctx: _Context) -> list[Finding]:
    findings = []
    for device, busy in ctx.busy.items():
        work = ctx.device_work(device)
        copies = work[work["kind"] == "memcpy"]
        if copies.empty:
            continue
        names = copies["name"]
        direction = pd.Series("other", index=copies.index)
        for label, pattern in reversed(MEMCPY_DIRECTIONS):
            direction[names.str.contains(pattern)] = label
        args = pd.Series(ctx.trace.events["args"].take(copies["row"].to_numpy()).to_pylist(), index=copies.index)
        pageable = names.str.contains(PAGEABLE) | args.fillna("").str.contains(PAGEABLE_ARG)
        s, e = merge_intervals(copies["start_ns"].to_numpy(), copies["end_ns"].to_numpy())
        kernels = work[work["kind"] != "memcpy"]
        ks, ke = merge_intervals(kernels["start_ns"].to_numpy(), kernels["end_ns"].to_numpy())
        exposed = int((e - s).sum() - covered_ns(ks, ke, s, e).sum())
        by_direction = {
            str(d): {"count": len(g), "ns": int(g["dur_ns"].sum()), "bytes": _number(g["bytes"].sum(min_count=1))}
            for d, g in copies.groupby(direction, sort=True)
        }
        busy_ns = int((e - s).sum())
        share = busy_ns / max(busy.span_ns, 1)
        main = max(by_direction, key=lambda d: by_direction[d]["ns"])
        findings.append(Finding(
            kind="memcpy", device=device, time_share=_share(share),
            evidence={"device": device, "count": len(copies), "total_ns": int(copies["dur_ns"].sum()),
                      "busy_ns": busy_ns, "exposed_ns": exposed, "span_ns": busy.span_ns,
                      "bytes": _number(copies["bytes"].sum(min_count=1)), "by_direction": by_direction,
                      "pageable": {"count": int(pageable.sum()), "ns": int(copies.loc[pageable, "dur_ns"].sum())},
                      "top": _top_names(copies)},
            suggestion=_memcpy_advice(main, bool(pageable.any())),
            title=f"{device}: copies take {share:.1%} of its span ({len(copies)} memcpy, mostly {main}; "
                  f"{_ms(exposed)} not overlapped by kernels)",
        ))
    return findings


def _memcpy_advice(direction: str, pageable: bool) -> str:
    if direction in ("host_to_device", "device_to_host"):
        advice = ("Host-device copies: keep weights and intermediate tensors on the device, move inputs once "
                  "per step in bulk, prefetch the next batch on a side stream")
        if pageable:
            advice += ", and copy from pinned memory (pin_memory=True, tensor.pin_memory()) with non_blocking=True"
        return advice + "."
    if direction == "device_to_device":
        return ("Device-to-device copies: avoid .contiguous()/.clone()/torch.cat copies and layout changes "
                "(channels_last conversions, transposes) on the hot path; let a compiler fuse them away.")
    return "Peer or other copies: check that tensors live on the device that uses them."


def _unfused_elementwise(ctx: _Context) -> list[Finding]:
    t = ctx.thresholds
    events = ctx.events
    if ctx.busy:
        findings = []
        all_names = ctx.trace.events["name"]
        for device, busy in ctx.busy.items():
            kernels = ctx.device_work(device)
            kernels = kernels[kernels["kind"] == "kernel"]
            launcher = kernels["launcher"].to_numpy()
            op = np.full(len(kernels), "", dtype=object)
            op[launcher >= 0] = all_names.take(launcher[launcher >= 0]).to_pylist()
            elementwise = (np.isin(op, list(ELEMENTWISE_OPS)) | kernels["name"].str.contains(ELEMENTWISE_KERNEL))
            elementwise &= ~kernels["name"].str.contains(FUSED_NAME).to_numpy()
            label = np.where(op != "", op, kernels["name"].str.slice(0, 80).to_numpy())
            finding = _chains(kernels, np.asarray(elementwise), label, t.min_chain, busy.span_ns, device)
            if finding:
                findings.append(finding)
        return findings
    ops = events[events["kind"] == "op"]
    parent_kind = events.set_index("row")["kind"].reindex(ops["parent"]).to_numpy()
    top = ops[parent_kind != "op"].sort_values(["pid", "start_ns"], kind="stable")  # ops nothing else called
    names = top["name"].astype(str)
    finding = _chains(top, names.isin(ELEMENTWISE_OPS).to_numpy(), names.to_numpy(), t.min_chain, ctx.trace_span_ns,
                      None)
    return [finding] if finding else []


def _chains(items: pd.DataFrame, flag: np.ndarray, label: np.ndarray, min_chain: int, span_ns: int,
            device: str | None) -> Finding | None:
    """Runs of >= `min_chain` consecutive flagged items (time order) as an `unfused_elementwise` finding."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flag.astype(np.int8), [0]])))
    runs = [(a, b) for a, b in zip(edges[::2], edges[1::2], strict=True) if b - a >= min_chain]
    if not runs:
        return None
    dur = items["dur_ns"].to_numpy()
    patterns: dict[str, list[int]] = {}
    for a, b in runs:
        key = " → ".join(dict.fromkeys(label[a:b].tolist()))  # distinct ops, in order of first use
        entry = patterns.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += int(dur[a:b].sum())
    chain_ns = sum(int(dur[a:b].sum()) for a, b in runs)
    items_in = sum(b - a for a, b in runs)
    top = sorted(patterns.items(), key=lambda kv: -kv[1][1])[:5]
    share = chain_ns / max(span_ns, 1)
    where = device or "host"
    return Finding(
        kind="unfused_elementwise", device=device, time_share=_share(share),
        evidence={"device": where, "chains": len(runs), "items": items_in, "chain_ns": chain_ns,
                  "longest_chain": max(b - a for a, b in runs), "min_chain": min_chain, "span_ns": span_ns,
                  "top_patterns": [{"ops": k, "count": v[0], "ns": v[1]} for k, v in top]},
        suggestion="Chains of elementwise ops each read and write memory: fuse them with torch.compile (inductor) "
                   "or jax.jit (XLA fusion), or use fused kernels (fused optimizers, fused LayerNorm/GELU).",
        title=f"{where}: {len(runs)} chains of unfused elementwise {'kernels' if device else 'ops'} "
              f"({items_in} in all, {_ms(chain_ns)})",
    )


def _low_occupancy(ctx: _Context) -> list[Finding]:
    t = ctx.thresholds
    kernels = ctx.events[ctx.events["kind"] == "kernel"]
    if kernels.empty:
        return []
    args = ctx.trace.events["args"].take(kernels["row"].to_numpy())
    has = pc.match_substring(args, "occupancy").to_numpy(zero_copy_only=False)
    if not has.any():
        has = pc.match_substring(args, "sm__warps_active").to_numpy(zero_copy_only=False)
    if not has.any():
        return []
    parsed = [_occupancy(a) for a in args.filter(has).to_pylist()]
    rows = kernels[has].assign(occupancy=[p[0] for p in parsed], source=[p[1] for p in parsed],
                               grid=[p[2] for p in parsed], block=[p[3] for p in parsed])
    rows = rows[rows["occupancy"].notna()]
    findings = []
    for device, busy in ctx.busy.items():
        mine = rows[rows["device"] == device]
        low = mine[mine["occupancy"] < t.low_occupancy_pct]
        if low.empty:
            continue
        low_ns = int(low["dur_ns"].sum())
        share = low_ns / max(busy.span_ns, 1)
        grouped = low.groupby("name").agg(count=("dur_ns", "size"), ns=("dur_ns", "sum"),
                                          occupancy=("occupancy", "mean"), grid=("grid", "first"),
                                          block=("block", "first"))
        top = grouped.sort_values("ns", ascending=False).head(5).reset_index()
        weighted = float(np.average(mine["occupancy"], weights=np.maximum(mine["dur_ns"], 1)))
        findings.append(Finding(
            kind="low_occupancy", device=device, time_share=_share(share),
            evidence={"device": device, "source": mine["source"].iloc[0], "threshold_pct": t.low_occupancy_pct,
                      "kernels_with_data": len(mine), "low_kernels": len(low), "low_ns": low_ns,
                      "span_ns": busy.span_ns, "time_weighted_occupancy_pct": round(weighted, 1),
                      "top": top.to_dict("records")},
            suggestion="Kernels run with few warps per SM: small grids want more work per launch (larger batch, "
                       "fusing small kernels); large ones are limited by registers or shared memory per block "
                       "(tune block sizes, e.g. torch.compile(mode='max-autotune')). Confirm with Nsight Compute.",
            title=f"{device}: {len(low)} kernels below {t.low_occupancy_pct:g}% achieved occupancy "
                  f"({_ms(low_ns)}, {share:.1%} of its span)",
        ))
    return findings


def _occupancy(args: str | None) -> tuple[float | None, str | None, Any, Any]:
    """(occupancy %, its source key, grid, block) from a kernel's args JSON."""
    try:
        values = json.loads(args or "{}")
    except ValueError:
        return None, None, None, None
    for key in OCCUPANCY_KEYS:
        value = values.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value), key, values.get("grid"), values.get("block")
    return None, None, None, None


def _dtype_casts(ctx: _Context) -> list[Finding]:
    events = ctx.events
    copies = events[events["name"] == "aten::copy_"]
    pairs = [_cast_pair(d) for d in copies["dtypes"].tolist()]
    is_cast = np.array([p is not None for p in pairs], dtype=bool)
    casts = copies[is_cast].assign(pair=[p for p in pairs if p is not None])
    converts = events[(events["kind"] == "hlo") & (events["device"] != "cpu") & ctx.named(XLA_CONVERT)]
    if casts.empty and converts.empty:
        return []
    full = ctx.trace.events.select(["dur_ns", "parent", "depth", "launcher"]).to_pandas()
    launched = device_time_launched_ns(full)[casts["row"].to_numpy()]
    cast_ns = np.where(launched > 0, launched, casts["dur_ns"].to_numpy())
    casts = casts.assign(ns=cast_ns, on_device=launched > 0)
    by_pair = (casts.groupby("pair").agg(count=("ns", "size"), ns=("ns", "sum"))
               .sort_values("ns", ascending=False).head(5).reset_index())
    total = int(cast_ns.sum()) + int(converts["dur_ns"].sum())
    share = total / ctx.trace_span_ns
    return [Finding(
        kind="dtype_cast", time_share=_share(share),
        evidence={"count": len(casts) + len(converts), "ns": total, "span_ns": ctx.trace_span_ns,
                  "device_ns": int(casts.loc[casts["on_device"], "ns"].sum()) + int(converts["dur_ns"].sum()),
                  "host_ns": int(casts.loc[~casts["on_device"], "ns"].sum()), "copies": len(casts),
                  "xla_converts": len(converts),
                  "top_pairs": [{"cast": r.pair, "count": int(r.count), "ns": int(r.ns)}
                                for r in by_pair.itertuples()]},
        suggestion="Data changes dtype on the way: cast once (inputs in the model's dtype from the data pipeline, "
                   "uint8 images converted on the device), use autocast instead of manual .to(dtype) pairs, and "
                   "keep weights in the compute dtype so no cast runs every step.",
        title=f"{len(casts) + len(converts)} dtype casts take {_ms(total)} ({share:.1%} of the trace)",
    )]


def _cast_pair(dtypes: object) -> str | None:
    """"src→dst" for an `aten::copy_(dst, src)` whose input types differ, else None."""
    if not isinstance(dtypes, str) or not dtypes:
        return None
    try:
        types = json.loads(dtypes)
    except ValueError:
        return None
    if not isinstance(types, list) or len(types) < 2:
        return None
    dst, src = types[0], types[1]
    if not dst or not src or "Scalar" in (dst, src) or dst == src:
        return None
    return f"{src}→{dst}"


def _recompilation(ctx: _Context) -> list[Finding]:
    """Recompiles: torch.compile frame compiles whose compile id (`F/N`, from the `..._data: compile_id=F/N`
    annotation inside the compile span) has N >= 1, and XLA compiles of a jitted function after its
    first; inside an explicit window (a capture's steady state) every compile counts."""
    events = ctx.events
    torch_starts, torch_ends = merge_intervals(*_bounds(events[ctx.named(TORCH_COMPILE)]))
    tagged = events[ctx.named(re.compile(r".*compile_id=|Torch-Compiled Region: "))]
    ids = tagged["name"].astype(str).str.extract(COMPILE_ID)
    regions = sorted({f"{a}/{b}" for a, b in ids[[2, 3]].dropna().itertuples(index=False)})
    id_rows = ids[0].notna().to_numpy()
    id_start = tagged["start_ns"].to_numpy()[id_rows]
    id_text = (ids.loc[id_rows, 0] + "/" + ids.loc[id_rows, 1]).to_numpy()
    compiles = []  # (start, end, compile id or None) per torch compile
    for a, b in zip(torch_starts.tolist(), torch_ends.tolist(), strict=True):
        inside = np.flatnonzero((id_start >= a) & (id_start < b))
        compiles.append((a, b, str(id_text[inside[0]]) if len(inside) else None))
    torch_again = [c for c in compiles if (c[2] is not None and not c[2].endswith("/0"))
                   or (c[2] is None and ctx.window is not None)]
    xla_spans = events[ctx.named(XLA_COMPILE)].assign(function=lambda d: _xla_functions(ctx, d))
    xla_spans = xla_spans[xla_spans["function"].notna()].sort_values("start_ns")
    per_function = xla_spans["function"].value_counts()
    xla_again = xla_spans if ctx.window is not None else xla_spans[xla_spans.duplicated("function")]
    recompiles = len(torch_again) + len(xla_again)
    if recompiles == 0:
        return []
    s, e = merge_intervals(np.array([c[0] for c in torch_again] + xla_again["start_ns"].tolist(), dtype=np.int64),
                           np.array([c[1] for c in torch_again] + xla_again["end_ns"].tolist(), dtype=np.int64))
    compile_ns = int((e - s).sum())
    share = compile_ns / ctx.trace_span_ns
    return [Finding(
        kind="recompilation", time_share=_share(share),
        evidence={"recompiles": recompiles, "compile_ns": compile_ns, "span_ns": ctx.trace_span_ns,
                  "torch_compiles": len(compiles), "torch_compile_ids": [c[2] for c in compiles if c[2]],
                  "torch_recompiles": [{"compile_id": c[2], "start_ns": c[0], "ns": c[1] - c[0]} for c in torch_again],
                  "torch_regions": regions, "xla_compiles_by_function": per_function.to_dict(),
                  "xla_recompiles": [{"function": r.function, "start_ns": int(r.start_ns), "ns": int(r.dur_ns)}
                                     for r in xla_again.itertuples()]},
        suggestion="Shapes or dtypes change between calls, so the model compiles again: mark dynamic dimensions "
                   "(torch._dynamo.mark_dynamic, torch.compile(dynamic=True)) or pad inputs to a few bucket sizes; "
                   "keep dtypes and Python scalars steady (TORCH_LOGS=recompiles says why); for JAX keep shapes "
                   "static or bucketed and pass changing Python values as arrays, not static args.",
        title=f"{recompiles} recompilations take {_ms(compile_ns)} ({share:.1%} of the trace)",
    )]


def _xla_functions(ctx: _Context, spans: pd.DataFrame) -> list[str | None]:
    """The jitted function (`PjitFunction(f)` around it) of each compile span; None when no call of a jitted
    function encloses it (then it is no XLA compile: torch.compile also has a `backend_compile` span)."""
    if spans.empty:
        return []
    parent = ctx.trace.events["parent"].to_numpy()
    name = ctx.trace.events["name"]
    names: list[str | None] = []
    for row in spans["row"].tolist():
        found = None
        up = parent[row]
        while up >= 0:
            match = JAX_FUNCTION.match(name[int(up)].as_py() or "")
            if match:
                found = match[1]
                break
            up = parent[up]
        names.append(found)
    return names


def _memory_bound(roofline: pd.DataFrame) -> list[Finding]:
    if "bound" not in roofline.columns or "name" not in roofline.columns:
        raise WorkbenchError(f"roofline table needs 'name' and 'bound' columns, it has {list(roofline.columns)}")
    time_column = next((c for c in ("time_ns", "device_ns", "total_ns", "dur_ns") if c in roofline.columns), None)
    if time_column is None:
        raise WorkbenchError(f"roofline table has no time column (time_ns, device_ns, total_ns, dur_ns): "
                             f"{list(roofline.columns)}")
    measured = _measured_by_ncu(roofline)
    kernels_only = bool(measured.any()) and "kind" in roofline.columns
    if kernels_only:
        roofline, measured = roofline[roofline["kind"] == "kernel"], measured[roofline["kind"] == "kernel"]
    time = pd.to_numeric(roofline[time_column], errors="coerce").fillna(0)
    is_memory = roofline["bound"] == "memory"
    memory = roofline[is_memory].assign(_t=time[is_memory])  # a whole Series would fill an empty frame
    total = float(time.sum())
    if memory.empty or total <= 0:
        return []
    memory_ns = float(memory["_t"].sum())
    extra = [c for c in ("arithmetic_intensity", "intensity", "bytes", "flops", "achieved_bandwidth",
                         "achieved_bytes_per_s", "fraction_of_roof", "source") if c in memory]
    top = memory.sort_values("_t", ascending=False).head(5)
    share = memory_ns / total
    return [Finding(
        kind="memory_bound", time_share=_share(share),
        evidence={"ops": len(memory), "time_ns": int(memory_ns), "total_ns": int(total), "time_column": time_column,
                  "ncu_measured": bool(measured.any()), "ncu_time_ns": int(memory.loc[measured[is_memory], "_t"].sum()),
                  "top": [{"name": r["name"], "time_ns": int(r["_t"]), **{c: r[c] for c in extra}}
                          for _, r in top.iterrows()]},
        suggestion="These ops move more bytes than they compute on: lower the precision of weights and activations "
                   "(bf16/fp16, int8 weight-only), and fuse them with their neighbours (torch.compile, XLA fusion) "
                   "so intermediates stay in registers instead of memory.",
        title=(f"{len(memory)} memory-bound kernels take {share:.1%} of the kernels' time" if kernels_only else
               f"{len(memory)} memory-bound ops take {share:.1%} of the roofline's time")
              + (" (DRAM traffic measured by Nsight Compute)" if measured.any() else ""),
    )]


def _measured_by_ncu(roofline: pd.DataFrame) -> pd.Series:
    """Which roofline rows have work Nsight Compute measured (their `source` names "ncu")."""
    if "source" not in roofline.columns:
        return pd.Series(False, index=roofline.index)
    return roofline["source"].map(lambda s: isinstance(s, str) and "ncu" in s.split("+")).astype(bool)


# -- helpers ----------------------------------------------------------------------------------------


def _top_names(rows: pd.DataFrame, top: int = 5) -> list[dict[str, Any]]:
    """The names with most time among `rows`: `[{"name", "count", "ns"}]`."""
    if rows.empty:
        return []
    grouped = rows.groupby("name")["dur_ns"].agg(["size", "sum"]).sort_values("sum", ascending=False).head(top)
    return [{"name": str(n), "count": int(r["size"]), "ns": int(r["sum"])} for n, r in grouped.iterrows()]


def _bounds(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy()


def _share(value: float) -> float:
    return float(min(max(value, 0.0), 1.0))


def _number(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _ms(ns: int | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:.3f} ms"


def _plain(value: Any) -> Any:
    """JSON-ready copy: numpy scalars to Python, NaN to None, tuples and arrays to lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
