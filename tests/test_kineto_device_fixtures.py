"""The Kineto reader on real traces of devices other than a plain GPU: an MTIA inference trace and a CUPTI
range-profiler trace. Expected figures come from the raw JSON, classified here by the rules the reader
documents (`kineto_categories`), never from the reader."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict

import pytest
from conftest import fixture_path, load_raw
from test_kineto_parallel import assert_same_trace

from workbench.analysis.breakdown import kernel_time_by_device
from workbench.trace import read_trace
from workbench.trace.kineto import jsonstream
from workbench.trace.kineto.jsonstream import can_fork
from workbench.trace.kineto.reader import read_kineto

MTIA = "mtia_inference_rank0.json.gz"
CUPTI = "cupti_range_profiler.json.gz"


def _ns(us: float) -> int:
    return round(us * 1000)


def _mtia_kind(event: dict) -> str:
    """What an MTIA command-processor event is: DMA copies, stream syncs, or compute (HTA's kernels)."""
    name = event["name"]
    if name.startswith("dma"):
        return "memcpy"
    if name in ("event_wait", "event_record"):
        return "runtime"
    return "kernel"


@pytest.fixture(scope="module")
def mtia():
    path = fixture_path("kineto", MTIA)
    return read_trace(path), load_raw(path)


@pytest.fixture(scope="module")
def cupti():
    path = fixture_path("kineto", CUPTI)
    return read_trace(path), load_raw(path)


def test_mtia_device_events_by_kind_count_and_time(mtia):
    trace, raw = mtia
    expected_n: Counter[str] = Counter()
    expected_ns: dict[str, int] = defaultdict(int)
    for e in raw["traceEvents"]:
        if e.get("cat") == "mtia_ccp_events":
            expected_n[_mtia_kind(e)] += 1
            expected_ns[_mtia_kind(e)] += _ns(e["dur"])
    ccp_device = {e["pid"] for e in raw["traceEvents"] if e.get("cat") == "mtia_ccp_events"}
    assert ccp_device == {17}
    df = trace.df()
    device_side = df[(df["device"] == "mtia:17") & df["kind"].isin(["kernel", "memcpy"])]
    waits = df[(df["device"] == "mtia:17") & df["name"].isin(["event_wait", "event_record"])]
    got_n = {**device_side["kind"].astype(str).value_counts().to_dict(), "runtime": len(waits)}
    got_ns = {**device_side.groupby("kind", observed=True)["dur_ns"].sum().to_dict(),
              "runtime": int(waits["dur_ns"].sum())}
    assert got_n == dict(expected_n)
    assert {k: int(v) for k, v in got_ns.items()} == dict(expected_ns)
    assert set(waits["kind"].astype(str)) == {"runtime"}
    # kernel time is compute only: event_wait (43% of the device events' time) is not in it
    assert kernel_time_by_device(trace) == {"mtia:17": expected_ns["kernel"]}
    assert expected_ns["runtime"] > 0.4 * sum(expected_ns.values())


def test_mtia_devices_tracks_and_bytes(mtia):
    trace, raw = mtia
    events = raw["traceEvents"]
    df = trace.df()
    assert set(df["device"].astype(str)) == {"cpu", "mtia:17"}
    assert [d["device"] for d in trace.metadata["devices"]] == ["mtia:17"]
    ccp = df[df["device"] == "mtia:17"]
    expected_tracks = Counter(f"mtia:17/stream {e['args']['stream']}" for e in events
                              if e.get("cat") == "mtia_ccp_events")
    # mtia_runtime calls recorded in the device's process (pid 17) are on its threads
    expected_tracks.update(f"mtia:17/thread {e['tid']}" for e in events
                           if e.get("cat") == "mtia_runtime" and e["pid"] == 17)
    assert Counter(ccp["track"].astype(str)) == expected_tracks
    runtime = df[df["name"].isin({e["name"] for e in events if e.get("cat") == "mtia_runtime"})]
    assert set(runtime["kind"].astype(str)) == {"runtime"}
    host_calls = sum(e.get("cat") == "mtia_runtime" and e["pid"] != 17 for e in events)
    assert int((runtime["device"] == "cpu").sum()) == host_calls
    copies = df[df["kind"] == "memcpy"]
    assert copies["bytes"].sum() == sum(e["args"]["size"] for e in events if e.get("name") == "dma_request")
    on_device = [e for e in events if e.get("cat") in ("mtia_ccp_events", "mtia_runtime") and e["pid"] == 17]
    with_corr = [e["args"]["correlation"] for e in on_device if "correlation" in e["args"]]
    assert Counter(df.loc[df["device"].eq("mtia:17") & df["corr"].ge(0), "corr"].tolist()) == Counter(with_corr)


def test_mtia_every_record_is_accounted_for(mtia):
    trace, raw = mtia
    events = raw["traceEvents"]
    flows = sum(e.get("ph") in ("s", "t", "f") for e in events)
    meta = sum(e.get("ph") == "M" for e in events)
    assert trace.events.num_rows + flows + meta == len(events)
    assert trace.metadata["reader"]["skipped"] == {"flow events (links kept as correlation ids)": flows,
                                                   "metadata records (kept in metadata processes/threads)": meta}


def test_cupti_ranges_are_device_annotations_with_their_counters(cupti):
    trace, raw = cupti
    ranges = sorted((e for e in raw["traceEvents"] if e.get("cat") == "cuda_profiler_range"), key=lambda e: e["ts"])
    df = trace.df()
    got = df[df["track"] == "cuda:0/profiler ranges"].sort_values("start_ns")
    assert len(got) == len(ranges) == 77
    assert set(got["kind"].astype(str)) == {"annotation"} and set(got["device"].astype(str)) == {"cuda:0"}
    assert got["name"].tolist() == [e["name"] for e in ranges]
    assert int(got["dur_ns"].sum()) == sum(_ns(e["dur"]) for e in ranges)
    assert [json.loads(a) for a in got["args"]] == [e["args"] for e in ranges]  # counters stay in args
    assert "kernel" not in trace.kind_counts()  # the ranges' times are the profiler's, not kernel time


def test_cupti_counters_table(cupti):
    trace, raw = cupti
    ranges = [e for e in raw["traceEvents"] if e.get("cat") == "cuda_profiler_range"]
    origin_us = min(e["ts"] for e in raw["traceEvents"] if e.get("ph") not in ("M", "s", "t", "f") and "ts" in e)
    counters = trace.df("counters")
    assert set(counters["device"].astype(str)) == {"cuda:0"}
    expected = Counter()
    for e in ranges:
        for key, value in e["args"].items():
            expected[(key, _ns(e["ts"] - origin_us))] += value
    got = Counter()
    for name, ts, value in zip(counters["name"].astype(str), counters["ts_ns"], counters["value"], strict=True):
        got[(name, int(ts))] += value
    assert got == expected
    assert len(counters) == sum(len(e["args"]) for e in ranges)


@pytest.mark.skipif(not can_fork(), reason="worker processes are forked, on Linux only")
@pytest.mark.parametrize("name", [MTIA, CUPTI])
def test_parallel_equals_one_process(tmp_path, monkeypatch, name):
    path = tmp_path / name.removesuffix(".gz")
    path.write_bytes(gzip.decompress(fixture_path("kineto", name).read_bytes()))
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", 1 << 15)
    parallel = read_kineto(path, workers=2)
    assert_same_trace(parallel, read_kineto(path, workers=1))
    monkeypatch.setattr(jsonstream, "BLOCK_BYTES", 64 << 20)
    assert_same_trace(parallel, read_kineto(path, workers=1))  # and the same as one chunk
