"""Serving metrics (`workbench.serving.metrics`): SLO parsing, the latency summary of a `requests` table against
figures computed by hand, and a sweep's curve, knee, highest load meeting the SLO and Pareto front."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from workbench.errors import WorkbenchError
from workbench.serving.metrics import latency_summary, parse_slo, sweep_summary
from workbench.serving.requests import REQUESTS_SCHEMA, read_requests

REAL_AIPERF = Path(__file__).parent / "data" / "serving" / "aiperf"

MS = 1_000_000


def _table(rows: list[dict]) -> pa.Table:
    """A requests table of `rows` (arrival, token times in ms; output tokens; error), derived columns as the
    reader computes them."""
    out = []
    for i, row in enumerate(rows):
        tokens = [t * MS for t in row["tokens"]] if row.get("tokens") is not None else None
        arrival, end = row["arrival"] * MS, row["end"] * MS
        first = tokens[0] if tokens else row.get("first", None)
        n = row.get("out", len(tokens) if tokens else 0)
        out.append({"request": i, "id": str(i), "session": None, "turn": None, "arrival_ns": arrival, "ack_ns": None,
                    "first_token_ns": first, "end_ns": end, "token_ns": tokens, "prompt_tokens": 10,
                    "output_tokens": n, "status": "error" if row.get("error") else "ok", "error": row.get("error"),
                    "ttft_ns": None if first is None else first - arrival, "e2e_ns": end - arrival,
                    "tpot_ns": (end - first) / (n - 1) if first is not None and n >= 2 else None, "source": "aiperf"})
    return pa.Table.from_pylist(out, schema=REQUESTS_SCHEMA)


# ttft 10, 20, 40, 30 ms; e2e 30, 60, 100, 50 ms; tpot 10, 20, 30, 20 ms; a failed request
ROWS = [
    {"arrival": 0, "end": 30, "tokens": [10, 20, 30]},
    {"arrival": 100, "end": 160, "tokens": [120, 140, 160]},
    {"arrival": 200, "end": 300, "tokens": [240, 270, 300]},
    {"arrival": 300, "end": 350, "tokens": [330, 350]},
    {"arrival": 400, "end": 500, "tokens": None, "error": "HTTPError: boom"},
]


@pytest.mark.parametrize("text, bounds", [
    ("ttft=200ms,tpot=50ms,e2e=2s", {"ttft": 200 * MS, "tpot": 50 * MS, "e2e": 2_000 * MS}),
    (" itl = 1500us , ttft=0.5s", {"itl": 1_500_000, "ttft": 500 * MS}),
    ("E2E=250NS", {"e2e": 250}),
])
def test_parse_slo(text, bounds):
    assert parse_slo(text) == bounds


@pytest.mark.parametrize("text, problem", [
    ("", "no bound"), ("ttft", "no bound"), ("ttft=200", "unit of time"), ("ttft=200 parsecs", "unit of time"),
    ("latency=2s", "unknown metric"), ("ttft=1s,ttft=2s", "twice"), ("ttft=0ms", "above zero"),
    ("ttft=-1ms", "no bound"), ("ttft=1ms;tpot=2ms", "no bound"),
])
def test_parse_slo_misuse(text, problem):
    with pytest.raises(WorkbenchError, match=problem):
        parse_slo(text)


def test_latency_summary_by_hand():
    summary = latency_summary(_table(ROWS))
    assert (summary["requests"], summary["ok"], summary["failed"]) == (5, 4, 1)
    assert summary["duration_s"] == pytest.approx(0.5)  # first arrival 0 → last end 500 ms (the failed one)
    assert summary["request_throughput"] == pytest.approx(4 / 0.5)
    assert summary["output_token_throughput"] == pytest.approx(11 / 0.5)
    # ttft sorted 10, 20, 30, 40: p50 = 25; p90 at rank 2.7 = 30 + 0.7 * 10 = 37; p99 at 2.97 = 39.7
    assert summary["ttft"] == pytest.approx({"mean": 25.0, "p50": 25.0, "p90": 37.0, "p99": 39.7})
    # e2e sorted 30, 50, 60, 100: p50 = 55; p90 = 60 + 0.7 * 40 = 88; p99 = 60 + 0.97 * 40 = 98.8
    assert summary["e2e"] == pytest.approx({"mean": 60.0, "p50": 55.0, "p90": 88.0, "p99": 98.8})
    # tpot 10, 20, 30, 20 → sorted 10, 20, 20, 30
    assert summary["tpot"] == pytest.approx({"mean": 20.0, "p50": 20.0, "p90": 27.0, "p99": 29.7})
    # itl gaps 10, 10 | 20, 20 | 30, 30 | 20 → sorted 10 10 20 20 20 30 30: p50 = 20; p90 at 5.4 = 30
    assert summary["itl"] == pytest.approx({"mean": 140 / 7, "p50": 20.0, "p90": 30.0, "p99": 30.0})
    assert "goodput" not in summary
    json.dumps(summary, allow_nan=False)


def test_goodput_against_a_hand_count():
    # ttft ≤ 25 ms: requests 0, 1; e2e ≤ 60 ms: 0, 1, 3; tpot ≤ 20 ms: 0, 1, 3 → 0 and 1 meet all; the failed one
    # never does
    summary = latency_summary(_table(ROWS), parse_slo("ttft=25ms,e2e=60ms,tpot=20ms"))
    assert summary["good"] == 2
    assert summary["goodput"] == pytest.approx(2 / 0.5) and summary["goodput_fraction"] == pytest.approx(2 / 5)
    assert summary["slo_ms"] == {"ttft": 25.0, "e2e": 60.0, "tpot": 20.0}
    # largest chunk gap ≤ 20 ms: requests 0 (10), 1 (20), 3 (20)
    assert latency_summary(_table(ROWS), parse_slo("itl=20ms"))["good"] == 3


def test_slo_rules_for_missing_figures():
    rows = [{"arrival": 0, "end": 5, "tokens": [5]},  # one token: no TPOT, no gap: both bounds met
            {"arrival": 0, "end": 50, "tokens": None, "first": 10, "out": 5},  # chunk times unknown (GuideLLM)
            {"arrival": 0, "end": 50, "tokens": None, "out": 0}]  # ok but no token: TTFT bound not met
    table = _table(rows)
    assert latency_summary(table, {"tpot": MS, "itl": MS})["good"] == 2  # the first and the last
    assert latency_summary(table, {"itl": 10**12})["good"] == 2  # not the second, whatever the bound
    assert latency_summary(table, {"ttft": 100 * MS})["good"] == 2
    with pytest.raises(WorkbenchError, match="unknown metric"):
        latency_summary(table, {"latency": MS})


def test_empty_table_is_json_safe():
    summary = latency_summary(_table([]), parse_slo("ttft=1s"))
    assert summary["requests"] == 0 and summary["duration_s"] is None and summary["ttft"]["p90"] is None
    assert summary["goodput"] is None and summary["goodput_fraction"] is None
    json.dumps(summary, allow_nan=False)


def _point(rate: float, throughput: float, ttft_p90: float, tpot_mean: float, fraction: float) -> dict:
    return {"rate": rate, "request_throughput": throughput, "output_token_throughput": throughput * 100,
            "ttft": {"mean": None, "p50": None, "p90": ttft_p90, "p99": None},
            "tpot": {"mean": tpot_mean, "p50": None, "p90": None, "p99": None},
            "e2e": {"mean": None, "p50": None, "p90": ttft_p90 * 10, "p99": None},
            "goodput": throughput * fraction, "goodput_fraction": fraction}


def test_sweep_knee_slo_and_pareto():
    # elasticities: 1→2: (55/50 - 1) / (1.9/1 - 1) = 0.1 / 0.9; 2→4: (60/55 - 1) / (3.6/1.9 - 1) ≈ 0.1;
    # 4→8: (300/60 - 1) / (4.5/3.6 - 1) = 4 / 0.25 = 16 > 2 → the knee is rate 4
    points = [_point(8, 4.5, 300, 40, 0.5), _point(1, 1.0, 50, 10, 1.0), _point(2, 1.9, 55, 12, 0.95),
              _point(4, 3.6, 60, 20, 0.9), _point(16, 4.4, 900, 80, 0.0)]
    sweep = sweep_summary(points)
    assert sweep["load"] == "rate" and sweep["latency"] == "ttft_p90_ms"
    assert [row["rate"] for row in sweep["curve"]] == [1, 2, 4, 8, 16]
    assert sweep["curve"][0]["tokens_per_user"] == pytest.approx(100.0)
    assert sweep["knee"] == 4
    assert sweep["max_load_meeting_slo"] == 4  # goodput_fraction ≥ 0.9 at 1, 2 and 4
    # (tokens/user, tokens/s): 1 (100, 100), 2 (83, 190), 4 (50, 360), 8 (25, 450), 16 (12.5, 440): 16 is beaten
    assert sweep["pareto"] == [1, 2, 4, 8]
    json.dumps(sweep, allow_nan=False)


def test_sweep_without_knee_or_slo():
    points = [{"concurrency": c, **_point(0, c * 1.0, 50 + c, 10, 1.0)} for c in (1, 2, 4)]
    for point in points:
        del point["rate"], point["goodput"], point["goodput_fraction"]
    sweep = sweep_summary(points)
    assert sweep["load"] == "concurrency" and sweep["knee"] is None and sweep["max_load_meeting_slo"] is None


def test_sweep_throughput_that_stops_growing_is_past_the_knee():
    sweep = sweep_summary([_point(1, 1.0, 50, 10, 1.0), _point(2, 1.0, 51, 10, 1.0)])
    assert sweep["knee"] == 1


@pytest.mark.parametrize("points, problem", [
    ([{"rate": 1}, {"concurrency": 2}], "same load key"),
    ([{"rps": 1}], "same load key"),
    ([{"rate": float("inf")}], "finite"),
    ([{"rate": "fast"}], "finite"),
])
def test_sweep_misuse(points, problem):
    with pytest.raises(WorkbenchError, match=problem):
        sweep_summary(points)


@pytest.mark.skipif(not (REAL_AIPERF / "profile_export.jsonl").exists(), reason="no real AIPerf run recorded")
def test_real_aiperf_run_summary():
    """A real AIPerf run: TTFT and ITL as AIPerf summed them up; duration from the first start to the last end."""
    summary = latency_summary(read_requests(REAL_AIPERF / "profile_export.jsonl").table, parse_slo("e2e=10s"))
    own = json.loads((REAL_AIPERF / "profile_export_aiperf.json").read_text())
    for ours, theirs in (("ttft", "time_to_first_token"), ("itl", "inter_chunk_latency")):
        assert summary[ours] == pytest.approx({q: own[theirs][q if q != "mean" else "avg"]
                                               for q in ("mean", "p50", "p90", "p99")}, rel=1e-6)
    assert summary["duration_s"] == pytest.approx(own["benchmark_duration"]["avg"], rel=1e-6)
    assert summary["ok"] == own["request_count"]["avg"] and summary["goodput_fraction"] == 1.0
    json.dumps(summary, allow_nan=False)
