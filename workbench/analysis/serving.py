"""What the serving views draw (`workbench.views.serving`), as DataFrames: a serving run's requests as the bars
and token ticks of a waterfall, its engine steps as a lane, its sampled server metrics as tracks, its latency
summary as headline tables, and a sweep's load points as curves.

Bounded by what is drawn: the waterfall keeps at most `MAX_WATERFALL_ROWS` requests (all of them when they fit,
else the slowest, failed first), at most `MAX_TOKEN_TICKS` token ticks (every k-th when there are more) and the
lane at most `MAX_STEPS` steps (the longest); each says what it left out. Times stay in ns from the run's
origin, the one clock of requests, steps and counters (`workbench.serving.run`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from workbench.trace.columns import floats

MAX_WATERFALL_ROWS = 1_000
"""Requests the waterfall draws at most."""
MAX_TOKEN_TICKS = 20_000
"""Token arrival ticks the waterfall draws at most."""
MAX_STEPS = 20_000
"""Engine steps the step lane draws at most."""
MAX_FLIGHT_POINTS = 4_000
"""Points each series of the requests-in-flight track has at most (the maximum per time bin when more)."""
SERVER_DEVICE = "server"
"""The `device` of the sampled server metrics in the counters table (`workbench.serving.metrics_sampler.DEVICE`)."""

PHASES = ("queued", "prefill", "delivery", "to first token", "decode", "failed")
"""The waterfall's bar kinds: queued, prefill and decode where the request was joined to the engine's steps
(`workbench.serving.join`), else arrival → first token ("to first token") and decode; a failed request is one
bar from arrival to its end."""

GAUGE, PERCENT, RATE = "gauge", "percent", "rate"
TRACKS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    ("requests running and waiting", "requests", GAUGE, (
        ("vllm:num_requests_running", "running"), ("vllm:num_requests_waiting", "waiting"),
        ("sglang:num_running_reqs", "running"), ("sglang:num_queue_reqs", "waiting"))),
    ("KV-cache usage (%)", "%", PERCENT, (
        ("vllm:kv_cache_usage_perc", "KV cache used"), ("vllm:gpu_cache_usage_perc", "KV cache used"),
        ("sglang:token_usage", "KV cache used"))),
    ("tokens per second (from the server's counters)", "tokens/s", RATE, (
        ("vllm:generation_tokens_total", "generated"), ("vllm:prompt_tokens_total", "prompt"),
        ("sglang:generation_tokens_total", "generated"), ("sglang:prompt_tokens_total", "prompt"))),
    ("prefix-cache hits and preemptions per second", "per s", RATE, (
        ("vllm:prefix_cache_hits_total", "prefix-cache hit tokens"),
        ("vllm:num_preemptions_total", "preemptions"), ("sglang:num_preemptions_total", "preemptions"))),
)
"""The counter tracks: (title, unit, how to draw, ((series, legend), ...)). Gauges are drawn as sampled, usage
fractions as percent, cumulative counters (`_total`) as their rate per second between samples."""


@dataclass(frozen=True)
class Waterfall:
    """A waterfall's data: `requests` one row per drawn request (its `y`, from 0 by arrival), `segments` its
    bars (y, left, right, phase, and the request's figures for the hover), `ticks` its token arrivals (x, y);
    `total` requests and `total_ticks` ticks there were."""

    requests: pd.DataFrame
    segments: pd.DataFrame
    ticks: pd.DataFrame
    total: int
    total_ticks: int

    @property
    def note(self) -> str:
        """What the title adds about the rows left out: "" when all are drawn."""
        shown = len(self.requests)
        return "" if shown >= self.total else f" ({shown:,} slowest of {self.total:,} requests, failed first)"

    @property
    def ticks_note(self) -> str:
        """What the title adds about the token ticks left out: "" when all are drawn."""
        shown = len(self.ticks)
        return "" if shown >= self.total_ticks else f" (every {math.ceil(self.total_ticks / max(shown, 1))}th " \
                                                   f"of {self.total_ticks:,} token ticks)"


def _floats(table: pa.Table, name: str) -> np.ndarray:
    """A column as float64 with NaN for nulls; all NaN when the table lacks it."""
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    return floats(table[name])


def _texts(table: pa.Table, name: str) -> np.ndarray:
    """A column as strings ("" for nulls and when the table lacks it)."""
    if name not in table.column_names:
        return np.full(table.num_rows, "", dtype=object)
    return np.array(["" if v is None else str(v) for v in table[name].to_pylist()], dtype=object)


def waterfall(requests: pa.Table | None, *, max_rows: int | None = None, max_ticks: int | None = None) -> Waterfall:
    """The waterfall of a `requests` table: the requests with an arrival time, at most `max_rows` of them (the
    slowest end to end, failed first, when there are more), by arrival; their bars (`PHASES`) and at most
    `max_ticks` token ticks (by default `MAX_WATERFALL_ROWS` and `MAX_TOKEN_TICKS`)."""
    max_rows = MAX_WATERFALL_ROWS if max_rows is None else max_rows
    max_ticks = MAX_TOKEN_TICKS if max_ticks is None else max_ticks
    empty = Waterfall(pd.DataFrame(columns=["y"]), pd.DataFrame(columns=["y", "left", "right", "phase"]),
                      pd.DataFrame({"x": [], "y": []}), 0, 0)
    if requests is None or not requests.num_rows:
        return empty
    arrival = _floats(requests, "arrival_ns")
    placed = np.flatnonzero(~np.isnan(arrival))
    if not len(placed):
        return empty
    total = len(placed)
    if total > max_rows:
        failed = _texts(requests, "status")[placed] != "ok"
        e2e = _floats(requests, "e2e_ns")[placed]
        e2e = np.where(np.isnan(e2e), _floats(requests, "end_ns")[placed] - arrival[placed], e2e)
        order = np.lexsort((-np.nan_to_num(e2e, nan=-np.inf), ~failed))  # failed first, then slowest
        placed = placed[order[:max_rows]]
    placed = placed[np.argsort(arrival[placed], kind="stable")]
    kept = requests.take(pa.array(placed))
    rows = _request_rows(kept)
    ticks, total_ticks = _ticks(kept, max_ticks)
    return Waterfall(rows, _segments(rows), ticks, total, total_ticks)


def _request_rows(kept: pa.Table) -> pd.DataFrame:
    """One row per drawn request: its times (ns), figures (ms) and texts for the hover."""
    n = kept.num_rows
    arrival, first, end, ack = (_floats(kept, f"{c}_ns") for c in ("arrival", "first_token", "end", "ack"))
    known_end = np.where(np.isnan(end), np.fmax(np.fmax(ack, first), arrival), end)
    rows = pd.DataFrame({
        "y": np.arange(n, dtype=float), "request": _floats(kept, "request"), "id": _texts(kept, "id"),
        "status": _texts(kept, "status"), "error": _texts(kept, "error"),
        "arrival_ns": arrival, "first_token_ns": first, "end_ns": known_end,
        "prompt_tokens": _floats(kept, "prompt_tokens"), "output_tokens": _floats(kept, "output_tokens"),
        "ttft_ms": _floats(kept, "ttft_ns") / 1e6, "tpot_ms": _floats(kept, "tpot_ns") / 1e6,
        "e2e_ms": _floats(kept, "e2e_ns") / 1e6, "queued_ms": _floats(kept, "queued_ns") / 1e6,
        "prefill_ms": _floats(kept, "prefill_ns") / 1e6, "delivery_ms": _floats(kept, "delivery_ns") / 1e6,
        "decode_ms": _floats(kept, "decode_ns") / 1e6,
        "stalled_ms": _floats(kept, "stalled_ns") / 1e6, "steps": _floats(kept, "steps"),
        "first_step": _floats(kept, "first_step"), "last_step": _floats(kept, "last_step"),
    })
    rows["failed"] = rows["status"] != "ok"
    return rows


def _segments(rows: pd.DataFrame) -> pd.DataFrame:
    """The bars of the drawn requests: queued, prefill (the step), delivery (its end → the first token at the
    client), decode where joined to steps; arrival → first token and decode where not; one failed bar for a
    failed request."""
    a, first, end = rows["arrival_ns"].to_numpy(), rows["first_token_ns"].to_numpy(), rows["end_ns"].to_numpy()
    queued, prefill = rows["queued_ms"].to_numpy() * 1e6, rows["prefill_ms"].to_numpy() * 1e6
    failed = rows["failed"].to_numpy()
    joined = ~failed & ~np.isnan(queued) & ~np.isnan(prefill)
    unjoined = ~failed & ~joined & ~np.isnan(first)
    no_token = ~failed & np.isnan(first)
    parts = [
        ("queued", joined, a, a + queued), ("prefill", joined, a + queued, a + queued + prefill),
        ("delivery", joined, a + queued + prefill, first),
        ("to first token", unjoined, a, first), ("decode", (joined | unjoined), first, end),
        ("to first token", no_token, a, end), ("failed", failed, a, end),
    ]
    frames = []
    for phase, mask, left, right in parts:
        idx = np.flatnonzero(mask)
        part = rows.iloc[idx].copy()
        part["left"], part["right"], part["phase"] = left[idx], np.maximum(right[idx], left[idx]), phase
        frames.append(part)
    segments = pd.concat(frames, ignore_index=True)
    segments["phase_ms"] = (segments["right"] - segments["left"]) / 1e6
    return segments.sort_values(["y", "left"], kind="stable").reset_index(drop=True)


def _ticks(kept: pa.Table, max_ticks: int) -> tuple[pd.DataFrame, int]:
    """The token arrivals of the drawn requests as (x, y), every k-th when there are more than `max_ticks`."""
    if "token_ns" not in kept.column_names:
        return pd.DataFrame({"x": [], "y": []}), 0
    tokens = kept["token_ns"].combine_chunks() if kept.num_rows else pa.array([], pa.list_(pa.int64()))
    times = pc.list_flatten(tokens)
    parents = pc.list_parent_indices(tokens)
    total = len(times)
    stride = max(1, math.ceil(total / max_ticks)) if max_ticks > 0 else max(total, 1)
    take = np.arange(0, total, stride)[: max(max_ticks, 0)]
    x = np.asarray(pc.cast(times, pa.float64()).to_numpy(zero_copy_only=False), dtype=float)[take]
    y = np.asarray(parents.to_numpy(zero_copy_only=False), dtype=float)[take]
    known = ~np.isnan(x)
    return pd.DataFrame({"x": x[known], "y": y[known]}), total


def step_lane(steps: pa.Table | None, *, max_steps: int | None = None) -> tuple[pd.DataFrame, int]:
    """The engine steps to draw (the longest `max_steps`, default `MAX_STEPS`, when there are more, by start)
    with their batch figures, and how many there were. `top` is the batch's requests (1 where unknown)."""
    max_steps = MAX_STEPS if max_steps is None else max_steps
    columns = ["step", "left", "right", "dur_ms", "mode", "top", "prefill_requests", "prefill_tokens",
               "decode_requests", "scheduled_tokens", "batch_requests", "kernels", "kernel_ms"]
    if steps is None or not steps.num_rows:
        return pd.DataFrame(columns=columns), 0
    total = steps.num_rows
    dur = _floats(steps, "dur_ns")
    keep = np.arange(total)
    if total > max_steps:
        keep = np.argsort(-np.nan_to_num(dur, nan=0.0), kind="stable")[:max_steps]
    start = _floats(steps, "start_ns")
    keep = keep[np.argsort(start[keep], kind="stable")]
    kept = steps.take(pa.array(keep))
    start, dur = start[keep], dur[keep]
    batch = _floats(kept, "batch_requests")
    mode = _texts(kept, "mode")
    lane = pd.DataFrame({
        "step": _floats(kept, "step"), "left": start, "right": start + dur, "dur_ms": dur / 1e6,
        "mode": np.where(mode == "", "unknown", mode), "top": np.where(np.isnan(batch), 1.0, batch),
        "prefill_requests": _floats(kept, "prefill_requests"), "prefill_tokens": _floats(kept, "prefill_tokens"),
        "decode_requests": _floats(kept, "decode_requests"), "scheduled_tokens": _floats(kept, "scheduled_tokens"),
        "batch_requests": batch, "kernels": _floats(kept, "kernels"), "kernel_ms": _floats(kept, "kernel_ns") / 1e6,
    })
    return lane, total


def counter_tracks(counters: pa.Table | None) -> list[tuple[str, str, pd.DataFrame]]:
    """The `TRACKS` the server's sampled series fill: (title, unit, frame of ts_ns, value, series), in order;
    a track none of whose series was sampled is left out."""
    if counters is None or not counters.num_rows:
        return []
    device = pc.cast(counters["device"], pa.string())
    server = counters.filter(pc.equal(device, SERVER_DEVICE))
    if not server.num_rows:
        return []
    names = np.asarray(pc.cast(server["name"], pa.string()).to_numpy(zero_copy_only=False), dtype=object)
    ts = server["ts_ns"].to_numpy().astype(float)
    value = server["value"].to_numpy().astype(float)
    tracks = []
    for title, unit, how, series in TRACKS:
        frames, labels = [], set()
        for name, label in series:
            here = names == name
            if not here.any() or label in labels:
                continue
            labels.add(label)
            order = np.argsort(ts[here], kind="stable")
            x, v = ts[here][order], value[here][order]
            if how == PERCENT:
                v = v * 100.0
            elif how == RATE:
                dt, dv = np.diff(x), np.diff(v)
                x, v = x[1:], np.where((dt > 0) & (dv >= 0), dv / np.where(dt > 0, dt, 1) * 1e9, np.nan)
            frames.append(pd.DataFrame({"ts_ns": x, "value": v, "series": label}))
        if frames:
            tracks.append((title, unit, pd.concat(frames, ignore_index=True)))
    return tracks


def in_flight(requests: pa.Table | None, *, max_points: int | None = None) -> tuple[pd.DataFrame, float]:
    """Every request's state over time from the generator's own times, exact where the samples of the server's
    gauges are coarse: how many requests were waiting for their first token (arrival → first token, or → end
    without one) and how many were streaming (first token → end), as (ts_ns, value, series) after each change.
    Past `max_points` (default `MAX_FLIGHT_POINTS`) changes a series is binned: each bin's maximum at its start.
    Returns the frame and the bin width in ns (0 when not binned)."""
    max_points = MAX_FLIGHT_POINTS if max_points is None else max_points
    empty = pd.DataFrame({"ts_ns": [], "value": [], "series": []})
    if requests is None or not requests.num_rows:
        return empty, 0.0
    arrival, first, end = (_floats(requests, f"{c}_ns") for c in ("arrival", "first_token", "end"))
    known = ~np.isnan(arrival) & ~np.isnan(end)
    streaming = known & ~np.isnan(first)
    spans = {"waiting for first token": (arrival[known], np.where(np.isnan(first), end, first)[known]),
             "streaming": (first[streaming], end[streaming])}
    if not known.any():
        return empty, 0.0
    lo, hi = float(arrival[known].min()), float(end[known].max())
    width = 0.0
    frames = []
    for series, (begin, stop) in spans.items():
        times = np.concatenate([begin, stop])
        steps = np.concatenate([np.ones(len(begin)), -np.ones(len(stop))])
        order = np.lexsort((steps, times))  # at one instant, ends before starts
        times, values = times[order], np.cumsum(steps[order])
        times, values = np.concatenate([[lo], times]), np.concatenate([[0.0], values])
        if len(times) > max_points:
            width = max((hi - lo) / max(max_points - 1, 1), 1.0)
            bins = np.minimum(((times - lo) // width).astype(np.int64), max_points - 1)
            peak = pd.Series(values).groupby(bins).max()
            carried = pd.Series(values).groupby(bins).last().reindex(range(max_points)).ffill().shift(1)
            top = pd.concat([peak.reindex(range(max_points)), carried], axis=1).max(axis=1).fillna(0.0)
            times, values = lo + np.arange(max_points) * width, top.to_numpy()
        frames.append(pd.DataFrame({"ts_ns": times, "value": values, "series": series}))
    return pd.concat(frames, ignore_index=True), width


LATENCY_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))


def summary_tables(summary: dict[str, Any] | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A latency summary (`workbench.serving.metrics.latency_summary`) as two tables: per metric (TTFT, TPOT,
    ITL, E2E) its mean, p50, p90, p99 and SLO bound in ms; and one row of counts and throughputs."""
    summary = summary or {}
    slo = summary.get("slo_ms") or {}
    latency = pd.DataFrame([{"metric": title, **{k: _num((summary.get(key) or {}).get(k))
                                                  for k in ("mean", "p50", "p90", "p99")},
                             "slo_ms": _num(slo.get(key))} for key, title in LATENCY_METRICS])
    fraction = _num(summary.get("goodput_fraction"))
    throughput = pd.DataFrame([{
        **{k: _num(summary.get(k)) for k in ("requests", "ok", "failed", "duration_s", "request_throughput",
                                             "output_token_throughput", "good", "goodput")},
        "goodput_pct": fraction * 100 if not math.isnan(fraction) else math.nan}])
    return latency, throughput


def _num(value: Any) -> float:
    """A JSON number as a float, NaN for None or anything else."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def point_of(record: Any) -> dict[str, Any] | None:
    """A serving run's record as a sweep point (`workbench.serving.metrics.sweep_summary`): its load under
    "rate" or "concurrency", its latency summary, and its `label` and `run_id`; None for another run."""
    serving = getattr(record, "serving", None) or {}
    load, summary = serving.get("load") or {}, serving.get("summary")
    key = "rate" if load.get("rate") is not None else "concurrency" if load.get("concurrency") is not None else None
    if key is None or not summary:
        return None
    label = getattr(record, "label", None) or (getattr(record, "variant", None) or {}).get("name") or record.run_id
    return {key: load[key], **summary, "label": str(label), "run_id": record.run_id}


def sweep_curve(points: Sequence[dict[str, Any]]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A sweep's points as its curve (`sweep_summary`'s rows, by load) with each point's `label`, `on_front`,
    `knee` and `max_slo` (the highest load meeting the SLO) flags, and the summary itself. Points of the less
    common load key (rate or concurrency) are left out: one curve has one load axis."""
    from workbench.serving.metrics import sweep_summary

    keys = Counter(k for p in points for k in ("rate", "concurrency") if k in p)
    if not keys:
        return pd.DataFrame(), {"load": "rate", "curve": [], "knee": None, "max_load_meeting_slo": None,
                                "pareto": [], "latency": "ttft_p90_ms", "left_out": 0}
    key = keys.most_common(1)[0][0]
    same = [p for p in points if key in p]
    summary = sweep_summary([{k: v for k, v in p.items() if k not in ("rate", "concurrency") or k == key}
                             for p in same])
    labels = {p[key]: p.get("label", f"{key} {p[key]:g}") for p in same}
    runs = {p[key]: p.get("run_id", "") for p in same}
    curve = pd.DataFrame(summary["curve"]).rename(columns={key: "load"})
    curve = curve.astype({c: float for c in curve.columns})
    curve["label"] = [str(labels[load]) for load in curve["load"]]
    curve["run_id"] = [str(runs[load]) for load in curve["load"]]
    curve["on_front"] = curve["load"].isin(summary["pareto"])
    curve["knee"] = curve["load"] == summary["knee"] if summary["knee"] is not None else False
    best = summary["max_load_meeting_slo"]
    curve["max_slo"] = curve["load"] == best if best is not None else False
    curve["goodput_pct"] = curve["goodput_fraction"] * 100
    return curve, {**summary, "left_out": len(points) - len(same)}
