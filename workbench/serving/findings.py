"""What a serving run's requests and steps say about why requests were slow, as `Finding`s with their evidence:

- **queueing**: the slowest requests' time to first token is mostly waiting before the step that computed their
  prompt ("p99 TTFT is queueing: 71% of it before the first prefill step");
- **delivery**: it is mostly after that step ended, before the token reached the client (the API server's
  detokenizing and streaming lag the engine);
- **prefill interference**: decode steps that share a batch with a prefill take longer than decode-only steps
  ("decode steps that share a batch with a prefill are 3.2× slower"), and how much of the requests' decode
  time was spent stalled behind other requests' prefills;
- **preemption**: the engine preempted requests (its KV cache ran out), from its sampled metrics;
- **failures**: requests that failed, by error.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from workbench.analysis.findings.finding import Finding
from workbench.trace.columns import floats

SLOW_QUANTILE = 0.99
"""The slowest requests by TTFT, whose queueing share is reported."""
MIN_QUEUE_SHARE = 0.5
"""Queueing is a finding when at least this share of the slow requests' TTFT is spent queued."""
MIN_SLOWDOWN = 1.25
"""Mixed steps are a finding when their median is at least this many times the decode-only median."""
MIN_STEPS = 3
"""Steps of each kind needed to compare their medians."""


def serving_findings(requests: pa.Table | None, steps: pa.Table | None,
                     counters: pa.Table | None = None) -> list[Finding]:
    """The findings of one serving run, the largest share first."""
    found = [f for f in (_queueing(requests, steps), _delivery(requests), _interference(requests, steps),
                         _preemption(counters), _failures(requests)) if f is not None]
    return sorted(found, key=lambda f: -f.time_share)


def _slow_share(requests: pa.Table | None, part: str) -> tuple[float, dict[str, Any]] | None:
    """The share of the slowest requests' TTFT (SLOW_QUANTILE and up) spent in `part` (a join column), with the
    evidence; None without joined requests."""
    if requests is None or part not in requests.column_names:
        return None
    ttft, spent = floats(requests["ttft_ns"]), floats(requests[part])
    known = ~np.isnan(ttft) & ~np.isnan(spent)
    if not known.any():
        return None
    cut = float(np.quantile(ttft[known], SLOW_QUANTILE))
    slow = known & (ttft >= cut)
    share = float(spent[slow].sum() / ttft[slow].sum()) if ttft[slow].sum() > 0 else 0.0
    label = f"p{round(SLOW_QUANTILE * 100)}"
    return share, {"slow_requests": int(slow.sum()), f"{label}_ttft_ms": cut / 1e6,
                   f"{part.removesuffix('_ns')}_ms": float(np.median(spent[slow]) / 1e6), "share": share}


def _queueing(requests: pa.Table | None, steps: pa.Table | None) -> Finding | None:
    found = _slow_share(requests, "queued_ns")
    if found is None or found[0] < MIN_QUEUE_SHARE:
        return None
    share, evidence = found
    busy = _engine_busy_share(requests, steps)
    evidence["engine_busy_share"] = busy
    label = f"p{round(SLOW_QUANTILE * 100)}"
    if busy < MIN_QUEUE_SHARE:  # the engine was mostly idle while they waited: they had not reached it
        return Finding(
            kind="serving-queueing", time_share=share,
            title=f"{label} TTFT is queueing before the engine: {share:.0%} of it before the first prefill step, "
                  f"while the engine ran steps only {busy:.0%} of that time",
            evidence=evidence,
            suggestion="requests waited in the API server (HTTP, tokenizing), not for a batch slot: give the API "
                       "process more CPU (--api-server-count, its own cores) or shorter prompts to tokenize")
    return Finding(
        kind="serving-queueing", time_share=share,
        title=f"{label} TTFT is queueing: {share:.0%} of it before the first prefill step",
        evidence=evidence,
        suggestion="requests wait for a batch slot: raise --max-num-seqs or the KV-cache size, lower the request "
                   "rate, or add replicas; check vllm:num_requests_waiting in the counter tracks")


def _engine_busy_share(requests: pa.Table, steps: pa.Table | None) -> float:
    """The share of the slowest requests' queued time during which the engine was running a step."""
    if steps is None or not steps.num_rows:
        return 1.0
    order = np.argsort(steps["start_ns"].to_numpy(), kind="stable")
    start = steps["start_ns"].to_numpy()[order].astype(np.float64)
    stop = start + steps["dur_ns"].to_numpy()[order]
    ttft, queued, arrival = (floats(requests[c]) for c in ("ttft_ns", "queued_ns", "arrival_ns"))
    known = ~np.isnan(ttft) & ~np.isnan(queued)
    slow = np.flatnonzero(known & (ttft >= np.quantile(ttft[known], SLOW_QUANTILE)))
    waited = busy = 0.0
    for r in slow:
        begin, end = arrival[r], arrival[r] + queued[r]
        near = slice(np.searchsorted(stop, begin), np.searchsorted(start, end))
        busy += float(np.clip(np.minimum(stop[near], end) - np.maximum(start[near], begin), 0, None).sum())
        waited += queued[r]
    return busy / waited if waited > 0 else 1.0


def _delivery(requests: pa.Table | None) -> Finding | None:
    found = _slow_share(requests, "delivery_ns")
    if found is None or found[0] < MIN_QUEUE_SHARE:
        return None
    share, evidence = found
    return Finding(
        kind="serving-delivery", time_share=share,
        title=f"p{round(SLOW_QUANTILE * 100)} TTFT is delivery: {share:.0%} of it after the prefill step ended, "
              "before the token reached the client",
        evidence=evidence,
        suggestion="the engine computed the token long before the client saw it: the API server is starved "
                   "(detokenizing, streaming; on a CPU it shares cores with the engine) or the network is slow: "
                   "give the API process its own cores (--api-server-count, taskset) or stream in larger chunks")


def _interference(requests: pa.Table | None, steps: pa.Table | None) -> Finding | None:
    if steps is None or not steps.num_rows:
        return None
    mode = np.asarray(steps["mode"].to_pylist(), dtype=object)
    dur = steps["dur_ns"].to_numpy().astype(np.float64)
    mixed, decode = dur[mode == "mixed"], dur[mode == "decode"]
    if len(mixed) < MIN_STEPS or len(decode) < MIN_STEPS:
        return None
    ratio = float(np.median(mixed) / np.median(decode))
    if ratio < MIN_SLOWDOWN:
        return None
    evidence: dict[str, Any] = {"mixed_steps": len(mixed), "decode_steps": len(decode),
                                "mixed_median_ms": float(np.median(mixed) / 1e6),
                                "decode_median_ms": float(np.median(decode) / 1e6), "slowdown": ratio}
    share = float(mixed.sum() / dur.sum())
    if requests is not None and "stalled_ns" in requests.column_names:
        stalled, decoding = floats(requests["stalled_ns"]), floats(requests["decode_ns"])
        known = ~np.isnan(stalled) & ~np.isnan(decoding)
        if known.any() and decoding[known].sum() > 0:
            share = float(stalled[known].sum() / decoding[known].sum())
            evidence["stalled_share_of_decode"] = share
    return Finding(
        kind="serving-prefill-interference", time_share=share,
        title=f"decode steps that share a batch with a prefill are {ratio:.1f}× slower",
        evidence=evidence,
        suggestion="a long prefill stretches the decodes batched with it: lower --max-num-batched-tokens (smaller "
                   "prefill chunks), or separate prefill and decode (disaggregated serving)")


def _preemption(counters: pa.Table | None) -> Finding | None:
    if counters is None or not counters.num_rows:
        return None
    names = np.asarray(counters["name"].to_pylist(), dtype=object)
    values = counters["value"].to_numpy()[names == "vllm:num_preemptions_total"]
    if len(values) < 2 or values[-1] <= values[0]:
        return None
    count = int(values[-1] - values[0])
    return Finding(kind="serving-preemption", time_share=1.0, title=f"the engine preempted requests {count} times",
                   evidence={"preemptions": count},
                   suggestion="the KV cache ran out: give it more memory (VLLM_CPU_KVCACHE_SPACE, "
                              "--gpu-memory-utilization), lower --max-num-seqs, or shorten contexts")


def _failures(requests: pa.Table | None) -> Finding | None:
    if requests is None or not requests.num_rows:
        return None
    status = np.asarray(requests["status"].to_pylist(), dtype=object)
    failed = status != "ok"
    if not failed.any():
        return None
    errors: dict[str, int] = {}
    for message in np.asarray(requests["error"].to_pylist(), dtype=object)[failed]:
        errors[str(message)[:200]] = errors.get(str(message)[:200], 0) + 1
    share = float(failed.mean())
    return Finding(kind="serving-failures", time_share=share,
                   title=f"{int(failed.sum())} of {len(status)} requests failed",
                   evidence={"failed": int(failed.sum()),
                             "errors": dict(sorted(errors.items(), key=lambda e: -e[1])[:5])},
                   suggestion="see the errors: timeouts mean the server is overloaded at this load; 4xx mean the "
                              "requests do not fit the model (context length, model name)")
