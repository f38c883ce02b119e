"""The op timeline: its analysis (lanes, spans, density levels) and its Bokeh view, checked by their data."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from bokeh.embed import file_html
from bokeh.models import ColumnDataSource, Div, GlyphRenderer, Range1d
from bokeh.resources import INLINE
from click.testing import CliRunner
from conftest import fixture_path

from workbench.analysis.timeline import (
    SPAN_COLUMNS,
    count_spans,
    density,
    detail_window,
    lanes,
    phases,
    select_level,
    spans,
)
from workbench.cli import main
from workbench.trace import Trace, read_trace, schema
from workbench.trace.store.bundle import open_bundle
from workbench.views.timeline import SPANS_SOURCE, refine, timeline
from workbench.views.timeline_density import REMOTE_BARS

PAYLOAD = "<img src=x onerror=alert(1)>"
SCRIPT_PAYLOAD = "</script><script>alert(2)</script>"


def make_trace(columns: dict[str, object]) -> Trace:
    """A Trace from event columns; the ones not given take their 'unknown' value."""
    n = len(next(iter(columns.values())))
    defaults = {"pid": 1, "tid": 1, "corr": -1, "parent": -1, "depth": 0, "launcher": -1, "flops": np.nan,
                "bytes": np.nan, "shapes": "", "dtypes": "", "args": "", "device": "cpu", "track": "cpu/thread 1",
                "kind": "op", "name": "op"}
    arrays = {}
    for field in schema.EVENTS:
        value = columns.get(field.name, defaults.get(field.name))
        if np.isscalar(value):
            value = np.full(n, value, dtype=object if isinstance(value, str) else None)
        if pa.types.is_dictionary(field.type):
            codes, uniques = pd.factorize(np.asarray(value, dtype=object))
            arrays[field.name] = pa.DictionaryArray.from_arrays(codes.astype(np.int32), pa.array(uniques, pa.string()))
        else:
            arrays[field.name] = pa.array(value, type=field.type)
    return Trace(pa.table(arrays, schema=schema.EVENTS))


def busy_trace(n: int) -> Trace:
    """`n` events (a multiple of 4) on three lanes: nested host ops and the kernels they launch."""
    group = np.arange(n) // 4
    role = np.arange(n) % 4  # 0 op, 1 nested op, 2 kernel it launched, 3 op on a second thread
    t = group * 1000
    return make_trace({
        "start_ns": t + np.array([0, 100, 300, 0])[role],
        "dur_ns": np.array([800, 400, 600, 900])[role],
        "depth": np.array([0, 1, 0, 0])[role],
        "parent": np.where(role == 1, np.arange(n) - 1, -1),
        "launcher": np.where(role == 2, np.arange(n) - 1, -1),
        "kind": np.array(["op", "op", "kernel", "op"], dtype=object)[role],
        "name": np.array(["aten::linear", "aten::addmm", "gemm", "aten::copy_"], dtype=object)[role],
        "device": np.array(["cpu", "cpu", "cuda:0", "cpu"], dtype=object)[role],
        "track": np.array(["cpu/thread 1", "cpu/thread 1", "cuda:0/stream 7", "cpu/thread 2"], dtype=object)[role],
    })


@pytest.fixture(scope="module")
def resnet() -> Trace:
    return read_trace(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"))


@pytest.fixture(scope="module")
def million() -> Trace:
    return busy_trace(1_000_000)


def glyph_renderers(fig, glyph: str) -> list[GlyphRenderer]:
    return [r for r in fig.renderers if isinstance(r, GlyphRenderer) and type(r.glyph).__name__ == glyph]


def span_source(fig) -> ColumnDataSource:
    return glyph_renderers(fig, "HBar")[0].data_source


def status_text(fig) -> str:
    return fig.above[-1].text


# --- analysis -------------------------------------------------------------------------------------------


def test_lanes_of_resnet_follow_devices_and_count_events(resnet: Trace) -> None:
    table = lanes(resnet)
    per_track = resnet.df().groupby("track", observed=True).agg(events=("name", "size"), depth=("depth", "max"))
    assert list(table["lane"]) == list(range(len(per_track)))
    assert list(table["device"]) == ["cuda:0"] + ["cpu"] * 5  # device lanes first; two threads, three marker lanes
    assert table["track"].iloc[0] == "cuda:0/stream 7" and table["label"].iloc[0] == "stream 7"
    host = table[table["device"] == "cpu"]
    assert list(host["events"]) == sorted(host["events"], reverse=True)  # busiest thread first
    for _, lane in table.iterrows():
        assert lane["events"] == per_track.loc[lane["track"], "events"]
        assert lane["max_depth"] == per_track.loc[lane["track"], "depth"]
    assert table["events"].sum() == resnet.events.num_rows


def test_streams_are_ordered_by_number() -> None:
    trace = read_trace(fixture_path("kineto", "diff_control.json.gz"))
    table = lanes(trace)
    assert list(table.loc[table["device"] == "cuda:3", "label"]) == ["stream 7", "stream 20", "stream 21", "stream 22"]
    assert table["device"].iloc[-1] == "cpu"  # the host's threads below the devices' streams


def test_spans_of_a_window_are_the_overlapping_events(resnet: Trace) -> None:
    window = (100_000_000, 104_000_000)
    table = spans(resnet, window)
    events = resnet.df()
    end = np.maximum(events["start_ns"] + events["dur_ns"], events["start_ns"] + 1)
    expected = np.flatnonzero((events["start_ns"] < window[1]) & (end > window[0]))
    assert list(table.columns) == list(SPAN_COLUMNS)
    assert table["row"].tolist() == expected.tolist() and count_spans(resnet, window) == len(expected)
    picked = events.iloc[expected]
    assert table["name"].tolist() == picked["name"].astype(str).tolist()
    assert (table["dur_ns"].to_numpy() == picked["dur_ns"].to_numpy()).all()
    lane_track = lanes(resnet).set_index("lane")["track"]
    assert (lane_track.loc[table["lane"]].to_numpy() == picked["track"].astype(str).to_numpy()).all()
    launched = events.loc[events["launcher"] >= 0, "launcher"].value_counts()
    assert (table["launched"].to_numpy() == launched.reindex(expected, fill_value=0).to_numpy()).all()
    assert (table.loc[table["kind"] == "kernel", "launcher"] >= 0).all()


def test_detail_window_is_the_longest_within_budget(resnet: Trace) -> None:
    start, end = detail_window(resnet, 5_000)
    assert start == phases(resnet)["start_ns"].min()  # it starts at the first step
    assert count_spans(resnet, (start, end)) <= 5_000 < count_spans(resnet, (start, end + 1))
    small = busy_trace(400)
    assert count_spans(small, detail_window(small, 1_000)) == 400


def test_steps_recorded_as_ops_are_phases(resnet: Trace) -> None:
    bands = phases(resnet)
    assert bands["name"].tolist() == [f"ProfilerStep#{n}" for n in range(5, 11)]
    assert (bands["tier"] == 1).all() and (bands["end_ns"] > bands["start_ns"]).all()


def test_density_conserves_events_at_every_level(resnet: Trace) -> None:
    lod = density(resnet, bins=512, levels=3)
    table = lanes(resnet)
    assert lod.bins == (512, 1024, 2048)
    for level, n_bins in enumerate(lod.bins):
        cells = lod.cells[lod.cells["level"] == level]
        per_lane = cells.groupby("lane")["count"].sum()
        assert per_lane.reindex(table["lane"], fill_value=0).tolist() == table["events"].tolist()
        assert cells["bin"].between(0, n_bins - 1).all()
        assert not cells.duplicated(["lane", "bin"]).any()
    assert lod.cells["busy"].between(0, 1).all()
    assert set(lod.cells["kind"].astype(str)) <= set(schema.KINDS)
    gpu = lod.cells[(lod.cells["lane"] == table["lane"].iloc[0]) & (lod.cells["count"] > 0)]
    assert set(gpu["kind"].astype(str)) <= {"kernel", "memcpy", "memset"}


def test_busy_is_the_union_of_span_time() -> None:
    # Two overlapping spans [0, 40) and [20, 60) in the first 100 ns bin: union 60 ns, sum 80 ns.
    trace = make_trace({"start_ns": [0, 20, 199], "dur_ns": [40, 40, 1], "name": ["a", "b", "c"]})
    lod = density(trace, bins=2, levels=2)
    first = lod.cells[lod.cells["level"] == 0].set_index("bin")
    assert first.loc[0, "busy"] == pytest.approx(0.6) and first.loc[0, "count"] == 2
    assert first.loc[1, "busy"] == pytest.approx(0.01) and first.loc[1, "name"] == "c"
    finer = lod.cells[lod.cells["level"] == 1].set_index("bin")  # 50 ns bins
    assert finer.loc[0, "busy"] == pytest.approx(1.0) and finer.loc[1, "busy"] == pytest.approx(0.2)


def test_level_rule_picks_bins_no_wider_than_a_pixel(million: Trace) -> None:
    lod = density(million, bins=2048, levels=4)
    assert select_level(lod, lod.span_ns, 1200) == 0
    assert select_level(lod, lod.span_ns / 4, 1200) == 2
    assert select_level(lod, lod.span_ns / 1000, 1200) == 3  # finer than the finest level: the finest


def test_density_of_a_million_events(million: Trace) -> None:
    lod = density(million, bins=2048, levels=4)
    assert lod.bins == (2048, 4096, 8192, 16384)
    for level, n_bins in enumerate(lod.bins):
        cells = lod.cells[lod.cells["level"] == level]
        assert len(cells) == 3 * n_bins  # every lane is active in every bin
        assert cells.groupby("lane")["count"].sum().tolist() == [250_000, 500_000, 250_000]  # the kernels' lane first
    assert lod.cells["busy"].between(0, 1).all()
    thread_2 = lod.cells[(lod.cells["level"] == 0) & (lod.cells["lane"] == 2)]
    assert thread_2["busy"].mean() == pytest.approx(0.9, abs=0.01)


# --- view -----------------------------------------------------------------------------------------------


def test_resnet_timeline_lanes_and_aggregation(resnet: Trace) -> None:
    fig = timeline(resnet, max_spans=5_000, levels=3)
    labels = {label.removeprefix("▾ ") for label in fig.yaxis[0].major_label_overrides.values()}
    # thread names from the raw file's thread_name metadata ("thread 25738 (python)"; 25738 is also the pid)
    assert {"cpu · python main thread", "cpu · python thread 25772",
            "cuda:0 · stream 7 (compute, copy, memset)"} <= labels
    assert not any("thread -" in label for label in labels)
    levels = [r for r in glyph_renderers(fig, "Rect") if r.name != REMOTE_BARS]
    assert len(levels) == 3 and [r.visible for r in levels] == [True, False, False]
    level_0 = levels[0].data_source.data
    assert int(np.sum(level_0["count"])) == resnet.events.num_rows
    assert status_text(fig).startswith(f"aggregated: {resnet.events.num_rows:,} events in {len(level_0['x']):,} "
                                       "bins — zoom in for spans")
    data = span_source(fig).data
    assert len(data["row"]) <= 5_000
    assert not glyph_renderers(fig, "HBar")[0].visible
    strip = glyph_renderers(fig, "Quad")[1].data_source.data
    assert strip["name"][0] == "ProfilerStep#5" and len(strip["name"]) == 6


def test_kernels_link_to_their_launching_ops(resnet: Trace) -> None:
    fig = timeline(resnet, max_spans=5_000)
    assert fig.select_one({"name": SPANS_SOURCE}) is span_source(fig)  # how a dashboard finds it to link
    data = span_source(fig).data
    launcher = resnet.events["launcher"].to_numpy()
    names = resnet.df()["name"].astype(str).to_numpy()
    linked = np.flatnonzero(data["launcher_idx"] >= 0)
    assert len(linked) > 100
    for i in linked:
        op = data["launcher_idx"][i]
        assert data["row"][op] == launcher[data["row"][i]]
        assert data["kind"][i] in {"kernel", "memcpy", "memset"} and data["kind"][op] == "op"
        assert data["launcher_name"][i] == names[data["row"][op]]
    assert sum(data["launched"][data["launcher_idx"][linked]]) >= len(linked)


def test_small_trace_shows_real_spans_and_phases() -> None:
    trace = make_trace({
        "start_ns": [0, 10, 20, 60, 200],
        "dur_ns": [100, 40, 30, 0, 50],
        "depth": [0, 1, 2, 1, 0],
        "kind": ["annotation", "op", "op", "op", "annotation"],
        "name": ["step 0", "aten::mm", "aten::add", "mark", "measure"],
    })
    fig = timeline(trace)
    assert glyph_renderers(fig, "HBar")[0].visible and not any(r.visible for r in glyph_renderers(fig, "Rect"))
    data = span_source(fig).data
    assert sorted(data["name"]) == sorted(["step 0", "aten::mm", "aten::add", "mark", "measure"])
    assert data["instant_px"].tolist().count(0) == 4  # the 0 ns event is drawn as a marker
    assert status_text(fig) == "5 spans in view"
    assert set(glyph_renderers(fig, "Quad")[1].data_source.data["name"]) == {"step 0", "measure"}


def test_refine_fills_a_window_and_refuses_over_budget(million: Trace) -> None:
    source = ColumnDataSource(data={})
    assert refine(million, source, 10_000, 20_000) == 40  # groups 10 to 19, four events each
    assert len(source.data["row"]) == 40 and source.tags == [10_000, 20_000]
    assert set(source.data["name"]) == {"aten::linear", "aten::addmm", "gemm", "aten::copy_"}
    assert refine(million, source, 0, 100_000_000, max_spans=1_000) > 1_000
    assert len(source.data["row"]) == 0 and source.tags == []


def test_million_events_report_stays_small(million: Trace) -> None:
    fig = timeline(million, max_spans=20_000)
    data = span_source(fig).data
    assert 0 < len(data["row"]) <= 20_000
    assert status_text(fig).startswith("aggregated: 1,000,000 events in ")
    html = file_html(fig, resources=INLINE, title="timeline")
    assert len(html.encode()) < 10_000_000


def test_one_event_and_empty_traces_render() -> None:
    one = timeline(make_trace({"start_ns": [5], "dur_ns": [0]}))
    assert len(span_source(one).data["row"]) == 1
    assert "<html" in file_html(one, resources=INLINE, title="one").lower()
    empty = timeline(make_trace({"start_ns": np.zeros(0, dtype=np.int64), "dur_ns": np.zeros(0, dtype=np.int64)}))
    assert isinstance(empty, Div) and empty.render_as_text


def test_trace_without_device_work_renders() -> None:
    trace = read_trace(fixture_path("kineto", "cpu_only_rank34.pt.trace.json.gz"))
    fig = timeline(trace)
    assert set(lanes(trace)["device"]) == {"cpu"}
    assert len(span_source(fig).data["row"]) == trace.events.num_rows
    file_html(fig, resources=INLINE, title="cpu only")


def test_names_render_as_text_never_html() -> None:
    trace = make_trace({"start_ns": [0, 10, 20], "dur_ns": [100, 5, 5], "depth": [0, 1, 1],
                        "name": [PAYLOAD, SCRIPT_PAYLOAD, "step 1"],
                        "kind": ["op", "op", "annotation"], "shapes": [PAYLOAD, "", ""]})
    fig = timeline(trace)
    html = file_html(fig, resources=INLINE, title="xss")
    assert PAYLOAD not in html and SCRIPT_PAYLOAD not in html
    assert "alert(1)" in html and "alert(2)" in html  # the names are there, as escaped JSON data
    for tool in fig.tools:
        for _, field in getattr(tool, "tooltips", None) or []:
            assert "{safe}" not in field


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    """A real capture of a tiny model (eager, on CPU): phases and steps annotated by the workbench."""
    root = tmp_path_factory.mktemp("traces")
    result = CliRunner().invoke(main, ["capture", "--model", "tiny-gpt", "--set", "d_model=32", "--set", "layers=1",
                                       "--set", "heads=2", "--batch", "2", "--seq", "8", "--iterations", "3",
                                       "--warmup", "1", "--variants", "eager", "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    return open_bundle(json.loads(result.stdout)["runs"][0]["run_id"], root).trace()


def test_captured_run_timeline(captured: Trace) -> None:
    bands = phases(captured)
    assert bands.loc[bands["tier"] == 0, "name"].tolist() == ["load", "compile", "warmup", "measure"]
    assert bands.loc[bands["tier"] == 1, "name"].tolist() == ["step 0", "step 1", "step 2"]
    fig = timeline(captured)
    assert len(span_source(fig).data["row"]) == captured.events.num_rows
    # in view: all but the instants past the events with a duration (they do not stretch the time axis)
    events = captured.df()
    timed = events[events["dur_ns"] > 0]
    first, last = timed["start_ns"].min(), (timed["start_ns"] + timed["dur_ns"]).max()
    pad = (last - first) * 0.01
    in_view = events["start_ns"].between(first - pad, last + pad).sum()
    assert status_text(fig) == f"{in_view:,} spans in view"
    x_range = Range1d(0, 1)
    assert timeline(captured, x_range=x_range).x_range is x_range
