"""The dashboard timeline in a real `jupyter lab` with headless Chromium, on a real GPU trace (ResNet-50, Kineto):
the GPU stream is the top lane; zoomed into the last 10% of the trace the panel fetches that window's spans from the
server and a named kernel is there; a click on it shows its details with its launch facts (grid, block, registers,
... as the raw file records them), its launcher and a flow arrow; searching another kernel's name jumps the timeline
to a match, which the details pane then shows and the focus marker marks; a click on a lane's label collapses it to
one row and a second click expands it; W zooms in; a redraw at a new width keeps the zoom. Screenshots go to
docs/images/timeline-*.png."""

# ruff: noqa: F811 (the Lab fixtures imported below are used as fixture parameters of the same names)
from __future__ import annotations

import gzip
import json
from pathlib import Path

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
RUN = "resnet50-gpu"
DOC = "Bokeh.documents.find((d) => d.get_model_by_name('timeline'))"
"""The embedded dashboard's BokehJS document (the one holding the timeline)."""
MODELS = f"""const doc = {DOC};
const plot = doc.get_model_by_name('timeline'), spans = doc.get_model_by_name('timeline spans');
const remote = doc.get_model_by_name('timeline remote');"""


def evaluate(page, body: str, arg=None):
    """Run `body` (JS statements ending in a return) with the timeline's models in scope."""
    return page.evaluate(f"(arg) => {{ {MODELS}\n{body} }}", arg)


def wait_for(page, condition: str, arg=None, timeout: int = 60_000) -> None:
    page.wait_for_function(f"(arg) => {{ if (!{DOC}) return false; {MODELS}\n{condition} }}",
                           arg=arg, timeout=timeout)


def screen_point(page, t_ns: float, y: float) -> tuple[float, float]:
    """Page coordinates of the plot's point (t_ns, y)."""
    return tuple(evaluate(page, """
const view = Bokeh.index.find_one(plot), box = view.el.getBoundingClientRect();
return [box.left + view.frame.x_scale.compute(arg[0]), box.top + view.frame.y_scale.compute(arg[1])];""",
                          [t_ns, y]))


@pytest.fixture(scope="module")
def gpu_run(lab) -> str:
    trace = read_trace(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"))
    info = {"model": {"name": "resnet50"}, "variant": {"name": "kineto import"}, "device": "cuda:0"}
    write_bundle(lab.traces, RUN, info, trace)
    return RUN


def raw_launch(correlation: int) -> tuple[dict, dict[str, str]]:
    """From the raw file: the args of the kernel with this correlation id, and the recorded call stacks of the ops
    sharing its external id (by op name: the ops around its launch)."""
    with gzip.open(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"), "rt") as raw:
        events = [e for e in json.load(raw)["traceEvents"] if e.get("ph") == "X"]
    kernel = next(e["args"] for e in events if e.get("cat") == "Kernel" and e["args"]["correlation"] == correlation)
    stacks = {e["name"]: e["args"].get("Call stack", "") for e in events
              if e.get("cat") == "Operator" and e["args"].get("External id") == kernel["external id"]}
    return kernel, stacks


def expected_kernels_in_last_tenth() -> tuple[int, int, set[str]]:
    """From the raw file: the trace's first start and last end (ns, from its first event) and the names of the
    kernels starting in its last 11% (a margin for where the reader puts the origin)."""
    with gzip.open(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"), "rt") as raw:
        events = [e for e in json.load(raw)["traceEvents"] if e.get("ph") == "X"]
    origin = min(e["ts"] for e in events)
    last = max(e["ts"] + e.get("dur", 0) for e in events)
    cut = last - (last - origin) * 0.11
    names = {e["name"] for e in events if e.get("cat", "").lower() == "kernel" and e["ts"] >= cut}
    return 0, int((last - origin) * 1000), names


def test_zoom_click_search_on_a_gpu_trace(lab, page, gpu_run):
    IMAGES.mkdir(parents=True, exist_ok=True)
    first, last, late_kernels = expected_kernels_in_last_tenth()
    assert late_kernels, "the fixture has kernels in its last tenth"
    page.locator("#jp-workbench-sidebar").get_by_role("button", name="Refresh", exact=True).click()
    run_row(page, gpu_run).wait_for(timeout=30_000)
    run_row(page, gpu_run).locator(".jp-Workbench-runName").click()
    wait_for_plots(page, view_selector([gpu_run]))
    wait_for(page, "return remote._wb_api != null")  # the panel gave the timeline the server's routes

    # lanes are named for people, the GPU stream first; a lane of several rows has a triangle to collapse it
    labels = evaluate(page, "const o = plot.left[0].major_label_overrides; "
                            "return o instanceof Map ? [...o.values()] : Object.values(o)")
    assert "▾ cpu · python main thread" in labels and labels[0] == "cuda:0 · stream 7 (compute, copy, memset)"

    # the last 10% of the trace: the server sends its spans and named kernels are there
    start = last - (last - first) / 10
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/spans?" in r.url else None)
    with page.expect_request(lambda r: "/spans?" in r.url, timeout=30_000):  # the view at connect may cover it
        evaluate(page, "plot.x_range.setv({start: arg[0], end: arg[1]}); return null", [start, last])
    # the reply of this view (twice its width: half a view each side), not the whole trace's asked at connect
    wait_for(page, """const d = spans.data, t = spans.tags;
return t.length == 2 && t[0] <= arg[0] && t[1] >= arg[1] && t[1] - t[0] <= 2.5 * (arg[1] - arg[0]) &&
  d.kind.some((k, i) => k == 'kernel' && d.left[i] >= arg[0] && d.name[i] && d.right[i] <= arg[1]);""",
             [start, last])
    assert requests and all("start_ns=" in url and "width_px=" in url for url in requests)
    kernel = evaluate(page, """const d = spans.data;
let best = -1;
for (let i = 0; i < d.left.length; i++)
  if (d.kind[i] == 'kernel' && d.left[i] >= arg && d.launcher_idx[i] >= 0 &&
      (best < 0 || d.dur_ns[i] > d.dur_ns[best])) best = i;
return {i: best, name: d.name[best], left: d.left[best], right: d.right[best], y: d.y[best], row: d.row[best],
        launcher: d.name[d.launcher_idx[best]]};""", start)
    assert kernel["i"] >= 0 and kernel["name"] in late_kernels
    page.wait_for_timeout(300)
    page.screenshot(path=str(IMAGES / "timeline-last-tenth.png"))

    # zoom onto it and click it: its details, its launcher and a flow arrow
    width = max((kernel["right"] - kernel["left"]) * 20, 20_000)
    center = (kernel["left"] + kernel["right"]) / 2
    evaluate(page, "plot.x_range.setv({start: arg[0], end: arg[1]}); return null", [center - width / 2,
                                                                                     center + width / 2])
    wait_for(page, "return spans.data.row.includes(arg)", kernel["row"])
    page.wait_for_timeout(500)
    x, y = screen_point(page, center, kernel["y"])
    page.mouse.click(x, y)
    wait_for(page, """const details = doc.get_model_by_name('timeline details');
return details.data.value.includes(arg) && details.data.field.some((f) => f.startsWith('arg: '))""", kernel["name"])
    # its launch facts, as the raw file records them
    facts = evaluate(page, """const d = doc.get_model_by_name('timeline details').data;
return Object.fromEntries(d.field.map((f, i) => [f, d.value[i]]));""")
    raw, stacks = raw_launch(int(facts["correlation id"]))
    assert facts["grid"] == " × ".join(f"{v:,}" for v in raw["grid"])
    assert facts["block"] == " × ".join(f"{v:,}" for v in raw["block"])
    assert facts["registers per thread"] == f"{raw['registers per thread']:,}"
    assert facts["stream"] == str(raw["stream"]) and facts["launching op"] == kernel["launcher"]
    stack = stacks[facts["launching op"]]  # the innermost frame of its recorded stack, when it has one
    assert facts.get("Python frame", "") == (stack.split(";")[0].rsplit("/", 1)[-1] if stack else "")
    related = evaluate(page, """const r = doc.get_model_by_name('timeline related').data;
return r.relation.map((rel, i) => [rel, r.name[i]]);""")
    assert ["launched by", kernel["launcher"]] in related
    arrows = evaluate(page, "return [...doc.all_models].filter((m) => m.type == 'Arrow')"
                            ".map((a) => a.source.data.x1.length)")
    assert arrows and arrows[0] >= 1
    # what the page shows: the details table lists the facts too (a table redraws only on data it sees change)
    facts_row = page.locator(".slick-row", has_text="registers per thread").first
    facts_row.wait_for(timeout=10_000)
    page.mouse.move(5, 5)  # no hover box over the plot
    page.locator(".slick-row", has_text="launching op").first.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    page.screenshot(path=str(IMAGES / "timeline-details.png"))

    # search another kernel's name: the count, and the timeline jumps to the first match, selected and shown
    other = evaluate(page, """const d = spans.data;
return d.name.find((name, i) => d.kind[i] == 'kernel' && name != arg && name.length > 8);""", kernel["name"])
    search = page.locator("input[placeholder^='search event names']")
    search.fill(other)
    search.press("Enter")
    wait_for(page, "return doc.get_model_by_name('timeline search status').text.startsWith('match 1 of')")
    status = evaluate(page, "return doc.get_model_by_name('timeline search status').text")
    count = int(status.split(" of ")[1].split(" ")[0].replace(",", ""))
    assert count >= 1
    wait_for(page, """const i = spans.selected.indices.find((j) => spans.data.name[j] == arg);
return i != null && spans.data.left[i] >= plot.x_range.start && spans.data.left[i] <= plot.x_range.end""", other)
    wait_for(page, """const i = spans.selected.indices.find((j) => spans.data.name[j] == arg);
const d = doc.get_model_by_name('timeline details').data;  // the details pane describes the match
return i != null && d.value[d.field.indexOf('name')] == arg &&
  d.value[d.field.indexOf('row')] == spans.data.row[i].toLocaleString('en-US');""", other)
    # what the page shows: the details table's first row names the match, and the match is outlined and marked
    details_text = page.locator(".slick-row").first.inner_text()
    assert other[:40] in details_text
    marked = evaluate(page, """const f = doc.get_model_by_name('timeline focus').data;
const marker = doc.get_model_by_name('timeline focus marker');
const i = spans.selected.indices.find((j) => spans.data.name[j] == arg);
return [f.left[0] == spans.data.left[i], f.y[0] == spans.data.y[i], marker.visible,
        marker.location == spans.data.left[i]];""",
                      other)
    assert marked == [True, True, True, True]
    page.locator(".slick-row", has_text="registers per thread").first.wait_for(timeout=10_000)  # its launch facts
    page.screenshot(path=str(IMAGES / "timeline-search.png"))

    # a click on a lane's label collapses it to one row (its top-level spans), a second expands it
    lane_rows = """const lanes = doc.get_model_by_name('timeline lanes').data, i = lanes.rows.findIndex((r) => r > 1);
const lane = lanes.lane[i], ys = spans.data.y.filter((y, j) => spans.data.lane[j] == lane);
return {i, lane, rows: lanes.rows[i], collapsed: lanes.collapsed[i], drawn: new Set(ys.filter(isFinite)).size,
        hidden: ys.filter((y) => !isFinite(y)).length, tick: plot.left[0].ticker.ticks[i], height: plot.height};"""
    before = evaluate(page, lane_rows)
    assert before["rows"] > 1 and not before["collapsed"] and before["drawn"] > 1
    box = evaluate(page, "const view = Bokeh.index.find_one(plot), b = view.el.getBoundingClientRect(); "
                         "return [b.left + view.frame.bbox.left, b.top + view.frame.y_scale.compute(arg)]",
                   before["tick"])
    page.mouse.click(box[0] - 40, box[1])
    wait_for(page, "return doc.get_model_by_name('timeline lanes').data.collapsed.some((c) => c)")
    after = evaluate(page, lane_rows)
    assert after["collapsed"] and after["drawn"] == 1 and after["height"] < before["height"]
    assert before["hidden"] == 0 and after["hidden"] > 0  # its deeper spans are hidden
    page.wait_for_timeout(300)
    page.screenshot(path=str(IMAGES / "timeline-collapsed.png"))
    box = evaluate(page, "const view = Bokeh.index.find_one(plot), b = view.el.getBoundingClientRect(); "
                         "return [b.left + view.frame.bbox.left, b.top + view.frame.y_scale.compute(arg)]",
                   after["tick"])
    page.mouse.click(box[0] - 40, box[1])
    wait_for(page, "return !doc.get_model_by_name('timeline lanes').data.collapsed.some((c) => c)")
    assert evaluate(page, lane_rows)["drawn"] == before["drawn"]

    # W zooms in while the pointer is over the plot (and no text field has the keyboard: typing is not zooming)
    search.blur()
    before = evaluate(page, "return plot.x_range.end - plot.x_range.start")
    x, y = screen_point(page, evaluate(page, "return (plot.x_range.start + plot.x_range.end) / 2"), kernel["y"])
    page.mouse.move(x, y)
    page.keyboard.press("w")
    wait_for(page, "return plot.x_range.end - plot.x_range.start < arg * 0.9", before)

    # a redraw at another width keeps the zoom
    kept = evaluate(page, "return [plot.x_range.start, plot.x_range.end]")
    old_id = evaluate(page, "return plot.id")
    page.set_viewport_size({"width": 1200, "height": 950})
    wait_for(page, "return plot.id != arg", old_id, timeout=120_000)
    page.wait_for_timeout(500)
    now = evaluate(page, "return [plot.x_range.start, plot.x_range.end]")
    assert now == pytest.approx(kept, rel=1e-9, abs=1)
    page.set_viewport_size({"width": 1500, "height": 950})
    assert page.seen.errors == []
    assert page.seen.dialogs == []


@pytest.fixture(scope="module")
def threads_run(lab) -> str:
    from test_lane_folding import threads_trace

    info = {"model": {"name": "threads"}, "variant": {"name": "kineto import"}, "device": "cpu"}
    write_bundle(lab.traces, "threads-2000", info, threads_trace(2_000))
    return "threads-2000"


def test_a_folded_lane_expands_in_the_panel(lab, page, threads_run):
    page.locator("#jp-workbench-sidebar").get_by_role("button", name="Refresh", exact=True).click()
    run_row(page, threads_run).wait_for(timeout=30_000)
    run_row(page, threads_run).locator(".jp-Workbench-runName").click()
    wait_for_plots(page, view_selector([threads_run]))
    wait_for(page, "return remote._wb_api != null")
    labels = "const o = plot.left[0].major_label_overrides; return [...o.values()]"
    before = evaluate(page, labels)
    folded = [label for label in before if label.endswith("more threads")]
    assert len(before) == 64 and len(folded) == 1
    tracks = int(folded[0].split(" · ")[1].split()[0].replace(",", ""))
    picker = page.locator("select:has(option:has-text('folded lanes: expand one'))")
    picker.wait_for(state="visible", timeout=30_000)

    picker.select_option(label=folded[0])
    wait_for(page, "return remote._wb_expanded != null && remote._wb_expanded.offset == 0")
    shown = evaluate(page, labels)
    assert len(shown) == 63 + 64 + 1 and f"cpu · {tracks - 64:,} more threads" in shown
    new = [label for label in shown if label not in before]
    assert len(new) == 65 and sum(label.startswith("cpu · thread ") for label in new) == 64
    wait_for(page, "return spans.data.lane.some((lane) => lane >= 64)")  # the tracks' own spans are drawn
    assert page.get_by_text(f"tracks 1 to 64 of {tracks:,}, busiest first").is_visible()
    page.wait_for_timeout(300)
    page.screenshot(path=str(IMAGES / "timeline-expanded.png"))

    page.get_by_role("button", name="next 64 ▶").click()
    wait_for(page, "return remote._wb_expanded != null && remote._wb_expanded.offset == 64")
    assert page.get_by_text(f"tracks 65 to 128 of {tracks:,}, busiest first").is_visible()
    picker.select_option(label="folded lanes: expand one…")
    wait_for(page, "return remote._wb_expanded == null")
    assert evaluate(page, labels) == before
    assert page.seen.errors == []
