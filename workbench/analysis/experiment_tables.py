"""Tables that set the runs of an experiment side by side: figures per variant, every timed sample, and
ops aligned across variants."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.analysis.breakdown import memory_peaks, op_table, phase_window
from workbench.analysis.noise import latency_noise
from workbench.analysis.steps import steps_in
from workbench.analysis.sweep import is_sweep, run_shape
from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE
from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import display_name, number, series_name


def variant_table(bundles: Sequence[Bundle], reference: str = "eager") -> pd.DataFrame:
    """One row per run: latency, throughput, speedup against the reference variant (in a sweep, against the
    reference at the same shape), compile time, peak memory and numerics.

    | variant | run | status | p50_ms | p90_ms | p99_ms | mean_ms | noise | items_per_s | tokens_per_s | speedup |
    | first_call_s | peak_bytes | sqnr_db | cosine | max_abs_error | top1 |

    `noise` says why a run's median is not to be trusted (`workbench.analysis.noise`: "p99 is 2.1× p50"), as
    `workbench ls` does; "" when it is, or with too few samples to judge.
    """
    rows = []
    shaped = is_sweep(bundles)
    keys = []  # (series, shape) of each row: in a sweep, a run's reference ran at its shape
    for bundle in bundles:
        record = bundle.record
        keys.append((series_name(record), run_shape(record) if shaped else None))
        bench = record.benchmark or {}
        numerics = record.numerics or {}
        peaks = memory_peaks(bundle.trace()) if bundle.has_trace else {}
        rows.append({
            "variant": display_name(record),
            "run": bundle.run_id,
            "status": record.status,
            "p50_ms": record.p50_ms,
            "p90_ms": bench.get("p90"),
            "p99_ms": bench.get("p99"),
            "mean_ms": bench.get("mean"),
            "noise": noise.reason if (noise := latency_noise(record.benchmark)) else "",
            "items_per_s": bench.get("items_per_s"),
            "tokens_per_s": bench.get("tokens_per_s"),
            "first_call_s": record.first_call_s,
            "peak_bytes": max(peaks.values()) if peaks else None,
            "sqnr_db": number(numerics.get("sqnr_db")),
            "cosine": numerics.get("cosine_similarity"),
            "max_abs_error": numerics.get("max_abs_error"),
            "top1": numerics.get("top1_agreement"),
        })
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    p50s = list(zip(keys, table["p50_ms"].astype(float), strict=True))
    references: dict[object, float] = {}
    for (series, shape), p50 in p50s:
        if series == reference:
            references.setdefault(shape, p50)
    reference_p50 = pd.Series([references.get(shape, np.nan) for (_, shape), _ in p50s], dtype=float)
    table["speedup"] = reference_p50 / table["p50_ms"].astype(float)
    return table


def latency_samples(bundles: Sequence[Bundle]) -> pd.DataFrame:
    """Every timed sample of every run, long form: | variant | sample_ms |."""
    frames = [
        pd.DataFrame({"variant": display_name(b.record),
                      "sample_ms": (b.record.benchmark or {}).get("samples_ms") or []})
        for b in bundles
    ]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["variant", "sample_ms"])


def op_comparison(traces: dict[str, Trace]) -> pd.DataFrame:
    """Host ops and kernels aligned by name across variants, per profiled step of the steady state.

    | name | kind | <variant> calls | <variant> ms | ... |

    Counts and times are per step inside each trace's `measure` phase (the whole trace when it has
    none), so variants profiled for different numbers of steps compare.
    """
    frames = []
    for variant, trace in traces.items():
        window = phase_window(trace, PHASE_MEASURE)
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
