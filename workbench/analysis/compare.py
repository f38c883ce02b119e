"""Comparisons across the runs of an experiment: figures per variant and ops aligned across variants."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from workbench.analysis.breakdown import memory_peaks, op_table, phase_window
from workbench.analysis.steps import first_step_ns, steps_in
from workbench.analysis.summary import display_name
from workbench.trace import Trace
from workbench.trace.bundle import Bundle

FUSED_NAME = re.compile(r"fused|triton_|Torch-Compiled Region|CompiledFxGraph", re.IGNORECASE)
ELEMENTWISE_OPS = frozenset({
    "aten::add", "aten::add_", "aten::sub", "aten::mul", "aten::mul_", "aten::div", "aten::neg", "aten::exp",
    "aten::tanh", "aten::gelu", "aten::relu", "aten::relu_", "aten::silu", "aten::sigmoid", "aten::pow",
    "aten::rsqrt", "aten::sqrt", "aten::where", "aten::clamp", "aten::copy_", "aten::to", "aten::_to_copy",
    "aten::native_dropout", "aten::masked_fill", "aten::softmax", "aten::_softmax", "aten::layer_norm",
    "aten::native_layer_norm", "aten::embedding", "aten::cat", "aten::contiguous", "aten::clone",
})
"""Host ops that a fusing compiler (inductor, XLA) folds into its generated kernels."""


def variant_table(bundles: Sequence[Bundle], reference: str = "eager") -> pd.DataFrame:
    """One row per run: latency, throughput, speedup against the reference variant, compile time,
    peak memory and numerics.

    | variant | run | status | p50_ms | p90_ms | p99_ms | mean_ms | items_per_s | tokens_per_s | speedup |
    | first_call_s | peak_bytes | sqnr_db | cosine | max_abs_error | top1 |
    """
    rows = []
    for bundle in bundles:
        info = bundle.info
        bench = info.get("benchmark") or {}
        numerics = info.get("numerics") or {}
        peaks = memory_peaks(bundle.trace()) if bundle.has_trace else {}
        rows.append({
            "variant": display_name(info.get("variant")) or bundle.run_id,
            "run": bundle.run_id,
            "status": info.get("status"),
            "p50_ms": bench.get("p50"),
            "p90_ms": bench.get("p90"),
            "p99_ms": bench.get("p99"),
            "mean_ms": bench.get("mean"),
            "items_per_s": bench.get("items_per_s"),
            "tokens_per_s": bench.get("tokens_per_s"),
            "first_call_s": info.get("first_call_s"),
            "peak_bytes": max(peaks.values()) if peaks else None,
            "sqnr_db": _number(numerics.get("sqnr_db")),
            "cosine": numerics.get("cosine_similarity"),
            "max_abs_error": numerics.get("max_abs_error"),
            "top1": numerics.get("top1_agreement"),
        })
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    ref = table.loc[table["variant"] == reference, "p50_ms"]
    ref_p50 = float(ref.iloc[0]) if len(ref) and pd.notna(ref.iloc[0]) else np.nan
    table["speedup"] = ref_p50 / table["p50_ms"].astype(float)
    return table


def latency_samples(bundles: Sequence[Bundle]) -> pd.DataFrame:
    """Every timed sample of every run, long form: | variant | sample_ms |."""
    frames = [
        pd.DataFrame({"variant": display_name(b.info.get("variant")) or b.run_id,
                      "sample_ms": (b.info.get("benchmark") or {}).get("samples_ms") or []})
        for b in bundles
    ]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["variant", "sample_ms"])


def aligned_on_first_step(trace: Trace) -> Trace:
    """The trace with its times shifted so that its first profiled step starts at 0 ns."""
    offset = first_step_ns(trace)
    events = trace.events.set_column(0, "start_ns", pc.subtract(trace.events["start_ns"], offset))
    memory = trace.memory.set_column(0, "ts_ns", pc.subtract(trace.memory["ts_ns"], offset))
    counters = trace.counters.set_column(0, "ts_ns", pc.subtract(trace.counters["ts_ns"], offset))
    return Trace(events=events, memory=memory, counters=counters,
                 metadata={**trace.metadata, "aligned_offset_ns": offset})


def op_comparison(traces: dict[str, Trace]) -> pd.DataFrame:
    """Host ops and kernels aligned by name across variants, per profiled step of the steady state.

    | name | kind | <variant> calls | <variant> ms | ... |

    Counts and times are per step inside each trace's `measure` phase (the whole trace when it has
    none), so variants profiled for different numbers of steps compare.
    """
    frames = []
    for variant, trace in traces.items():
        window = phase_window(trace, "measure")
        steps = steps_in(trace)
        for kind in ("op", "kernel"):
            table = op_table(trace, (kind,), window)
            if table.empty:
                continue
            frames.append(pd.DataFrame({
                "name": table["name"], "kind": kind, "variant": variant,
                "calls": table["calls"] / steps, "ms": table["total_ns"] / steps / 1e6,
            }))
    if not frames:
        return pd.DataFrame(columns=["name", "kind"])
    long = pd.concat(frames, ignore_index=True)
    wide = long.pivot_table(index=["name", "kind"], columns="variant", values=["calls", "ms"], aggfunc="sum")
    wide.columns = [f"{variant} {measure}" for measure, variant in wide.columns]
    ordered = [f"{v} {m}" for v in traces for m in ("calls", "ms") if f"{v} {m}" in wide.columns]
    wide = wide[ordered].fillna(0.0).reset_index()
    time_columns = [c for c in ordered if c.endswith(" ms")]
    return wide.sort_values(by=time_columns[0], ascending=False, ignore_index=True) if time_columns else wide


def _number(value: object) -> float | None:
    """run.json writes infinite SQNR as the string "inf"."""
    if isinstance(value, str):
        return float(value)
    return value  # type: ignore[return-value]
