"""Per-request results of load generators (`workbench.serving.requests`): AIPerf's profile_export.jsonl, vllm bench
serve's detailed JSON and GuideLLM's benchmarks.json, hand-built from the field names in their sources (and the
real AIPerf run in tests/data/serving/aiperf when present), read into the `requests` table."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from workbench.errors import TraceFormatError
from workbench.serving import requests as requests_module
from workbench.serving.requests import REQUESTS_SCHEMA, read_requests

REAL_AIPERF = Path(__file__).parent / "data" / "serving" / "aiperf"
T0 = 1_760_000_000_000_000_000


def _aiperf(start: int, end: int, ttft_ms: float | None = None, icl_ms: list[float] | None = None, osl: int = 0,
            error: dict | None = None, phase: str = "profiling", rid: str = "r", session: str = "s") -> dict:
    """One AIPerf 0.13 record as RecordExportJSONLWriter writes it (metrics in display units)."""
    metrics: dict = {"input_sequence_length": {"value": 10, "unit": "tokens"}}
    if ttft_ms is not None:
        metrics["time_to_first_token"] = {"value": ttft_ms, "unit": "ms"}
        metrics["output_sequence_length"] = {"value": osl, "unit": "tokens"}
    if icl_ms:
        metrics["inter_chunk_latency"] = {"value": icl_ms, "unit": "ms"}
    record = {"metadata": {"session_num": 0, "x_request_id": rid, "x_correlation_id": session,
                           "conversation_id": "c", "turn_index": 0, "request_start_ns": start,
                           "request_ack_ns": start + 1_000_000, "request_end_ns": end, "worker_id": "w",
                           "record_processor_id": "p", "benchmark_phase": phase, "was_cancelled": False},
              "metrics": metrics}
    if error is not None:
        record["error"] = error
    return record


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_aiperf_rows_times_and_failures(tmp_path):
    path = _write_jsonl(tmp_path / "profile_export.jsonl", [
        _aiperf(T0 + 50_000_000, T0 + 80_000_000, ttft_ms=10.0, icl_ms=[5.0, 15.0], osl=3, rid="b"),
        _aiperf(T0, T0 + 40_000_000, ttft_ms=20.0, icl_ms=[10.0], osl=2, rid="a", session="s2"),
        _aiperf(T0 + 60_000_000, T0 + 61_000_000, rid="c",
                error={"code": 500, "type": "HTTPError", "message": "boom"}),
        _aiperf(T0 - 10_000_000, T0, ttft_ms=1.0, osl=1, phase="warmup"),
    ])
    result = read_requests(path)
    rows = result.table.to_pylist()
    assert result.table.schema == REQUESTS_SCHEMA
    assert result.source == "aiperf" and result.origin_ns == T0
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    assert [r["request"] for r in rows] == [0, 1, 2]
    a, b, c = rows
    assert a["session"] == "s2" and a["arrival_ns"] == 0 and a["ack_ns"] == 1_000_000
    assert a["token_ns"] == [20_000_000, 30_000_000] and a["first_token_ns"] == 20_000_000
    assert a["ttft_ns"] == 20_000_000 and a["e2e_ns"] == 40_000_000 and a["tpot_ns"] == 20_000_000.0
    assert b["token_ns"] == [60_000_000, 65_000_000, 80_000_000]
    assert b["tpot_ns"] == pytest.approx((80_000_000 - 60_000_000) / 2)
    assert b["prompt_tokens"] == 10 and b["output_tokens"] == 3 and b["status"] == "ok" and b["error"] is None
    assert c["status"] == "error" and c["error"] == "HTTPError: boom" and c["first_token_ns"] is None
    assert c["token_ns"] is None and c["ttft_ns"] is None and c["e2e_ns"] == 1_000_000
    assert result.failed == 1 and result.errors == {"HTTPError: boom": 1}
    assert any("warm-up" in w for w in result.warnings)
    assert set(result.table["source"].to_pylist()) == {"aiperf"}


def test_origin_given(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [_aiperf(T0, T0 + 5, ttft_ms=0.000001, osl=1)])
    result = read_requests(path, origin_ns=T0 - 1000)
    assert result.origin_ns == T0 - 1000
    assert result.table["arrival_ns"].to_pylist() == [1000] and result.table["end_ns"].to_pylist() == [1005]


def test_aiperf_truncated_last_line_kept_with_warning(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [_aiperf(T0 + i, T0 + i + 10, ttft_ms=0.000001, osl=1)
                                               for i in range(3)])
    text = path.read_text()
    path.write_text(text[:len(text) - 40])  # the third record cut short
    result = read_requests(path)
    assert result.table.num_rows == 2
    assert len(result.warnings) == 1 and str(path) in result.warnings[0] and "line 3" in result.warnings[0]


def test_aiperf_broken_line_in_the_middle_is_an_error(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", [_aiperf(T0, T0 + 10, ttft_ms=0.000001, osl=1)])
    path.write_text(path.read_text() + "{not json\n" + path.read_text())
    with pytest.raises(TraceFormatError, match="line 2"):
        read_requests(path)


def test_aiperf_unknown_time_unit_is_an_error(tmp_path):
    record = _aiperf(T0, T0 + 10, ttft_ms=1.0, osl=1)
    record["metrics"]["time_to_first_token"]["unit"] = "fortnights"
    with pytest.raises(TraceFormatError, match="line 1"):
        read_requests(_write_jsonl(tmp_path / "p.jsonl", [record]))


def test_huge_line_refused_before_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(requests_module, "MAX_LINE_BYTES", 1000)
    record = _aiperf(T0, T0 + 10, ttft_ms=1.0, icl_ms=[1.0] * 500, osl=501)
    with pytest.raises(TraceFormatError, match="line 1 is longer than"):
        read_requests(_write_jsonl(tmp_path / "p.jsonl", [record]))


@pytest.mark.parametrize("text, problem", [
    ("hello", "not JSON results"),
    ("[1, 2]", "not JSON results"),
    ('{"traceEvents": []}', "no known load generator"),
    ('{"duration": 10.0, "completed": 5, "ttft": 1', "not valid JSON"),
    ('{"date": "20260101-000000", "duration": 10.0, "completed": 5}', "--save-detailed"),
    ('{"metadata": {"version": 9}, "benchmarks": []}', "schema version 9"),
    ('{"ttfts": [0.1], "itls": [[]], "input_lens": [1], "output_lens": "x", "errors": [""]}', "unexpected field"),
])
def test_wrong_format(tmp_path, text, problem):
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=problem) as error:
        read_requests(path)
    assert str(path) in str(error.value)


def test_missing_file(tmp_path):
    with pytest.raises(TraceFormatError, match="cannot open"):
        read_requests(tmp_path / "absent.jsonl")


def _vllm(**extra) -> dict:
    """A `vllm bench serve --save-result --save-detailed` result (vLLM 0.32 fields; times in seconds)."""
    return {"date": "20260101-120000", "endpoint_type": "openai", "backend": "openai", "num_prompts": 3,
            "request_rate": 2.0, "burstiness": 1.0, "max_concurrency": None, "duration": 4.0, "completed": 2,
            "failed": 1, "input_lens": [5, 6, 7], "output_lens": [3, 0, 2], "ttfts": [0.1, 0.0, 0.2],
            "itls": [[0.01, 0.03], [], [0.05]], "latencies": [0.14, 0.0, 0.25], "start_times": [100.5, 100.0, 101.0],
            "generated_texts": ["abc", "", "de"], "errors": ["", "Bad Request", ""], **extra}


def test_vllm_bench_detailed(tmp_path):
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(_vllm()))
    result = read_requests(path)
    assert result.source == "vllm-bench"
    first = round((datetime(2026, 1, 1, 12).timestamp() - 4.0) * 1e9)
    assert result.origin_ns == first
    rows = result.table.to_pylist()
    assert [r["arrival_ns"] for r in rows] == [0, 500_000_000, 1_000_000_000]
    failed, a, b = rows
    assert failed["status"] == "error" and failed["error"] == "Bad Request" and failed["token_ns"] is None
    assert a["token_ns"] == [600_000_000, 610_000_000, 640_000_000] and a["end_ns"] == 640_000_000
    assert a["ttft_ns"] == 100_000_000 and a["tpot_ns"] == pytest.approx(20_000_000)
    assert b["token_ns"] == [1_200_000_000, 1_250_000_000] and b["e2e_ns"] == 250_000_000
    assert a["prompt_tokens"] == 5 and a["output_tokens"] == 3 and a["ack_ns"] is None and a["id"] is None
    assert result.failed == 1 and result.errors == {"Bad Request": 1}
    assert any("perf_counter" in w and "date" in w for w in result.warnings)


def test_vllm_bench_without_start_times_placed_by_rate(tmp_path):
    old = _vllm()
    del old["start_times"], old["latencies"]
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(old))
    result = read_requests(path)
    assert result.table["arrival_ns"].to_pylist() == [0, 500_000_000, 1_000_000_000]
    assert result.table["end_ns"].to_pylist()[0] == 140_000_000  # the last token, without latencies
    assert any("request_rate" in w for w in result.warnings)


def test_vllm_bench_appended_results_need_a_choice(tmp_path):
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps(_vllm()) + "\n" + json.dumps(_vllm(request_rate=4.0, start_times=[0, 1, 2])))
    with pytest.raises(TraceFormatError, match="holds 2 results"):
        read_requests(path)
    assert read_requests(path, benchmark=1).table["arrival_ns"].to_pylist() == [0, 1_000_000_000, 2_000_000_000]


def _guidellm_request(rid: str, start: float, first: float | None, end: float, out: int,
                      error: str | None = None) -> dict:
    """A GuideLLM 0.7 GenerativeRequestStats as model_dump(mode="json") writes it (computed fields included)."""
    return {"type_": "generative_request_stats", "request_id": rid, "request_args": "{}", "output": "x" * out,
            "info": {"request_id": rid, "conversation_id": "conv", "turn_index": 1, "status": "completed",
                     "error": error,
                     "timings": {"request_start": start, "first_token_iteration": first,
                                 "last_token_iteration": end, "token_iterations": out, "request_end": end,
                                 "resolve_start": start - 0.001, "resolve_end": end + 0.001}},
            "input_metrics": {"text_tokens": 8, "total_tokens": 8}, "output_metrics": {"total_tokens": out},
            "request_start_time": start, "request_end_time": end, "prompt_tokens": 8, "output_tokens": out}


def test_guidellm_report(tmp_path):
    s = 1_760_000_000.0
    report = {"metadata": {"version": 2, "guidellm_version": "0.7.3"}, "config": {},
              "benchmarks": [{"type_": "generative_benchmark", "requests": {
                  "successful": [_guidellm_request("b", s + 1.0, s + 1.25, s + 2.0, 4),
                                 _guidellm_request("a", s, s + 0.5, s + 1.5, 2)],
                  "errored": [_guidellm_request("e", s + 0.5, None, s + 0.75, 0, error="timeout")],
                  "incomplete": [_guidellm_request("i", s + 3, None, s + 4, 0)], "total": None}}]}
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(report))
    result = read_requests(path)
    rows = result.table.to_pylist()
    assert result.source == "guidellm" and result.origin_ns == round(s * 1e9)
    assert [r["id"] for r in rows] == ["a", "e", "b"]
    a, e, b = rows
    assert a["ttft_ns"] == 500_000_000 and a["e2e_ns"] == 1_500_000_000 and a["tpot_ns"] == pytest.approx(1e9)
    assert b["tpot_ns"] == pytest.approx(750_000_000 / 3, rel=1e-6) and b["token_ns"] is None
    assert a["session"] == "conv" and a["turn"] == 1 and a["prompt_tokens"] == 8
    assert e["status"] == "error" and e["error"] == "timeout" and e["first_token_ns"] is None
    assert result.errors == {"timeout": 1}
    assert any("incomplete" in w for w in result.warnings) and any("token_ns" in w for w in result.warnings)


def test_guidellm_sweep_needs_a_choice(tmp_path):
    one = {"requests": {"successful": [_guidellm_request("a", 1.0, 1.5, 2.0, 2)], "errored": [], "incomplete": []}}
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps({"benchmarks": [one, one]}))  # GuideLLM 0.4 has no metadata
    with pytest.raises(TraceFormatError, match=r"benchmark=0\.\.1"):
        read_requests(path)
    assert read_requests(path, benchmark=1).table.num_rows == 1


def test_guidellm_03_flat_records(tmp_path):
    request = {"request_id": "a", "prompt_tokens": 4, "output_tokens": 3, "start_time": 10.0,
               "first_token_time": 10.2, "last_token_time": 10.6, "end_time": 10.6}
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps({"benchmarks": [{"requests": {"successful": [request], "errored": [],
                                                             "incomplete": []}}]}))
    row = read_requests(path).table.to_pylist()[0]
    assert row["ttft_ns"] == 200_000_000 and row["e2e_ns"] == 600_000_000 and row["output_tokens"] == 3


@pytest.mark.skipif(not (REAL_AIPERF / "profile_export.jsonl").exists(), reason="no real AIPerf run recorded")
def test_real_aiperf_run_matches_its_own_summary():
    """A real `aiperf profile` run against vLLM: the rows' TTFT and inter-chunk gaps give AIPerf's own figures."""
    result = read_requests(REAL_AIPERF / "profile_export.jsonl")
    summary = json.loads((REAL_AIPERF / "profile_export_aiperf.json").read_text())
    table = result.table
    assert table.num_rows == summary["request_count"]["avg"] and result.source == "aiperf"
    ttft = np.asarray(table["ttft_ns"].to_pylist(), dtype=float) / 1e6
    for q in (50, 90, 99):
        assert np.percentile(ttft, q) == pytest.approx(summary["time_to_first_token"][f"p{q}"], rel=1e-6)
    gaps = np.concatenate([np.diff(t) for t in table["token_ns"].to_pylist() if t]) / 1e6
    assert len(gaps) == summary["inter_chunk_latency"]["count"]
    assert gaps.mean() == pytest.approx(summary["inter_chunk_latency"]["avg"], rel=1e-6)
    assert table["arrival_ns"].to_pylist() == sorted(table["arrival_ns"].to_pylist())
    assert (np.asarray(table["end_ns"]) >= np.asarray(table["arrival_ns"])).all()


def test_a_real_guidellm_0_8_report_reads_as_guidellm_computed_it():
    """A report GuideLLM 0.8.1 wrote (against its mock server, 6 requests at 5/s): each request's TTFT and output
    tokens equal GuideLLM's own per-request figures."""
    path = Path(__file__).parent / "data" / "serving" / "guidellm" / "benchmarks.json"
    raw = json.loads(path.read_text())["benchmarks"][0]["requests"]["successful"]
    results = read_requests(path)
    rows = {row["id"]: row for row in results.table.to_pylist()}
    assert results.source == "guidellm" and len(rows) == len(raw) == 6
    for request in raw:
        row = rows[request["request_id"]]
        assert row["status"] == "ok" and row["output_tokens"] == request["output_tokens"]
        assert row["ttft_ns"] / 1e6 == pytest.approx(request["time_to_first_token_ms"], abs=1e-3)
