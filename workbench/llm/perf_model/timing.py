"""Time of forward passes on a device by the roofline: one pass, the decode steps after a prefill, and the
batch at which decoding turns compute-bound."""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench.hardware.device import DeviceSpec
from workbench.llm.perf_model.config import LLMConfig
from workbench.llm.perf_model.cost import Cost, forward_cost


def pass_time(cost: Cost, device: DeviceSpec, dtype: str, overhead_s: float = 0.0) -> dict[str, Any]:
    """Roofline time of one pass: `{"time_s", "compute_s", "memory_s", "overhead_s", "bound", "peak_dtype"}`;
    bound is "compute" or "memory" (the larger term), "latency" when the overhead exceeds both."""
    peak_dtype, peak = device.peak(dtype)
    compute_s, memory_s = cost.flops / peak, cost.bytes / device.memory_bw_bytes_per_s
    roof = max(compute_s, memory_s)
    bound = "latency" if overhead_s > roof else "compute" if compute_s >= memory_s else "memory"
    return {"time_s": roof + overhead_s, "compute_s": compute_s, "memory_s": memory_s, "overhead_s": overhead_s,
            "bound": bound, "peak_dtype": peak_dtype}


def predicted_decode_steps(c: LLMConfig, device: DeviceSpec, batch: int, prompt: int, new: int, *,
                           overhead_s: float = 0.0) -> dict[str, Any]:
    """The `new − 1` decode steps after a prefill of `prompt` tokens (past = prompt … prompt+new−2):
    totals, per-step means, and the time of each step (an array in `"step_s"`)."""
    steps = new - 1
    if steps < 1:
        return {"steps": 0, "step_s": np.zeros(0)}
    first, second = forward_cost(c, batch, 1, prompt), forward_cost(c, batch, 1, prompt + 1)
    i = np.arange(steps, dtype=np.float64)

    def along(attribute: str) -> np.ndarray:  # costs are affine in past: exact per-step values
        start = getattr(first, attribute)
        return start + (getattr(second, attribute) - start) * i

    flops, moved, kv_read, act = along("flops"), along("bytes"), along("kv_read_bytes"), along("act_bytes")
    _, peak = device.peak(c.dtype)
    compute_s, memory_s = flops / peak, moved / device.memory_bw_bytes_per_s
    step_s = np.maximum(compute_s, memory_s) + overhead_s
    mid = pass_time(forward_cost(c, batch, 1, prompt + steps // 2), device, c.dtype, overhead_s)
    return {
        "steps": steps, "flops": float(flops.sum()), "bytes": float(moved.sum()),
        "flops_per_step": float(flops.mean()), "bytes_per_step": float(moved.mean()),
        "weight_bytes_per_step": first.weight_bytes, "kv_read_bytes_per_step": float(kv_read.mean()),
        "kv_write_bytes_per_step": first.kv_write_bytes, "act_bytes_per_step": float(act.mean()),
        "intensity": float(flops.sum() / moved.sum()), "time_s": float(step_s.sum()),
        "time_per_step_s": float(step_s.mean()), "bound": mid["bound"],
        "compute_bound_steps": int((compute_s >= memory_s).sum()), "step_s": step_s,
    }


def crossover_batch(c: LLMConfig, device: DeviceSpec, context: int, *, max_batch: int = 1 << 24) -> int | None:
    """The smallest batch whose decode step at `context` cached tokens is compute-bound (intensity at
    least the ridge point of the config's `dtype`); None when even `max_batch` is not (the KV-cache read
    grows with the batch as fast as the FLOPs: MHA attention stays near 1 FLOP per byte)."""
    ridge = device.ridge_point(c.dtype)

    def compute_bound(batch: int) -> bool:
        return forward_cost(c, batch, 1, context).intensity >= ridge

    if not compute_bound(max_batch):
        return None
    low, high = 0, 1  # invariant: low is memory-bound (or 0), high compute-bound
    while not compute_bound(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if compute_bound(mid) else (mid, high)
    return high
