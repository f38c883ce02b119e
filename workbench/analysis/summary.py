"""The summary of one run: the figures `workbench show` prints and `show --json` returns."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from workbench.analysis.breakdown import kernel_time_by_device, kind_counts, memory_peaks, op_table, phase_window
from workbench.analysis.noise import latency_noise
from workbench.serving.graphs import graph_kernels_summary
from workbench.serving.steps import steps_summary
from workbench.serving.summary import serving_summary
from workbench.trace.schema import PHASE_MEASURE
from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import RunInfo, as_run_info, display_name

LATENCY_KEYS = ("p50", "p90", "p99", "mean", "std", "min", "max")

RANDOM_WEIGHTS_NOTE = ("random weights: SQNR and top-1 compare each variant with the reference, not a trained "
                       "model's accuracy")
"""What numerics on seeded random weights (built-ins, hf-config:, uncached vision weights) mean."""


def model_label(name: str | None, weights: str | None) -> str | None:
    """A model's name with its weights, e.g. "hf-config:gpt2 (random weights)"; the bare name when the weights
    were not recorded (None for an import, which names no model)."""
    return f"{name} ({weights} weights)" if name and weights else name


def run_summary(bundle: Bundle, top: int = 10, *, all_ops: bool = False) -> dict[str, Any]:
    """Key figures of a run as JSON-ready values.

    `{"run", "status", "model", "weights": "real" | "trained" | "random" | None, "training": a trained built-in's
    description | None, "variant", "device", "events": {kind: n},
    "kernel_ns": {device: ns},
    "noise": why the latency samples are noisy (None when they are not),
    "ops": n, "memory_peak_bytes": {device: n}, "latency_ms": {...}, "throughput": {...},
    "numerics": {...}, "llm": {...} | None, "steps": {...} | None (a serving engine's steps,
    `workbench.serving.steps.steps_summary`), "serving": {...} | None (a serving run's or an imported generator
    result's load, latencies, time split and findings: `workbench.serving.summary`), "graph_kernels": {...} | None
    (graph-replayed kernels by capture-time op, `workbench.serving.graphs`), "warnings": [...], "top_ops": [...],
    "top_kernels": [...]}`; the op tables (`op_table` rows: `calls` an int, `device_ns` a kernel's own time and
    an op's kernels' time) cover the `measure` phase of a capture (steady state, not compilation) and the whole
    trace of an import; `warnings` are the trace reader's (`reader_warnings`). Top ops leave out profiler wrappers
    (`ProfilerStep#N`, `## ... ##` markers: `breakdown.WRAPPER_PATTERN`) unless `all_ops`."""
    record = bundle.record
    bench = record.benchmark or {}
    summary: dict[str, Any] = {
        "run": bundle.run_id,
        "status": record.status,
        "error": record.error,
        "experiment": record.experiment,
        "model": record.model_name,
        "weights": record.model_weights,
        "training": record.model_training,
        "variant": record.variant_name,
        "device": record.device,
        "created": record.created,
        "latency_ms": {k: bench[k] for k in LATENCY_KEYS if k in bench},
        "noise": noise_reason(bench),
        "throughput": {k: bench[k] for k in ("items_per_s", "tokens_per_s") if bench.get(k) is not None},
        "first_call_s": record.first_call_s,
        "numerics": record.numerics or {},
        "llm": llm_summary(record),
        "steps": None,
        "serving": None,
        "graph_kernels": None,
        "warnings": reader_warnings(record),
        "events": {},
        "kernel_ns": {},
        "ops": 0,
        "memory_peak_bytes": {},
        "ops_window": None,
        "top_ops": [],
        "top_kernels": [],
    }
    if not bundle.has_trace:
        return summary
    trace = bundle.trace()
    steps = bundle.table("steps")
    summary["steps"] = steps_summary(steps)
    summary["serving"] = serving_summary(record.serving, bundle.table("requests"), steps, trace.counters)
    summary["graph_kernels"] = graph_kernels_summary(bundle.table("graph_kernels"))
    summary["events"] = kind_counts(trace)
    summary["ops"] = summary["events"].get("op", 0)
    summary["kernel_ns"] = kernel_time_by_device(trace)
    summary["memory_peak_bytes"] = memory_peaks(trace)
    window = phase_window(trace, PHASE_MEASURE)  # a capture's steady state; imports have none
    summary["ops_window"] = PHASE_MEASURE if window else "whole trace"
    # Nsight exports carry framework ops as NVTX ranges (annotations): rank those when there are no ops.
    op_kinds = ("op",) if summary["ops"] else ("annotation",)
    summary["top_ops"] = _records(op_table(trace, op_kinds, window, wrappers=all_ops).head(top))
    summary["top_kernels"] = _records(op_table(trace, ("kernel",), window).head(top))
    return summary


def reader_warnings(run: RunInfo | Mapping[str, Any]) -> list[str]:
    """What the trace reader found doubtful about the run's trace as a whole (run.json
    `trace.reader.warnings`: an empty trace, malformed device properties...)."""
    reader = (as_run_info(run).trace or {}).get("reader") or {}
    return [str(w) for w in reader.get("warnings") or ()]


LLM_KEYS = ("ttft_ms", "tpot_ms", "tpot_p99_ms", "tokens_per_s", "kv_cache_bytes", "kv_cache_bytes_predicted",
            "peak_memory_bytes", "attention", "kv", "decoding")
"""The figures of a generation run (`workbench generate`) that its summary carries."""


def llm_summary(record: RunInfo) -> dict[str, Any] | None:
    """The headline figures of a generation run's run.json "llm" object (TTFT, TPOT, tokens/s, KV-cache
    bytes, ...; acceptance rate and speedup for speculative decoding); None for other runs."""
    llm = record.llm
    if llm is None:
        return None
    summary = {key: llm.get(key) for key in LLM_KEYS}
    speculative = llm.get("speculative")
    if isinstance(speculative, dict):
        summary.update(acceptance_rate=speculative.get("acceptance_rate"),
                       speedup_vs_greedy=speculative.get("speedup_vs_greedy"))
    return summary


def _records(table) -> list[dict[str, Any]]:
    return [{k: (None if v != v else v) for k, v in row.items()} for row in table.to_dict("records")]


def run_row(run_id: str, info: RunInfo | Mapping[str, Any]) -> dict[str, Any]:
    """One run's line in listings (`workbench ls`, the server's `GET runs`): its id, what ran where,
    its status, median latency, experiment and creation time; its batch and sequence length, its display name
    (`name`: a sweep's label "eager-b4", the variant, an import's file less its suffix), the file an import came
    from (`file`, its name only) and why its latency samples are noisy (`noise`, `workbench.analysis.noise`; None
    when they are not, or cannot be judged)."""
    record = as_run_info(info)
    return {
        "run": run_id,
        "model": record.model_name,
        "variant": record.variant_name,
        "device": record.device,
        "status": record.status,
        "p50_ms": record.p50_ms,
        "experiment": record.experiment,
        "created": record.created or "",
        "batch": record.batch,
        "seq": record.seq,
        "name": display_name(record),
        "file": PurePath(record.imported_from).name if record.imported_from else None,
        "noise": noise_reason(record.benchmark),
    }


def noise_reason(benchmark: Mapping[str, Any] | None) -> str | None:
    """Why a run's latency samples are noisy (`workbench.analysis.noise`); None when they are not or cannot be
    judged."""
    noise = latency_noise(benchmark)
    return noise.reason if noise is not None and noise.noisy else None
