"""The call tree (host spans over a window, self and total time) and device work by launching op: on a hand-built
trace whose tree is worked out by hand, and on the real ResNet-50 Kineto trace against figures computed straight
from its raw JSON; then their views (the icicle and the table) by their data."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import numpy as np
import pytest
from bokeh.embed import file_html
from bokeh.models import ColumnDataSource, CustomJS, DataTable, HoverTool, Range1d, TabPanel
from bokeh.resources import INLINE
from conftest import fixture_path
from test_timeline import PAYLOAD, SCRIPT_PAYLOAD, make_trace

from workbench.analysis.call_tree import (
    CALL_TREE_COLUMNS,
    KERNELS_BY_OP_COLUMNS,
    NO_LAUNCHER,
    OTHER,
    call_tree,
    kernels_by_op,
)
from workbench.trace import Trace, read_trace
from workbench.trace.store.bundle import open_bundle, write_bundle
from workbench.views.dashboard import dashboard
from workbench.views.flame import FLAME_SOURCE, KERNELS_TABLE, ROOT, THREAD, call_tree_panel, flame_graph

RESNET = ("kineto", "resnet50_v100_train.pt.trace.json.gz")

# Two threads. Thread 1: A [0, 100) holds B [10, 40) (holding C [15, 25) and a runtime call) and B [50, 90)
# (holding an `other` span [52, 88) that holds D [60, 70)); thread 2: A [20, 60) holding E [30, 40). Thread 9 holds
# an annotation alone, [0, 200). Kernels: C launched k1 (30 ns) and k2 (10 ns), D launched k1 (20 ns), and k3 (5 ns)
# has no known launcher.
HAND = {
    "start_ns": [0, 10, 15, 30, 50, 60, 52, 20, 30, 0, 100, 130, 140, 170],
    "dur_ns": [100, 30, 10, 5, 40, 10, 36, 40, 10, 200, 30, 10, 20, 5],
    "name": ["A", "B", "C", "cudaLaunchKernel", "B", "D", "X", "A", "E", "session", "k1", "k2", "k1", "k3"],
    "kind": ["op", "op", "op", "runtime", "op", "op", "other", "op", "op", "annotation", "kernel", "kernel", "kernel",
             "kernel"],
    "parent": [-1, 0, 1, 1, 0, 6, 4, -1, 7, -1, -1, -1, -1, -1],
    "depth": [0, 1, 2, 2, 1, 3, 2, 0, 1, 0, 0, 0, 0, 0],
    "launcher": [-1] * 10 + [2, 2, 5, -1],
    "track": ["cpu/thread 1"] * 7 + ["cpu/thread 2"] * 2 + ["cpu/thread 9"] + ["cuda:0/stream 7"] * 4,
    "device": ["cpu"] * 10 + ["cuda:0"] * 4,
}


def hand_trace(**changes: list) -> Trace:
    return make_trace({**HAND, **changes})


def rows(table, *columns: str) -> list[tuple]:
    return [tuple(row) for row in table[list(columns)].itertuples(index=False)]


def test_per_thread_tree_by_hand() -> None:
    tree = call_tree(hand_trace())
    assert list(tree.columns) == list(CALL_TREE_COLUMNS)
    # thread 9 (an annotation alone) is left out; the `other` span X between B and D is skipped
    assert rows(tree, "node", "parent", "depth", "track", "path", "count", "total_ns", "self_ns", "offset_ns") == [
        (0, -1, 0, "cpu/thread 1", "A", 1, 100, 30, 0),
        (1, 0, 1, "cpu/thread 1", "A;B", 2, 70, 50, 0),
        (2, 1, 2, "cpu/thread 1", "A;B;C", 1, 10, 10, 0),
        (3, 1, 2, "cpu/thread 1", "A;B;D", 1, 10, 10, 10),
        (4, -1, 0, "cpu/thread 2", "A", 1, 40, 30, 100),
        (5, 4, 1, "cpu/thread 2", "A;E", 1, 10, 10, 100),
    ]
    assert rows(tree, "first_start_ns", "first_dur_ns")[1] == (10, 30)  # the first of B's two calls
    assert tree["count"].dtype == np.int64 and tree["total_ns"].dtype == np.int64


def test_threads_merged() -> None:
    tree = call_tree(hand_trace(), threads=False)
    assert rows(tree, "parent", "track", "path", "count", "total_ns", "self_ns") == [
        (-1, "", "A", 2, 140, 60), (0, "", "A;B", 2, 70, 50), (1, "", "A;B;C", 1, 10, 10),
        (1, "", "A;B;D", 1, 10, 10), (0, "", "A;E", 1, 10, 10)]


def test_window_clips_each_call() -> None:
    tree = call_tree(hand_trace(), (20, 70))
    # A [0,100) → 50; B [10,40) → 20 and [50,90) → 20; C [15,25) → 5; D [60,70) → 10; thread 2: A 40, E 10
    assert rows(tree, "track", "path", "count", "total_ns", "self_ns") == [
        ("cpu/thread 1", "A", 1, 50, 10), ("cpu/thread 1", "A;B", 2, 40, 25), ("cpu/thread 1", "A;B;D", 1, 10, 10),
        ("cpu/thread 1", "A;B;C", 1, 5, 5), ("cpu/thread 2", "A", 1, 40, 30), ("cpu/thread 2", "A;E", 1, 10, 10)]
    assert rows(call_tree(hand_trace(), (60, 61)), "path", "total_ns") == [("A", 1), ("A;B", 1), ("A;B;D", 1)]
    assert call_tree(hand_trace(), (300, 400)).empty


def test_annotation_only_tracks_count_when_no_track_runs_ops() -> None:
    kinds = ["annotation" if kind == "op" else kind for kind in HAND["kind"]]
    tree = call_tree(hand_trace(kind=kinds))
    assert set(tree["track"]) == {"cpu/thread 1", "cpu/thread 2", "cpu/thread 9"}
    assert call_tree(hand_trace(), kinds=("annotation",))["path"].tolist() == ["session"]


def test_steps_merge_into_one_path() -> None:
    names = ["ProfilerStep#1", "B", "C", "cudaLaunchKernel", "B", "D", "X", "ProfilerStep#2", *HAND["name"][8:]]
    tracks = ["cpu/thread 1"] * 9 + HAND["track"][9:]
    merged = call_tree(hand_trace(name=names, track=tracks))
    assert rows(merged, "depth", "name", "count", "total_ns") == [
        (0, "ProfilerStep#*", 2, 140), (1, "B", 2, 70), (2, "C", 1, 10), (2, "D", 1, 10), (1, "E", 1, 10)]
    apart = call_tree(hand_trace(name=names, track=tracks), steps=False)
    assert apart.loc[apart["depth"] == 0, "name"].tolist() == ["ProfilerStep#1", "ProfilerStep#2"]


def test_bounded_nodes_sum_the_rest_into_other() -> None:
    tree = call_tree(hand_trace(), max_nodes=2)  # the heaviest: thread 1's A (100) and A;B (70)
    assert rows(tree, "parent", "track", "name", "kind", "count", "total_ns", "self_ns") == [
        (-1, "cpu/thread 1", "A", "op", 1, 100, 30), (0, "cpu/thread 1", "B", "op", 2, 70, 50),
        (1, "cpu/thread 1", OTHER, OTHER, 2, 20, 20),  # C and D
        (-1, "cpu/thread 2", OTHER, OTHER, 1, 40, 40)]  # thread 2's A, its child E inside it
    assert tree.loc[tree["parent"] < 0, "total_ns"].sum() == 140  # nothing lost


def test_bad_arguments_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="unknown event kinds"):
        call_tree(hand_trace(), kinds=("ops",))
    with pytest.raises(ValueError, match="is empty"):
        call_tree(hand_trace(), (50, 50))
    with pytest.raises(ValueError, match="max_nodes"):
        call_tree(hand_trace(), max_nodes=0)
    with pytest.raises(ValueError, match="unknown event kinds"):
        kernels_by_op(hand_trace(), kinds=("kernels",))


def test_kernels_by_op_by_hand() -> None:
    table = kernels_by_op(hand_trace())
    assert list(table.columns) == list(KERNELS_BY_OP_COLUMNS)
    assert rows(table, "level", "op", "name", "kind", "launches", "calls", "device_ns", "first_start_ns",
                "first_dur_ns") == [
        (0, "C", "C", "op", 2, 1, 40, 15, 10), (1, "C", "k1", "kernel", 1, 1, 30, 100, 30),
        (1, "C", "k2", "kernel", 1, 1, 10, 130, 10),
        (0, "D", "D", "op", 1, 1, 20, 60, 10), (1, "D", "k1", "kernel", 1, 1, 20, 140, 20),
        (0, NO_LAUNCHER, NO_LAUNCHER, "", 1, 0, 5, 170, 5), (1, NO_LAUNCHER, "k3", "kernel", 1, 0, 5, 170, 5)]
    assert table.loc[table["level"] == 0, "share"].tolist() == pytest.approx([40 / 65, 20 / 65, 5 / 65])
    # the window picks work by its launching op's start (C at 15), not by the kernel's own
    assert rows(kernels_by_op(hand_trace(), (0, 20)), "name", "device_ns") == [("C", 40), ("k1", 30), ("k2", 10)]


# ---- the real ResNet-50 trace against its raw JSON ----

@pytest.fixture(scope="module")
def raw_events() -> list[dict]:
    with gzip.open(fixture_path(*RESNET), "rt") as raw:
        return [e for e in json.load(raw)["traceEvents"] if e.get("ph") == "X"]


@pytest.fixture(scope="module")
def resnet() -> Trace:
    return read_trace(fixture_path(*RESNET))


def raw_top_level_ns(events: list[dict], window_us: tuple[float, float]) -> dict[str, tuple[float, int]]:
    """Per thread, the clipped time (ns) in `window_us` (µs from the first event) of the host ops no other op on
    their thread encloses, nesting worked out from the raw intervals, and how many such ops overlap the window."""
    origin = min(e["ts"] for e in events)
    per_thread: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("cat") in ("Operator", "cpu_op"):
            per_thread[str(e["tid"])].append((e["ts"] - origin, e["ts"] - origin + e.get("dur", 0)))
    totals = {}
    for tid, spans in per_thread.items():
        total, count, open_until = 0.0, 0, -np.inf
        for start, end in sorted(spans, key=lambda s: (s[0], -(s[1] - s[0]))):
            if start < open_until:
                continue  # inside an earlier op still running
            open_until = end
            if start < window_us[1] and max(end, start + 1e-3) > window_us[0]:
                total += max(0.0, min(end, window_us[1]) - max(start, window_us[0]))
                count += 1
        totals[tid] = (total * 1000, count)
    return totals


@pytest.mark.parametrize("window_us", [(300_000, 700_000), (123_456, 123_456 + 2_000), None])
def test_resnet_root_totals_match_the_raw_trace(resnet, raw_events, window_us) -> None:
    span = (0, max(e["ts"] + e["dur"] for e in raw_events) - min(e["ts"] for e in raw_events))
    expected = raw_top_level_ns(raw_events, window_us or span)
    window = None if window_us is None else (window_us[0] * 1000, window_us[1] * 1000)
    for kinds in (("op",), ("op", "annotation", "python")):  # the Kineto session range (an annotation) is left out
        tree = call_tree(resnet, window, kinds=kinds, steps=False)
        tops = tree[tree["parent"] < 0].groupby("track")["total_ns"].sum()
        got = {track.rsplit(" ", 1)[1]: ns for track, ns in tops.items()}
        assert set(got) == {tid for tid, (_, count) in expected.items() if count}
        for tid, ns in got.items():
            raw_ns, count = expected[tid]
            assert ns == pytest.approx(raw_ns, abs=1000 * count)  # Kineto's µs: within 1 µs per op
    assert any(e.get("cat") == "Trace" for e in raw_events)  # so the annotation rule was exercised


def test_resnet_steps_merge_and_bounded_tree_keeps_the_total(resnet) -> None:
    whole = call_tree(resnet)
    steps = whole[whole["name"] == "ProfilerStep#*"]
    assert steps["count"].tolist() == [6] and steps["depth"].tolist() == [0]
    small = call_tree(resnet, max_nodes=40)
    assert len(small) <= 2 * 40 and (small["kind"] == OTHER).any()
    assert small.loc[small["parent"] < 0, "total_ns"].sum() == whole.loc[whole["parent"] < 0, "total_ns"].sum()
    children = small[small["parent"] >= 0].groupby("parent")["total_ns"].sum()
    assert (children <= small["total_ns"].reindex(children.index) - small["self_ns"].reindex(children.index)).all()


def raw_device_ns_by_op(events: list[dict]) -> dict[str, float]:
    """Per op name, the duration (ns) of the kernels, copies and sets whose correlation id is a runtime call's
    inside it (its innermost enclosing op on the same thread), from the raw events by a sweep per thread."""
    op_of_corr: dict[int, str] = {}
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") in ("Operator", "Runtime"):
            by_thread[(e["pid"], e["tid"])].append(e)
    for spans in by_thread.values():
        stack: list[dict] = []
        for e in sorted(spans, key=lambda e: (e["ts"], e["cat"] == "Runtime", -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if e["cat"] == "Operator":
                stack.append(e)
            elif stack:
                op_of_corr[e["args"]["correlation"]] = stack[-1]["name"]
    totals: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") in ("Kernel", "Memcpy", "Memset") and e["args"]["correlation"] in op_of_corr:
            totals[op_of_corr[e["args"]["correlation"]]] += e["dur"] * 1000
    return dict(totals)


def test_resnet_device_time_by_op_matches_the_raw_trace(resnet, raw_events) -> None:
    expected = raw_device_ns_by_op(raw_events)
    table = kernels_by_op(resnet)
    ops = table[table["level"] == 0].set_index("op")
    assert NO_LAUNCHER not in ops.index  # every kernel of this trace has its runtime call inside an op
    assert set(ops.index) == set(expected)
    launches = {name: 0 for name in expected}
    for name in expected:
        assert ops.loc[name, "device_ns"] == pytest.approx(expected[name], abs=1000)
        launches[name] = int(ops.loc[name, "launches"])
    assert ops["device_ns"].is_monotonic_decreasing
    kernels = table[table["level"] == 1].groupby("op")["device_ns"].sum()
    assert (kernels.reindex(ops.index) == ops["device_ns"]).all()  # an op's kernels add up to it
    assert sum(launches.values()) == sum(1 for e in raw_events if e.get("cat") in ("Kernel", "Memcpy", "Memset"))


# ---- the views ----

def test_flame_graph_boxes_and_links() -> None:
    x_range = Range1d(0, 200)
    view = flame_graph(hand_trace(), (20, 70), scope="a test window", x_range=x_range)
    source = view.select_one({"name": FLAME_SOURCE})
    data = source.data
    # the range, two threads, then the nodes of `test_window_clips_each_call`
    assert list(data["kind"][:3]) == [ROOT, THREAD, THREAD] and list(data["name"][1:3]) == ["thread 1", "thread 2"]
    assert data["total_ns"][0] == 90
    assert list(data["left"][:3]) == [0, 0, 50] and list(data["right"][:3]) == [90, 50, 90]
    assert list(data["top"]) == [0, 1, 1, 2, 3, 4, 4, 2, 3]
    assert list(data["count"][3:]) == [1, 2, 1, 1, 1, 1]
    tap = [cb for cb in source.selected.js_property_callbacks["change:indices"] if isinstance(cb, CustomJS)]
    assert tap and tap[0].args["xr"] is x_range
    heading = view.children[0].text
    assert "a test window" in heading and "total 90 ns" in heading and "2 threads" in heading


def test_no_host_spans_gives_a_note() -> None:
    view = flame_graph(hand_trace(), (500, 600))
    assert "No host spans" in view.text


def test_kernels_table_is_a_tree_of_integers_and_units() -> None:
    panel = call_tree_panel(hand_trace(), x_range=Range1d(0, 200))
    table = panel.select_one({"name": KERNELS_TABLE})
    assert isinstance(table, DataTable) and not table.sortable
    data = table.source.data
    assert list(data["name"][:3]) == ["C", "\u2003\u21b3 k1", "\u2003\u21b3 k2"]
    assert data["launches"].dtype == np.int64 and data["calls"].dtype == np.int64
    assert [column.title for column in table.columns][4] == "device time (ns)"
    assert list(data["first_start_ns"][:3]) == [15, 100, 130]


def test_names_render_as_text_never_html() -> None:
    names = [PAYLOAD, SCRIPT_PAYLOAD, *HAND["name"][2:10], PAYLOAD, *HAND["name"][11:]]
    panel = call_tree_panel(hand_trace(name=names))
    html = file_html(panel, resources=INLINE, title="xss")
    assert PAYLOAD not in html and SCRIPT_PAYLOAD not in html
    assert "alert(1)" in html and "alert(2)" in html  # the names are there, as escaped JSON data
    for tool in panel.select({"type": HoverTool}):
        assert all("{safe}" not in field for _, field in tool.tooltips)


def test_dashboard_has_a_call_tree_tab(tmp_path, resnet) -> None:
    write_bundle(tmp_path, "resnet", {"model": {"name": "resnet50"}, "variant": {"name": "kineto import"}}, resnet)
    layout = dashboard(open_bundle("resnet", tmp_path))
    tab = next(tab for tab in layout.select({"type": TabPanel}) if tab.title == "call tree")
    source = tab.child.select_one({"name": FLAME_SOURCE})
    assert isinstance(source, ColumnDataSource)
    tree = call_tree(resnet)
    assert source.data["total_ns"][0] == tree.loc[tree["parent"] < 0, "total_ns"].sum()


def test_a_deep_chain_is_cheap_and_bounded() -> None:
    n = 3_000  # op i encloses op i + 1, one level deeper each
    trace = make_trace({"start_ns": np.arange(n), "dur_ns": 2 * n - 2 * np.arange(n), "name": "f",
                        "parent": np.arange(n) - 1, "depth": np.minimum(np.arange(n), 32_767)})
    tree = call_tree(trace, max_nodes=100)
    assert tree["depth"].tolist() == list(range(101)) and tree["kind"].iat[-1] == OTHER
    assert tree["count"].iat[-1] == 1 and tree["total_ns"].iat[-1] == 2 * n - 200
    assert tree["self_ns"].iloc[:100].tolist() == [2] * 100
