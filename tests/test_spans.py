"""Windowed timeline queries (`workbench.analysis.spans.queries`) against figures computed from the Parquet with
pyarrow."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from spans_data import CPU, STREAM, gpu_steps, write_run

from workbench.analysis.spans import queries as spans
from workbench.analysis.spans.index import RunCache, SpanIndex


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 20-step trace of 36k events: its bundle folder."""
    return write_run(tmp_path_factory.mktemp("spans"), "steps", gpu_steps(steps=20, ops_per_step=600))


@pytest.fixture(scope="module")
def parquet(run):
    """The events table as written (read independently of the index), with end times."""
    table = pq.read_table(run / "events.parquet")
    start, dur = table["start_ns"].to_numpy(), table["dur_ns"].to_numpy()
    return {"start": start, "end": np.maximum(start + dur, start + 1),
            "track": np.asarray(table["track"].cast("string").to_pylist()), "table": table}


def overlapping_rows(parquet, start_ns, end_ns, track=None):
    """Rows overlapping [start_ns, end_ns) (an instant counts 1 ns), optionally on one track."""
    hit = (parquet["start"] < end_ns) & (parquet["end"] > start_ns)
    if track is not None:
        hit &= parquet["track"] == track
    return np.flatnonzero(hit)


def lane_named(reply, track):
    return next(lane for lane in reply["lanes"] if lane["track"] == track)


def test_a_narrow_window_in_the_last_tenth_holds_the_real_spans(run, parquet):
    first, last = int(parquet["start"].min()), int(parquet["end"].max())
    start = first + int(0.95 * (last - first))
    end = start + (last - first) // 500
    reply = spans.window(run, start, end, 1200)
    expected = overlapping_rows(parquet, start, end)
    assert 0 < len(expected) <= spans.MAX_SPANS
    assert reply["events"] == reply["spans"] == len(expected)
    assert all(lane["mode"] == "spans" for lane in reply["lanes"])
    rows = sorted(row for lane in reply["lanes"] for row in lane["spans"]["row"])
    assert rows == expected.tolist()
    kernels = lane_named(reply, STREAM)["spans"]
    names = [reply["names"][i] for i in kernels["name"]]
    assert set(names) <= {"gemm_kernel", "add_kernel", "gelu_kernel"} and names
    launcher = kernels["launcher"][0]
    table = parquet["table"]
    assert reply["names"][kernels["launcher_name"][0]] == table["name"][launcher].as_py()
    assert kernels["start_ns"] == sorted(kernels["start_ns"])


def test_the_whole_trace_is_density_where_the_budget_runs_out(run, parquet):
    first, last = int(parquet["start"].min()), int(parquet["end"].max())
    reply = spans.window(run, first, last, 800)
    cpu, stream = lane_named(reply, CPU), lane_named(reply, STREAM)
    assert cpu["in_window"] == len(overlapping_rows(parquet, first, last, CPU)) > spans.MAX_SPANS
    assert stream["in_window"] == len(overlapping_rows(parquet, first, last, STREAM)) <= spans.MAX_SPANS
    # lanes are given spans from the sparsest while the budget lasts: the stream fits, the CPU thread does not
    assert stream["mode"] == "spans" and len(stream["spans"]["row"]) == stream["in_window"]
    assert cpu["mode"] == "density" and cpu["spans"] is None
    bins = cpu["bins"]
    cpu_starts = parquet["start"][parquet["track"] == CPU]
    edges = first + np.floor(np.arange(801) * (last - first) / 800).astype(np.int64)
    edges[-1] = last
    per_pixel = np.histogram(cpu_starts[cpu_starts < last], bins=edges)[0]
    dense = np.zeros(800, dtype=np.int64)
    dense[bins["bin"]] = bins["count"]
    assert dense.tolist() == per_pixel.tolist()
    assert all(0 <= b <= 1 for b in bins["busy"])
    named = [reply["names"][i] for i, c in zip(bins["name"], bins["count"], strict=True) if c]
    assert set(named) <= {"aten::mm", "aten::add", "aten::gelu"}  # work outranks the step annotations


def test_density_busy_time_and_names_of_a_hand_built_lane(tmp_path):
    rows = [{"start_ns": 0, "dur_ns": 10, "name": "a", "kind": "kernel", "track": STREAM},
            {"start_ns": 20, "dur_ns": 30, "name": "b", "kind": "kernel", "track": STREAM},
            {"start_ns": 22, "dur_ns": 2, "name": "c", "kind": "kernel", "track": STREAM},
            {"start_ns": 0, "dur_ns": 80, "name": "ProfilerStep#1", "kind": "annotation", "track": STREAM},
            {"start_ns": 10, "dur_ns": 20, "name": "phase", "kind": "annotation", "track": CPU},
            {"start_ns": 60, "dur_ns": 0, "name": "mark", "kind": "annotation", "track": CPU}]
    reply = spans.window(write_run(tmp_path, "hand", rows), 0, 80, 8, max_spans=1)
    markers_only = lane_named(reply, CPU)["bins"]  # a lane of annotations alone: they are its busy time
    assert (markers_only["bin"], markers_only["busy"], markers_only["count"]) == ([1, 2, 6], [1.0, 1.0, 0.0], [1, 0, 1])
    bins = lane_named(reply, STREAM)["bins"]
    assert bins["bin"] == [0, 2, 3, 4]
    assert bins["count"] == [2, 2, 0, 0]
    assert bins["busy"] == [1.0, 1.0, 1.0, 1.0]  # work only: the annotation covers all 80 ns
    names = [reply["names"][i] if i >= 0 else None for i in bins["name"]]
    assert names == ["a", "b", None, None]  # the longest work event starting there, not the annotation


def test_search_counts_match_pyarrow(run, parquet):
    names = parquet["table"]["name"].cast("string")
    reply = spans.search(run, "KERNEL", limit=5)
    assert reply["count"] == pc.sum(pc.match_substring(names, "kernel", ignore_case=True)).as_py()
    hits = pc.match_substring(names, "kernel", ignore_case=True)
    assert reply["names"] == pc.count_distinct(names.filter(hits)).as_py() == 4  # cudaLaunchKernel too
    assert reply["truncated"]
    starts = [m["start_ns"] for m in reply["matches"]]
    assert starts == sorted(starts) and len(starts) == 5
    assert starts[0] == int(parquet["start"][hits.to_numpy(zero_copy_only=False)].min())
    later = spans.search(run, "kernel", limit=5, from_ns=starts[-1] + 1)
    assert later["matches"][0]["start_ns"] > starts[-1] and later["count"] == reply["count"]
    regex = spans.search(run, r"^aten::(mm|add)$", regex=True)
    assert regex["count"] == pc.sum(pc.match_substring_regex(names, r"^aten::(mm|add)$")).as_py()
    assert spans.search(run, "no such name")["count"] == 0
    with pytest.raises(spans.QueryError, match="regular expression"):
        spans.search(run, "(", regex=True)


def test_aggregate_self_time_of_a_nested_trace(tmp_path):
    #  A [0,100)  B [10,40) in A  D [15,20) in B  C [50,60) in A  A2 [200,210) (another A)
    rows = [{"start_ns": 0, "dur_ns": 100, "name": "A"},
            {"start_ns": 10, "dur_ns": 30, "name": "B", "parent": 0, "depth": 1},
            {"start_ns": 50, "dur_ns": 10, "name": "C", "parent": 0, "depth": 1},
            {"start_ns": 15, "dur_ns": 5, "name": "D", "parent": 1, "depth": 2},
            {"start_ns": 200, "dur_ns": 10, "name": "A"}]
    run = write_run(tmp_path, "nested", rows)

    def table(start, end):
        return {r["name"]: (r["count"], r["total_ns"], r["self_ns"]) for r in spans.aggregate(run, start, end)["rows"]}

    assert table(0, 300) == {"A": (2, 110, 70), "B": (1, 30, 25), "C": (1, 10, 10), "D": (1, 5, 5)}
    assert table(30, 55) == {"A": (1, 25, 10), "B": (1, 10, 10), "C": (1, 5, 5)}  # clipped to the range
    assert spans.aggregate(run, 100, 200)["rows"] == []
    assert [r["name"] for r in spans.aggregate(run, 0, 300, limit=2)["rows"]] == ["A", "B"]


def test_event_details_link_launcher_and_launches(run, parquet):
    table = parquet["table"]
    kernel = int(np.flatnonzero(parquet["track"] == STREAM)[0])
    launcher = table["launcher"][kernel].as_py()
    details = spans.event(run, kernel)
    assert details["name"] == table["name"][kernel].as_py() and details["track"] == STREAM
    assert [e["row"] for e in details["launched_by"]] == [launcher]
    assert kernel in [e["row"] for e in spans.event(run, launcher)["launches"]]
    assert details["args"] == {} and details["flops"] is None
    with pytest.raises(IndexError):
        spans.event(run, table.num_rows)


def test_bad_windows_are_refused(run):
    with pytest.raises(spans.QueryError, match="greater than"):
        spans.window(run, 10, 10, 100)
    with pytest.raises(spans.QueryError, match="positive"):
        spans.window(run, 0, 10, 0)


def test_the_cache_keeps_the_most_recent_runs(tmp_path):
    rows = [{"start_ns": 0, "dur_ns": 5, "name": "x"}]
    paths = [write_run(tmp_path, f"r{i}", rows) / "events.parquet" for i in range(3)]
    cache = RunCache(max_runs=2)
    first = cache.get(paths[0])
    cache.get(paths[1])
    assert cache.get(paths[0]) is first  # still open: a hit, now the most recent
    cache.get(paths[2])
    assert cache.paths() == [paths[0].resolve(), paths[2].resolve()]  # r1, least recently used, went
    assert cache.get(paths[1]) is not None and paths[0].resolve() not in cache.paths()


def test_an_index_holds_long_spans_aside_without_losing_overlaps(tmp_path):
    # one long span and many short ones: a window deep inside the long one still finds it
    rows = [{"start_ns": 0, "dur_ns": 10**9, "name": "long"}]
    rows += [{"start_ns": 1_000 * i, "dur_ns": 10, "name": "short", "depth": 1} for i in range(1, 3000)]
    index = SpanIndex.open(write_run(tmp_path, "long", rows) / "events.parquet")
    assert [index.row[p] for p in index.overlapping(0, 5 * 10**8, 5 * 10**8 + 5)] == [0]
    assert index.count_overlapping(0, 1_500, 2_500) == 2  # the long span and the short one at 2000
    assert index.short_max[0] == 10 and index.long[0].tolist() == [0]


def test_the_longest_event_of_wide_ranges_matches_a_plain_scan(run):
    _, index = spans.open_run(run)
    lane = index.lane_slice(0)
    rng = np.random.default_rng(1)
    for count in (3, 40, 400):  # thousands of events per range (whole blocks) down to a few dozen (a direct scan)
        cuts = np.sort(rng.choice(np.arange(lane.start + 1, lane.stop), count - 1, replace=False))
        starts, ends = np.r_[lane.start, cuts], np.r_[cuts, lane.stop]
        expected = []
        for lo, hi in zip(starts, ends, strict=True):
            work = [p for p in range(lo, hi) if not index.is_marker[p]] or [lo]  # markers alone: the first
            expected.append(max(work, key=lambda p: (index.dur[p], -p)))
        assert index.longest(starts, ends).tolist() == expected
