"""Counter tracks (memory over time, device busy per stream, counters, server metrics) and their view, checked
against the raw fixture files and hand-built traces whose expected values are worked out by hand."""

from __future__ import annotations

import sqlite3
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from bokeh.models import CheckboxGroup, ColumnDataSource, CustomJS, PlainText, Range1d
from conftest import fixture_path, load_raw

from workbench.analysis.counter_tracks import (
    BUSY_GROUP,
    BYTES,
    FRACTION,
    MEMORY_GROUP,
    SERVER_GROUP,
    bin_edges,
    busy_tracks,
    counter_tracks,
    decimate,
)
from workbench.serving.metrics_sampler import counters_table
from workbench.trace import Trace, read_trace
from workbench.trace import schema as trace_schema
from workbench.trace.store.bundle import open_bundle, write_bundle
from workbench.views.counter_tracks import GROUP_TOGGLE, TRACK_PLOT, TRACK_SOURCE
from workbench.views.counter_tracks import counter_tracks as counter_tracks_view
from workbench.views.dashboard import dashboard

RESNET = ("kineto", "resnet50_v100_train.pt.trace.json.gz")
CUPTI = ("kineto", "cupti_range_profiler.json.gz")
H100 = ("nsys", "h100_2gpu_1s.sqlite")
DEVICE_TYPES = {0: "cpu", 1: "cuda"}
"""c10::DeviceType codes of the `[memory]` records in the ResNet fixture."""


@lru_cache(maxsize=3)
def fixture_trace(*parts: str) -> Trace:
    return read_trace(fixture_path(*parts))


def raw_origin_us(events: list[dict]) -> float:
    """The Kineto reader's origin on the raw clock: the earliest timestamp of any record but metadata."""
    return min(e["ts"] for e in events if e.get("ph") != "M" and "ts" in e)


def raw_memory(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per device, from the raw `[memory]` instants: times (ns from the origin) and allocated bytes, a running sum
    of `Bytes` in time order (this 2021 trace writes no `Total Allocated`)."""
    events = load_raw(path)["traceEvents"]
    origin = raw_origin_us(events)
    per_device: dict[str, list[tuple[float, int]]] = {}
    for e in events:
        if e.get("name") == "[memory]":
            args = e["args"]
            base = DEVICE_TYPES[args["Device Type"]]
            device = base if args["Device Id"] < 0 else f"{base}:{args['Device Id']}"
            per_device.setdefault(device, []).append((e["ts"], args["Bytes"]))
    out = {}
    for device, rows in per_device.items():
        rows.sort(key=lambda r: r[0])  # stable: records at one time keep their order in the file
        ts = np.array([round((t - origin) * 1000) for t, _ in rows], dtype=np.int64)
        out[device] = (ts, np.cumsum([b for _, b in rows]))
    return out


def events_trace(rows: list[tuple[int, int, str, str, str]], counters: pa.Table | None = None) -> Trace:
    """A Trace of (start_ns, dur_ns, kind, device, track) rows, other columns neutral."""
    n = len(rows)
    columns = {"start_ns": [r[0] for r in rows], "dur_ns": [r[1] for r in rows], "name": [f"e{i}" for i in range(n)],
               "kind": [r[2] for r in rows], "device": [r[3] for r in rows], "track": [r[4] for r in rows],
               "pid": [0] * n, "tid": [0] * n, "corr": [-1] * n, "parent": [-1] * n, "depth": [0] * n,
               "launcher": [-1] * n, "flops": [float("nan")] * n, "bytes": [float("nan")] * n,
               "shapes": [None] * n, "dtypes": [None] * n, "args": [None] * n}
    table = pa.table({f.name: pa.array(columns[f.name], type=pa.string() if pa.types.is_dictionary(f.type)
                                       else f.type) for f in trace_schema.EVENTS})
    return Trace(events=table) if counters is None else Trace(events=table, counters=counters)


# -- memory ------------------------------------------------------------------------------------------


def test_memory_tracks_equal_the_raw_memory_records():
    path = fixture_path(*RESNET)
    expected = raw_memory(path)
    found = counter_tracks(fixture_trace(*RESNET), max_points=100_000)
    memory = {t.name: t for t in found.tracks if t.group == MEMORY_GROUP}
    assert set(memory) == {"cuda:0 allocated", "cpu allocated"}  # no reserved bytes in this trace
    assert list(memory) == ["cuda:0 allocated", "cpu allocated"]  # accelerators first
    for device, (ts, allocated) in expected.items():
        track = memory[f"{device} allocated"]
        assert track.unit == BYTES and not track.decimated
        np.testing.assert_array_equal(track.points["ts_ns"], ts)
        np.testing.assert_array_equal(track.points["value"], allocated)
        np.testing.assert_array_equal(track.points["end_ns"].to_numpy()[:-1], ts[1:])  # each value held to the next
    assert expected["cuda:0"][1].max() == 2_791_636_480  # 2.6 GiB at the peak of a step


def test_decimated_memory_keeps_the_peak_and_the_trough():
    expected = raw_memory(fixture_path(*RESNET))
    found = counter_tracks(fixture_trace(*RESNET), max_points=300)
    for device, (ts, allocated) in expected.items():
        track = next(t for t in found.tracks if t.name == f"{device} allocated")
        assert track.decimated and len(track.points) <= 300 and track.total == len(ts)
        values = track.points["value"].to_numpy()
        assert values.max() == allocated.max() and values.min() == allocated.min()
        # every drawn point is a raw point: (time, value) pairs of the raw series
        raw_pairs = set(zip(ts.tolist(), allocated.tolist(), strict=True))
        assert set(zip(track.points["ts_ns"].tolist(), values.tolist(), strict=True)) <= raw_pairs
        assert track.points["ts_ns"].iloc[-1] == ts[-1]  # the last value is kept


# -- decimation --------------------------------------------------------------------------------------


def test_decimation_keeps_the_global_max_and_min_and_bounds_the_points():
    rng = np.random.default_rng(7)
    ts = np.sort(rng.integers(0, 10**9, 100_000))
    value = rng.normal(size=100_000).cumsum()
    value[31_337], value[77_777] = value.max() + 5.0, value.min() - 5.0  # one-sample spikes
    kept = decimate(ts, value, 600)
    assert len(kept) <= 600 and np.all(np.diff(kept) > 0)
    assert 31_337 in kept and 77_777 in kept
    assert kept[-1] == len(ts) - 1
    # every bin's own minimum and maximum are kept, not only the global ones
    which = np.minimum((ts - ts[0]) * 200 // (ts[-1] - ts[0] + 1), 199)
    for b in (0, 57, 199):
        rows = np.flatnonzero(which == b)
        assert rows[np.argmax(value[rows])] in kept and rows[np.argmin(value[rows])] in kept


def test_decimation_treats_gaps_as_neither_peak_nor_trough():
    ts = np.arange(30, dtype=np.int64)
    value = np.where(np.arange(30) % 2 == 0, np.arange(30.0), np.nan)
    value[10:20] = np.nan  # bins of NaN only keep one point each: the gap stays a gap
    kept = decimate(ts, value, 9)  # 3 bins of 10 points
    assert len(kept) <= 9
    assert 28 in kept and 0 in kept  # the maximum and minimum values
    assert np.isnan(value[kept]).sum() >= 1  # the gap in the middle
    np.testing.assert_array_equal(decimate(ts, value, 30), np.arange(30))


def test_bad_bounds_are_refused():
    trace = events_trace([(0, 10, "kernel", "cuda:0", "cuda:0/stream 7")])
    with pytest.raises(ValueError, match="max_points >= 3"):
        counter_tracks(trace, max_points=2)
    with pytest.raises(ValueError, match="empty"):
        busy_tracks(trace, window=(5, 5))


# -- device busy --------------------------------------------------------------------------------------


def test_busy_per_stream_counts_overlaps_once():
    # stream 7: kernels [10, 40) and [20, 30) overlap (the second inside the first), a memcpy [60, 70);
    # stream 9: one kernel over the whole window; an annotation on stream 7 and a CPU op are no device work.
    trace = events_trace([
        (10, 30, "kernel", "cuda:0", "cuda:0/stream 7"),
        (20, 10, "kernel", "cuda:0", "cuda:0/stream 7"),
        (60, 10, "memcpy", "cuda:0", "cuda:0/stream 7"),
        (0, 100, "kernel", "cuda:0", "cuda:0/stream 9"),
        (0, 100, "annotation", "cuda:0", "cuda:0/stream 7"),
        (0, 100, "op", "cpu", "cpu/thread 1"),
    ])
    tracks, left_out = busy_tracks(trace, bins=4, window=(0, 100))
    assert left_out == 0
    assert [t.name for t in tracks] == ["cuda:0 · stream 7", "cuda:0 · stream 9"]
    seven, nine = tracks
    assert seven.group == BUSY_GROUP and seven.unit == FRACTION
    np.testing.assert_array_equal(seven.points["ts_ns"], [0, 25, 50, 75])
    np.testing.assert_array_equal(seven.points["end_ns"], [25, 50, 75, 100])
    # [0, 25): 15 ns of [10, 40) (the nested kernel adds nothing); [25, 50): 15 ns; [50, 75): the 10 ns copy
    np.testing.assert_array_equal(seven.points["value"], [0.6, 0.6, 0.4, 0.0])
    np.testing.assert_array_equal(nine.points["value"], [1.0, 1.0, 1.0, 1.0])
    # the default window is the events' extent, here [0, 100) as well
    assert counter_tracks(trace, bins=4).tracks[0].points.equals(seven.points)
    # the busiest stream is kept when only one may be
    (kept,), left = busy_tracks(trace, bins=4, window=(0, 100), max_streams=1)
    assert kept.name == "cuda:0 · stream 9" and left == 1


def test_busy_bins_clip_work_to_the_window_and_never_divide_below_a_nanosecond():
    trace = events_trace([(0, 100, "kernel", "cuda:0", "cuda:0/stream 7"), (150, 50, "kernel", "cuda:1", "cuda:1/s")])
    # cuda:1's [150, 200) is clipped to [150, 170): 20 ns busy, cuda:0 50 ns
    (track,), _ = busy_tracks(trace, bins=2, window=(50, 170), max_streams=1)
    np.testing.assert_array_equal(track.points["value"], [50 / 60, 0.0])
    both, _ = busy_tracks(trace, bins=2, window=(50, 170), max_streams=4)
    np.testing.assert_array_equal(both[1].points["value"], [0.0, 20 / 60])
    np.testing.assert_array_equal(bin_edges(0, 3, 10), [0, 1, 2, 3])  # 3 ns: 3 bins of 1 ns


def raw_nsys_streams(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per `cuda:<device> · stream <id>`, start and end (nsys clock ns) of every kernel, memcpy and memset."""
    query = " UNION ALL ".join(f"SELECT deviceId, streamId, start, end FROM {t} WHERE end > start" for t in (
        "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"))
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = np.array(db.execute(query).fetchall(), dtype=np.int64)
    keys = {(int(d), int(s)) for d, s in rows[:, :2]}
    return {f"cuda:{d} · stream {s}": (rows[(rows[:, 0] == d) & (rows[:, 1] == s), 2],
                                       rows[(rows[:, 0] == d) & (rows[:, 1] == s), 3]) for d, s in keys}


def raw_busy_fractions(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The fraction of each bin covered by the union of the intervals: merged in a plain loop, then each merged
    interval's overlap with each bin summed."""
    merged: list[list[int]] = []
    for s, e in sorted(zip(starts.tolist(), ends.tolist(), strict=True)):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    m = np.array(merged, dtype=np.int64)
    lo, hi = edges[:-1, None], edges[1:, None]
    overlap = np.clip(np.minimum(hi, m[None, :, 1]) - np.maximum(lo, m[None, :, 0]), 0, None).sum(axis=1)
    return overlap / np.diff(edges)


def test_nsys_busy_bins_equal_the_sqlite_activity():
    path = fixture_path(*H100)
    trace = fixture_trace(*H100)
    origin = trace.metadata["origin_ns"]
    raw = raw_nsys_streams(path)
    first = min(int(s.min()) for s, _ in raw.values()) - origin
    last = max(int(e.max()) for _, e in raw.values()) - origin
    tracks, left_out = busy_tracks(trace, bins=500, window=(first, last))
    assert left_out == 0 and {t.name for t in tracks} == set(raw) == {"cuda:0 · stream 7", "cuda:1 · stream 15"}
    for track in tracks:
        starts, ends = raw[track.name]
        edges = np.append(track.points["ts_ns"].to_numpy(), track.points["end_ns"].iloc[-1]) + origin
        assert edges[0] == first + origin and edges[-1] == last + origin and len(edges) == 501
        np.testing.assert_allclose(track.points["value"], raw_busy_fractions(starts, ends, edges), rtol=0, atol=1e-12)
        assert 0 < track.points["value"].mean() < 1


def test_nsys_fixture_has_no_counters_or_memory_tables():
    """What the Nsight fixture offers: no GPU_METRICS (sampled GPU counters) and no CUDA memory usage table, so its
    only tracks are the busy streams; the reader writes no counters for Nsight exports."""
    with sqlite3.connect(f"file:{fixture_path(*H100)}?mode=ro", uri=True) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert not {"GPU_METRICS", "CUDA_GPU_MEMORY_USAGE_EVENTS"} & tables
    assert {t.group for t in counter_tracks(fixture_trace(*H100)).tracks} == {BUSY_GROUP}


# -- counters ----------------------------------------------------------------------------------------


def test_cupti_range_counters_equal_the_raw_args():
    path = fixture_path(*CUPTI)
    events = load_raw(path)["traceEvents"]
    origin = raw_origin_us(events)
    ranges = sorted((e for e in events if e.get("cat") == "cuda_profiler_range"), key=lambda e: e["ts"])
    expected: dict[str, list[tuple[int, float]]] = {}
    for e in ranges:
        for key, value in e["args"].items():
            if isinstance(value, int | float):
                expected.setdefault(key, []).append((round((e["ts"] - origin) * 1000), float(value)))
    found = counter_tracks(fixture_trace(*CUPTI))
    groups = {t.group for t in found.tracks}
    assert groups == {f"cuda:{ranges[0]['pid']} counters"}  # the ranges' GPU; no memory, no kernels here
    tracks = {t.name: t for t in found.tracks}
    assert set(tracks) == set(expected) and len(expected) == 9
    for name, points in expected.items():
        track = tracks[name]
        assert track.unit == "" and len(track.points) == len(points) == len(ranges)
        assert track.points["ts_ns"].tolist() == [t for t, _ in points]
        assert track.points["value"].tolist() == [v for _, v in points]
    ffma = tracks["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"].points["value"]
    assert ffma.max() == max(e["args"]["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] for e in ranges) > 0


def test_server_metrics_come_as_the_serving_view_draws_them():
    second = 1_000_000_000
    samples = [(t * second, "vllm:num_requests_running", r) for t, r in enumerate([0.0, 3.0, 5.0])]
    samples += [(t * second, "vllm:kv_cache_usage_perc", u) for t, u in enumerate([0.0, 0.25, 0.5])]
    samples += [(t * second, "vllm:generation_tokens_total", n) for t, n in enumerate([0.0, 100.0, 400.0])]
    samples += [(t * second, "vllm:num_requests_swapped", s) for t, s in enumerate([0.0, 1.0, 0.0])]
    counters = counters_table(samples, origin_ns=0)
    trace = events_trace([(0, 3 * second, "kernel", "cuda:0", "cuda:0/stream 7")], counters)
    found = counter_tracks(trace, bins=3)
    assert found.groups == [BUSY_GROUP, SERVER_GROUP]
    server = {t.name: t for t in found.tracks if t.group == SERVER_GROUP}
    assert list(server) == ["running", "KV cache used", "generated", "vllm:num_requests_swapped"]
    assert server["running"].unit == "requests" and server["running"].points["value"].tolist() == [0, 3, 5]
    assert server["KV cache used"].unit == "%" and server["KV cache used"].points["value"].tolist() == [0, 25, 50]
    generated = server["generated"].points  # a cumulative counter as its rate between samples
    assert server["generated"].unit == "tokens/s" and generated["value"].tolist() == [100.0, 300.0]
    assert generated["ts_ns"].tolist() == [second, 2 * second]
    assert generated["end_ns"].tolist() == [2 * second, 3 * second]  # the last rate holds to the trace end
    assert server["vllm:num_requests_swapped"].points["value"].tolist() == [0, 1, 0]  # unknown series: as sampled


def test_series_past_the_bound_are_counted_not_drawn():
    rows = [(i, f"series {i}", float(i)) for i in range(70)]
    counters = pa.table({"ts_ns": [r[0] for r in rows], "device": ["cpu"] * 70, "name": [r[1] for r in rows],
                         "value": [r[2] for r in rows]})
    found = counter_tracks(Trace(events=trace_schema.EVENTS.empty_table(), counters=counters))
    assert len(found.tracks) == 64 and found.left_out == {"cpu counters": 6}
    assert found.tracks[0].name == "series 0" and found.tracks[9].name == "series 9"  # natural order
    assert found.tracks[10].name == "series 10"


# -- the view -----------------------------------------------------------------------------------------


def test_view_draws_each_track_on_the_shared_range():
    trace = fixture_trace(*RESNET)
    x_range = Range1d(0, 10**9)
    view = counter_tracks_view(trace, x_range=x_range, width=900)
    expected = counter_tracks(trace, max_points=4 * 900, bins=2 * 900)
    figures = [child for child in view.children if child.name == TRACK_PLOT]  # in the order drawn
    assert [f.tags[0]["track"] for f in figures] == [t.name for t in expected.tracks]
    for fig, track in zip(figures, expected.tracks, strict=True):
        assert fig.x_range is x_range and fig.height == 70
        (source,) = [s for s in fig.select({"type": ColumnDataSource}) if s.name == TRACK_SOURCE]
        np.testing.assert_array_equal(source.data["value"], track.points["value"])
        np.testing.assert_array_equal(source.data["ts_ns"], track.points["ts_ns"])
        assert isinstance(fig.yaxis[0].axis_label, PlainText)
    formats = {f.tags[0]["unit"]: f.yaxis[0].formatter.format for f in figures}
    assert formats == {BYTES: "0.0 b", FRACTION: "0%"}
    toggle = view.select_one({"name": GROUP_TOGGLE})
    assert isinstance(toggle, CheckboxGroup) and toggle.labels == ["memory (2)", "device busy (1)"]
    assert toggle.active == [0, 1]
    (callback,) = toggle.js_property_callbacks["change:active"]
    assert isinstance(callback, CustomJS) and [len(g) for g in callback.args["groups"]] == [2, 1]


def test_view_is_none_without_tracks():
    trace = read_trace(fixture_path("kineto", "cpu_only_rank34.pt.trace.json.gz"))
    assert counter_tracks(trace).tracks == ()
    assert counter_tracks_view(trace, x_range=Range1d(0, 1), width=600) is None


def test_names_from_the_trace_are_plain_text():
    name = "$$x$$ <img src=x onerror=alert(1)>"
    counters = pa.table({"ts_ns": [0, 10], "device": ["cpu", "cpu"], "name": [name, name], "value": [1.0, 2.0]})
    view = counter_tracks_view(Trace(events=trace_schema.EVENTS.empty_table(), counters=counters),
                               x_range=Range1d(0, 10), width=600)
    (fig,) = view.select({"name": TRACK_PLOT})
    assert fig.yaxis[0].axis_label.text == name


def test_dashboard_places_the_tracks_under_the_timeline(tmp_path):
    write_bundle(tmp_path, "resnet", {"model": {"name": "resnet50"}, "device": "cuda:0"}, fixture_trace(*RESNET))
    board = dashboard(open_bundle("resnet", tmp_path), width=900)
    timeline = board.select_one({"name": "timeline"})
    figures = list(board.select({"name": TRACK_PLOT}))
    assert len(figures) == 3 and all(f.x_range is timeline.x_range for f in figures)
    # inside the timeline's column, right under the lanes (before the details panes)
    (panel,) = [child for child in board.children if timeline in getattr(child, "children", [])]
    at = next(i for i, part in enumerate(panel.children) if part.select_one({"name": GROUP_TOGGLE}) is not None)
    assert panel.children[at - 1] is timeline


def test_long_counter_names_are_cut_in_the_middle_and_stay_apart():
    view = counter_tracks_view(fixture_trace(*CUPTI), x_range=Range1d(0, 1), width=600)
    names = [child.tags[0]["track"] for child in view.children if child.name == TRACK_PLOT]
    labels = [child.yaxis[0].axis_label.text for child in view.children if child.name == TRACK_PLOT]
    assert len(set(labels)) == len(labels) == 9 and all(len(label) <= 36 for label in labels)
    for name, label in zip(names, labels, strict=True):
        head, tail = label.split("…")
        assert name.startswith(head) and name.endswith(tail)  # e.g. smsp__sass_thread…p_dadd_pred_on.sum
