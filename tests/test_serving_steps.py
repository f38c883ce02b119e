"""Engine steps (`workbench.serving.steps`): the step annotations of vLLM and SGLang traces as a `steps` table,
built at import and queryable. Expected figures come from the raw fixture files (json and gzip only)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import fixture_path, write_trace

from workbench.cli import main
from workbench.serving.steps import engine_steps, parse_step
from workbench.trace import read_trace

SERVING = ["vllm_decode_full/graph_execution.json.gz", "vllm_prefilldecode_piecewise/graph_execution.json.gz",
           "sglang_decode/sglang_Qwen3-8B_decode.json.gz", "sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz"]
EXECUTE = re.compile(r"execute_(\d+)_context_(\d+)\(sq(\d+)sk(\d+)sqsq\d+sqsk\d+\)_generation_(\d+)\(sq(\d+)sk(\d+)")


def _raw_steps(path: Path) -> list[dict]:
    """Per step of the raw file: its outer annotation span and the figures of its execute_ annotation, and the
    kernels whose launching runtime call (same correlation id) starts inside it on its thread."""
    with gzip.open(path, "rt") as raw:
        events = json.load(raw)["traceEvents"]
    marks = [e for e in events if e.get("cat") == "user_annotation" and e.get("ph") == "X"
             and (e["name"].startswith("execute_") or e["name"].startswith("step["))]
    outer = max(marks, key=lambda e: e["dur"])  # the fixtures hold one step each, one or two annotations deep
    assert all(outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] for e in marks)
    execute = next(e["name"] for e in marks if e["name"].startswith("execute_"))
    numbers = [int(x) for x in EXECUTE.match(execute).groups()]
    calls = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime"
             and (e["pid"], e["tid"]) == (outer["pid"], outer["tid"])
             and outer["ts"] <= e["ts"] < outer["ts"] + outer["dur"]}
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in calls]
    return [{"scheduled_tokens": numbers[0], "prefill_requests": numbers[1], "prefill_tokens": numbers[2],
             "prefill_context_tokens": numbers[3], "decode_requests": numbers[4], "decode_tokens": numbers[5],
             "decode_context_tokens": numbers[6], "kernels": len(kernels), "annotations": len(marks),
             "sglang": any(e["name"].startswith("step[") for e in marks)}]


@pytest.mark.parametrize("name", SERVING)
def test_steps_of_each_serving_fixture_match_its_raw_annotations(name):
    path = fixture_path("serving", *name.split("/"))
    expected = _raw_steps(path)
    steps = engine_steps(read_trace(path)).to_pylist()
    assert len(steps) == len(expected)  # two annotations of one SGLang step are one row
    for step, raw in zip(steps, expected, strict=True):
        for field in ("scheduled_tokens", "prefill_requests", "prefill_tokens", "prefill_context_tokens",
                      "decode_requests", "decode_tokens", "decode_context_tokens", "kernels"):
            assert step[field] == raw[field], field
        assert step["batch_requests"] == raw["prefill_requests"] + raw["decode_requests"]
        assert step["engine"] == ("sglang" if raw["sglang"] else "vllm")
        assert step["mode"] == {(True, False): "prefill", (False, True): "decode", (True, True): "mixed"}[
            (raw["prefill_requests"] > 0, raw["decode_requests"] > 0)]
        assert step["kernels"] > 400  # the graph-replayed kernels of the step are in it


def test_the_annotations_of_each_engine_parse():
    assert parse_step("execute_context_4(164)_generation_0(0)") == {
        "engine": "vllm", "prefill_requests": 4, "decode_requests": 0, "prefill_tokens": 164, "decode_tokens": 0,
        "scheduled_tokens": 164, "batch_requests": 4, "mode": "prefill"}
    assert parse_step("step[EXTEND bs=15 toks=15360]") == {
        "engine": "sglang", "mode": "prefill", "batch_requests": 15, "prefill_requests": 15, "scheduled_tokens": 15360}
    assert parse_step("step[DECODE bs=32]")["decode_requests"] == 32
    assert parse_step("step[IDLE]") == {"engine": "sglang", "mode": "idle"}
    for other in ("execute_model", "step", "execute_context_4(164)", "aten::mm", "step[decode bs=2]"):
        assert parse_step(other) is None


def _annotation(name: str, ts: int, dur: int, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_a_cpu_vllm_trace_gets_one_row_per_step_with_its_kernels(tmp_path):
    events = [_annotation("execute_context_4(164)_generation_0(0)", 0, 100),
              _annotation("execute_context_1(10)_generation_3(3)", 200, 50),
              _annotation("execute_context_0(0)_generation_4(4)", 300, 40, tid=2),
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 210, "dur": 20},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 212, "dur": 2,
               "args": {"correlation": 7}},
              {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 215, "dur": 30,
               "args": {"correlation": 7, "device": 0, "stream": 7}}]
    steps = engine_steps(read_trace(write_trace(tmp_path / "vllm.json", events))).to_pylist()
    assert [(s["mode"], s["prefill_requests"], s["prefill_tokens"], s["decode_requests"], s["scheduled_tokens"])
            for s in steps] == [("prefill", 4, 164, 0, 164), ("mixed", 1, 10, 3, 13), ("decode", 0, 0, 4, 4)]
    assert [s["kernels"] for s in steps] == [0, 1, 0] and steps[1]["kernel_ns"] == 30_000
    assert [s["step"] for s in steps] == [0, 1, 2] and steps[2]["tid"] == 2
    assert steps[0]["prefill_context_tokens"] is None  # the CPU build's annotation does not say


def test_sglang_step_inside_its_execute_annotation_is_one_step_and_a_lone_one_stands(tmp_path):
    events = [_annotation("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk100sqsq32sqsk100)", 0, 100),
              _annotation("step[DECODE bs=32]", 5, 90), _annotation("step[EXTEND bs=2 toks=300]", 200, 50)]
    steps = engine_steps(read_trace(write_trace(tmp_path / "sglang.json", events))).to_pylist()
    assert len(steps) == 2
    assert steps[0]["engine"] == "sglang" and steps[0]["dur_ns"] == 100_000 and steps[0]["decode_context_tokens"] == 100
    assert steps[0]["annotation"].startswith("execute_32_")
    assert (steps[1]["mode"], steps[1]["prefill_requests"], steps[1]["scheduled_tokens"]) == ("prefill", 2, 300)
    assert steps[1]["decode_requests"] is None


def test_import_writes_the_steps_table_and_sql_reads_it(tmp_path):
    path = fixture_path("serving", "vllm_prefilldecode_piecewise", "graph_execution.json.gz")
    out = tmp_path / "traces"
    imported = CliRunner().invoke(main, ["import", str(path), "--out", str(out), "--json"])
    assert imported.exit_code == 0, imported.output
    (run,) = json.loads(imported.output)
    query = "select mode, prefill_requests, decode_requests, kernels from steps"
    result = CliRunner().invoke(main, ["query", run, query, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rows"] == [["mixed", 9, 37, 413]]


def test_a_trace_without_step_annotations_has_no_steps_table(tmp_path):
    path = write_trace(tmp_path / "plain.json", [_annotation("ProfilerStep#1", 0, 10)])
    assert engine_steps(read_trace(path)) is None


def test_show_summarizes_the_steps_by_mode(tmp_path):
    events = [_annotation(f"execute_context_{p}({pt})_generation_{d}({d})", ts, dur)
              for p, pt, d, ts, dur in [(4, 164, 0, 0, 100), (1, 10, 3, 200, 50), (0, 0, 4, 300, 40),
                                        (0, 0, 2, 400, 60)]]
    out = tmp_path / "traces"
    imported = CliRunner().invoke(main, ["import", str(write_trace(tmp_path / "cpu.json", events)), "--out", str(out),
                                         "--json"])
    (run,) = json.loads(imported.output)
    shown = CliRunner().invoke(main, ["show", run, "--out", str(out), "--json"])
    steps = json.loads(shown.output)["steps"]
    assert steps["steps"] == 4 and steps["prefill_tokens"] == 174 and steps["decode_tokens"] == 9
    assert steps["by_mode"]["decode"] == {"steps": 2, "median_ms": 0.05, "p90_ms": pytest.approx(0.058),
                                          "mean_batch": 3.0, "median_kernels": 0.0}
    assert steps["by_mode"]["prefill"]["steps"] == steps["by_mode"]["mixed"]["steps"] == 1
    text = CliRunner().invoke(main, ["show", run, "--out", str(out)]).output
    assert "engine steps (4; prefill tokens 174, decode tokens 9)" in text and "decode" in text
