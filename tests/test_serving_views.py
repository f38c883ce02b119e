"""The serving views (`workbench.views.serving`, data from `workbench.analysis.serving`): the waterfall, step lane
and counter tracks of one run, a sweep's curves, their caps, escaping, and their place in the report and the
notebook. Bundles are built here from hand-made tables."""

from __future__ import annotations

import shutil
from html import escape

import numpy as np
import pyarrow as pa
import pytest
from bokeh.embed import file_html
from bokeh.models import ColumnDataSource, CustomJS, DataTable, Div, NumberFormatter, Plot, TapTool
from bokeh.resources import INLINE
from click.testing import CliRunner
from conftest import PAYLOADS

from workbench.analysis.serving import counter_tracks, in_flight, step_lane, summary_tables, sweep_curve, waterfall
from workbench.cli import main
from workbench.serving.join import with_phases
from workbench.serving.metrics import latency_summary
from workbench.serving.steps import STEPS_SCHEMA
from workbench.trace import Trace
from workbench.trace.schema import COUNTERS, EVENTS
from workbench.trace.store.bundle import open_bundle, write_bundle
from workbench.trace.store.experiment import write_experiment
from workbench.trace.store.records import ExperimentRecord, RunInfo
from workbench.views.serving import SEGMENTS, STEPS, serving_layout, serving_sweep_view, serving_view

MS = 1_000_000


def make_requests(n: int = 6, *, failed: tuple[int, ...] = (), ids: list[str] | None = None,
                  tokens: int = 4) -> pa.Table:
    """`n` requests 10 ms apart, each 2 ms to its first token then `tokens` chunks 1 ms apart; `failed` ones
    have no tokens and an error."""
    rows = []
    for i in range(n):
        arrival = 10 * MS * i
        bad = i in failed
        times = [] if bad else [arrival + 2 * MS + k * MS for k in range(tokens)]
        rows.append({
            "request": i, "id": (ids or [f"req-{j}" for j in range(n)])[i], "session": None, "turn": 0,
            "arrival_ns": arrival, "ack_ns": arrival + MS // 2, "first_token_ns": times[0] if times else None,
            "end_ns": arrival + (MS if bad else 2 * MS + tokens * MS), "token_ns": times or None,
            "prompt_tokens": 32, "output_tokens": 0 if bad else tokens, "status": "error" if bad else "ok",
            "error": "HTTP 500: boom" if bad else None, "ttft_ns": None if bad else 2 * MS,
            "e2e_ns": None if bad else 2 * MS + tokens * MS, "tpot_ns": None if bad else float(MS), "source": "test"})
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("request", pa.int64()), ("id", pa.string()), ("session", pa.string()), ("turn", pa.int64()),
        ("arrival_ns", pa.int64()), ("ack_ns", pa.int64()), ("first_token_ns", pa.int64()), ("end_ns", pa.int64()),
        ("token_ns", pa.list_(pa.int64())), ("prompt_tokens", pa.int64()), ("output_tokens", pa.int64()),
        ("status", pa.string()), ("error", pa.string()), ("ttft_ns", pa.int64()), ("e2e_ns", pa.int64()),
        ("tpot_ns", pa.float64()), ("source", pa.string())]))


def make_steps(n_requests: int = 6, tokens: int = 4) -> pa.Table:
    """Per request a prefill step ending just before its first token, then a decode step per later chunk."""
    rows = []
    for i in range(n_requests):
        arrival = 10 * MS * i
        rows.append({"start_ns": arrival + MS, "dur_ns": MS * 9 // 10, "mode": "prefill", "prefill_requests": 1,
                     "prefill_tokens": 32, "decode_requests": 0, "batch_requests": 1})
        rows += [{"start_ns": arrival + 2 * MS + k * MS + MS // 10, "dur_ns": MS * 8 // 10, "mode": "decode",
                  "prefill_requests": 0, "prefill_tokens": 0, "decode_requests": 1, "batch_requests": 1}
                 for k in range(tokens - 1)]
    columns = {name: [row.get(name) for row in rows] for name in STEPS_SCHEMA.names}
    columns["step"] = list(range(len(rows)))
    columns["engine"] = ["vllm"] * len(rows)
    columns["kernels"] = [3] * len(rows)
    columns["kernel_ns"] = [MS // 2] * len(rows)
    return pa.table(columns, schema=STEPS_SCHEMA)


def make_counters(end_ns: int) -> pa.Table:
    """Samples every 10 ms of running/waiting gauges, KV usage and a generation-token counter."""
    ts = list(range(0, end_ns + 10 * MS, 10 * MS))
    series = {"vllm:num_requests_running": [1.0] * len(ts), "vllm:num_requests_waiting": [0.0] * len(ts),
              "vllm:kv_cache_usage_perc": [0.25] * len(ts),
              "vllm:generation_tokens_total": [4.0 * i for i in range(len(ts))]}
    rows = [(t, "server", name, values[k]) for name, values in series.items() for k, t in enumerate(ts)]
    rows.append((0, "cpu", "vllm:num_requests_running", 99.0))  # another device's series is no server metric
    return pa.table({"ts_ns": pa.array([r[0] for r in rows], pa.int64()),
                     "device": pa.array([r[1] for r in rows]).dictionary_encode(),
                     "name": pa.array([r[2] for r in rows]).dictionary_encode(),
                     "value": pa.array([r[3] for r in rows], pa.float64())}).cast(COUNTERS)


def serving_bundle(root, run_id: str, *, n: int = 6, failed: tuple[int, ...] = (), with_steps: bool = True,
                   rate: float = 4.0, ids: list[str] | None = None, label: str | None = None,
                   experiment: str | None = None, tokens: int = 4):
    requests = make_requests(n, failed=failed, ids=ids, tokens=tokens)
    steps = make_steps(n, tokens) if with_steps else None
    slo = {"ttft": 5 * MS, "tpot": 2 * MS}
    summary = latency_summary(requests, slo)
    info = RunInfo(run_id=run_id, kind="serving", experiment=experiment, model={"name": "tiny"},
                   variant={"name": label or f"rate-{rate:g}"}, label=label or f"rate-{rate:g}", device="cpu",
                   source="serve", serving={"generator": "aiperf", "load": {"requests": n, "rate": rate},
                                            "slo": slo, "origin_ns": 0, "summary": summary,
                                            "errors": {"HTTP 500: boom": len(failed)} if failed else {},
                                            "warnings": []})
    trace = Trace(events=EVENTS.empty_table(), counters=make_counters(10 * MS * n), metadata={"origin_ns": 0})
    tables = {"requests": with_phases(requests, steps)}
    if steps is not None:
        tables["steps"] = steps
    write_bundle(root, run_id, info, trace, tables=tables)
    return open_bundle(run_id, root)


def sources(layout) -> dict[str, ColumnDataSource]:
    return {s.name: s for s in layout.select({"type": ColumnDataSource}) if s.name}


def titles(layout) -> list[str]:
    return [fig.title.text for fig in layout.select({"type": Plot}) if fig.title is not None]


def test_waterfall_joined_to_steps_has_queued_prefill_delivery_decode_and_ticks():
    requests = make_requests(3)
    flow = waterfall(with_phases(requests, make_steps(3)))
    assert list(flow.requests["id"]) == ["req-0", "req-1", "req-2"]
    first = flow.segments[flow.segments["y"] == 0].set_index("phase")
    assert set(first.index) == {"queued", "prefill", "delivery", "decode"}
    assert first.loc["queued", "left"] == 0 and first.loc["queued", "right"] == MS  # arrival → prefill step start
    assert first.loc["prefill", "right"] == MS + MS * 9 // 10  # the prefill step's end
    assert first.loc["delivery", "right"] == 2 * MS  # → first token at the client
    assert first.loc["decode", "left"] == 2 * MS and first.loc["decode", "right"] == 6 * MS
    assert len(flow.ticks) == 12 and set(flow.ticks["y"]) == {0.0, 1.0, 2.0}
    assert flow.note == "" and flow.ticks_note == ""


def test_waterfall_without_steps_and_failed_requests():
    flow = waterfall(with_phases(make_requests(4, failed=(2,)), None))
    phases = flow.segments.groupby("y")["phase"].apply(list).to_dict()
    assert phases[0.0] == ["to first token", "decode"]
    assert phases[2.0] == ["failed"]
    failed = flow.requests.set_index("id").loc["req-2"]
    assert failed["failed"] and failed["error"] == "HTTP 500: boom"


def test_waterfall_caps_rows_slowest_and_failed_first_and_ticks():
    requests = make_requests(50, failed=(7,))
    slow = requests.to_pylist()
    slow[30]["e2e_ns"] = 10_000 * MS
    flow = waterfall(pa.Table.from_pylist(slow, schema=requests.schema), max_rows=5, max_ticks=7)
    assert len(flow.requests) == 5 and flow.total == 50
    assert {"req-7", "req-30"} <= set(flow.requests["id"])
    assert list(flow.requests["arrival_ns"]) == sorted(flow.requests["arrival_ns"])  # drawn by arrival
    assert "5 slowest of 50 requests" in flow.note
    assert len(flow.ticks) <= 7 and flow.total_ticks == 16 and "token ticks" in flow.ticks_note


def test_step_lane_cap_and_counter_tracks():
    lane, total = step_lane(make_steps(5), max_steps=4)
    assert total == 20 and len(lane) == 4
    assert list(lane["left"]) == sorted(lane["left"])
    assert set(lane["mode"]) == {"prefill"}  # the longest steps are the prefills
    tracks = {title: frame for title, _, frame in counter_tracks(make_counters(50 * MS))}
    running = tracks["requests running and waiting"]
    assert set(running["series"]) == {"running", "waiting"} and running["value"].max() == 1.0  # not the cpu's 99
    assert tracks["KV-cache usage (%)"]["value"].eq(25.0).all()
    rates = tracks["tokens per second (from the server's counters)"]
    assert np.allclose(rates["value"], 400.0)  # 4 tokens per 10 ms sample
    assert not any("preemptions" in title for title in tracks)  # not sampled: no track


def test_in_flight_counts_and_bins():
    frame, width = in_flight(make_requests(3))
    waiting = frame[frame["series"] == "waiting for first token"]
    assert width == 0 and waiting["value"].max() == 1 and waiting["value"].iloc[-1] == 0
    many = make_requests(400)
    binned, width = in_flight(many, max_points=50)
    assert width > 0 and binned.groupby("series").size().max() <= 50


def test_summary_tables_format_the_headline():
    latency, throughput = summary_tables(latency_summary(make_requests(4, failed=(1,)), {"ttft": 5 * MS}))
    assert list(latency["metric"]) == ["TTFT", "TPOT", "ITL", "E2E"]
    assert latency.set_index("metric").loc["TTFT", "p50"] == pytest.approx(2.0)
    assert latency.set_index("metric").loc["TTFT", "slo_ms"] == 5.0
    row = throughput.iloc[0]
    assert row["requests"] == 4 and row["failed"] == 1 and row["goodput_pct"] == pytest.approx(75.0)


def test_serving_view_links_requests_to_steps(tmp_path):
    bundle = serving_bundle(tmp_path, "one", failed=(3,))
    layout = serving_view(bundle)
    found = sources(layout)
    segments, steps = found[SEGMENTS], found[STEPS]
    assert len(set(segments.data["y"])) == 6 and len(steps.data["step"]) == 24
    joined = [i for i, p in enumerate(segments.data["phase"]) if p == "decode"]
    assert all(np.isfinite(segments.data["first_step"][i]) for i in joined)
    callbacks = [tool.callback for tool in layout.select({"type": TapTool})]
    assert len(callbacks) == 2 and all(isinstance(c, CustomJS) for c in callbacks)
    assert all(set(c.args) == {"segments", "steps", "timeline_name"} for c in callbacks)
    names = titles(layout)
    assert any(t.startswith("request waterfall: 6 requests") for t in names)
    assert any(t.startswith("engine steps: 24") for t in names)
    assert any("requests in flight" in t for t in names)
    assert any("KV-cache usage" in t for t in names)
    x_ranges = {id(fig.x_range) for fig in layout.select({"type": Plot})}
    assert len(x_ranges) == 1  # all x-linked
    html = file_html(layout, INLINE, "t")
    assert "1 failed: HTTP 500: boom" in html
    formats = {c.field: c.formatter for table in layout.select({"type": DataTable}) for c in table.columns}
    assert isinstance(formats["p90"], NumberFormatter) and formats["p90"].format == "0,0.00"
    assert formats["output_token_throughput"].format == "0,0.0"


def test_serving_view_without_steps_or_trace_parts(tmp_path):
    layout = serving_view(serving_bundle(tmp_path, "bare", with_steps=False))
    assert any(t.startswith("engine steps: none recorded") for t in titles(layout))
    phases = set(sources(layout)[SEGMENTS].data["phase"])
    assert phases == {"to first token", "decode"}


def test_names_are_escaped(tmp_path):
    bundle = serving_bundle(tmp_path, "evil", n=2, ids=list(PAYLOADS), label=PAYLOADS[0])
    layout = serving_view(bundle)
    for div in layout.select({"type": Div}):
        assert "<img" not in div.text and "<script" not in div.text.lower()
    html = file_html(layout, INLINE, "t")
    assert any(escape(PAYLOADS[0]) in div.text for div in layout.select({"type": Div}))  # the heading's label
    assert "</script><script>window.__pwned" not in html  # the ids stay inside the JSON of the data


def test_caps_hold_in_the_view(tmp_path, monkeypatch):
    import workbench.analysis.serving as data

    monkeypatch.setattr(data, "MAX_WATERFALL_ROWS", 10)
    monkeypatch.setattr(data, "MAX_TOKEN_TICKS", 25)
    monkeypatch.setattr(data, "MAX_STEPS", 30)
    monkeypatch.setattr(data, "MAX_FLIGHT_POINTS", 20)
    layout = serving_view(serving_bundle(tmp_path, "big", n=40))
    found = sources(layout)
    assert len(set(found[SEGMENTS].data["y"])) == 10
    assert len(found[STEPS].data["step"]) == 30
    ticks = [s for s in layout.select({"type": ColumnDataSource}) if set(s.data) == {"x", "y"}]
    assert ticks and len(ticks[0].data["x"]) <= 25
    names = titles(layout)
    assert any("10 slowest of 40 requests" in t for t in names)
    assert any("30 longest of 160 shown" in t for t in names)
    flight = [s for s in layout.select({"type": ColumnDataSource}) if "series" in s.data
              and "streaming" in set(s.data["series"]) | set(s.data["series"][:1])]
    waiting = [s for s in layout.select({"type": ColumnDataSource}) if "series" in s.data
               and list(s.data["series"][:1]) == ["waiting for first token"]]
    assert waiting and all(len(s.data["ts_ns"]) <= 20 for s in [*flight, *waiting])


def sweep_root(tmp_path):
    root = tmp_path / "traces"
    rates = (1.0, 4.0, 16.0)
    runs = [serving_bundle(root, f"p{i}", rate=rate, n=4 + 2 * i, experiment="sw") for i, rate in enumerate(rates)]
    write_experiment(root, "sw", ExperimentRecord(experiment_id="sw", kind="serving", runs=[r.run_id for r in runs],
                                                  variants=[f"rate-{r:g}" for r in rates]))
    return root, runs


def test_sweep_curve_and_view(tmp_path):
    _, runs = sweep_root(tmp_path)
    points = [{"rate": r.record.serving["load"]["rate"], **r.record.serving["summary"], "label": r.record.label}
              for r in runs]
    curve, summary = sweep_curve(points)
    assert list(curve["load"]) == [1.0, 4.0, 16.0] and list(curve["label"]) == ["rate-1", "rate-4", "rate-16"]
    assert curve["on_front"].any() and summary["max_load_meeting_slo"] == 16.0 and curve["max_slo"].sum() == 1
    mixed = [*points, {"concurrency": 3, **runs[0].record.serving["summary"]}]
    assert sweep_curve(mixed)[1]["left_out"] == 1
    for given in (runs, points):
        layout = serving_sweep_view(given)
        names = titles(layout)
        assert "throughput vs latency: p90 TTFT and E2E" in names
        assert "goodput vs load (rate)" in names
        assert any(t.startswith("Pareto: tokens/s per user") for t in names)
        assert "highest rate meeting the SLO: 16" in "".join(d.text for d in layout.select({"type": Div}))
    assert serving_sweep_view([]).select_one({"type": Div}) is not None


def test_report_of_a_serving_run_and_sweep(tmp_path):
    root, runs = sweep_root(tmp_path)
    runner = CliRunner()
    one = runner.invoke(main, ["report", runs[0].run_id, "--out", str(root), "-o", str(tmp_path / "one.html")])
    assert one.exit_code == 0, one.output
    html = (tmp_path / "one.html").read_text()
    assert "request waterfall" in html and "engine steps" in html and '"serving"' in html
    sweep = runner.invoke(main, ["report", "sw", "--out", str(root), "-o", str(tmp_path / "sweep.html")])
    assert sweep.exit_code == 0, sweep.output
    html = (tmp_path / "sweep.html").read_text()
    assert "throughput vs latency" in html and "request waterfall" in html and "compare" in html


def test_serving_layout_and_notebook(tmp_path, monkeypatch):
    import workbench.notebook as wb
    from workbench.errors import WorkbenchError

    root, runs = sweep_root(tmp_path)
    assert serving_layout([]) is None
    shown = []
    monkeypatch.setattr(wb, "_render", shown.append)
    wb.show_serving("sw", root=root)
    assert [tab.title for tab in shown[0].tabs] == ["sweep", "rate-1", "rate-4", "rate-16"]
    wb.show_serving(runs[1].run_id, root=root)
    assert any(t.startswith("request waterfall") for t in titles(shown[1]))
    plain = tmp_path / "plain"
    write_bundle(plain, "other", {"model": {"name": "m"}}, Trace(events=EVENTS.empty_table()))
    with pytest.raises(WorkbenchError, match="no serving run"):
        wb.show_serving("other", root=plain)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_click_on_a_request_selects_its_steps_in_the_browser(tmp_path):
    """...and the run's timeline on the same page zooms to those steps (their ops and kernels)."""
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    from bokeh.layouts import column
    from bokeh.models import Range1d
    from bokeh.plotting import figure

    from workbench.report import write_report
    from workbench.views.timeline import TIMELINE_PLOT

    timeline = figure(name=TIMELINE_PLOT, x_range=Range1d(0, 10**9), width=400, height=100)
    timeline.scatter([0], [0])
    page_layout = column(serving_view(serving_bundle(tmp_path, "click")), timeline)
    path = write_report(page_layout, tmp_path / "click.html", "t")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"),
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0 && "
                               "Bokeh.index.find_one(Bokeh.documents[0].get_model_by_name('serving waterfall'))",
                               timeout=20_000)
        page.wait_for_timeout(500)
        x, y, first, last = page.evaluate("""() => {
          const doc = Bokeh.documents[0], seg = doc.get_model_by_name('serving segments').data;
          const view = Bokeh.index.find_one(doc.get_model_by_name('serving waterfall'));
          const i = seg.y.findIndex((y, j) => y == 2 && seg.phase[j] == 'decode');
          const box = view.el.getBoundingClientRect();
          return [box.left + view.frame.x_scale.compute((seg.left[i] + seg.right[i]) / 2),
                  box.top + view.frame.y_scale.compute(seg.y[i]), seg.first_step[i], seg.last_step[i]];
        }""")
        page.mouse.click(x, y)
        page.wait_for_function("() => Bokeh.documents[0].get_model_by_name('serving step source')"
                               ".selected.indices.length > 0", timeout=5_000)
        chosen, window, zoomed = page.evaluate("""() => {
          const doc = Bokeh.documents[0], s = doc.get_model_by_name('serving step source');
          const picked = s.selected.indices, x = doc.get_model_by_name('timeline').x_range;
          return [picked.map((j) => s.data.step[j]),
                  [Math.min(...picked.map((j) => s.data.left[j])), Math.max(...picked.map((j) => s.data.right[j]))],
                  [x.start, x.end]] }""")
        browser.close()
    assert errors == []
    assert chosen == list(range(int(first), int(last) + 1))
    pad = max((window[1] - window[0]) * 0.05, 1000)
    assert zoomed == pytest.approx([window[0] - pad, window[1] + pad])
