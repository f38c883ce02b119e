"""The counter tracks under the timeline in a real `jupyter lab` with headless Chromium, on a real GPU trace
(ResNet-50, Kineto): the tracks BokehJS draws hold the values of the raw file (allocated bytes, a running sum of
the `[memory]` records' `Bytes`; the busy fraction of each bin of the kernels, copies and memsets of the stream),
the peak is drawn, a time is at the same x on the timeline and on the tracks, the hover reads the peak in GiB,
and a group hides. The screenshot goes to docs/images/counter-tracks.png."""

# ruff: noqa: F811 (the Lab fixtures imported below are used as fixture parameters of the same names)
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import fixture_path
from test_lab_browser import (  # the same Lab server, browser and panel fixtures
    Lab,  # noqa: F401
    browser,  # noqa: F401
    lab,  # noqa: F401
    page,  # noqa: F401
    pytestmark,  # noqa: F401
    run_row,
    view_selector,
    wait_for_plots,
)

from workbench.trace import read_trace
from workbench.trace.store.bundle import write_bundle

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
FIXTURE = ("kineto", "resnet50_v100_train.pt.trace.json.gz")
RUN = "resnet50-counters"
DEVICE_CATEGORIES = {"Kernel", "Memcpy", "Memset"}
"""The categories of the fixture's device work (2021 Kineto names)."""
DOC = "Bokeh.documents.find((d) => d.get_model_by_name('counter track groups'))"
"""The embedded dashboard's BokehJS document (the one holding the counter tracks)."""
MODELS = f"""const doc = {DOC};
const plot = doc.get_model_by_name('timeline'), toggle = doc.get_model_by_name('counter track groups');
const tracks = [...doc.all_models].filter((m) => m.name == 'counter track');
const track = (name) => tracks.find((t) => t.tags[0].track == name);
const points = (name) => track(name).renderers.map((r) => r.data_source)
  .find((s) => s.name == 'counter track points').data;"""


def evaluate(page, body: str, arg=None):
    """Run `body` (JS statements ending in a return) with the dashboard's models in scope."""
    return page.evaluate(f"(arg) => {{ {MODELS}\n{body} }}", arg)


def wait_for(page, condition: str, arg=None, timeout: int = 60_000) -> None:
    page.wait_for_function(f"(arg) => {{ if (!{DOC}) return false; {MODELS}\n{condition} }}",
                           arg=arg, timeout=timeout)


def raw_trace() -> tuple[list[dict], float]:
    """The raw events of the fixture and the reader's origin on their clock (µs): the earliest timestamp of
    any record but metadata."""
    with gzip.open(fixture_path(*FIXTURE), "rt") as raw:
        events = json.load(raw)["traceEvents"]
    return events, min(e["ts"] for e in events if e.get("ph") != "M" and "ts" in e)


def raw_allocated(events: list[dict], origin: float, device_type: int) -> tuple[np.ndarray, np.ndarray]:
    """Times (ns from the origin) and allocated bytes of one device type's `[memory]` records: the running sum of
    their `Bytes` in time order (the 2021 format writes no totals)."""
    rows = sorted(((e["ts"], e["args"]["Bytes"]) for e in events
                   if e.get("name") == "[memory]" and e["args"]["Device Type"] == device_type), key=lambda r: r[0])
    return (np.array([round((t - origin) * 1000) for t, _ in rows], dtype=np.int64),
            np.cumsum([b for _, b in rows]))


def raw_busy(events: list[dict], origin: float, edges: np.ndarray) -> np.ndarray:
    """The fraction of each bin [edges[i], edges[i+1]) (ns from the origin) that the union of the stream's
    kernels, copies and memsets covers (the fixture has one stream)."""
    spans = sorted((round((e["ts"] - origin) * 1000), round((e["ts"] + e["dur"] - origin) * 1000))
                   for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES and e["dur"] > 0)
    merged: list[list[int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    m = np.array(merged, dtype=np.int64)
    lo, hi = edges[:-1, None], edges[1:, None]
    return np.clip(np.minimum(hi, m[None, :, 1]) - np.maximum(lo, m[None, :, 0]), 0, None).sum(axis=1) / np.diff(edges)


@pytest.fixture(scope="module")
def counters_run(lab) -> str:
    info = {"model": {"name": "resnet50"}, "variant": {"name": "kineto import"}, "device": "cuda:0"}
    write_bundle(lab.traces, RUN, info, read_trace(fixture_path(*FIXTURE)))
    return RUN


def test_counter_tracks_draw_the_raw_counters(lab, page, counters_run):
    IMAGES.mkdir(parents=True, exist_ok=True)
    events, origin = raw_trace()
    page.locator("#jp-workbench-sidebar").get_by_role("button", name="Refresh", exact=True).click()
    run_row(page, counters_run).wait_for(timeout=30_000)
    run_row(page, counters_run).locator(".jp-Workbench-runName").click()
    wait_for_plots(page, view_selector([counters_run]))
    wait_for(page, "return tracks.length == 3 && tracks.every((t) => Bokeh.index.find_one(t) != null)")
    assert evaluate(page, "return tracks.map((t) => t.tags[0].track)") == [
        "cuda:0 allocated", "cpu allocated", "cuda:0 · stream 7"]
    assert evaluate(page, "return toggle.labels") == ["memory (2)", "device busy (1)"]
    width = evaluate(page, "return tracks[0].width")

    # memory: every drawn point is a raw record, the peak and the trough are there; all of them when they fit
    for name, device_type in (("cuda:0 allocated", 1), ("cpu allocated", 0)):
        ts, allocated = raw_allocated(events, origin, device_type)
        drawn = evaluate(page, "const d = points(arg); return [Array.from(d.ts_ns), Array.from(d.value)]", name)
        drawn_ts, drawn_value = np.array(drawn[0], dtype=np.int64), np.array(drawn[1])
        assert len(drawn_ts) <= 4 * width
        if len(ts) <= 4 * width:
            np.testing.assert_array_equal(drawn_ts, ts)
            np.testing.assert_array_equal(drawn_value, allocated)
        assert set(zip(drawn_ts.tolist(), drawn_value.tolist(), strict=True)) <= set(
            zip(ts.tolist(), allocated.tolist(), strict=True))
        assert drawn_value.max() == allocated.max() and drawn_value.min() == allocated.min()
    ts, allocated = raw_allocated(events, origin, 1)
    assert len(ts) <= 4 * width or len(drawn_ts) < len(ts)  # cuda:0 has 8,220 records

    # device busy: the fraction of each drawn bin equals the raw spans' union over it
    busy = evaluate(page, "const d = points(arg); return [Array.from(d.ts_ns), Array.from(d.end_ns), "
                          "Array.from(d.value)]", "cuda:0 · stream 7")
    edges = np.append(np.array(busy[0], dtype=np.int64), int(busy[1][-1]))
    np.testing.assert_array_equal(np.array(busy[1], dtype=np.int64), edges[1:])
    np.testing.assert_allclose(busy[2], raw_busy(events, origin, edges), rtol=0, atol=1e-9)
    assert max(busy[2]) == 1.0 and 0 < np.mean(busy[2]) < 1

    # the tracks share the timeline's range, and a time is at the same x on both
    peak_ns = int(ts[np.argmax(allocated)])
    evaluate(page, "plot.x_range.setv({start: arg - 2e7, end: arg + 2e7}); return null", peak_ns)
    wait_for(page, "return tracks.every((t) => t.x_range === plot.x_range)")
    page.wait_for_timeout(500)
    xs = evaluate(page, """return [plot, ...tracks].map((p) => {
  const view = Bokeh.index.find_one(p);
  return view.el.getBoundingClientRect().left + view.frame.x_scale.compute(arg);
});""", peak_ns)
    assert max(xs) - min(xs) < 1.5, xs

    # hovering the peak names it in GiB
    target = evaluate(page, """const view = Bokeh.index.find_one(track('cuda:0 allocated'));
view.el.scrollIntoView({block: 'center'});
const box = view.el.getBoundingClientRect();
return [box.left + view.frame.x_scale.compute(arg), box.top + view.frame.bbox.top + view.frame.bbox.height / 2];""",
                      peak_ns)
    page.wait_for_timeout(300)
    target = evaluate(page, """const view = Bokeh.index.find_one(track('cuda:0 allocated'));
const box = view.el.getBoundingClientRect();
return [box.left + view.frame.x_scale.compute(arg), box.top + view.frame.bbox.top + view.frame.bbox.height / 2];""",
                      peak_ns)
    page.mouse.move(target[0] - 3, target[1])
    page.mouse.move(*target)
    peak_gib = f"{allocated.max() / 2**30:.1f} GiB"  # 2.6 GiB
    page.get_by_text(peak_gib).filter(visible=True).first.wait_for(timeout=10_000)
    view = page.locator(view_selector([counters_run]))
    heading = page.get_by_text("Counter tracks (show or hide a group):")
    top = heading.bounding_box()["y"] - 8
    axis = evaluate(page, "const v = Bokeh.index.find_one(tracks[tracks.length - 1]); "
                          "return v.el.getBoundingClientRect().bottom")
    box = view.bounding_box()
    page.screenshot(path=str(IMAGES / "counter-tracks.png"),
                    clip={"x": box["x"], "y": top, "width": min(box["width"], width + 40), "height": axis - top + 70})

    # a group hides and shows again
    page.get_by_label("memory (2)").uncheck()
    wait_for(page, "return !track('cuda:0 allocated').visible && !track('cpu allocated').visible && "
                   "track('cuda:0 · stream 7').visible")
    page.get_by_label("memory (2)").check()
    wait_for(page, "return tracks.every((t) => t.visible)")
    assert page.seen.errors == []
    assert page.seen.dialogs == []
