"""Views bounded by what they draw: a trace naming a track per event folds its quietest tracks into "more"
lanes, the detectors look at the busiest devices, tables embed their first rows, and the server refuses a
dashboard it cannot hold (issue 22, defect 1). Inputs are made here: 20k events, each on its own thread."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bokeh.embed import file_html
from bokeh.models import ColumnDataSource
from bokeh.resources import INLINE
from click.testing import CliRunner
from test_timeline import make_trace

from workbench.analysis.findings.finding import MAX_DEVICES, FindingContext, Thresholds
from workbench.analysis.spans import queries as spans
from workbench.analysis.timeline import (
    FOLDED_TRACK,
    MAX_LANES,
    OTHER_DEVICES,
    density,
    lane_of_rows,
    lanes,
    track_table,
)
from workbench.cli import main
from workbench.trace.store.bundle import write_bundle
from workbench.views._table import MAX_TABLE_ROWS, data_table, rows_note
from workbench.views.tables import op_table_view
from workbench.views.timeline import TIMELINE_PLOT, timeline


def threads_trace(n: int, busy: int = 3):
    """`n` 5 ns ops, each on its own thread, but for `busy` threads that hold ten times more events."""
    tids = np.concatenate([np.arange(n), np.repeat(np.arange(busy), 9)])
    return make_trace({"start_ns": np.arange(len(tids), dtype=np.int64) * 10, "dur_ns": 5, "tid": tids,
                       "track": [f"cpu/thread {t}" for t in tids]})


def devices_trace(n: int):
    """`n` kernels, each on its own GPU's stream 7."""
    return make_trace({"start_ns": np.arange(n, dtype=np.int64) * 10, "dur_ns": 5 + np.arange(n) % 7,
                       "kind": "kernel", "device": [f"cuda:{i}" for i in range(n)],
                       "track": [f"cuda:{i}/stream 7" for i in range(n)]})


def test_a_trace_within_the_limit_keeps_a_lane_per_track():
    table = lanes(threads_trace(10))
    assert len(table) == 10
    assert (table["tracks"] == 1).all()
    assert list(table["track"]) == list(track_table(threads_trace(10).events)["track"])


def test_quiet_threads_fold_into_one_more_lane():
    trace = threads_trace(20_000)
    table = lanes(trace)
    assert len(table) == MAX_LANES
    assert table["tracks"].sum() == 20_000 and table["events"].sum() == trace.events.num_rows
    folded = table.iloc[-1]
    assert folded["track"] == FOLDED_TRACK.format(device="cpu")
    assert folded["label"] == f"{20_000 - (MAX_LANES - 1):,} more threads"
    assert set(table["track"][:3]) == {"cpu/thread 0", "cpu/thread 1", "cpu/thread 2"}  # the busiest kept first
    lane = lane_of_rows(trace.events, table)
    assert (lane >= 0).all()
    assert np.bincount(lane, minlength=len(table)).tolist() == table["events"].tolist()


def test_the_timeline_of_20k_threads_draws_its_lanes_and_says_so():
    trace = threads_trace(20_000)
    fig = timeline(trace, max_spans=100)
    assert fig.name == TIMELINE_PLOT
    assert f"in {MAX_LANES} lanes" in fig.title.text and "20,000 tracks" in fig.title.text
    labels = fig.yaxis.major_label_overrides
    assert len(labels) == MAX_LANES
    assert any(label.endswith("19,937 more threads") for label in labels.values())
    cells = density(trace, bins=64, levels=2, lane_table=lanes(trace)).cells
    assert cells["lane"].max() < MAX_LANES
    spans_source = [m for m in fig.references() if isinstance(m, ColumnDataSource) and m.name == "timeline spans"]
    assert spans_source and max(spans_source[0].data["lane"]) < MAX_LANES


def test_too_many_devices_fold_into_other_devices_and_the_detectors_look_at_the_busiest():
    trace = devices_trace(2_000)
    table = lanes(trace)
    assert len(table) <= MAX_LANES
    assert table.iloc[-1]["device"] == OTHER_DEVICES
    assert table.iloc[-1]["label"] == f"{2_000 - (len(table) - 1):,} more devices"
    assert table["tracks"].sum() == 2_000
    context = FindingContext(trace, None, Thresholds())
    assert len(context.busy) == MAX_DEVICES
    durations = trace.events["dur_ns"].to_numpy()
    kept = {int(device.split(":")[1]) for device in context.busy}
    assert min(durations[list(kept)]) >= max(np.delete(durations, list(kept)))  # the busiest were kept
    some = next(iter(context.busy))
    assert len(context.device_work(some)) == 1


def test_the_span_route_names_folded_lanes_and_their_tracks(tmp_path):
    write_bundle(tmp_path, "threads", {"device": "cpu"}, threads_trace(5_000))
    reply = spans.window(tmp_path / "threads", 0, 60_000, 400, max_spans=10)
    assert len(reply["lanes"]) == MAX_LANES
    folded = reply["lanes"][-1]
    assert folded["tracks"] == 5_000 - (MAX_LANES - 1)
    assert folded["label"].endswith("more threads")
    assert sum(lane["tracks"] for lane in reply["lanes"]) == 5_000
    assert sum(lane["events"] for lane in reply["lanes"]) == 5_000 + 27


def _threads_run(tmp_path, n: int = 5_000) -> Path:
    write_bundle(tmp_path, "threads", {"device": "cpu"}, threads_trace(n))
    return tmp_path / "threads"


def test_a_folded_lane_expands_into_its_tracks_a_page_at_a_time(tmp_path):
    run = _threads_run(tmp_path)
    whole = spans.window(run, 0, 60_000, 400, max_spans=10)
    folded = whole["lanes"][-1]
    reply = spans.window(run, 0, 60_000, 400, max_spans=10, expand=folded["lane"], offset=100)
    assert reply["expanded"] == {"lane": folded["lane"], "offset": 100, "shown": MAX_LANES, "tracks": folded["tracks"]}
    lanes_ = reply["lanes"]
    assert len(lanes_) == 2 * MAX_LANES  # the other lanes, a page of tracks, and the folded lane for the rest
    assert [lane["lane"] for lane in lanes_[:MAX_LANES - 1]] == list(range(MAX_LANES - 1))
    page = lanes_[MAX_LANES - 1:-1]
    assert [lane["lane"] for lane in page] == [MAX_LANES + i for i in range(MAX_LANES)]
    assert {lane["parent"] for lane in page} == {folded["lane"]} and {lane["tracks"] for lane in page} == {1}
    # the folded threads have one event each: busiest first, then by name, from the 100th
    quiet = sorted(lane["label"] for lane in spans.window(run, 0, 60_000, 400)["lanes"][:-1])
    expected = [f"thread {t}" for t in range(5_000) if f"thread {t}" not in quiet][100:100 + MAX_LANES]
    assert [lane["label"] for lane in page] == expected
    rest = lanes_[-1]
    assert rest["lane"] == folded["lane"] and rest["tracks"] == folded["tracks"] - MAX_LANES
    assert rest["label"] == f"{folded['tracks'] - MAX_LANES:,} more threads"
    # every event is in exactly one lane, and the reply still draws what the window holds
    assert sum(lane["events"] for lane in lanes_) == sum(lane["events"] for lane in whole["lanes"])
    assert reply["events"] == whole["events"] and reply["spans"] <= 10


def test_an_expanded_track_draws_its_spans_and_density(tmp_path):
    run = _threads_run(tmp_path, n=200)
    folded = spans.window(run, 0, 3_000, 100)["lanes"][-1]
    reply = spans.window(run, 0, 3_000, 100, max_spans=100_000, expand=folded["lane"])
    first = next(lane for lane in reply["lanes"] if lane.get("parent") == folded["lane"])
    thread = int(first["label"].split()[-1])
    assert first["mode"] == "spans" and first["spans"]["start_ns"] == [10 * thread] and first["in_window"] == 1
    dense = spans.window(run, 0, 3_000, 100, max_spans=1, expand=folded["lane"])
    lane = next(lane for lane in dense["lanes"] if lane["label"] == first["label"])
    assert lane["mode"] == "density" and lane["bins"]["count"] == [1]
    assert lane["bins"]["busy"] == [pytest.approx(5 / 30, abs=1e-4)] and dense["names"][lane["bins"]["name"][0]]


@pytest.mark.parametrize(("expand", "offset", "words"), [(0, 0, "nothing to expand"), (64, 0, "lanes 0 to 63"),
                                                        (63, 10_000, "offset is 0 to")])
def test_what_cannot_be_expanded_is_refused_naming_why(tmp_path, expand, offset, words):
    run = _threads_run(tmp_path)
    with pytest.raises(spans.QueryError, match=words):
        spans.window(run, 0, 60_000, 400, expand=expand, offset=offset)


def test_the_report_of_a_20k_thread_trace_names_the_folded_lane(tmp_path):
    write_bundle(tmp_path, "threads", {"device": "cpu"}, threads_trace(20_000))
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", "threads", "-o", str(out), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "more threads" in html and "20,000 tracks" in html


def test_tables_embed_their_first_rows_and_say_how_many():
    import pandas as pd

    frame = pd.DataFrame({"name": [f"op{i}" for i in range(MAX_TABLE_ROWS + 10)]})
    table = data_table(frame, [("name", "name", None)], width=400, height=200)
    assert len(table.source.data["name"]) == MAX_TABLE_ROWS
    assert rows_note(MAX_TABLE_ROWS) == ""
    note = rows_note(MAX_TABLE_ROWS + 10, "names")
    assert note == f" (first {MAX_TABLE_ROWS:,} of {MAX_TABLE_ROWS + 10:,} names shown)"
    names = make_trace({"start_ns": np.arange(MAX_TABLE_ROWS + 1) * 10, "dur_ns": 5,
                        "name": [f"op{i}" for i in range(MAX_TABLE_ROWS + 1)]})
    html = file_html(op_table_view(names), INLINE)
    assert f"first {MAX_TABLE_ROWS:,} of {MAX_TABLE_ROWS + 1:,} names shown" in html


def test_the_idle_table_of_too_many_devices_keeps_the_busiest():
    from workbench.views.findings import idle_table

    idle = {f"cuda:{i}": {"busy_ns": i, "idle_ns": 1, "span_ns": i + 1, "largest_gap_ns": 1, "gaps": 1,
                          "largest_gap_start_ns": 0} for i in range(MAX_TABLE_ROWS + 5)}
    view = idle_table(idle, x_range=None)
    table = view.children[1]
    assert len(table.source.data["device"]) == MAX_TABLE_ROWS
    assert {len(column) for column in table.source.data.values()} == {MAX_TABLE_ROWS}
    assert "cuda:0" not in set(table.source.data["device"])  # the quietest left out
    assert f"first {MAX_TABLE_ROWS:,} of {MAX_TABLE_ROWS + 5:,} devices" in view.children[0].text


# --- the server refuses a dashboard it cannot hold --------------------------------------------------------

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

import test_server  # noqa: E402
from pytest_jupyter.jupyter_server import *  # noqa: E402, F403
from server_api import make_run  # noqa: E402

jp_server_config, api, traces = test_server.jp_server_config, test_server.api, test_server.traces


def test_the_server_refuses_a_dashboard_it_cannot_hold(api, traces, tmp_path, monkeypatch):
    make_run(traces, "a", tmp_path)
    make_run(traces, "b", tmp_path)
    assert api.ok("GET", "runs/a/dashboard")["run"] == "a"
    monkeypatch.setattr("workbench.machine.available_memory", lambda: 1_000)  # less than three events need
    code, reply = api.call("GET", "runs/a/dashboard")
    assert code == 413
    assert "\n" not in reply["message"] and reply["message"].startswith("run 'a': ")
    assert "(3 events)" in reply["message"] and "workbench report" in reply["message"]
    code, reply = api.call("POST", "compare", {"runs": ["a", "b"]})
    assert code == 413 and reply["message"].startswith("runs 'a', 'b': ") and "(6 events)" in reply["message"]
    assert json.loads((Path(traces) / "a" / "run.json").read_text())["run_id"] == "a"  # nothing changed
