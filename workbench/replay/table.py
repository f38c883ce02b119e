"""The op replay of a run: its top op signatures rebuilt, timed in isolation under variants, beside the trace.

| name | signature | device | calls | trace_ns | self_ns | replay_eager_ns | replay_bf16_ns | replay_compile_ns |
| ratio | flops | intensity | bound | status | reason |

One row per signature among the `top` by self time (`signatures.op_signatures`), in that order. `trace_ns` is the
median time of one call in the trace (inclusive: a standalone call runs its nested ops too), `replay_*_ns` the
median of the isolated calls, `ratio` replay_eager_ns / trace_ns. `flops` is one call's (from its shapes,
`op_cost`), `intensity` FLOP/byte and `bound` its roofline position against the run's device (as
`analysis.roofline` classifies: latency, compute, memory or unknown; None without device figures). `status` is
"ok" when at least one variant was timed, else "skipped", and `reason` says why, or for an ok row what the
rebuild assumed and which variants did not apply or failed: no row is dropped.

Timing: every (signature, variant) is a contender of one interleaved benchmark (`backends.benchmark`): `warmup`
rounds, then `iterations` rounds calling every contender once each, in rotating order, so drift hits all alike;
medians. Before it, each call is made once (the compile variant compiles then, outside the timing). torch's
intra-op threads are set to the capture's (run.json), and calls run under `torch.inference_mode`, as the torch
backend's did. A CPU call is timed on the host clock, a GPU call with CUDA events (device time, as the trace's
`trace_ns` is for calls that launched device work).

The table's `attrs` hold the settings (variants, iterations, warmup, threads, device) and `floor_ns` (`FLOOR`).

What to expect: on a CPU a replayed call is usually faster than in the trace (for tiny-gpt's ops of 5 µs or more,
0.4 to 0.9 of the trace's time), since the trace's time includes the profiler's cost for every nested op it records
(inputs, shapes, memory, FLOPs), and the model calls each op with caches cold from the code around it where a
replay calls it hot. Calls near the replay's floor (views, empty) replay slower than they ran nested in C++. ORT
does not apply to a single aten op here (`ORT_NOTE`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from workbench.analysis.roofline import roof_columns, run_device_spec
from workbench.backends.benchmark import CudaEventTimer, WallClockTimer, Workload, benchmark_until_clean
from workbench.errors import WorkbenchError
from workbench.hardware.device import DeviceSpec
from workbench.replay.calls import NotRebuilt, parse_inputs, signature_text
from workbench.replay.rebuild import compiled_call, eager_call, first_line, make_tensors, notes, resolve
from workbench.replay.signatures import op_signatures
from workbench.trace import Trace
from workbench.trace.store.bundle import Bundle

VARIANTS = ("eager", "bf16", "compile")
"""The variants a replay times, in this order."""

ORT_NOTE = ("ORT: not applicable to single aten ops here (an aten call has no ONNX graph of its own; capture the "
            "model's ort variant to time it under ONNX Runtime)")

REPLAY_COLUMNS = ("name", "signature", "device", "calls", "trace_ns", "self_ns", *(f"replay_{v}_ns" for v in VARIANTS),
                  "ratio", "flops", "intensity", "bound", "status", "reason")

FLOOR = "floor"
"""The benchmark's extra contender: the cheapest op call through the replay's path (`aten::alias` of a one-element
tensor). Its median (`attrs["floor_ns"]`) is the replay's own cost per call: Python, argument parsing against
the schema and dispatch, about 1-2 µs on a CPU. A replayed time near it says little about the op; ops that take
less than it in the trace (views, empty) replay slower than they ran, nested in C++."""

Progress = Callable[[str], None]
"""Told what the replay is doing ("rebuilding aten::addmm (3/20)"), for a spinner."""


@dataclass
class _Row:
    """One signature's replay while it is made: its contenders and what to say about it."""

    status: str = "ok"
    notes: list[str] = field(default_factory=list)
    workloads: dict[str, Workload] = field(default_factory=dict)
    medians: dict[str, float] = field(default_factory=dict)


def check_variants(variants: Sequence[str]) -> tuple[str, ...]:
    """`variants` in the replay's order; a WorkbenchError naming the valid ones for an unknown or empty list."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        what = f"unknown replay variant(s) {', '.join(map(repr, unknown))}" if unknown else "no replay variant given"
        raise WorkbenchError(f"{what}; choose from {', '.join(VARIANTS)} ({ORT_NOTE})")
    return tuple(v for v in VARIANTS if v in variants)


def replay_run(bundle: Bundle, *, top: int = 20, variants: Sequence[str] = VARIANTS, iterations: int = 20,
               warmup: int = 3, progress: Progress | None = None) -> pd.DataFrame:
    """The replay table of a run (module docstring), with torch's threads as the capture set them and the
    roofline of the run's device; a WorkbenchError for a run without a trace, ops or recorded shapes."""
    if not bundle.has_trace:
        raise WorkbenchError(f"run {bundle.run_id!r} has no trace to replay")
    trace = bundle.trace()
    record = bundle.record
    capture_notes = (record.capture or {}).get("notes") or {}
    threads = capture_notes.get("torch_threads")
    return replay_trace(trace, top=top, variants=variants, iterations=iterations, warmup=warmup,
                        threads=threads if isinstance(threads, int) and threads > 0 else None,
                        device=run_device_spec(record, trace), label=f"run {bundle.run_id!r}", progress=progress)


def replay_trace(trace: Trace, *, top: int = 20, variants: Sequence[str] = VARIANTS, iterations: int = 20,
                 warmup: int = 3, threads: int | None = None, device: DeviceSpec | None = None,
                 label: str = "the trace", progress: Progress | None = None) -> pd.DataFrame:
    """The replay table of a trace's `top` signatures (module docstring). `threads` sets torch's intra-op
    threads for the replay (None keeps them); `device` is what the roofline columns are against."""
    variants = check_variants(variants)
    if top < 1 or iterations < 1 or warmup < 0:
        raise WorkbenchError(f"replay needs top >= 1, iterations >= 1 and warmup >= 0 (got {top}, {iterations}, "
                             f"{warmup})")
    signatures = op_signatures(trace)
    if signatures.empty:
        raise WorkbenchError(f"{label} has no framework ops to replay (op replay reads torch.profiler traces)")
    if signatures["inputs"].isna().all():
        raise WorkbenchError(f"{label} recorded no op inputs: capture it with shapes recorded (record_shapes=True: "
                             "the default of ProfileSettings; torch.profiler.profile(record_shapes=True) for a "
                             "trace of your own)")
    chosen = signatures.head(top).reset_index(drop=True)
    with _threads(threads), torch.inference_mode():
        rows = [_prepare(str(i), r.name, r.inputs, r.device, variants, progress, f"({i + 1}/{len(chosen)})")
                for i, r in enumerate(chosen.itertuples(index=False))]
        floor_ns = _time(rows, iterations, warmup, progress)
        used_threads = torch.get_num_threads()
    table = _table(chosen, rows, device)
    table.attrs.update({"variants": list(variants), "iterations": iterations, "warmup": warmup,
                        "threads": used_threads, "device": device.name if device is not None else None,
                        "floor_ns": floor_ns, "ort": ORT_NOTE})
    return table


@contextmanager
def _threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `threads` for the block (unchanged when None)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _prepare(tag: str, name: str, inputs: dict | None, device: str, variants: tuple[str, ...],
             progress: Progress | None, position: str) -> _Row:
    """A signature rebuilt and called once under each variant (compiling for `compile`): its contenders, or why
    there are none."""
    row = _Row()
    if progress is not None:
        progress(f"rebuilding {name} {position}")
    if inputs is None:
        return _skip(row, "no shapes recorded for this op (its calls have no Input Dims)")
    try:
        rebuilt = resolve(name, parse_inputs(inputs), device)
        row.notes.extend(notes(rebuilt))
    except NotRebuilt as reason:
        return _skip(row, str(reason))
    timer = CudaEventTimer() if device == "cuda" else WallClockTimer()
    for variant in variants:
        try:
            fn = _variant_call(rebuilt, variant, tag)
            start = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            first_ms = (time.perf_counter() - start) * 1e3
        except NotRebuilt as reason:
            row.notes.append(f"{variant} n/a: {reason}")
            continue
        except Exception as exc:  # the op's own error on these inputs, or the compiler's: said, never raised
            if variant == "eager":
                return _skip(row, f"op raised: {first_line(exc)}")
            row.notes.append(f"{variant} failed: {first_line(exc)}")
            continue
        row.workloads[variant] = Workload(fn, timer=timer, first_call_ms=first_ms)
    if not row.workloads:
        row.status = "skipped"
    return row


def _variant_call(rebuilt: Any, variant: str, tag: str) -> Callable[[], object]:
    if variant == "bf16":
        return eager_call(rebuilt, make_tensors(rebuilt, bf16=True))
    if variant == "compile":
        return compiled_call(rebuilt, make_tensors(rebuilt), tag)
    return eager_call(rebuilt, make_tensors(rebuilt))


def _skip(row: _Row, reason: str) -> _Row:
    row.status = "skipped"
    row.notes.insert(0, reason)
    row.workloads.clear()
    return row


def _time(rows: list[_Row], iterations: int, warmup: int, progress: Progress | None) -> float | None:
    """Every row's contenders timed in one interleaved benchmark, with the `FLOOR` call among them; medians in ns
    into the rows, and the floor's median returned (None when nothing ran). A contender that raises is dropped,
    said in its row, and the benchmark starts over without it."""
    contenders = {f"{i}/{variant}": workload
                  for i, row in enumerate(rows) for variant, workload in row.workloads.items()}
    if not contenders:
        return None

    def failed(name: str, exc: Exception) -> None:
        index, variant = name.split("/")
        row = rows[int(index)]
        row.notes.append(f"{variant} failed while timed: {first_line(exc)}")
        del contenders[name], row.workloads[variant]
        if not row.workloads:
            row.status = "skipped"

    if progress is not None:
        progress(f"timing {len(contenders)} calls: {warmup} warm-up and {iterations} interleaved rounds")
    stats = benchmark_until_clean(lambda: {**contenders, FLOOR: _floor_workload()}, failed, warmup=warmup,
                                  iterations=iterations)
    for name, result in stats.items():
        if name != FLOOR:
            index, variant = name.split("/")
            rows[int(index)].medians[variant] = round(result.p50 * 1e6)
    return round(stats[FLOOR].p50 * 1e6) if FLOOR in stats else None


def _floor_workload() -> Workload:
    """The cheapest op call through the replay's own path: `aten::alias` of a one-element CPU tensor."""
    tensor = torch.zeros(1)
    alias = torch.ops.aten.alias.default
    return Workload(lambda: alias(tensor))


def _table(chosen: pd.DataFrame, rows: list[_Row], device: DeviceSpec | None) -> pd.DataFrame:
    """The replay table (module docstring) from the chosen signatures and their replays."""
    table = pd.DataFrame({
        "name": chosen["name"].astype(str),
        "signature": [_signature(inputs) for inputs in chosen["inputs"]],
        "device": chosen["device"].astype(str),
        "calls": chosen["calls"].astype(np.int64),
        "trace_ns": chosen["trace_ns"].astype(np.float64),
        "self_ns": chosen["self_ns"].astype(np.int64),
    })
    for variant in VARIANTS:
        table[f"replay_{variant}_ns"] = [row.medians.get(variant, np.nan) for row in rows]
    with np.errstate(divide="ignore", invalid="ignore"):
        table["ratio"] = np.where(table["trace_ns"] > 0, table["replay_eager_ns"] / table["trace_ns"], np.nan)
    table["flops"] = chosen["flops"].astype(np.float64)
    if device is not None:
        roof = roof_columns(pd.DataFrame({"flops": chosen["flops"], "bytes": chosen["bytes"],
                                          "dtype": chosen["dtype"], "calls": chosen["calls"],
                                          "time_ns": chosen["trace_ns"] * chosen["calls"]}), device)
        table["intensity"] = roof["intensity"].to_numpy()
        table["bound"] = roof["bound"].to_numpy()
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            table["intensity"] = chosen["flops"].astype(np.float64) / chosen["bytes"].astype(np.float64)
        table["bound"] = None
    table["status"] = [row.status for row in rows]
    table["reason"] = ["; ".join(row.notes) for row in rows]
    return table[[*REPLAY_COLUMNS]]


def _signature(inputs: dict | None) -> str:
    """A signature's readable inputs ("-" when none were recorded or they do not parse)."""
    if inputs is None:
        return "-"
    try:
        return signature_text(parse_inputs(inputs))
    except NotRebuilt:
        return "-"
