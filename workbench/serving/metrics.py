"""Serving metrics of a `requests` table (`serving/requests.py`), and of a sweep of loads.

A load test is judged by what each user sees and what the server delivers in all: per request the time to the
first token (TTFT), the time per output token after it (TPOT: (end - first token) / (output tokens - 1)), the
gaps between consecutive output chunks (ITL) and the end-to-end latency (e2e); in all the requests and output
tokens per second. A service-level objective (SLO) bounds some of those per request; goodput counts only the
requests that meet every bound. Figures are computed here from the per-request rows, by one rule for every
load generator, rather than taken from each generator's own summary.

Rules, so that a figure can be checked by hand:

- duration runs from the first arrival to the last end (failed requests included); throughputs count the ok
  requests and their output tokens over it;
- latency percentiles are over ok requests, numpy's linear interpolation between closest ranks; ITL pools
  every ok request's gaps (diffs of `token_ns`);
- a request meets an SLO when it is ok and: TTFT, TPOT and e2e are within their bounds (a TPOT bound is met
  by a request of fewer than two tokens, a TTFT bound is not met without a first token), and its largest
  chunk gap is within the ITL bound (met with fewer than two chunks, not met where the chunk times are unknown
  but there are two tokens or more, as in GuideLLM's results); `goodput_fraction` is over all requests.

A sweep (`sweep_summary`) runs the same load test at rising loads. Its knee is where latency stops being
cheap: with the points sorted by load, the segment from point i-1 to point i has elasticity
(ΔL / L[i-1]) / (ΔX / X[i-1]), the relative growth of the p90 latency L (TTFT, else e2e where a point lacks
TTFT) over the relative growth of request throughput X; a segment that adds latency but no throughput has
infinite elasticity. The knee is the last point before the first segment of elasticity above `knee_factor`
(default 2: latency grows more than twice as fast as throughput), None where no segment is above it. The
highest load meeting the SLO is the highest load whose `goodput_fraction` is at least `SLO_ATTAINMENT`. The
Pareto front is the points that no other point beats on both output tokens per second per user (1000 / mean
TPOT in ms) and output tokens per second in all.
"""

from __future__ import annotations

import math
import re
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.errors import WorkbenchError
from workbench.trace.columns import floats

SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
"""The per-request latencies an SLO may bound."""

SLO_ATTAINMENT = 0.9
"""The share of requests that must meet the SLO for a load to count as meeting it."""

KNEE_FACTOR = 2.0
"""Default elasticity (relative latency growth over relative throughput growth) above which a segment of a
sweep's curve lies past the knee."""

PERCENTILES = (50, 90, 99)
_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_BOUND = re.compile(r"\s*(?P<name>[a-z0-9]+)\s*=\s*(?P<number>[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(?P<unit>[a-z]*)\s*")


def parse_slo(text: str) -> dict[str, int]:
    """The SLO of `text` (`ttft=200ms,tpot=50ms,e2e=2s`; units ns, us, ms, s) as bounds in ns by metric name
    (ttft, tpot, itl, e2e); WorkbenchError on anything else."""
    bounds: dict[str, int] = {}
    for part in text.split(","):
        match = _BOUND.fullmatch(part.lower())
        if match is None:
            raise WorkbenchError(f"SLO {text!r}: {part.strip()!r} is no bound; write NAME=NUMBER UNIT bounds apart "
                                 "by commas, e.g. ttft=200ms,tpot=50ms,e2e=2s")
        name, unit = match["name"], match["unit"]
        if name not in SLO_METRICS:
            raise WorkbenchError(f"SLO {text!r}: unknown metric {name!r}; choose from {', '.join(SLO_METRICS)}")
        if unit not in _UNITS:
            raise WorkbenchError(f"SLO {text!r}: {name} needs a unit of time ({', '.join(_UNITS)}), got "
                                 f"{unit or 'none'}")
        if name in bounds:
            raise WorkbenchError(f"SLO {text!r}: {name} is bounded twice")
        bound = round(float(match["number"]) * _UNITS[unit])
        if bound <= 0:
            raise WorkbenchError(f"SLO {text!r}: the {name} bound must be above zero")
        bounds[name] = bound
    return bounds


def latency_summary(requests: pa.Table, slo: dict[str, int] | None = None) -> dict[str, Any]:
    """Counts, throughputs and TTFT/TPOT/ITL/e2e mean and percentiles (ms) of a `requests` table, and goodput
    under `slo` (bounds in ns, as `parse_slo` gives) when one is given. JSON-safe: None where undefined."""
    ok = pc.equal(requests["status"], "ok").to_numpy(zero_copy_only=False)
    arrival, end = floats(requests["arrival_ns"]), floats(requests["end_ns"])
    duration = (np.nanmax(end) - np.nanmin(arrival)) / 1e9 if requests.num_rows else math.nan
    ttft, tpot, e2e = (floats(requests[name])[ok] for name in ("ttft_ns", "tpot_ns", "e2e_ns"))
    tokens = requests["token_ns"].filter(pa.array(ok))
    gaps = _gaps(tokens)
    summary: dict[str, Any] = {
        "requests": requests.num_rows, "ok": int(ok.sum()), "failed": int((~ok).sum()),
        "duration_s": _safe(duration),
        "request_throughput": _safe(ok.sum() / duration if duration > 0 else math.nan),
        "output_token_throughput": _safe(np.nansum(floats(requests["output_tokens"])[ok]) / duration
                                         if duration > 0 else math.nan),
        **{name: _stats(values) for name, values in
           (("ttft", ttft), ("tpot", tpot), ("itl", np.concatenate(gaps) if gaps else np.zeros(0)), ("e2e", e2e))},
    }
    if slo is not None:
        good = _meets(requests, ok, slo)
        summary["slo_ms"] = {name: bound / 1e6 for name, bound in slo.items()}
        summary["good"] = int(good.sum())
        summary["goodput"] = _safe(good.sum() / duration if duration > 0 else math.nan)
        summary["goodput_fraction"] = _safe(good.sum() / requests.num_rows if requests.num_rows else math.nan)
    return summary


def _gaps(tokens: pa.ChunkedArray) -> list[np.ndarray]:
    """Per request with known chunk times, the gaps between its consecutive chunks (ns)."""
    return [np.diff(np.asarray(times, dtype=np.float64)) for times in tokens.to_pylist() if times is not None]


def _stats(values: np.ndarray) -> dict[str, float | None]:
    """Mean and percentiles in ms of ns `values` (NaN left out); None each without values."""
    values = values[~np.isnan(values)] / 1e6
    if not len(values):
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    return {"mean": float(values.mean()), **{f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}}


def _meets(requests: pa.Table, ok: np.ndarray, slo: dict[str, int]) -> np.ndarray:
    """Per request, whether it meets every bound of `slo` (the rules in the module docstring)."""
    unknown = set(slo) - set(SLO_METRICS)
    if unknown:
        raise WorkbenchError(f"SLO: unknown metric {', '.join(sorted(unknown))}; choose from {', '.join(SLO_METRICS)}")
    good = ok.copy()
    few = np.nan_to_num(floats(requests["output_tokens"]), nan=0.0) < 2
    for name in ("ttft", "tpot", "e2e"):
        if name in slo:
            values = floats(requests[f"{name}_ns"])
            within = np.nan_to_num(values, nan=math.inf) <= slo[name]
            good &= within | few if name == "tpot" else within
    if "itl" in slo:
        worst = np.array([math.inf if times is None else max(np.diff(times), default=0) if len(times) >= 2 else 0
                          for times in requests["token_ns"].to_pylist()], dtype=np.float64)
        good &= (worst <= slo["itl"]) | (few & np.isinf(worst))
    return good


def _safe(value: float) -> float | None:
    """`value` as a JSON-safe float: None for NaN and infinities."""
    value = float(value)
    return value if math.isfinite(value) else None


def sweep_summary(points: list[dict[str, Any]], knee_factor: float = KNEE_FACTOR) -> dict[str, Any]:
    """The throughput–latency curve of a sweep: `points` are {"rate" or "concurrency": load,
    **latency_summary(...)}, one per load. Gives the curve's rows by load, the knee's load, the highest load
    meeting the SLO and the loads of the Pareto front (the rules in the module docstring)."""
    keys = {key for point in points for key in ("rate", "concurrency") if key in point}
    if len(keys) > 1 or (points and not keys) or any(not keys & point.keys() for point in points):
        raise WorkbenchError("sweep: every point needs the same load key, rate or concurrency")
    load = keys.pop() if keys else "rate"
    for point in points:
        if isinstance(point[load], bool) or not isinstance(point[load], (int, float)) or not math.isfinite(
                point[load]):
            raise WorkbenchError(f"sweep: {load} {point[load]!r} is not a finite number")
    curve = [_row(load, point) for point in sorted(points, key=lambda p: p[load])]
    latency = "ttft_p90_ms" if all(row["ttft_p90_ms"] is not None for row in curve) else "e2e_p90_ms"
    meeting = [row[load] for row in curve
               if row["goodput_fraction"] is not None and row["goodput_fraction"] >= SLO_ATTAINMENT]
    return {"load": load, "latency": latency, "curve": curve, "knee": _knee(curve, load, latency, knee_factor),
            "max_load_meeting_slo": max(meeting) if meeting else None, "pareto": _pareto(curve, load)}


def _row(load: str, point: dict[str, Any]) -> dict[str, Any]:
    """One point of the curve: its load, throughputs, per-user token rate and p90 latencies."""
    tpot = (point.get("tpot") or {}).get("mean")
    return {load: point[load], "request_throughput": point.get("request_throughput"),
            "output_token_throughput": point.get("output_token_throughput"),
            "tokens_per_user": 1000.0 / tpot if tpot else None,
            "ttft_p90_ms": (point.get("ttft") or {}).get("p90"), "e2e_p90_ms": (point.get("e2e") or {}).get("p90"),
            "goodput": point.get("goodput"), "goodput_fraction": point.get("goodput_fraction")}


def _knee(curve: list[dict[str, Any]], load: str, latency: str, factor: float) -> float | None:
    """The load of the last point before the first segment of elasticity above `factor`; None without one."""
    for before, after in pairwise(curve):
        x0, x1, l0, l1 = (before["request_throughput"], after["request_throughput"], before[latency],
                          after[latency])
        if None in (x0, x1, l0, l1) or x0 <= 0 or l0 <= 0:
            continue
        grows, gains = (l1 - l0) / l0, (x1 - x0) / x0
        if grows > 0 and (gains <= 0 or grows / gains > factor):
            return before[load]
    return None


def _pareto(curve: list[dict[str, Any]], load: str) -> list[float]:
    """The loads of the points no other point beats on both tokens per user and output tokens per second, by
    rising output tokens per second."""
    known = [row for row in curve if row["tokens_per_user"] is not None and row["output_token_throughput"] is not None]

    def beaten(row: dict[str, Any]) -> bool:
        return any(other["tokens_per_user"] >= row["tokens_per_user"]
                   and other["output_token_throughput"] >= row["output_token_throughput"]
                   and (other["tokens_per_user"], other["output_token_throughput"])
                   != (row["tokens_per_user"], row["output_token_throughput"]) for other in known)

    return [row[load] for row in sorted(known, key=lambda r: r["output_token_throughput"]) if not beaten(row)]
