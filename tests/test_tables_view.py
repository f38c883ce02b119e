"""The op/kernel table view: its rows are `op_table`'s, names render as text, selection links to spans."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from bokeh.embed import file_html
from bokeh.models import ColumnDataSource, CustomJS, DataTable, Div, HTMLTemplateFormatter
from bokeh.resources import CDN
from conftest import fixture_path, write_trace

from workbench.analysis.breakdown import op_table
from workbench.trace import Trace, read_trace
from workbench.views.tables import OP_TABLE_NAME, link_table_to_timeline, op_table_view

PAYLOADS = ("<img src=x onerror=alert(1)>", "</script><script>alert(2)</script>")


def _op(name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


@pytest.fixture
def flops_trace(tmp_path) -> Trace:
    """An op that launches a 4 µs kernel, and a host-only op, both with FLOPs; the XSS names as ops."""
    events = [
        _op("aten::mm", 100, 10, flops=8e6),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 101, "dur": 2,
         "args": {"correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 104, "dur": 4,
         "args": {"correlation": 5, "device": 0, "stream": 7}},
        _op("aten::add", 120, 10, flops=1e6),
        _op(PAYLOADS[0], 140, 3),
        _op(PAYLOADS[1], 150, 2),
    ]
    return read_trace(write_trace(tmp_path / "trace.json", events))


def table_of(layout) -> DataTable:
    return layout.select_one({"name": OP_TABLE_NAME})


@pytest.mark.parametrize("kinds", [("op",), ("kernel",)])
def test_rows_and_order_equal_op_table(kinds):
    trace = read_trace(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"))
    expected = op_table(trace, kinds, wrappers=False)
    table = table_of(op_table_view(trace, kinds))
    data = table.source.data
    assert list(data["name"]) == expected["name"].tolist()
    assert list(data["calls"]) == expected["calls"].tolist()
    scales = {"ns": 1, "µs": 1e3, "ms": 1e6, "s": 1e9}
    titles = {c.field: c.title for c in table.columns}
    for field in ("total", "self", "device", "mean"):
        unit = titles[field].split("(")[1].rstrip(")")  # one unit per column, that of its largest value
        np.testing.assert_allclose(data[field], expected[f"{field}_ns"] / scales[unit])
        assert 1 <= np.nanmax(data[field]) < 1000 or np.nanmax(data[field]) == 0 or unit == "s"
    np.testing.assert_allclose(data["share"], expected["share"])


def test_window_and_units(flops_trace):
    layout = op_table_view(flops_trace, window=(0, 15_000))
    table = table_of(layout)
    assert list(table.source.data["name"]) == ["aten::mm"]
    assert [c.title for c in table.columns][2] == "total (µs)"
    assert table.sortable
    assert "0.000 to 0.015 ms" in layout.children[0].text


def test_flops_and_achieved_rate(flops_trace):
    data = table_of(op_table_view(flops_trace)).source.data
    row = {name: i for i, name in enumerate(data["name"])}
    assert data["gflop"][row["aten::mm"]] == pytest.approx(8e-3)
    assert data["gflops"][row["aten::mm"]] == pytest.approx(2000)  # 8 MFLOP over 4 µs of device time
    assert data["gflops"][row["aten::add"]] == pytest.approx(100)  # 1 MFLOP over its 10 µs on the host
    assert np.isnan(data["gflops"][row[PAYLOADS[0]]])


def test_empty_table_is_a_note(flops_trace):
    note = op_table_view(flops_trace, ("hlo",))
    assert isinstance(note, Div) and note.render_as_text
    assert "No hlo events" in note.text


def test_names_render_as_text(flops_trace):
    layout = op_table_view(flops_trace)
    table = table_of(layout)
    name_column = next(c for c in table.columns if c.field == "name")
    # The whole name on hover: the template inserts only the escaped copy of each name, as text and as title.
    assert type(name_column.formatter) is HTMLTemplateFormatter
    assert name_column.formatter.template == '<span title="<%= name_escaped %>"><%= name_escaped %></span>'
    escaped = dict(zip(table.source.data["name"], table.source.data["name_escaped"], strict=True))
    for payload in PAYLOADS:
        assert escaped[payload] == html.escape(payload, quote=True)
        assert "<" not in escaped[payload] and '"' not in escaped[payload]
    assert all(type(c.formatter) is not HTMLTemplateFormatter for c in table.columns if c.field != "name")
    assert all(div.render_as_text for div in layout.select({"type": Div}))

    page = file_html(layout, CDN, "ops")
    for payload in PAYLOADS:
        assert payload not in page
    assert "<script>alert" not in page and "<img" not in page
    # The names are in the embedded document, HTML-escaped, and come back intact when BokehJS reads it.
    (doc,) = re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', page, re.S)
    assert all(payload in json.dumps(json.loads(html.unescape(doc)), ensure_ascii=False) for payload in PAYLOADS)


def test_link_table_to_timeline_attaches_a_selection_callback():
    table = ColumnDataSource({"name": ["aten::mm", "aten::add"]})
    spans = ColumnDataSource({"name": ["aten::add", "aten::mm", "aten::add", "gemm"]})
    callback = link_table_to_timeline(table, spans)
    assert isinstance(callback, CustomJS)
    assert table.selected.js_property_callbacks["change:indices"] == [callback]
    assert callback.args["table"] is table and callback.args["span_sources"] == [spans]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the callback's JavaScript")
def test_link_callback_selects_spans_by_name():
    table = ColumnDataSource({"name": ["aten::mm", "aten::add", PAYLOADS[0]]})
    lanes = [ColumnDataSource({"name": ["aten::add", "aten::mm", "aten::add", "gemm"]}),
             ColumnDataSource({"name": [PAYLOADS[0], "gemm"]})]
    callback = link_table_to_timeline(table, *lanes)
    script = f"""
        const table = {{data: {{name: {json.dumps(table.data["name"])}}}, selected: {{indices: []}}}}
        const span_sources = {json.dumps([{"data": dict(s.data), "selected": {"indices": [0]}} for s in lanes])}
        const run = new Function("table", "span_sources", {json.dumps(callback.code)})
        const out = []
        for (const indices of [[1], [0, 2], []]) {{
          table.selected.indices = indices
          run(table, span_sources)
          out.push(span_sources.map((s) => s.selected.indices))
        }}
        console.log(JSON.stringify(out))
    """
    result = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(result.stdout) == [
        [[0, 2], []],  # aten::add
        [[1], [0]],  # aten::mm and the payload name
        [[], []],  # selection cleared
    ]
