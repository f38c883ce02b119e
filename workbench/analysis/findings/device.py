"""Bottleneck detectors that look at each device's work: idle time and its causes, launch-bound stretches of
short kernels, memory copies, and low achieved occupancy (`workbench.analysis.findings.bottlenecks` ranks them)."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from workbench.analysis.findings.finding import Finding, FindingContext, clamp_share, ms_text, number_or_none, top_names
from workbench.analysis.idle import covered_ns, idle_gaps, merge_intervals

OCCUPANCY_KEYS = ("sm__warps_active.avg.pct_of_peak_sustained_active", "est. achieved occupancy %")
"""Kernel args holding achieved occupancy in %: Nsight Compute's metric, then Kineto's estimate."""

MEMCPY_DIRECTIONS = (
    ("host_to_device", re.compile(r"HtoD|H2D|Host-to-Device", re.IGNORECASE)),
    ("device_to_host", re.compile(r"DtoH|D2H|Device-to-Host", re.IGNORECASE)),
    ("device_to_device", re.compile(r"DtoD|D2D|Device-to-Device", re.IGNORECASE)),
    ("peer_to_peer", re.compile(r"PtoP|P2P|Peer", re.IGNORECASE)),
)
"""Copy directions by the names Kineto (`Memcpy HtoD (Pageable -> Device)`), Nsight
(`[CUDA memcpy Host-to-Device]`) and XSpace stream lines (`MemcpyH2D`) give memcpy events."""

PAGEABLE = re.compile(r"pageable", re.IGNORECASE)
PAGEABLE_ARG = re.compile(r'"(?:src|dst)Kind"\s*:\s*"Pageable"')
"""Pageable host memory in a copy's name (Kineto) or in its source/destination kind (Nsight args)."""

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


def device_idle(ctx: FindingContext) -> list[Finding]:
    """Per device: its idle share of its span, the gaps by cause and advice for the main cause."""
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
            kind="device_idle", device=device, time_share=clamp_share(share),
            evidence={**summary, "device": device, "largest_gap_cause": largest["cause"], "cause_ns": by_cause,
                      "gaps_by_cause": mine["cause"].value_counts().to_dict(), "top_gaps": top},
            suggestion=_IDLE_ADVICE[cause],
            title=f"{device} idle {share:.1%} of its span; largest gap {ms_text(summary['largest_gap_ns'])} at "
                  f"{ms_text(summary['largest_gap_start_ns'])} ({largest['cause']}); mostly {cause}",
        ))
    return findings


def launch_bound(ctx: FindingContext) -> list[Finding]:
    """Per device: stretches of many short items with the device idle part of the time (launch overhead)."""
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
            kind="launch_bound", device=device, time_share=clamp_share(share),
            evidence={"device": device, "threshold_ns": t.short_kernel_ns, "kernels": int(kernels.sum()),
                      "short_kernels": len(short_kernels), "stretches": len(stretches), "stretch_ns": stretch_ns,
                      "stretch_busy_ns": sum(s["busy_ns"] for s in stretches), "span_ns": busy.span_ns,
                      "longest_stretch": max(stretches, key=lambda s: s["end_ns"] - s["start_ns"]),
                      "top_short_kernels": top_names(short_kernels),
                      "launch_calls": len(launches),
                      "mean_launch_ns": int((launches["end_ns"] - launches["start_ns"]).mean()) if len(launches)
                      else None},
            suggestion="Many short kernels leave the device waiting on launches: capture the step in a CUDA graph "
                       "(torch.compile(mode='reduce-overhead') or torch.cuda.graphs), fuse small ops "
                       "(torch.compile, jax.jit), or give each kernel more work (larger batch).",
            title=f"{device}: {len(stretches)} launch-bound stretches of short kernels (< "
                  f"{t.short_kernel_ns / 1000:g} µs), {ms_text(stretch_ns)}; {len(short_kernels)} of "
                  f"{int(kernels.sum())} kernels are short",
        ))
    return findings


def memcpy(ctx: FindingContext) -> list[Finding]:
    """Per device: its copies by direction, pageable ones and the time no kernel overlaps."""
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
            str(d): {"count": len(g), "ns": int(g["dur_ns"].sum()),
                     "bytes": number_or_none(g["bytes"].sum(min_count=1))}
            for d, g in copies.groupby(direction, sort=True)
        }
        busy_ns = int((e - s).sum())
        share = busy_ns / max(busy.span_ns, 1)
        main = max(by_direction, key=lambda d: by_direction[d]["ns"])
        findings.append(Finding(
            kind="memcpy", device=device, time_share=clamp_share(share),
            evidence={"device": device, "count": len(copies), "total_ns": int(copies["dur_ns"].sum()),
                      "busy_ns": busy_ns, "exposed_ns": exposed, "span_ns": busy.span_ns,
                      "bytes": number_or_none(copies["bytes"].sum(min_count=1)), "by_direction": by_direction,
                      "pageable": {"count": int(pageable.sum()), "ns": int(copies.loc[pageable, "dur_ns"].sum())},
                      "top": top_names(copies)},
            suggestion=_memcpy_advice(main, bool(pageable.any())),
            title=f"{device}: copies take {share:.1%} of its span ({len(copies)} memcpy, mostly {main}; "
                  f"{ms_text(exposed)} not overlapped by kernels)",
        ))
    return findings


def _memcpy_advice(direction: str, pageable: bool) -> str:
    """The next step for copies mostly in `direction`."""
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


def low_occupancy(ctx: FindingContext) -> list[Finding]:
    """Per device: kernels below the occupancy threshold, where the trace records achieved occupancy."""
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
            kind="low_occupancy", device=device, time_share=clamp_share(share),
            evidence={"device": device, "source": mine["source"].iloc[0], "threshold_pct": t.low_occupancy_pct,
                      "kernels_with_data": len(mine), "low_kernels": len(low), "low_ns": low_ns,
                      "span_ns": busy.span_ns, "time_weighted_occupancy_pct": round(weighted, 1),
                      "top": top.to_dict("records")},
            suggestion="Kernels run with few warps per SM: small grids want more work per launch (larger batch, "
                       "fusing small kernels); large ones are limited by registers or shared memory per block "
                       "(tune block sizes, e.g. torch.compile(mode='max-autotune')). Confirm with Nsight Compute.",
            title=f"{device}: {len(low)} kernels below {t.low_occupancy_pct:g}% achieved occupancy "
                  f"({ms_text(low_ns)}, {share:.1%} of its span)",
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
