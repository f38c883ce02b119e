"""Roofline analysis of a trace against a device, and projection of measured work onto another device.

Work per event (`event_work`), FLOPs and bytes each from the first source that has them, in this order
of precedence (the `source` column names it: "ncu", "trace", "xla", "shapes"):

1. ncu: a kernel joined to a launch Nsight Compute profiled (the run's `kernel_metrics` table,
   `workbench.analysis.kernel_metrics.measured_work`) takes its FLOPs from the SASS counters, as
   Nsight Compute's roofline sections count them: `fadd + fmul + 2 * ffma` for fp32 (`d…` for fp64,
   `h…` for fp16) plus the tensor pipe's work (`sm__ops_path_tensor_src_*`, else 512 ×
   `sm__inst_executed_pipe_tensor`; see `workbench.trace.formats.ncu`), and its bytes from DRAM
   (`dram__bytes_read.sum + dram__bytes_write.sum`). Without a tensor counter the FLOP count misses MMA
   work and is only a lower bound: a larger count from the sources below wins then. The kernel's dtype,
   when the trace says none, is the precision with the most FLOPs;
2. trace: FLOPs and bytes the trace recorded on the event (torch.profiler FLOPs attached by capture);
3. xla: those recorded on `hlo` events, from XLA's cost analysis (XSpace `flops` / `bytes_accessed`,
   or `workbench.analysis.hlo_cost`);
4. shapes: estimated from shapes and dtypes (`workbench.analysis.op_cost`). A kernel with no work of its
   own inherits its launching op's work (shape-derived, else recorded), given to the longest kernel that
   op call launched (a GEMM op's GEMM kernel, not its memset), so kernels get a roofline too.

`work_source` is the older, coarser provenance ("ncu", "trace" for recorded or XLA work, "shapes",
"trace+shapes", "launcher" for work inherited from the launching op).

Per (kind, name, dtype) over the steady-state window (`phase_window`, the whole trace without one)
`roofline` reports time, work, arithmetic intensity, achieved FLOP/s and bytes/s, the ceiling of the
dtype (`DeviceSpec.peak`), the ridge point and the bound:

- latency: the time is dominated by a fixed per-call overhead (op dispatch, kernel launch, sync): the
  mean call is shorter than `latency_ns` (5 µs by default, about one kernel launch; raise it for eager
  CPU ops, whose dispatch costs more). A long call with tiny work is not called latency-bound: its time
  is not overhead, and its low `fraction_of_roof` shows the inefficiency;
- compute: intensity >= ridge point (peak FLOP/s / bandwidth); memory: below it;
- unknown: no work known and calls longer than `latency_ns`.

`fraction_of_roof` is the roofline time max(FLOPs/peak, bytes/bandwidth) over the measured time of the
calls whose work is known: 1 means the ceiling was reached. The measured time of a call ncu profiled is
ncu's `gpu__time_duration.sum`, taken in the same replay as its counters, for the achieved FLOP/s and
bytes/s and for `fraction_of_roof`; `time_ns`, `mean_ns` and the latency rule keep the timeline's duration,
the time the call took in the profiled run. Memory-bound rows of small tensors can
exceed 1: the bandwidth ceiling is main memory's, and their data stays in cache. An op row's time is the device time it
launched when it launched any (GPU), else its own duration, inclusive of nested ops (CPU), so a wrapper
(aten::linear) and the op it calls (aten::addmm) appear as two rows with the same work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from workbench.analysis.breakdown import device_time_launched_ns, phase_window
from workbench.analysis.kernel_metrics import measured_work
from workbench.analysis.op_cost import event_costs
from workbench.hardware.device import DeviceSpec
from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE
from workbench.trace.store.records import RunInfo, as_run_info

LATENCY_NS = 5_000.0
"""Default mean call duration below which an op or kernel counts as latency-bound (about one kernel
launch on a GPU, a few framework dispatches on a CPU)."""

ROOFLINE_COLUMNS = ("kind", "name", "dtype", "calls", "time_ns", "mean_ns", "flops", "bytes", "intensity",
                    "achieved_flops_per_s", "achieved_bytes_per_s", "peak_dtype", "peak_flops_per_s", "ridge_point",
                    "roof_ns", "fraction_of_roof", "bound", "known_calls", "work_source", "source")
ORIGINS = ("ncu", "trace", "xla", "shapes")
"""Where FLOPs and bytes come from, in order of precedence (the module docstring)."""
PROJECTION_COLUMNS = ("projected_device", "projected_peak_dtype", "projected_ns", "projected_bound",
                      "projected_speedup")


def event_work(events: pd.DataFrame, measured: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per row of a trace's whole events table (`launcher` refers to row numbers): the work the roofline
    uses and where it came from (see the module docstring).

    | (index of events) | flops | bytes | dtype | work_source | source | measured_ns |

    `measured` is Nsight Compute's work per kernel row (`kernel_metrics.measured_work`); `measured_ns` is
    ncu's duration of the rows it covers (NaN elsewhere). `source` joins the origins of FLOPs and bytes
    with "+" in the order of `ORIGINS` (e.g. "ncu+shapes"); `work_source` is "trace", "shapes",
    "trace+shapes", "launcher", "ncu" or None.
    """
    n = len(events)
    estimate = event_costs(events)
    recorded_flops = events["flops"].to_numpy(dtype=np.float64)
    recorded_bytes = events["bytes"].to_numpy(dtype=np.float64)
    estimated_flops = estimate["flops"].to_numpy(dtype=np.float64)
    estimated_bytes = estimate["bytes"].to_numpy(dtype=np.float64)
    flops = np.where(np.isnan(recorded_flops), estimated_flops, recorded_flops)
    moved = np.where(np.isnan(recorded_bytes), estimated_bytes, recorded_bytes)
    recorded = np.where((events["kind"] == "hlo").to_numpy(), "xla", "trace").astype(object)
    origin_flops = _origin(recorded_flops, estimated_flops, recorded)
    origin_bytes = _origin(recorded_bytes, estimated_bytes, recorded)
    from_trace = ~np.isnan(recorded_flops) | ~np.isnan(recorded_bytes)
    from_shapes = (np.isnan(recorded_flops) & ~np.isnan(estimated_flops)) | \
                  (np.isnan(recorded_bytes) & ~np.isnan(estimated_bytes))
    source = np.full(n, None, dtype=object)
    source[from_trace] = "trace"
    source[from_shapes] = "shapes"
    source[from_trace & from_shapes] = "trace+shapes"
    dtype = estimate["dtype"].to_numpy(dtype=object).copy()
    work = _Work(flops, moved, dtype, source, origin_flops, origin_bytes, np.full(n, np.nan))
    _attribute_to_kernels(events, estimate, recorded, work)
    if measured is not None and len(measured):
        _take_measured(events, measured, work)
    return pd.DataFrame({"flops": work.flops, "bytes": work.moved,
                         "dtype": pd.Series(work.dtype, dtype=object, index=events.index),
                         "work_source": pd.Series(work.source, dtype=object, index=events.index),
                         "source": pd.Series(_joined_origins(work.origin_flops, work.origin_bytes), dtype=object,
                                             index=events.index),
                         "measured_ns": work.measured_ns}, index=events.index)


@dataclass
class _Work:
    """Per-event work arrays that `event_work` fills in stages (positions, not index labels)."""

    flops: np.ndarray
    moved: np.ndarray
    dtype: np.ndarray
    source: np.ndarray
    origin_flops: np.ndarray
    origin_bytes: np.ndarray
    measured_ns: np.ndarray


def _origin(recorded: np.ndarray, estimated: np.ndarray, recorded_origin: np.ndarray) -> np.ndarray:
    """Where each value came from: the recorded origin ("trace" / "xla"), "shapes", or None."""
    return np.where(~np.isnan(recorded), recorded_origin, np.where(~np.isnan(estimated), "shapes", None)).astype(object)


def _attribute_to_kernels(events: pd.DataFrame, estimate: pd.DataFrame, recorded: np.ndarray, work: _Work) -> None:
    """Give each launching op call's work to the longest device kernel it launched that has none."""
    launcher = events["launcher"].to_numpy()
    kernels = np.flatnonzero((events["kind"] == "kernel").to_numpy() & (launcher >= 0))
    if kernels.size == 0:
        return
    dtype = work.dtype
    dtype[kernels] = np.where(pd.isna(dtype[kernels]), dtype[launcher[kernels]], dtype[kernels])
    blank = kernels[np.isnan(work.flops[kernels]) & np.isnan(work.moved[kernels])]
    if blank.size == 0:
        return
    durations = pd.Series(events["dur_ns"].to_numpy()[blank], index=blank)
    longest = durations.groupby(launcher[blank]).idxmax().to_numpy()
    ops = launcher[longest]
    # the op's own shape estimate, else what the trace recorded for it (a per-name average for torch FLOPs)
    estimated_flops = estimate["flops"].to_numpy()[ops]
    estimated_bytes = estimate["bytes"].to_numpy()[ops]
    op_flops = np.where(np.isnan(estimated_flops), events["flops"].to_numpy(dtype=np.float64)[ops], estimated_flops)
    op_bytes = np.where(np.isnan(estimated_bytes), events["bytes"].to_numpy(dtype=np.float64)[ops], estimated_bytes)
    work.flops[longest], work.moved[longest] = op_flops, op_bytes
    work.origin_flops[longest] = _origin(np.where(np.isnan(estimated_flops), op_flops, np.nan), estimated_flops,
                                         recorded[ops])
    work.origin_bytes[longest] = _origin(np.where(np.isnan(estimated_bytes), op_bytes, np.nan), estimated_bytes,
                                         recorded[ops])
    known = ~np.isnan(op_flops) | ~np.isnan(op_bytes)
    work.source[longest[known]] = "launcher"


def _take_measured(events: pd.DataFrame, measured: pd.DataFrame, work: _Work) -> None:
    """Overwrite the work of the kernels Nsight Compute measured (first in precedence): its DRAM bytes; its
    FLOPs when complete, else when at least what the other sources say (a lower bound that is larger); its
    dtype where none is known; its duration."""
    positions = events.index.get_indexer(measured.index)
    keep = positions >= 0
    rows, measured = positions[keep], measured[keep]
    measured_bytes = measured["bytes"].to_numpy(dtype=np.float64)
    measured_flops = measured["flops"].to_numpy(dtype=np.float64)
    complete = measured["flops_complete"].to_numpy(dtype=bool)
    has_bytes = ~np.isnan(measured_bytes)
    current = work.flops[rows]
    has_flops = ~np.isnan(measured_flops) & (complete | np.isnan(current) | (measured_flops >= current))
    work.moved[rows[has_bytes]] = measured_bytes[has_bytes]
    work.origin_bytes[rows[has_bytes]] = "ncu"
    work.flops[rows[has_flops]] = measured_flops[has_flops]
    work.origin_flops[rows[has_flops]] = "ncu"
    work.source[rows[has_bytes | has_flops]] = "ncu"
    dtype = measured["dtype"].to_numpy(dtype=object)
    fill = pd.isna(work.dtype[rows]) & pd.notna(dtype)
    work.dtype[rows[fill]] = dtype[fill]
    work.measured_ns[rows] = measured["duration_ns"].to_numpy(dtype=np.float64)


def _joined_origins(origin_flops: np.ndarray, origin_bytes: np.ndarray) -> np.ndarray:
    """Per event, the distinct origins of its FLOPs and bytes joined by "+" in precedence order (None: neither)."""
    choices: list[str | None] = [*ORIGINS, None]
    code = {origin: i for i, origin in enumerate(choices)}
    labels = np.array([_origins([a, b]) for a in choices for b in choices], dtype=object)
    first, second = (pd.Series(o, dtype=object).map(code).fillna(len(ORIGINS)).to_numpy(dtype=np.int64)
                     for o in (origin_flops, origin_bytes))
    return labels[first * len(choices) + second]


def _origins(values: Iterable[object]) -> str | None:
    """The distinct origins among `values` (each possibly "+"-joined), in precedence order, joined by "+"."""
    found = {part for value in values if isinstance(value, str) for part in value.split("+")}
    return "+".join(o for o in ORIGINS if o in found) or None


def roofline(trace: Trace, device: DeviceSpec, *, kinds: Sequence[str] = ("op", "kernel", "hlo"),
             phase: str | None = PHASE_MEASURE, latency_ns: float = LATENCY_NS, default_dtype: str | None = None,
             peak_dtypes: Mapping[str, str] | None = None,
             kernel_metrics: pa.Table | pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (kind, name, dtype): where each op / kernel / HLO op sits on `device`'s roofline.

    | kind | name | dtype | calls | time_ns | mean_ns | flops | bytes | intensity | achieved_flops_per_s |
    | achieved_bytes_per_s | peak_dtype | peak_flops_per_s | ridge_point | roof_ns | fraction_of_roof |
    | bound | known_calls | work_source | source |

    Only events starting inside the `phase` annotation count (the whole trace when it is None or the
    trace has no such annotation). `default_dtype` is assumed where no dtype is known (HLO ops);
    `peak_dtypes` maps a dtype to the one whose peak applies, e.g. `{"fp32": "tf32"}` when TF32 matmuls
    were enabled. `kernel_metrics` is the run's Nsight Compute table (`workbench.trace.formats.ncu`): the kernels it
    profiled take their work and rate durations from it. Work and rates cover the `known_calls` whose work
    is known; intensity is FLOP/byte and NaN unless both are known. `source` names where the FLOPs and
    bytes of the calls came from. Sorted by time, longest first. See the module docstring for the sources,
    durations and bounds.
    """
    events = trace.df()
    if events.empty:
        return pd.DataFrame(columns=[*ROOFLINE_COLUMNS])
    measured = measured_work(trace, kernel_metrics) if kernel_metrics is not None else None
    work = event_work(events, measured)
    launched = device_time_launched_ns(events)
    is_op = (events["kind"] == "op").to_numpy()
    time_ns = np.where(is_op & (launched > 0), launched, events["dur_ns"].to_numpy())
    measured_ns = work["measured_ns"].to_numpy()
    rate_ns = np.where(measured_ns > 0, measured_ns, time_ns)  # NaN compares False: the timeline's
    rows = events["kind"].isin(kinds).to_numpy().copy()
    window = phase_window(trace, phase) if phase else None
    if window is not None:
        start = events["start_ns"].to_numpy()
        rows &= (start >= window[0]) & (start < window[1])
    if not rows.any():
        return pd.DataFrame(columns=[*ROOFLINE_COLUMNS])
    known = (work["flops"].notna() | work["bytes"].notna()).to_numpy()
    frame = pd.DataFrame({
        "kind": events["kind"].astype(str).to_numpy(),
        "name": events["name"].astype(str).to_numpy(),
        "dtype": work["dtype"].fillna(default_dtype).to_numpy() if default_dtype else work["dtype"].to_numpy(),
        "time_ns": time_ns,
        "work_ns": np.where(known, rate_ns, 0),
        "known": known.astype(np.int64),
        "flops": work["flops"].to_numpy(),
        "bytes": work["bytes"].to_numpy(),
        "work_source": work["work_source"].to_numpy(),
        "source": work["source"].to_numpy(),
    })[rows]
    grouped = frame.groupby(["kind", "name", "dtype"], dropna=False, sort=False)
    table = grouped.agg(calls=("time_ns", "size"), time_ns=("time_ns", "sum"), work_ns=("work_ns", "sum"),
                        known_calls=("known", "sum"))
    table["flops"] = grouped["flops"].sum(min_count=1)
    table["bytes"] = grouped["bytes"].sum(min_count=1)
    table["work_source"] = grouped["work_source"].agg(_sources)
    table["source"] = grouped["source"].agg(_origins)
    table = table.reset_index()
    table["mean_ns"] = table["time_ns"] / table["calls"]
    seconds = table["work_ns"].to_numpy(dtype=np.float64) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        table["achieved_flops_per_s"] = np.where(seconds > 0, table["flops"] / seconds, np.nan)
        table["achieved_bytes_per_s"] = np.where(seconds > 0, table["bytes"] / seconds, np.nan)
    table = pd.concat([table, roof_columns(table, device, latency_ns=latency_ns, peak_dtypes=peak_dtypes)], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        table["fraction_of_roof"] = np.where(table["work_ns"] > 0, table["roof_ns"] / table["work_ns"], np.nan)
    table = table.sort_values("time_ns", ascending=False, ignore_index=True)
    return table[[*ROOFLINE_COLUMNS]]


def roof_columns(table: pd.DataFrame, device: DeviceSpec, *, latency_ns: float = LATENCY_NS,
                 peak_dtypes: Mapping[str, str] | None = None) -> pd.DataFrame:
    """For rows with `flops`, `bytes`, `dtype` and optionally `calls`, `time_ns`: the ceilings of
    `device` and the bound.

    | intensity | peak_dtype | peak_flops_per_s | ridge_point | roof_ns | bound |

    `roof_ns` is max(flops / peak, bytes / bandwidth) in ns, an unknown FLOP or byte count counting as
    zero when the other is known (NaN when neither is).
    """
    n = len(table)
    dtypes = table["dtype"] if "dtype" in table else pd.Series([None] * n, index=table.index)
    mapped = [(peak_dtypes or {}).get(d, d) if isinstance(d, str) else None for d in dtypes]
    peaks = [device.peak(d) for d in mapped]
    peak_dtype = [p[0] for p in peaks]
    peak = np.array([p[1] for p in peaks], dtype=np.float64)
    flops = table["flops"].to_numpy(dtype=np.float64)
    moved = table["bytes"].to_numpy(dtype=np.float64)
    known = ~np.isnan(flops) | ~np.isnan(moved)
    f0, b0 = np.nan_to_num(flops), np.nan_to_num(moved)
    roof_ns = np.where(known, np.maximum(f0 / peak, b0 / device.memory_bw_bytes_per_s) * 1e9, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = flops / moved
        classify_intensity = np.where(b0 > 0, f0 / b0, np.where(f0 > 0, np.inf, 0.0))
    ridge = peak / device.memory_bw_bytes_per_s
    mean_ns = _column(table, "time_ns", np.nan) / np.maximum(_column(table, "calls", 1.0), 1)
    bound = classify_bound(known, classify_intensity, ridge, mean_ns, latency_ns)
    return pd.DataFrame({"intensity": intensity, "peak_dtype": peak_dtype, "peak_flops_per_s": peak,
                         "ridge_point": ridge, "roof_ns": roof_ns, "bound": bound}, index=table.index)


def classify_bound(known: np.ndarray, intensity: np.ndarray, ridge: np.ndarray, mean_ns: np.ndarray,
                   latency_ns: float = LATENCY_NS) -> np.ndarray:
    """"latency", "compute", "memory" or "unknown" per row (the rules of the module docstring); NaN
    times never count as short."""
    known = np.asarray(known, dtype=bool)
    with np.errstate(invalid="ignore"):
        short = np.nan_to_num(np.asarray(mean_ns, dtype=np.float64), nan=np.inf) < latency_ns
        compute = np.asarray(intensity, dtype=np.float64) >= np.asarray(ridge, dtype=np.float64)
    return np.select([short, known & compute, known], ["latency", "compute", "memory"], "unknown")


def project(table: pd.DataFrame, device: DeviceSpec, *, overhead_ns_per_call: float = 0.0,
            peak_dtypes: Mapping[str, str] | None = None) -> pd.DataFrame:
    """A projection, not a measurement: the time each row's work would take on `device`.

    `table` has `flops`, `bytes` and optionally `dtype`, `calls`, `time_ns` (a `roofline` table, or
    any op table with work). Adds:

    | projected_device | projected_peak_dtype | projected_ns | projected_bound | projected_speedup |

    projected_ns = max(flops / peak, bytes / bandwidth) + overhead_ns_per_call · calls: the roofline
    time with perfect kernels and, unless an overhead is given, no launch or dispatch cost, so small
    ops come out optimistic. projected_speedup = measured time_ns / projected_ns.
    """
    roof = roof_columns(table, device, latency_ns=0.0, peak_dtypes=peak_dtypes)
    calls = _column(table, "calls", 1.0)
    projected_ns = roof["roof_ns"].to_numpy() + overhead_ns_per_call * calls
    with np.errstate(divide="ignore", invalid="ignore"):
        speedup = _column(table, "time_ns", np.nan) / projected_ns
    out = table.copy()
    out["projected_device"] = device.name
    out["projected_peak_dtype"] = roof["peak_dtype"].to_numpy()
    out["projected_ns"] = projected_ns
    out["projected_bound"] = roof["bound"].to_numpy()
    out["projected_speedup"] = np.where(projected_ns > 0, speedup, np.nan)
    return out


def _sources(values: pd.Series) -> str | None:
    """The distinct work sources of a group, joined by "+" (None when no call's work is known)."""
    return "+".join(sorted({v for v in values if isinstance(v, str)})) or None


def _column(table: pd.DataFrame, name: str, default: float | np.ndarray) -> np.ndarray:
    """A numeric column as float64, or `default` broadcast to the table's length."""
    if name in table:
        return table[name].to_numpy(dtype=np.float64)
    return np.broadcast_to(np.asarray(default, dtype=np.float64), (len(table),)).astype(np.float64)


def run_device_spec(run: RunInfo | Mapping[str, Any], trace: Trace | None,
                    device: str | None = None) -> DeviceSpec | None:
    """The device a run's roofline is drawn against: `device` when given (a built-in name or alias,
    "cpu", or an accelerator YAML), else the run's recorded `device_properties`, else the first GPU the
    trace names that the hardware table knows; None when nothing says. `run` is the run's record (or
    its run.json object)."""
    from workbench.hardware import match_device, resolve_device_spec

    if device is not None:
        return resolve_device_spec(device)
    properties = as_run_info(run).device_properties
    if properties:
        return DeviceSpec.from_dict(properties)
    for props in (trace.metadata.get("devices") or []) if trace is not None else []:
        spec = match_device(str(props.get("name") or ""))
        if spec is not None:
            return spec
    return None
