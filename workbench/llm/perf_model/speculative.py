"""Speculative decoding: expected tokens per target pass and speedups (Leviathan et al., "Fast Inference
from Transformers via Speculative Decoding", ICML 2023, arXiv:2211.17192, eq. 1 and theorem 3.8)."""

from __future__ import annotations

from typing import Any

from workbench.errors import WorkbenchError
from workbench.hardware.device import DeviceSpec
from workbench.llm.perf_model.config import LLMConfig
from workbench.llm.perf_model.cost import forward_cost
from workbench.llm.perf_model.timing import pass_time


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one target pass yields with `k` drafted tokens accepted i.i.d. with probability
    `acceptance`: (1 − α^(k+1)) / (1 − α) (Leviathan et al. 2023, eq. 1); k + 1 at α = 1."""
    _check_speculative(acceptance, k, 0.0)
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def speculative_speedup(acceptance: float, k: int, draft_cost: float) -> float:
    """Expected wall-time improvement of speculative decoding: expected tokens per target pass over
    (1 + k·c), c = one draft step's time over one target step's (Leviathan et al. 2023, theorem 3.8).
    Assumes verifying k+1 tokens costs one target step (true while decode is memory-bound)."""
    _check_speculative(acceptance, k, draft_cost)
    return expected_tokens(acceptance, k) / (1.0 + k * draft_cost)


def _check_speculative(acceptance: float, k: int, draft_cost: float) -> None:
    if not 0.0 <= acceptance <= 1.0:
        raise WorkbenchError(f"acceptance rate must be in [0, 1], got {acceptance}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise WorkbenchError(f"speculative k (drafted tokens) must be an integer >= 0, got {k!r}")
    if draft_cost < 0:
        raise WorkbenchError(f"draft cost must be >= 0 (draft step time / target step time), got {draft_cost}")


def speculative_projection(c: LLMConfig, device: DeviceSpec, *, batch: int, context: int, k: int,
                           acceptance: float, draft_cost: float, overhead_s: float = 0.0,
                           max_k: int = 16) -> dict[str, Any]:
    """Speculative decoding at `context` cached tokens: the paper's speedup, and a roofline one whose
    verify pass is this model's cost of k+1 tokens (it grows once verifying turns compute-bound):
    E / (k·c + T_verify / T_step). `best_k` maximises the paper's formula over 1..max_k."""
    step = pass_time(forward_cost(c, batch, 1, context), device, c.dtype, overhead_s)["time_s"]
    verify = pass_time(forward_cost(c, batch, k + 1, context), device, c.dtype, overhead_s)["time_s"]
    tokens = expected_tokens(acceptance, k)
    best = max(range(1, max_k + 1), key=lambda j: speculative_speedup(acceptance, j, draft_cost))
    return {"k": k, "acceptance": acceptance, "draft_cost": draft_cost, "context": context,
            "expected_tokens": tokens, "speedup": speculative_speedup(acceptance, k, draft_cost),
            "verify_over_step": verify / step, "speedup_roofline": tokens / (k * draft_cost + verify / step),
            "best_k": best, "best_k_speedup": speculative_speedup(acceptance, best, draft_cost)}
