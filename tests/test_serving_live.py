"""Serving against a real engine: vLLM's CPU build serving a 2-layer Llama built in code, on 127.0.0.1, one
server for the whole module, loaded by a real AIPerf with bounded request counts.

Expected figures come from the raw files the generator and the engine wrote (AIPerf's JSON lines, the engine
worker's gzipped Kineto trace), never from the readers under test. The environments come from `make serving`
(`scripts/serving-env`); without them the module is skipped and says so.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from workbench.serving.engine import EngineSettings, launched_engine
from workbench.serving.model_folder import DEFAULT_MODEL, model_folder
from workbench.trace.store.bundle import list_bundles, open_bundle
from workbench.trace.store.experiment import read_experiment

SERVING = Path(os.environ.get("WORKBENCH_SERVING", Path(__file__).resolve().parents[1] / ".serving"))
ENGINE_PYTHON = SERVING / "vllm" / "bin" / "python"
AIPERF = SERVING / "aiperf" / "bin" / "aiperf"
STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)|execute(?:_\d+)?_context_(\d+)\("
                  r"sq(\d+)sk\d+[^)]*\)_generation_(\d+)\(sq(\d+)sk\d+[^)]*\)")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (ENGINE_PYTHON.is_file() and AIPERF.is_file()),
                       reason=f"no serving environments in {SERVING}: run `make serving` (vLLM CPU and AIPerf)"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One vLLM server for the module, profiler on, stopped (with its workers) at the end."""
    work = tmp_path_factory.mktemp("serving")
    os.environ.setdefault("WORKBENCH_CACHE", str(work / "cache"))
    folder, name = model_folder(DEFAULT_MODEL, {})
    profile_dir = work / "profile"
    settings = EngineSettings(python=str(ENGINE_PYTHON), model_dir=folder, served_name=name, profile_dir=profile_dir,
                              max_steps=5000, ready_timeout_s=600)
    with launched_engine(settings, work / "engine.log") as endpoint:
        yield {"endpoint": endpoint, "folder": folder, "profile_dir": profile_dir, "work": work}


def _workbench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True,
                          timeout=timeout)


def _serve(server: dict, root: Path, *args: str) -> subprocess.CompletedProcess:
    return _workbench("serve", "--url", server["endpoint"].url, "--tokenizer", str(server["folder"]),
                      "--profile-dir", str(server["profile_dir"]), "--aiperf", str(AIPERF), "--out", str(root),
                      "--json", *args)


def _raw_records(bundle) -> list[dict]:
    path = next(p for p in bundle.raw_files() if p.name == "profile_export.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _raw_steps(bundle) -> list[tuple[int, int, int, int]]:
    """(prefill requests, prefill tokens, decode requests, decode tokens) of each step annotation in the raw trace."""
    path = next(p for p in bundle.raw_files() if p.name.endswith(".json.gz"))
    with gzip.open(path, "rt") as file:
        events = json.load(file)["traceEvents"]
    steps = []
    for event in events:
        if event.get("cat") == "user_annotation" and (m := STEP.fullmatch(event.get("name", ""))):
            groups = [int(g) for g in m.groups() if g is not None]
            steps.append(tuple(groups))
    return steps


def test_a_bounded_load_gives_one_row_per_request_and_the_steps_of_the_raw_trace(server: dict, tmp_path: Path):
    done = _serve(server, tmp_path, "--rate", "8", "--requests", "12", "--isl", "32", "--osl", "8",
                  "--slo", "ttft=40ms,tpot=4ms")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    (point,) = reply["runs"]
    bundle = open_bundle(point["run"], tmp_path)
    requests = bundle.table("requests").to_pylist()
    raw = _raw_records(bundle)
    assert len(requests) == len(raw) == 12  # every sent request has one row
    by_id = {r["metadata"]["x_request_id"]: r for r in raw}
    for row in requests:
        record = by_id[row["id"]]
        assert row["status"] == "ok" and row["ttft_ns"] <= row["e2e_ns"]
        assert row["output_tokens"] == record["metrics"]["usage_completion_tokens"]["value"] == 8  # the server's usage
        assert row["prompt_tokens"] == 32
    # goodput: requests within both bounds, counted from AIPerf's own figures
    def tpot_ms(record: dict) -> float:
        e2e_ms = (record["metadata"]["request_end_ns"] - record["metadata"]["request_start_ns"]) / 1e6
        return (e2e_ms - record["metrics"]["time_to_first_token"]["value"]) / 7

    good = sum(1 for r in raw if r["metrics"]["time_to_first_token"]["value"] <= 40 and tpot_ms(r) <= 4)
    assert point["summary"]["good"] == good
    # steps: exactly the step annotations of the engine worker's raw trace, with their batches
    steps = bundle.table("steps").to_pylist()
    raw_steps = _raw_steps(bundle)
    assert len(steps) == len(raw_steps) > 0
    assert [(s["prefill_requests"], s["prefill_tokens"], s["decode_requests"], s["decode_tokens"]) for s in steps] == \
        raw_steps
    assert sum(s["prefill_tokens"] for s in steps) == 12 * 32  # each prompt computed once (no prefix reuse)
    # the join: each request's first token follows the prefill step that produced it, on one clock
    for row in requests:
        assert row["first_step"] is not None and row["queued_ns"] >= 0 and row["prefill_ns"] > 0
        first = steps[row["first_step"]]
        assert first["prefill_requests"] > 0 and first["start_ns"] >= row["arrival_ns"]
        assert first["start_ns"] + first["dur_ns"] <= row["first_token_ns"]
    # the engine's metrics, sampled on the same clock
    counters = bundle.trace().counters.to_pylist()
    served = [c["value"] for c in counters if c["name"] == "vllm:request_success_total"]
    assert served[-1] - served[0] == 12 and all(c["device"] == "server" for c in counters)


def test_a_rate_sweep_is_one_experiment_with_its_curve(server: dict, tmp_path: Path):
    done = _serve(server, tmp_path, "--rate", "4,16", "--requests", "6", "--isl", "16", "--osl", "4",
                  "--profile-window", "off")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    experiment = read_experiment(tmp_path, reply["experiment"])
    assert experiment.info["kind"] == "serving" and experiment.info["variants"] == ["rate-4", "rate-16"]
    assert [r["run"] for r in reply["runs"]] == experiment.run_ids
    assert [row["rate"] for row in reply["sweep"]["curve"]] == [4.0, 16.0]
    assert all(open_bundle(run, tmp_path).table("steps") is None for run in experiment.run_ids)  # window off


def test_a_requests_window_closes_the_profiler_after_n_requests(server: dict, tmp_path: Path):
    done = _serve(server, tmp_path, "--concurrency", "1", "--requests", "20", "--isl", "16", "--osl", "48",
                  "--profile-window", "requests:2")
    assert done.returncode == 0, done.stderr
    bundle = open_bundle(json.loads(done.stdout)["runs"][0]["run"], tmp_path)
    steps = bundle.table("steps").to_pylist()
    prefills = sum(s["prefill_requests"] for s in steps)
    # closed once two had finished (read every 50 ms), well before the twentieth: on two busy cores the profiler's
    # own stop (it writes the trace) lets the engine run a few more requests, 12 at most seen here
    assert 2 <= prefills <= 15


def test_ctrl_c_during_the_load_exits_130_keeps_nothing_and_stops_the_generator(server: dict, tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "serve", "--url", server["endpoint"].url,
                             "--tokenizer", str(server["folder"]), "--aiperf", str(AIPERF), "--out", str(tmp_path),
                             "--concurrency", "1", "--requests", "400", "--osl", "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _generator_running(proc.pid):
        time.sleep(0.5)
    assert _generator_running(proc.pid), "AIPerf never started"
    children = psutil.Process(proc.pid).children(recursive=True)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert not list_bundles(tmp_path) and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.info for p in alive]


def _generator_running(pid: int) -> bool:
    try:
        return any("aiperf" in " ".join(c.cmdline()) for c in psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return False


def test_the_notebook_serves_the_same_way(server: dict, tmp_path: Path):
    import workbench.notebook as wb

    bundles = wb.serve(server["endpoint"].url, tokenizer=str(server["folder"]), rate=[16], requests=4, isl=16, osl=4,
                       root=tmp_path, show=False, profile_dir=server["profile_dir"], window="load", aiperf=str(AIPERF))
    (bundle,) = bundles
    assert bundle.record.kind == "serving" and bundle.table("requests").num_rows == 4
    assert sum(s["prefill_requests"] for s in bundle.table("steps").to_pylist()) == 4


def test_vllm_bench_serve_is_the_fallback_generator(server: dict, tmp_path: Path):
    done = _serve(server, tmp_path, "--generator", "vllm-bench", "--engine-python", str(ENGINE_PYTHON), "--rate", "16",
                  "--requests", "6", "--isl", "16", "--osl", "4", "--profile-window", "off")
    assert done.returncode == 0, done.stderr
    (point,) = json.loads(done.stdout)["runs"]
    bundle = open_bundle(point["run"], tmp_path)
    raw = json.loads(next(p for p in bundle.raw_files() if p.name == "results.json").read_text())
    requests = bundle.table("requests").to_pylist()
    assert len(requests) == raw["num_prompts"] == 6 and all(r["source"] == "vllm-bench" for r in requests)
    assert [r["output_tokens"] for r in requests] == raw["output_lens"] == [4] * 6
    assert any("time.perf_counter" in w for w in point["warnings"])  # its clock is placed, and it says so


def test_multi_turn_sessions_with_a_shared_prefix_reuse_the_prefix_cache(server: dict, tmp_path: Path):
    done = _serve(server, tmp_path, "--concurrency", "2", "--requests", "8", "--sessions", "2", "--turns", "4",
                  "--shared-prefix", "160", "--isl", "32", "--osl", "4", "--endpoint", "chat",
                  "--profile-window", "off")
    assert done.returncode == 0, done.stderr
    bundle = open_bundle(json.loads(done.stdout)["runs"][0]["run"], tmp_path)
    turns: dict[str, list[int]] = {}
    for row in bundle.table("requests").to_pylist():
        turns.setdefault(row["session"], []).append(row["turn"])
    assert sorted(sorted(t) for t in turns.values()) == [[0, 1, 2, 3], [0, 1, 2, 3]]
    hits = [c["value"] for c in bundle.trace().counters.to_pylist() if c["name"] == "vllm:prefix_cache_hits_total"]
    assert hits[-1] > hits[0]  # the shared system prompt and earlier turns hit the prefix cache (whole KV blocks)
