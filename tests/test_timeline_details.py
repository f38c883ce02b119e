"""The timeline's details and layout (issue #25, "Timeline"): kernel launch facts read from the raw files (Kineto
JSON, Nsight Systems SQLite), density hover figures that agree with the bars, device lanes first and at least two
rows high, lanes that collapse, and an axis no lone instant stretches."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from bokeh.models import Button, CustomJS, HoverTool
from conftest import fixture_path
from test_timeline import make_trace

from workbench.analysis.launch_facts import FIELDS, LaunchLinks, call_stack_frame, events_launch_facts, launch_facts
from workbench.analysis.spans import queries
from workbench.analysis.timeline import density, lanes
from workbench.trace import Trace, read_trace
from workbench.trace.store.bundle import write_bundle
from workbench.views import timeline_js as js
from workbench.views.timeline import DEVICE_LANE_ROWS, LANES, SPANS_SOURCE, timeline
from workbench.views.timeline_density import REMOTE_BARS
from workbench.views.timeline_panes import timeline_panel

KINETO = ("kineto", "resnet50_v100_train.pt.trace.json.gz")
NSYS = ("nsys", "h100_2gpu_1s.sqlite")
_NVTX_NAME = re.compile(r", (?:seq|op_id|sizes|input_op_ids) = ")
"""Where `torch.autograd.profiler.emit_nvtx` texts stop naming the op."""


@pytest.fixture(scope="module")
def resnet() -> Trace:
    return read_trace(fixture_path(*KINETO))


@pytest.fixture(scope="module")
def h100() -> Trace:
    return read_trace(fixture_path(*NSYS))


@pytest.fixture(scope="module")
def raw_kineto() -> list[dict]:
    with gzip.open(fixture_path(*KINETO), "rt") as raw:
        return [e for e in json.load(raw)["traceEvents"] if e.get("ph") == "X"]


def kib(value: int) -> str:
    """How the details write a shared memory size."""
    return f"{value / 1024:,.3g} KiB" if value >= 1024 else f"{value:,} B"


def expected_kineto(raw: list[dict], kernel: dict) -> list[tuple[str, str]]:
    """A Kineto kernel's launch facts from the raw events: its args, and the innermost operator around the runtime
    call of the same correlation id (on that call's thread) with the top frame of its call stack."""
    args = kernel["args"]
    call = next(e for e in raw if e.get("cat") == "Runtime" and e["args"].get("correlation") == args["correlation"])
    around = [e for e in raw if e.get("cat") == "Operator" and str(e["tid"]) == str(call["tid"])
              and e["ts"] <= call["ts"] and e["ts"] + e["dur"] >= call["ts"] + call["dur"]]
    op = max(around, key=lambda e: (e["ts"], -e["dur"]))
    facts = [("grid", " × ".join(f"{v:,}" for v in args["grid"])),
             ("block", " × ".join(f"{v:,}" for v in args["block"])),
             ("registers per thread", f"{args['registers per thread']:,}"),
             ("shared memory", kib(args["shared memory"])), ("stream", str(args["stream"])),
             ("correlation id", str(args["correlation"])), ("launching op", op["name"])]
    stack = op["args"].get("Call stack", "")
    if stack:
        facts.append(("Python frame", stack.split(";")[0].rsplit("/", 1)[-1]))
    return facts


def test_kineto_kernel_launch_facts_match_the_raw_file(resnet: Trace, raw_kineto: list[dict]) -> None:
    kernels = [e for e in raw_kineto if e.get("cat") == "Kernel"]
    picked = kernels[:40] + kernels[-40:]  # forward kernels (ops with call stacks) and backward ones (without)
    corr = resnet.events["corr"].to_numpy()
    kinds = np.asarray(resnet.events["kind"].cast("string").to_pylist(), dtype=object)
    rows = [int(np.flatnonzero((corr == k["args"]["correlation"]) & (kinds == "kernel"))[0]) for k in picked]
    got = events_launch_facts(resnet.events, np.array(rows))
    assert got == [expected_kineto(raw_kineto, k) for k in picked]
    assert any(field == "Python frame" for facts in got for field, _ in facts)  # the forward ops' call stacks


def test_nsys_kernel_launch_facts_match_the_sqlite_export(h100: Trace) -> None:
    db = sqlite3.connect(f"file:{fixture_path(*NSYS)}?mode=ro", uri=True)
    kernels = db.execute("SELECT correlationId, deviceId, streamId, globalPid, gridX, gridY, gridZ, blockX, blockY, "
                         "blockZ, registersPerThread, staticSharedMemory, dynamicSharedMemory FROM "
                         "CUPTI_ACTIVITY_KIND_KERNEL ORDER BY dynamicSharedMemory DESC, start LIMIT 30").fetchall()
    assert kernels[0][12] > 0  # some kernels have dynamic shared memory: both parts are shown
    corr = h100.events["corr"].to_numpy()
    device = np.asarray(h100.events["device"].cast("string").to_pylist(), dtype=object)
    kinds = np.asarray(h100.events["kind"].cast("string").to_pylist(), dtype=object)
    rows, expected = [], []
    for cid, dev, stream, pid, gx, gy, gz, bx, by, bz, regs, static, dynamic in kernels:
        rows.append(int(np.flatnonzero((corr == cid) & (device == f"cuda:{dev}") & (kinds == "kernel"))[0]))
        facts = [("grid", f"{gx:,} × {gy:,} × {gz:,}"), ("block", f"{bx:,} × {by:,} × {bz:,}"),
                 ("registers per thread", f"{regs:,}"),
                 ("shared memory", f"{kib(static + dynamic)} (static {kib(static)}, dynamic {kib(dynamic)})"),
                 ("stream", str(stream)), ("correlation id", str(cid))]
        call = db.execute("SELECT globalTid, start, end FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId = ? "
                          "AND globalTid >> 24 = ? >> 24", (cid, pid)).fetchone()
        if call is not None:
            ranges = db.execute("SELECT text FROM NVTX_EVENTS WHERE eventType = 59 AND globalTid = ? AND start <= ? "
                                "AND end >= ? ORDER BY start DESC, end LIMIT 1", (call[0], call[1], call[2])).fetchone()
            if ranges is not None:
                facts.append(("launching op", _NVTX_NAME.split(ranges[0])[0]))
        expected.append(facts)
    assert events_launch_facts(h100.events, np.array(rows)) == expected
    assert any(field == "launching op" for facts in expected for field, _ in facts)  # the NVTX ranges around them


def test_launch_facts_take_what_a_trace_has_in_order() -> None:
    # a memcpy: no launch configuration; the stream from the track, the correlation id from the column
    copy = launch_facts('{"bytes": 4096}', LaunchLinks(track="cuda:0/stream 20", corr=77, op="aten::copy_"))
    assert copy == [("stream", "20"), ("correlation id", "77"), ("launching op", "aten::copy_")]
    nsys_names = {"gridX": 2, "gridY": 1, "gridZ": 1, "blockX": 64, "blockY": 1, "blockZ": 1, "registersPerThread": 40,
                  "staticSharedMemory": 2048, "dynamicSharedMemory": 0, "streamId": 3, "correlationId": 9}
    facts = launch_facts(nsys_names, LaunchLinks(python_frame="model.py(12): forward"))
    assert [field for field, _ in facts] == [*FIELDS[:6], "Python frame"]
    assert dict(facts)["shared memory"] == "2 KiB (static 2 KiB, dynamic 0 B)"
    assert launch_facts("not json") == [] and launch_facts(None) == [] and launch_facts('{"grid": "x"}') == []
    stack = {"Call stack": "/a/b/conv.py(440): _conv_forward;/a/m.py(1): f"}
    assert call_stack_frame(stack) == "conv.py(440): _conv_forward"


def test_reports_and_the_events_route_give_the_same_facts(tmp_path: Path, resnet: Trace,
                                                           raw_kineto: list[dict]) -> None:
    write_bundle(tmp_path, "resnet", {"model": {"name": "resnet50"}, "variant": {"name": "import"},
                                      "device": "cuda:0"}, resnet)
    run = tmp_path / "resnet"
    kernel = next(e for e in raw_kineto if e.get("cat") == "Kernel")
    expected = expected_kineto(raw_kineto, kernel)
    row = int(np.flatnonzero(resnet.events["corr"].to_numpy() == kernel["args"]["correlation"])[0])
    assert [tuple(fact) for fact in queries.event(run, row)["launch"]] == expected  # the panel's route
    start = resnet.events["start_ns"][row].as_py()
    reply = queries.window(run, start, start + 1_000, 100, launch=True)  # what a complete report packs
    (lane,) = [lane for lane in reply["lanes"] if lane["spans"] and row in lane["spans"]["row"]]
    text = reply["launch"][lane["spans"]["launch"][lane["spans"]["row"].index(row)]]
    assert text == "\n".join(f"{FIELDS.index(field)}\t{value}" for field, value in expected)
    assert "launch" not in queries.window(run, start, start + 1_000, 100)  # the panel's windows do not pay for it
    fig = timeline(resnet, detail=(start, start + 1_000))  # what a report of windows embeds per span
    data = fig.select_one({"name": SPANS_SOURCE}).data
    assert data["launch"][list(data["row"]).index(row)] == text
    assert all(text == "" for text, kind in zip(data["launch"], data["kind"], strict=True) if kind == "op")


def test_density_counts_the_events_a_bar_is_made_of() -> None:
    # one long span [0, 1000) and a short one [900, 950): ten 100 ns bins
    trace = make_trace({"start_ns": [0, 900], "dur_ns": [1000, 50], "name": ["long", "short"], "depth": [0, 1]})
    cells = density(trace, bins=10, levels=1).cells.set_index("bin")
    assert cells["busy"].tolist() == [1.0] * 10
    assert cells["overlap"].tolist() == [1] * 9 + [2]  # every busy bar has events, though only bin 0 and 9 see starts
    assert cells["count"].tolist() == [1] + [0] * 8 + [1]


def test_density_hover_agrees_with_the_bars(resnet: Trace) -> None:
    cells = density(resnet, bins=256, levels=3).cells
    assert (cells.loc[cells["busy"] > 0, "overlap"] >= 1).all()
    assert (cells["overlap"] >= cells["count"]).all()
    fig = timeline(resnet, max_spans=5_000, levels=3, bins=256)
    hovers = [tool for tool in fig.tools if isinstance(tool, HoverTool)]
    texts = [" ".join(f"{label} {value}" for label, value in tool.tooltips) for tool in hovers
             if isinstance(tool.tooltips, list)]
    assert any("@overlap{0,0} overlapping this bar" in text for text in texts)
    remote = next(text for tool, text in zip(hovers, texts, strict=True) if tool.renderers[0].name == REMOTE_BARS)
    assert "starting in this pixel" in remote and "aggregated" not in " ".join(texts)


def test_a_lone_instant_does_not_stretch_the_time_axis(resnet: Trace, raw_kineto: list[dict]) -> None:
    timed = [e for e in raw_kineto if e.get("dur", 0) > 0]
    first, last = min(e["ts"] for e in timed), max(e["ts"] + e["dur"] for e in timed)
    with gzip.open(fixture_path(*KINETO), "rt") as raw:
        marker = next(e for e in json.load(raw)["traceEvents"] if e.get("name") == "Record Window End")
    assert marker["ts"] - last > 50_000  # a lone instant, over 100 ms after the rest
    lod = density(resnet, bins=64, levels=1)
    assert lod.span_ns == pytest.approx((last - first) * 1000, abs=1000)
    fig = timeline(resnet, max_spans=5_000, bins=64, levels=1)
    assert fig.x_range.bounds[1] - fig.x_range.bounds[0] == pytest.approx(1.02 * (last - first) * 1000, rel=1e-3)
    assert int(lod.cells["count"].sum()) == resnet.events.num_rows  # the instant still counts, at the edge


def test_device_lanes_come_first_and_are_at_least_two_rows_high(resnet: Trace, h100: Trace) -> None:
    for trace in (resnet, h100):
        devices = lanes(trace)["device"].tolist()
        assert devices == sorted(devices, key=lambda d: d == "cpu")  # accelerators, then the host
    fig = timeline(resnet, max_spans=5_000)
    lane_source = fig.select_one({"name": LANES}).data
    table = lanes(resnet)
    assert lane_source["rows"] == (table["max_depth"] + 1).tolist() and lane_source["device"][0] == "cuda:0"
    data = fig.select_one({"name": SPANS_SOURCE}).data
    kernel = list(data["kind"]).index("kernel")
    assert data["h"][kernel] == pytest.approx(0.8 * DEVICE_LANE_ROWS)  # one row of kernels, drawn twice as tall
    host = list(data["lane"]).index(1)
    assert data["h"][host] == pytest.approx(0.8)
    ticks = fig.yaxis[0].ticker.ticks
    assert ticks[0] == pytest.approx(DEVICE_LANE_ROWS / 2)


def test_lanes_collapse_by_their_label_and_by_the_buttons(resnet: Trace) -> None:
    layout = timeline_panel(resnet, max_spans=5_000)
    fig = layout.select_one({"name": "timeline"})
    tap = fig.select_one({"name": js.COLLAPSE_CALLBACK})
    assert isinstance(tap, CustomJS) and tap.code == js.COLLAPSE and tap.args["what"] is None
    assert tap.args["lanes"] is fig.select_one({"name": LANES})
    buttons = {b.label: b for b in layout.select({"type": Button}) if b.label.endswith("lanes")}
    assert set(buttons) == {"collapse lanes", "expand lanes"}
    for label, what in (("collapse lanes", "collapse"), ("expand lanes", "expand")):
        (callback,) = buttons[label].js_event_callbacks["button_click"]
        assert callback.code == js.COLLAPSE and callback.args["what"] == what
        assert callback.args["lanes"] is tap.args["lanes"]
    labels = list(fig.yaxis[0].major_label_overrides.values())
    assert labels[1] == "▾ cpu · python main thread" and not labels[0].startswith("▾")  # only a lane of several rows
