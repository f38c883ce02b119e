"""The synthetic Kineto trace generator used by benchmarks/ingest.py writes valid, realistic traces."""

from __future__ import annotations

import collections
import gzip
import itertools
import json
import re
import sys
from decimal import Decimal
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synthetic_kineto import CATEGORIES, write_synthetic_trace

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "kineto"
FULL_STEP = 14628
"""Events in one full step (24 layers); the fixed events outside steps are 18."""


def category(event: dict) -> str:
    """The `write_synthetic_trace` count an event belongs to."""
    if event["ph"] in "sf":
        return "flow"
    if event["ph"] == "M":
        return "metadata"
    if event.get("name") == "[memory]":
        return "memory"
    if event.get("cat") == "Trace" or event["ph"] == "i":
        return "trace"
    return event["cat"]


def ns(value: Decimal) -> int:
    """A Kineto µs timestamp as integer ns, exactly."""
    return int(value * 1000)


def load(path: Path) -> dict:
    return json.loads(path.read_text(), parse_float=Decimal)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    """Two full steps and a partial one: (path, returned counts, parsed trace)."""
    path = tmp_path_factory.mktemp("synthetic") / "trace.pt.trace.json"
    counts = write_synthetic_trace(path, 30_000, seed=3)
    return path, counts, load(path)


@pytest.mark.parametrize("events", [522, 523, 5_000, FULL_STEP + 18, FULL_STEP + 18 + 100, 30_001])
def test_writes_exactly_the_requested_events(tmp_path: Path, events: int) -> None:
    path = tmp_path / "t.json"
    counts = write_synthetic_trace(path, events)
    parsed = load(path)
    assert len(parsed["traceEvents"]) == events
    assert set(counts) == set(CATEGORIES)
    assert sum(counts.values()) == events
    found = collections.Counter(map(category, parsed["traceEvents"]))
    assert counts == {**dict.fromkeys(CATEGORIES, 0), **found}


def test_rejects_fewer_events_than_one_step(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 522 events"):
        write_synthetic_trace(tmp_path / "t.json", 521)


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    counts = write_synthetic_trace(a, 8_000, seed=1)
    assert write_synthetic_trace(b, 8_000, seed=1) == counts
    assert write_synthetic_trace(c, 8_000, seed=2) == counts
    assert a.read_bytes().replace(b"a.json", b"b.json") == b.read_bytes()
    assert a.read_bytes().replace(b"a.json", b"c.json") != c.read_bytes()


def test_mix_is_roughly_a_training_trace(trace: tuple[Path, dict, dict]) -> None:
    _, counts, _ = trace
    share = {k: v / sum(counts.values()) for k, v in counts.items()}
    assert 0.28 < share["cpu_op"] < 0.40
    assert 0.10 < share["cuda_runtime"] < 0.22
    assert 0.09 < share["kernel"] < 0.18
    assert 0.20 < share["flow"] < 0.34
    assert 0.06 < share["memory"] < 0.14
    assert all(counts[k] > 0 for k in CATEGORIES)


def test_layout_is_kinetos(trace: tuple[Path, dict, dict]) -> None:
    path, _, parsed = trace
    text = path.read_text()
    assert text.startswith('\n{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {\n      "id": 0, ')
    assert list(parsed)[:3] == ["schemaVersion", "deviceProperties", "distributedInfo"]
    assert list(parsed)[-4:] == ["traceEvents", "traceName", "displayTimeUnit", "baseTimeNanoseconds"]
    assert [d["name"] for d in parsed["deviceProperties"]] == ["NVIDIA H100 80GB HBM3"]
    assert parsed["distributedInfo"]["rank"] == 0
    assert re.search(r'\n  \{\n    "ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": \d+, '
                     r'"tid": \d+,\n    "ts": \d+\.\d{3}, "dur": \d+\.\d{3},\n    "args": \{\n'
                     r'      "External id": \d+,', text)
    assert text.endswith(f'\n  ],\n  "traceName": "{path}",\n  "displayTimeUnit": "ms",\n'
                         '  "baseTimeNanoseconds": 1735632360000000000\n}')
    stamps = re.findall(r'"(?:ts|dur)": ([^,\n]+)', text)
    assert len(stamps) > len(parsed["traceEvents"])
    assert all(re.fullmatch(r"\d+\.\d{3}", s) for s in stamps)


def _shapes(events: list[dict]) -> dict[tuple[str, str], tuple[list[str], set[str]]]:
    """(ph, cat) -> (event keys in order, every args key seen)."""
    out: dict[tuple[str, str], tuple[list[str], set[str]]] = {}
    for e in events:
        kind = e["ph"], e.get("cat", e.get("name", ""))
        out.setdefault(kind, (list(e), set()))[1].update(e.get("args", {}))
    return out


def test_events_have_the_keys_real_traces_have(trace: tuple[Path, dict, dict]) -> None:
    real = [FIXTURES / "ns_resolution_rank0.pt.trace.json.gz", FIXTURES / "amd_mi250_train.json.gz"]
    if not all(p.exists() for p in real):
        pytest.skip("shared Kineto fixtures not available")
    ours = _shapes(trace[2]["traceEvents"])
    theirs: dict[tuple[str, str], tuple[list[str], set[str]]] = {}
    for p in real:
        with gzip.open(p) as f:
            for kind, (keys, args) in _shapes(json.load(f)["traceEvents"]).items():
                theirs.setdefault(kind, (keys, set()))[1].update(args)
    for kind in [("X", "cpu_op"), ("X", "user_annotation"), ("X", "cuda_runtime"), ("X", "kernel"),
                 ("X", "gpu_memcpy"), ("X", "gpu_memset"), ("X", "gpu_user_annotation"), ("s", "ac2g"),
                 ("f", "ac2g"), ("s", "fwdbwd"), ("f", "fwdbwd"), ("X", "Trace")]:
        assert ours[kind][0] == theirs[kind][0], kind
        assert ours[kind][1] <= theirs[kind][1], (kind, ours[kind][1] - theirs[kind][1])
    assert ours[("i", "cpu_instant_event")][1] == {"Device Type", "Device Id", "Addr", "Bytes",
                                                  "Total Allocated", "Total Reserved", "Ev Idx"}


def test_cpu_events_nest_per_thread(trace: tuple[Path, dict, dict]) -> None:
    threads = collections.defaultdict(list)
    for e in trace[2]["traceEvents"]:
        if e["ph"] == "X" and e["cat"] in ("cpu_op", "user_annotation", "cuda_runtime"):
            threads[e["tid"]].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e))
    assert len(threads) == 2
    for events in threads.values():
        stack: list[tuple[int, int, dict]] = []
        for start, end, e in sorted(events, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1][1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1][1], (e, stack[-1][2])
            if e["cat"] == "cuda_runtime":  # a runtime call sits in the op that made it
                assert stack and stack[-1][2]["args"]["External id"] == e["args"]["External id"]
            else:
                assert stack or e["name"].startswith(("ProfilerStep#", "autograd::engine::evaluate_function"))
            stack.append((start, end, e))


def test_gpu_work_links_to_its_launch(trace: tuple[Path, dict, dict]) -> None:
    events = trace[2]["traceEvents"]
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    assert len(runtime) == sum(e.get("cat") == "cuda_runtime" for e in events)
    ops = {e["args"]["External id"] for e in events if e.get("cat") == "cpu_op"}
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    for e in gpu:
        launch = runtime[e["args"]["correlation"]]
        assert launch["name"] in ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync")
        assert e["args"]["External id"] == launch["args"]["External id"] in ops
        assert (e["pid"], e["tid"]) == (0, 7) and ns(e["ts"]) > ns(launch["ts"])
    spans = sorted((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in gpu)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # one stream: no overlap


def test_flows_pair_up(trace: tuple[Path, dict, dict]) -> None:
    events = trace[2]["traceEvents"]
    flows = collections.defaultdict(list)
    for e in events:
        if e["ph"] in "sf":
            flows[e["cat"], e["id"]].append(e)
    gpu = {e["args"]["correlation"]: e for e in events
           if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    for (cat, fid), pair in flows.items():
        phases = sorted(e["ph"] for e in pair)
        if cat == "ac2g" and fid not in gpu:  # runtime call without GPU work: a lone flow end, as Kineto has
            assert phases == ["f"] and pair[0]["pid"] != 0
            continue
        assert phases == ["f", "s"], (cat, fid)
        end = next(e for e in pair if e["ph"] == "f")
        assert end["bp"] == "e"
        if cat == "ac2g":
            assert end["ts"] == gpu[fid]["ts"] and (end["pid"], end["tid"]) == (0, 7)
    # a forward op and its backward node share the sequence number; the node is on the autograd thread
    by_start = {(e["tid"], e["ts"]): e for e in events if e.get("cat") == "cpu_op"}
    for (cat, _), pair in flows.items():
        if cat == "fwdbwd":
            start, end = sorted(pair, key=lambda e: e["ph"], reverse=True)
            forward, node = by_start[start["tid"], start["ts"]], by_start[end["tid"], end["ts"]]
            assert forward["args"]["Sequence number"] == node["args"]["Sequence number"]
            assert node["name"].endswith("Backward0") and start["tid"] != end["tid"]


def test_memory_events_add_up(trace: tuple[Path, dict, dict]) -> None:
    memory = sorted((e for e in trace[2]["traceEvents"] if e.get("name") == "[memory]"),
                    key=lambda e: e["args"]["Ev Idx"])
    allocated = reserved = 0
    live: dict[int, int] = {}
    for e in memory:
        args = e["args"]
        allocated += args["Bytes"]
        assert args["Total Allocated"] == allocated >= 0
        assert args["Total Reserved"] >= max(reserved, allocated)
        reserved = args["Total Reserved"]
        if args["Bytes"] > 0:  # a live block's address is not handed out again until it is freed
            assert args["Addr"] not in live
            live[args["Addr"]] = args["Bytes"]
        else:
            assert live.pop(args["Addr"]) == -args["Bytes"]
    assert allocated == 0 and not live


@pytest.mark.filterwarnings("ignore:The inplace keyword")  # HTA 0.5 on pandas 3
def test_hta_loads_it(trace: tuple[Path, dict, dict], tmp_path: Path) -> None:
    analysis = pytest.importorskip("hta.trace_analysis")
    (tmp_path / "rank0.pt.trace.json").symlink_to(trace[0])
    frame = analysis.TraceAnalysis(trace_dir=str(tmp_path)).t.get_trace(0)
    assert len(frame) > 5_000
