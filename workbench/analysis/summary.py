"""The summary of one run: the figures `workbench show` prints and `show --json` returns."""

from __future__ import annotations

from typing import Any

from workbench.analysis.breakdown import kernel_time_by_device, kind_counts, memory_peaks, op_table, phase_window
from workbench.trace.bundle import Bundle

LATENCY_KEYS = ("p50", "p90", "p99", "mean", "std", "min", "max")


def run_summary(bundle: Bundle, top: int = 10) -> dict[str, Any]:
    """Key figures of a run as JSON-ready values.

    `{"run", "status", "model", "variant", "device", "events": {kind: n}, "kernel_ns": {device: ns},
    "ops": n, "memory_peak_bytes": {device: n}, "latency_ms": {...}, "throughput": {...},
    "numerics": {...}, "llm": {...} | None, "top_ops": [...], "top_kernels": [...]}`; the op tables cover the `measure`
    phase of a capture (steady state, not compilation) and the whole trace of an import.
    """
    info = bundle.info
    bench = info.get("benchmark") or {}
    summary: dict[str, Any] = {
        "run": bundle.run_id,
        "status": info.get("status"),
        "error": info.get("error"),
        "experiment": info.get("experiment"),
        "model": display_name(info.get("model")),
        "variant": display_name(info.get("variant")),
        "device": info.get("device"),
        "created": info.get("created"),
        "latency_ms": {k: bench[k] for k in LATENCY_KEYS if k in bench},
        "throughput": {k: bench[k] for k in ("items_per_s", "tokens_per_s") if bench.get(k) is not None},
        "first_call_s": info.get("first_call_s"),
        "numerics": info.get("numerics") or {},
        "llm": llm_summary(info),
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
    summary["events"] = kind_counts(trace)
    summary["ops"] = summary["events"].get("op", 0)
    summary["kernel_ns"] = kernel_time_by_device(trace)
    summary["memory_peak_bytes"] = memory_peaks(trace)
    window = phase_window(trace, "measure")  # a capture's steady state; imports have none
    summary["ops_window"] = "measure" if window else "whole trace"
    # Nsight exports carry framework ops as NVTX ranges (annotations): rank those when there are no ops.
    op_kinds = ("op",) if summary["ops"] else ("annotation",)
    summary["top_ops"] = _records(op_table(trace, op_kinds, window).head(top))
    summary["top_kernels"] = _records(op_table(trace, ("kernel",), window).head(top))
    return summary


LLM_KEYS = ("ttft_ms", "tpot_ms", "tpot_p99_ms", "tokens_per_s", "kv_cache_bytes", "kv_cache_bytes_predicted",
            "peak_memory_bytes", "attention", "kv", "decoding")
"""The figures of a generation run (`workbench generate`) that its summary carries."""


def llm_summary(info: dict[str, Any]) -> dict[str, Any] | None:
    """The headline figures of a generation run's run.json "llm" object (TTFT, TPOT, tokens/s, KV-cache
    bytes, ...; acceptance rate and speedup for speculative decoding); None for other runs."""
    llm = info.get("llm")
    if not isinstance(llm, dict):
        return None
    summary = {key: llm.get(key) for key in LLM_KEYS}
    speculative = llm.get("speculative")
    if isinstance(speculative, dict):
        summary.update(acceptance_rate=speculative.get("acceptance_rate"),
                       speedup_vs_greedy=speculative.get("speedup_vs_greedy"))
    return summary


def display_name(value: Any) -> Any:
    """The name of a model or variant (run.json holds dicts for captures, plain names or None for imports)."""
    return value.get("name") if isinstance(value, dict) else value


def _records(table) -> list[dict[str, Any]]:
    return [{k: (None if v != v else v) for k, v in row.items()} for row in table.to_dict("records")]


def run_row(run_id: str, info: dict[str, Any]) -> dict[str, Any]:
    """One run's line in listings (`workbench ls`, the server's `GET runs`): its id, what ran where,
    its status, median latency, experiment and creation time."""
    return {
        "run": run_id,
        "model": display_name(info.get("model")),
        "variant": display_name(info.get("variant")),
        "device": info.get("device"),
        "status": info.get("status"),
        "p50_ms": (info.get("benchmark") or {}).get("p50"),
        "experiment": info.get("experiment"),
        "created": info.get("created", ""),
    }
