"""The timeline's viewing basics that Python decides: lane names, locked tools, the panes and their sources, the
embedded windows, and the findings' time ranges (the browser behaviour is in tests/browser/test_timeline_browser.py)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from bokeh.models import BoxSelectTool, DataTable, PanTool, Range1d, Select, TextInput, WheelZoomTool
from conftest import fixture_path
from test_timeline import busy_trace, make_trace

from workbench.analysis.timeline import lanes
from workbench.trace import read_trace
from workbench.views.findings import FINDINGS_TABLE, finding_range, findings_panel
from workbench.views.timeline import AGGREGATE, DETAILS, RELATED, REMOTE, SPANS_SOURCE, TIMELINE_PLOT, WINDOWS
from workbench.views.timeline_lanes import lane_names, stream_label, thread_label
from workbench.views.timeline_panes import SEARCH_INPUT, timeline_panel


def test_lanes_of_a_kineto_trace_are_named_from_its_metadata() -> None:
    path = fixture_path("kineto", "diff_control.json.gz")
    with gzip.open(path, "rt") as raw:
        records = json.load(raw)["traceEvents"]
    thread_names = {(r["pid"], r["tid"]): r["args"]["name"] for r in records
                    if r.get("ph") == "M" and r.get("name") == "thread_name"}
    process = next(r["args"]["name"] for r in records if r.get("ph") == "M" and r.get("name") == "process_name"
                   and r["pid"] == 3113936)
    assert thread_names[(3113936, 3113936)].startswith("thread 3113936")  # Kineto's generic name
    trace = read_trace(path)
    names = dict(zip(lanes(trace)["track"], lane_names(trace, lanes(trace)), strict=True))
    assert names["cpu/thread 3113936"] == f"{process} main thread"
    assert names["cpu/thread 3126441"] == f"{process} thread 3126441"
    assert names["cpu/thread -1029147072"] == f"{process} thread {-1029147072 & 0xFFFFFFFF}"  # never a negative id
    assert names["cuda:3/stream 22"] == "stream 22 (copy)" and names["cuda:3/stream 21"] == "stream 21 (compute)"
    assert names["cuda:3/stream 7"] == "stream 7 (compute, copy, memset)"
    assert not any("thread -" in name or '""' in name for name in names.values())


def test_label_rules() -> None:
    meta = {"processes": {"7": {"name": "python"}}, "threads": {"7/9": {"name": "dataloader"}}}
    assert thread_label("thread 7", 7, 7, meta) == "python main thread"
    assert thread_label("thread 9", 7, 9, meta) == "dataloader"
    assert thread_label("pid 7/thread 8", 7, 8, meta) == "python thread 8 (pid 7)"
    assert thread_label("thread 5", 3, 5, {}) == "thread 5"
    assert thread_label('pid Traces/thread PyTorch Profiler', -1, -2, {}) == "PyTorch Profiler (Traces)"
    assert thread_label('pid ""/thread ""', -1, -1, {}) == "unnamed markers"
    assert thread_label("host/python3", 0, 1, {}) == "host/python3"  # a reader's own name stays
    assert stream_label("Stream #1(Compute)", {"kernel"}) == "Stream #1(Compute)"
    assert stream_label("stream 3", {"annotation"}) == "stream 3"


@pytest.fixture(scope="module")
def panel():
    return timeline_panel(busy_trace(400), width=900)


def test_panel_has_search_details_aggregate_and_locked_tools(panel) -> None:
    fig = panel.select_one({"name": TIMELINE_PLOT})
    toolbar = fig.toolbar
    assert isinstance(toolbar.active_drag, PanTool) and isinstance(toolbar.active_scroll, WheelZoomTool)
    for tool in (toolbar.active_drag, toolbar.active_scroll):
        assert tool.js_property_callbacks["change:active"]  # switched back on when a click leaves none active
    assert any(isinstance(t, BoxSelectTool) and t.dimensions == "width" for t in toolbar.tools)
    assert {"mouseenter", "mouseleave", "mousemove", "selectiongeometry"} <= set(fig.js_event_callbacks)
    assert isinstance(panel.select_one({"name": SEARCH_INPUT}), TextInput)
    tables = {table.source.name for table in panel.select({"type": DataTable})}
    assert {DETAILS, RELATED, AGGREGATE} <= tables
    remote = panel.select_one({"name": REMOTE})
    assert remote.js_property_callbacks["change:tags"]  # a `spans` reply written here is applied in the browser
    source = panel.select_one({"name": SPANS_SOURCE})
    assert len(source.data["row"]) == 400 and source.tags == [0, 99_900]
    data = source.data
    nested = np.flatnonzero(data["parent_idx"] >= 0)
    assert len(nested) == 100 and (data["row"][data["parent_idx"][nested]] == data["row"][nested] - 1).all()


def test_several_windows_are_listed_to_jump_to() -> None:
    trace = busy_trace(4_000)  # groups of four events every 1000 ns
    windows = [(0, 10_000, "first"), (500_000, 510_000, "middle")]
    panel = timeline_panel(trace, windows=windows, width=900)
    source = panel.select_one({"name": SPANS_SOURCE})
    assert source.tags == [0, 10_000, 500_000, 510_000]
    assert len(source.data["row"]) == 40 + 40 and sorted(source.data["row"]) == list(source.data["row"])
    assert panel.select_one({"name": WINDOWS}).data["label"] == ["first", "middle"]
    picker = panel.select_one({"type": Select})
    assert [label for _, label in picker.options[1:]] == ["first: 0.000 ms to 0.010 ms",
                                                          "middle: 0.500 ms to 0.510 ms"]
    one = timeline_panel(make_trace({"start_ns": [0, 10], "dur_ns": [5, 5]}))
    assert one.select_one({"type": Select}) is None


def test_findings_jump_to_the_time_their_evidence_names() -> None:
    assert finding_range({"largest_gap_start_ns": 100, "largest_gap_ns": 50, "span_start_ns": 0,
                          "span_end_ns": 1000}) == (100, 150)
    assert finding_range({"longest_stretch": {"start_ns": 5, "end_ns": 9}}) == (5, 9)
    assert finding_range({"xla_recompiles": [{"start_ns": 7, "ns": 3}]}) == (7, 10)
    assert finding_range({"span_start_ns": 1, "span_end_ns": 4}) == (1, 4)
    assert finding_range({"count": 3}) is None and finding_range(None) is None
    findings = [{"kind": "device_idle", "device": "cuda:0", "time_share": 0.4, "title": "idle", "suggestion": "s",
                 "evidence": {"largest_gap_start_ns": 100, "largest_gap_ns": 50}},
                {"kind": "dtype_cast", "device": None, "time_share": 0.1, "title": "casts", "suggestion": "s",
                 "evidence": {"count": 3}}]
    x_range = Range1d(0, 1000)
    view = findings_panel(findings, {"cuda:0": {"largest_gap_start_ns": 100, "largest_gap_ns": 50}},
                          x_range=x_range)
    table = view.select_one({"name": FINDINGS_TABLE})
    assert table.source.data["range_start_ns"][0] == 100 and np.isnan(table.source.data["range_start_ns"][1])
    callbacks = table.source.selected.js_property_callbacks["change:indices"]
    assert any(callback.args.get("xr") is x_range for callback in callbacks)
