"""The critical path of a step (`workbench.analysis.critical_path`): hand-built traces whose paths are worked out
here by hand, and the real GPU fixtures, whose figures are read from the raw files."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import fixture_path, load_raw, write_trace
from workbench.analysis.critical_path import critical_path, finding_path_share, path_summary, step_spans
from workbench.errors import WorkbenchError
from workbench.trace.registry import read_trace

US = 1000  # the hand-built traces are in µs (Kineto's unit); the path is in ns


def _host(name: str, ts: float, dur: float, cat: str = "cuda_runtime", **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def _device(name: str, ts: float, dur: float, stream: int, corr: int, cat: str = "kernel",
            **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, **args}}


def _step(end: float) -> dict[str, Any]:
    return _host("ProfilerStep#0", 0, end, cat="user_annotation")


def _path(tmp_path: Path, events: list[dict[str, Any]]):
    return critical_path(read_trace(write_trace(tmp_path / "t.json", events)))


def _segments(path) -> list[tuple[str, str, int]]:
    return [(r.kind, r.name, r.dur_ns // US) for r in path.segments.itertuples()]


def test_event_wait_across_streams(tmp_path: Path) -> None:
    # Kernel A (stream 7) runs 5..45; B (stream 8) waits for A's event and runs 46..66; C follows A on stream 7
    # (46..56) but nothing waits for it but the device sync (14..68), which returns when B, the last, is done.
    path = _path(tmp_path, [
        _step(100),
        _host("cudaLaunchKernel", 1, 2, correlation=1), _device("A", 5, 40, 7, 1),
        _host("cudaEventRecord", 4, 1, correlation=2),
        _host("cudaStreamWaitEvent", 6, 1, correlation=3),
        _device("Stream Wait Event", 7, 0, 8, 3, cat="cuda_sync", wait_on_stream=7,
                wait_on_cuda_event_record_corr_id=2),
        _host("cudaLaunchKernel", 8, 2, correlation=4), _device("B", 46, 20, 8, 4),
        _host("cudaLaunchKernel", 11, 2, correlation=5), _device("C", 46, 10, 7, 5),
        _host("cudaDeviceSynchronize", 14, 54, correlation=6),
    ])
    # step start 0 → A's launch at 1 (the step's own time, 1) → A starts at 5 (launch latency 4) → A (40) → B starts
    # 1 after A's end (the event wait, not B's launch at 8) → B (20) → the sync returns 2 after B → the step's own
    # time to its end at 100 (32): 1 + 4 + 40 + 1 + 20 + 2 + 32 = 100.
    assert _segments(path) == [("cpu op", "ProfilerStep#0", 1), ("launch latency", "A", 4), ("kernel", "A", 40),
                               ("wait", "cudaStreamWaitEvent", 1), ("kernel", "B", 20),
                               ("wait", "cudaDeviceSynchronize", 2), ("cpu op", "ProfilerStep#0", 32)]
    assert path.length_ns == path.step_ns == 100 * US
    assert path.what_if({}) == 100 * US
    # A twice as fast: A ends at 25, B runs 26..46, the sync returns at 48, the step ends 32 later at 80.
    assert path.what_if({"A": 2}) == 80 * US
    # C is off the path: no speed-up of it shortens the step.
    assert path.what_if({"C": 2}) == path.what_if({"C": 100}) == 100 * US
    # A finding that names its kernels covers their time on the path: A's 40 of 100; C's none.
    for names, share in ((["A"], 0.4), (["C"], 0.0), (["A", "C"], 0.4)):
        finding = {"kind": "memory_bound", "device": "cuda:0", "evidence": {"top": [{"name": n} for n in names]}}
        assert finding_path_share(finding, path) == pytest.approx(share)
    chain = {"kind": "unfused_elementwise", "device": "cuda:0", "evidence": {"top_patterns": [{"ops": "C → A"}]}}
    assert finding_path_share(chain, path) == pytest.approx(0.4)
    assert finding_path_share({**chain, "device": "cuda:1"}, path) == 0.0


def test_sync_serializes_host_and_device(tmp_path: Path) -> None:
    # K1 runs 5..55 while the host waits in cudaStreamSynchronize (4..57); only then does aten::relu (58..68) run and
    # launch K2 (60..62 → 64..70), which nothing waits for.
    path = _path(tmp_path, [
        _step(72),
        _host("cudaLaunchKernel", 1, 2, correlation=1), _device("K1", 5, 50, 7, 1),
        _host("cudaStreamSynchronize", 4, 53, correlation=2),
        _host("aten::relu", 58, 10, cat="cpu_op"),
        _host("cudaLaunchKernel", 60, 2, correlation=3), _device("K2", 64, 6, 7, 3),
    ])
    # 1 (step) + 4 (launch) + 50 (K1) + 2 (the sync returns) + 1 (step) + 2 (relu) + 2 (launch call) + 6 (relu)
    # + 4 (step) = 72
    assert _segments(path) == [("cpu op", "ProfilerStep#0", 1), ("launch latency", "K1", 4), ("kernel", "K1", 50),
                               ("wait", "cudaStreamSynchronize", 2), ("cpu op", "ProfilerStep#0", 1),
                               ("cpu op", "aten::relu", 2), ("cpu op", "cudaLaunchKernel", 2),
                               ("cpu op", "aten::relu", 6), ("cpu op", "ProfilerStep#0", 4)]
    assert path.length_ns == 72 * US
    assert path.what_if({"K1": 2}) == (72 - 25) * US  # the host waits 25 less for K1
    assert path.what_if({"K2": 2}) == 72 * US  # K2 is off the path
    # relu's whole call, its nested launch call included (2 + 2 + 6 = 10), twice as fast: 5 saved
    assert path.what_if({"aten::relu": 2}) == (72 - 5) * US
    # the launch call inside keeps its own time when it is named too (innermost factor wins): (2 + 6) / 2 = 4 saved
    assert path.what_if({"aten::relu": 2, "cudaLaunchKernel": 1}) == (72 - 4) * US


def test_graph_launch_reaches_each_replayed_kernel(tmp_path: Path) -> None:
    # One cudaGraphLaunch (2..12) replays G1 20..30, G2 31..46, G3 47..52 (all with its correlation id); the stream
    # sync (14..54, with Kineto's Stream Sync record naming stream 7) waits for G3.
    path = _path(tmp_path, [
        _step(56),
        _host("cudaGraphLaunch", 2, 10, correlation=9),
        _device("G1", 20, 10, 7, 9), _device("G2", 31, 15, 7, 9), _device("G3", 47, 5, 7, 9),
        _host("cudaStreamSynchronize", 14, 40, correlation=10),
        _device("Stream Sync", 52, 2, 7, 10, cat="cuda_sync"),
    ])
    # 2 (step) + 18 (the graph launch to G1) + 10 + 1 + 15 + 1 + 5 (G1, gap, G2, gap, G3) + 2 (sync) + 2 (step) = 56
    assert _segments(path) == [("cpu op", "ProfilerStep#0", 2), ("launch latency", "G1", 18), ("kernel", "G1", 10),
                               ("launch latency", "G2", 1), ("kernel", "G2", 15), ("launch latency", "G3", 1),
                               ("kernel", "G3", 5), ("wait", "cudaStreamSynchronize", 2),
                               ("cpu op", "ProfilerStep#0", 2)]
    assert path.length_ns == 56 * US
    assert path.what_if({"G2": 2}) == 56 * US - 7_500  # 15 µs halved
    # the kernels hang on the graph launch: a faster launch call does not move them (launches run from its start)
    assert path.what_if({"cudaGraphLaunch": 10}) == 56 * US


def test_a_thread_waiting_on_another_hands_the_path_over(tmp_path: Path) -> None:
    # The main thread (tid 1) runs "fwd" (1..20), idles inside its step while an autograd-like thread (tid 2) runs
    # "bwd1" (25..40) and "bwd2" (42..65), and resumes with "opt" (70..90). A logging thread (tid 3) runs "log"
    # (50..52): a burst filling 2 of the 50 idle µs, under HANDOFF_COVER, so no one waits on it.
    def on(tid: int, name: str, ts: float, dur: float) -> dict[str, Any]:
        return {**_host(name, ts, dur, cat="cpu_op"), "tid": tid}
    path = _path(tmp_path, [_step(100), on(1, "fwd", 1, 19), on(2, "bwd1", 25, 15), on(2, "bwd2", 42, 23),
                            on(3, "log", 50, 2), on(1, "opt", 70, 20)])
    # step own 1 → fwd 19 → the fork (20 → bwd1's start at 25: 5) → bwd1 15 → tid 2 idle 2 → bwd2 23 → the join
    # (bwd2's end 65 → opt's start 70: 5, the step waiting) → opt 20 → step own 10: 1+19+5+15+2+23+5+20+10 = 100.
    assert _segments(path) == [("cpu op", "ProfilerStep#0", 1), ("cpu op", "fwd", 19), ("thread handoff", "bwd1", 5),
                               ("cpu op", "bwd1", 15), ("untraced", "(untraced host time)", 2),
                               ("cpu op", "bwd2", 23), ("thread handoff", "ProfilerStep#0", 5),
                               ("cpu op", "opt", 20), ("cpu op", "ProfilerStep#0", 10)]
    assert path.length_ns == 100 * US
    assert path.what_if({"bwd2": 2}) == 100 * US - 23 * US // 2  # the waited-on thread's op is on the path
    assert path.what_if({"log": 100}) == 100 * US


def test_bad_speedups_and_steps_are_refused(tmp_path: Path) -> None:
    path = _path(tmp_path, [_step(10), _host("cudaLaunchKernel", 1, 2, correlation=1), _device("K", 4, 3, 7, 1)])
    for bad in ({"K": 0}, {"K": -1.0}, {"K": float("nan")}, {"nope": 2}, {123456: 2}):
        with pytest.raises(WorkbenchError):
            path.what_if(bad)
    with pytest.raises(WorkbenchError, match="no step 3"):
        critical_path(read_trace(tmp_path / "t.json"), step=3)


# --- real fixtures -----------------------------------------------------------------------------------------------


def _check_real(path) -> None:
    assert abs(path.length_ns - path.step_ns) <= 0.01 * path.step_ns
    assert path.what_if({}) == path.length_ns
    assert path.segments["dur_ns"].sum() == path.length_ns
    on_path = set(path.segments["name"])
    off = sorted({str(n) for n in path.graph.name} - on_path)  # kernels where some are off the path, else ops
    device_off = [name for name in path.graph.device_time() if name not in on_path]
    assert off
    assert path.what_if({(device_off or off)[0]: 2}) == path.length_ns


def test_resnet_step(tmp_path: Path) -> None:
    file = fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz")
    raw = load_raw(file)["traceEvents"]
    steps = sorted((e for e in raw if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    trace = read_trace(file)
    assert step_spans(trace)["end_ns"].sub(step_spans(trace)["start_ns"]).tolist() == \
        [round(e["dur"] * US) for e in steps]
    path = critical_path(trace, 0)
    assert path.step_ns == round(steps[0]["dur"] * US)
    _check_real(path)
    # The step's pageable input copy is on the path: the cudaStreamSynchronize after it returns 6 µs after it ends.
    # Halving the copy lets that sync return as soon as it is called, so the step saves the sync's own duration
    # (83 µs: less than half the copy, 970 µs).
    copy = next(e for e in raw if e.get("cat") == "Memcpy" and steps[0]["ts"] <= e["ts"] < steps[0]["ts"] + 1e5)
    sync = next(e for e in raw if e.get("name") == "cudaStreamSynchronize" and e["ts"] > copy["ts"])
    row = int(path.segments.loc[path.segments["kind"] == "memcpy", "row"].iloc[0])
    saved = path.length_ns - path.what_if({row: 2})
    assert saved == min(round(copy["dur"] * US / 2), round(sync["dur"] * US))


def test_vllm_graph_step() -> None:
    file = fixture_path("serving", "vllm_decode_full", "graph_execution.json.gz")
    raw = load_raw(file)["traceEvents"]
    path = critical_path(read_trace(file))
    _check_real(path)
    # The graph's replayed kernels run back to back long after their launch, so halving the longest one (the last)
    # shortens the step by half its duration.
    longest = max((e for e in raw if e.get("cat") == "kernel"), key=lambda e: e["dur"])
    segment = path.segments[path.segments["name"] == longest["name"]]
    assert segment["dur_ns"].max() == round(longest["dur"] * US)
    row = int(segment.loc[segment["dur_ns"].idxmax(), "row"])
    assert path.length_ns - path.what_if({row: 2}) == round(longest["dur"] * US / 2)
    summary = path_summary(path)
    assert json.loads(json.dumps(summary))["length_ns"] == path.length_ns


def test_nsys_two_processes() -> None:
    file = fixture_path("nsys", "h100_2gpu_1s.sqlite")
    path = critical_path(read_trace(file))
    _check_real(path)
    tables = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
    work = " UNION ALL ".join(f"SELECT globalPid / 16777216 % 16777216 AS pid, start, end FROM {t}" for t in tables)
    with sqlite3.connect(file) as db:
        ends = dict(db.execute(f"SELECT pid, max(end) FROM ({work}) GROUP BY pid").fetchall())
        start, end, pid = db.execute("SELECT start, end, globalPid / 16777216 % 16777216 FROM "
                                     "CUPTI_ACTIVITY_KIND_MEMCPY ORDER BY end - start DESC LIMIT 1").fetchone()
    # Each process copies its input for 151 ms, and the step ends with the last device work of either. The path runs
    # through the longest copy (process 111's, which finishes last); halving it saves half the copy or, where the other
    # process then finishes last, what 111 finished after it: min(151.75 ms / 2, 111's end - 112's end = 112 µs).
    on = path.segments[path.segments["dur_ns"] == end - start]
    assert len(on) == 1 and on["kind"].iloc[0] == "memcpy"
    assert ends[pid] == max(ends.values())
    other = max(e for p, e in ends.items() if p != pid)
    saved = path.length_ns - path.what_if({int(on["row"].iloc[0]): 2})
    assert saved == min((end - start) // 2, ends[pid] - other)


def test_surfaces_carry_the_path(tmp_path: Path) -> None:
    """`workbench analyze --json` has the path's summary and ranks findings on it; `wb.critical_path` returns its
    segments; the panel draws them, names as text."""
    from bokeh.models import DataTable, Div
    from click.testing import CliRunner

    import workbench.notebook as wb
    from workbench.cli import main
    from workbench.views.critical_path import SEGMENTS_TABLE, critical_path_panel

    evil = "<img src=x onerror=alert(1)>"
    trace_file = write_trace(tmp_path / "t.json", [
        _step(72), _host("cudaLaunchKernel", 1, 2, correlation=1), _device(evil, 5, 50, 7, 1),
        _host("cudaStreamSynchronize", 4, 53, correlation=2),
    ])
    root = tmp_path / "root"
    runner = CliRunner()
    imported = runner.invoke(main, ["import", str(trace_file), "--out", str(root), "--json"])
    (run,) = json.loads(imported.stdout)
    result = runner.invoke(main, ["analyze", run, "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    path = critical_path(read_trace(trace_file))
    assert data["critical_path"] == json.loads(json.dumps(path_summary(path)))
    assert data["critical_path"]["length_ns"] == 72 * US
    assert data["critical_path"]["what_if"][0] == {  # the only kernel: halving its 50 µs saves 25
        "name": evil, "path_share": 50 / 72, "device_share": 1.0, "speedup": 2.0, "saves_ns": 25 * US,
        "saves_share": 25 / 72}
    assert all("path_share" in f for f in data["findings"])
    text = runner.invoke(main, ["analyze", run, "--out", str(root)])
    assert "critical path" in text.output and "saves 25 µs" in text.output
    table = wb.critical_path(run, root=root)
    assert table["dur_ns"].sum() == 72 * US and table.attrs["path"].what_if({evil: 2}) == 47 * US
    panel = critical_path_panel(path)
    segments = panel.select_one({"name": SEGMENTS_TABLE})
    assert isinstance(segments, DataTable) and evil in segments.source.data["name"]
    assert all(div.render_as_text for div in panel.select({"type": Div}))


def test_a_trace_without_events_in_its_step_has_no_path_and_says_so(tmp_path: Path) -> None:
    # only a GPU kernel with no host step around it: the trace's one window holds no host or device work to chain
    trace = read_trace(write_trace(tmp_path / "t.json", [_device("K", 0, 0, 7, 1, cat="ac2g")]))
    with pytest.raises(WorkbenchError, match="critical path"):
        critical_path(trace)
