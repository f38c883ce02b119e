"""Bottleneck detectors of what a compiler or a precision change would fix: chains of unfused elementwise
kernels, dtype casts, recompilations, and memory-bound ops of a roofline (`workbench.analysis.findings.bottlenecks`
ranks them)."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from workbench.analysis.breakdown import device_time_launched_ns
from workbench.analysis.findings.finding import Finding, FindingContext, clamp_share, ms_text
from workbench.analysis.fusion import ELEMENTWISE_OPS, FUSED_NAME
from workbench.analysis.idle import merge_intervals
from workbench.errors import WorkbenchError

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


def unfused_elementwise(ctx: FindingContext) -> list[Finding]:
    """Chains of elementwise kernels per device (of top-level host ops on a trace without device work)."""
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
        kind="unfused_elementwise", device=device, time_share=clamp_share(share),
        evidence={"device": where, "chains": len(runs), "items": items_in, "chain_ns": chain_ns,
                  "longest_chain": max(b - a for a, b in runs), "min_chain": min_chain, "span_ns": span_ns,
                  "top_patterns": [{"ops": k, "count": v[0], "ns": v[1]} for k, v in top]},
        suggestion="Chains of elementwise ops each read and write memory: fuse them with torch.compile (inductor) "
                   "or jax.jit (XLA fusion), or use fused kernels (fused optimizers, fused LayerNorm/GELU).",
        title=f"{where}: {len(runs)} chains of unfused elementwise {'kernels' if device else 'ops'} "
              f"({items_in} in all, {ms_text(chain_ns)})",
    )


def dtype_casts(ctx: FindingContext) -> list[Finding]:
    """`aten::copy_` calls between dtypes and XLA converts on a device, by cast pair."""
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
        kind="dtype_cast", time_share=clamp_share(share),
        evidence={"count": len(casts) + len(converts), "ns": total, "span_ns": ctx.trace_span_ns,
                  "device_ns": int(casts.loc[casts["on_device"], "ns"].sum()) + int(converts["dur_ns"].sum()),
                  "host_ns": int(casts.loc[~casts["on_device"], "ns"].sum()), "copies": len(casts),
                  "xla_converts": len(converts),
                  "top_pairs": [{"cast": r.pair, "count": int(r.count), "ns": int(r.ns)}
                                for r in by_pair.itertuples()]},
        suggestion="Data changes dtype on the way: cast once (inputs in the model's dtype from the data pipeline, "
                   "uint8 images converted on the device), use autocast instead of manual .to(dtype) pairs, and "
                   "keep weights in the compute dtype so no cast runs every step.",
        title=f"{len(casts) + len(converts)} dtype casts take {ms_text(total)} ({share:.1%} of the trace)",
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


def recompilation(ctx: FindingContext) -> list[Finding]:
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
        kind="recompilation", time_share=clamp_share(share),
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
        title=f"{recompiles} recompilations take {ms_text(compile_ns)} ({share:.1%} of the trace)",
    )]


def _xla_functions(ctx: FindingContext, spans: pd.DataFrame) -> list[str | None]:
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


def memory_bound(roofline: pd.DataFrame) -> list[Finding]:
    """The memory-bound rows of a roofline table (its kernel rows alone when Nsight Compute measured some)."""
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
        kind="memory_bound", time_share=clamp_share(share),
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


def _bounds(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of events, for `merge_intervals`."""
    return rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy()
