"""Per-token latency metrics of generation runs: TTFT, TPOT, inter-token latency, tokens/s.

A generation is recorded as `StepTimes`: the wall time of each step (step 0 is the prefill, which emits
the first token; each later step is a decode step, or a speculative draft-and-verify round that emits
one or more tokens) and how many tokens per sequence each step emitted. From it:

- TTFT (time to first token): the prefill step, from the start of the call until the first token is
  on the host side of a device sync.
- TPOT (time per output token) samples: each decode step's time divided by the tokens it emitted;
  summarized by median and p99 over every step of every repeat.
- ITL (inter-token latency): the gaps between consecutive tokens' arrival; a speculative round that
  emits several tokens at once gives one gap of the round's time, then zeros.
- tokens/s: batch × output tokens per sequence / end-to-end time (prefill included).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.errors import WorkbenchError
from workbench.trace import Trace

SUMMARY_PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class StepTimes:
    """The timing of one generation: `step_ns[i]` is step i's wall time (step 0: the prefill),
    `step_tokens[i]` the output tokens per sequence it emitted; `batch` sequences ran together."""

    step_ns: tuple[int, ...]
    step_tokens: tuple[int, ...]
    batch: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "step_ns", tuple(int(v) for v in self.step_ns))
        object.__setattr__(self, "step_tokens", tuple(int(v) for v in self.step_tokens))
        if not self.step_ns or len(self.step_ns) != len(self.step_tokens):
            raise WorkbenchError(f"step times: {len(self.step_ns)} durations for {len(self.step_tokens)} "
                                 "token counts (need one of each per step, at least the prefill)")
        if min(self.step_ns) < 0 or min(self.step_tokens) < 1 or self.batch < 1:
            raise WorkbenchError("step times: durations must be >= 0, tokens per step and batch >= 1")

    @classmethod
    def from_boundaries(cls, boundaries_ns: Sequence[int], step_tokens: Sequence[int], batch: int) -> StepTimes:
        """From the clock readings at the start and after each step (one more than the steps)."""
        return cls(tuple(np.diff(np.asarray(boundaries_ns, dtype=np.int64)).tolist()), tuple(step_tokens), batch)

    @property
    def total_ns(self) -> int:
        """End-to-end time of the generation."""
        return sum(self.step_ns)

    @property
    def ttft_ns(self) -> int:
        """Time to the first token (the prefill step)."""
        return self.step_ns[0]

    @property
    def output_tokens(self) -> int:
        """Output tokens per sequence."""
        return sum(self.step_tokens)

    def token_ns(self) -> np.ndarray:
        """When each output token arrived, ns from the start: every token of a step at the step's end."""
        ends = np.cumsum(np.asarray(self.step_ns, dtype=np.int64))
        return np.repeat(ends, self.step_tokens)

    def itl_ns(self) -> np.ndarray:
        """Gaps between consecutive output tokens."""
        return np.diff(self.token_ns())

    def tpot_ns(self) -> np.ndarray:
        """Time per output token of each decode step (its time / the tokens it emitted)."""
        return np.asarray(self.step_ns[1:], dtype=np.float64) / np.asarray(self.step_tokens[1:], dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: step times in ms and the tokens per step."""
        return {"step_ms": [ns / 1e6 for ns in self.step_ns], "step_tokens": list(self.step_tokens)}


def distribution_ms(samples_ns: np.ndarray) -> dict[str, float | int] | None:
    """p50 / p90 / p99 / mean / min / max of ns samples, in ms, and their count; None when empty."""
    if samples_ns.size == 0:
        return None
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    stats: dict[str, float | int] = {f"p{p}": float(v) for p, v in
                                     zip(SUMMARY_PERCENTILES, np.percentile(ms, SUMMARY_PERCENTILES), strict=True)}
    stats.update(mean=float(ms.mean()), min=float(ms.min()), max=float(ms.max()), count=int(ms.size))
    return stats


def llm_metrics(runs: Sequence[StepTimes], *, kv_cache_bytes: int | None = None,
                kv_cache_bytes_predicted: int | None = None, peak_memory_bytes: int | None = None) -> dict[str, Any]:
    """The headline figures of repeated generations of one configuration (see the module docstring):

    `ttft_ms` (median over runs) and `ttft_p99_ms`; `tpot_ms` (median over every decode step of every
    run) and `tpot_p99_ms`; `itl_ms` (the inter-token latency distribution); `tokens_per_s` (median over
    runs of batch × tokens / end-to-end time) and `decode_tokens_per_s` (after the first token);
    `e2e_ms` (median); the KV-cache bytes measured from the tensors and predicted by the formula; the
    peak memory. Figures that need decode steps are None when each run emitted one token.
    """
    if not runs:
        raise WorkbenchError("llm metrics need at least one timed generation")
    ttft = np.array([r.ttft_ns for r in runs], dtype=np.float64)
    total = np.array([r.total_ns for r in runs], dtype=np.float64)
    tokens = np.array([r.batch * r.output_tokens for r in runs], dtype=np.float64)
    decode_tokens = np.array([r.batch * (r.output_tokens - 1) for r in runs], dtype=np.float64)
    tpot = np.concatenate([r.tpot_ns() for r in runs])
    itl = np.concatenate([r.itl_ns() for r in runs])
    decode_time = total - ttft
    decode_rate = [n / (t / 1e9) for n, t in zip(decode_tokens, decode_time, strict=True) if n > 0 and t > 0]
    rate = [n / (t / 1e9) for n, t in zip(tokens, total, strict=True) if t > 0]
    return {
        "ttft_ms": float(np.median(ttft)) / 1e6,
        "ttft_p99_ms": float(np.percentile(ttft, 99)) / 1e6,
        "tpot_ms": float(np.median(tpot)) / 1e6 if tpot.size else None,
        "tpot_p99_ms": float(np.percentile(tpot, 99)) / 1e6 if tpot.size else None,
        "itl_ms": distribution_ms(itl),
        "tokens_per_s": float(np.median(rate)) if rate else None,
        "decode_tokens_per_s": float(np.median(decode_rate)) if decode_rate else None,
        "e2e_ms": float(np.median(total)) / 1e6,
        "output_tokens": runs[0].output_tokens,
        "batch": runs[0].batch,
        "runs": len(runs),
        "kv_cache_bytes": kv_cache_bytes,
        "kv_cache_bytes_predicted": kv_cache_bytes_predicted,
        "peak_memory_bytes": peak_memory_bytes,
    }


def peak_allocated_bytes(trace: Trace, device: str, window: tuple[int, int] | None = None) -> int | None:
    """The peak of bytes allocated on `device` above what was allocated when the window (default: the
    whole trace) began, from the trace's memory events: the captured code's own peak (cache and
    activations, not the weights allocated before). None without memory events there."""
    memory = trace.df("memory")
    memory = memory[memory["device"].astype(str) == device]
    if window is not None:
        memory = memory[(memory["ts_ns"] >= window[0]) & (memory["ts_ns"] < window[1])]
    if memory.empty:
        return None
    memory = memory.sort_values("ts_ns", kind="stable")
    baseline = int(memory["allocated_bytes"].iloc[0] - memory["delta_bytes"].iloc[0])
    return max(int(memory["allocated_bytes"].max()) - baseline, 0)
