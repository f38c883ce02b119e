"""Tables that read well on a real GPU trace (ResNet-50 training on a V100): `show`'s figures against sums made
from the raw file (json + gzip, never the reader under test), counts as integers, units that suit each time,
whole names on request, profiler wrappers left out of the top ops, `ls` never cutting an id, and names with
markup escaped in the Bokeh tables."""

from __future__ import annotations

import gzip
import html
import json
import re
from collections import defaultdict

import pytest
from click.testing import CliRunner
from conftest import fixture_path, write_trace

from workbench.cli import main, render
from workbench.trace import read_trace
from workbench.views.tables import OP_TABLE_NAME, op_table_view

DEVICE_CATS = ("kernel", "memcpy", "memset", "gpu_memcpy", "gpu_memset")
"""Kineto categories of device work (this older trace writes them capitalised: "Kernel", "Memset")."""


def _cat(event: dict) -> str:
    return str(event.get("cat", "")).lower()


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def raw():
    """The fixture's complete events, read with json and gzip only."""
    with gzip.open(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"), "rt") as f:
        doc = json.load(f)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    result = _invoke("import", fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"), "--out", root, "--json")
    assert result.exit_code == 0, result.output
    (run_id,) = json.loads(result.stdout)
    return root, run_id


@pytest.fixture(scope="module")
def summary(imported):
    root, run_id = imported
    return json.loads(_invoke("show", run_id, "--out", root, "--json", "--top", "1000").stdout)


def test_kernel_device_time_is_its_summed_duration_in_the_raw_file(raw, summary):
    durations, counts = defaultdict(float), defaultdict(int)
    for e in raw:
        if _cat(e) == "kernel":
            durations[e["name"]] += e["dur"]
            counts[e["name"]] += 1
    assert summary["top_kernels"]
    for row in summary["top_kernels"]:
        expected = durations[row["name"]] * 1000  # µs in the file, ns in the summary
        assert row["calls"] == counts[row["name"]] and isinstance(row["calls"], int)
        assert row["device_ns"] == pytest.approx(expected, abs=row["calls"])  # ≤ 1 ns of rounding per kernel
        assert row["device_ns"] == row["total_ns"] > 0


def test_op_device_time_is_the_device_work_launched_inside_it(raw, summary):
    """An op's device time: the device events whose launching runtime call (same correlation id) lies inside one
    of its calls on its thread, summed."""
    name = "CudnnConvolutionBackward"
    calls = [e for e in raw if _cat(e) in ("cpu_op", "operator") and e["name"] == name]
    runtime = [e for e in raw if _cat(e) in ("cuda_runtime", "runtime") and "correlation" in e.get("args", {})]
    inside = {e["args"]["correlation"] for e in runtime for op in calls
              if (e["pid"], e["tid"]) == (op["pid"], op["tid"]) and op["ts"] <= e["ts"] <= op["ts"] + op["dur"]}
    device = [e for e in raw if _cat(e) in DEVICE_CATS and e.get("args", {}).get("correlation") in inside]
    expected = sum(e["dur"] for e in device) * 1000
    (row,) = (r for r in summary["top_ops"] if r["name"] == name)
    assert expected > 0 and row["calls"] == len(calls)
    assert row["device_ns"] == pytest.approx(expected, abs=len(device))


def test_show_text_counts_are_integers_and_times_carry_units(imported):
    root, run_id = imported
    text = _invoke("show", run_id, "--out", root).stdout
    assert not re.search(r"\b\d+\.0\b", text), text  # no "3.0" counts, no "40,748,611.0" raw ns
    kernels = text.split("top kernels")[1]
    rows = [line for line in kernels.splitlines() if line.startswith("│")]
    assert len(rows) == 10
    device_cells = [[c.strip() for c in line.strip("│").split("│")][4] for line in rows]
    assert all(re.fullmatch(r"[\d.,]+ (ns|µs|ms|s)", c) for c in device_cells), device_cells
    assert not any(c.startswith("0 ") for c in device_cells)  # never "device 0" for a kernel
    assert "device ms" not in text and "total ms" not in text


def _name_column(text: str, title: str) -> str:
    """The name cells of the table titled `title` in rich's output, joined without whitespace."""
    table = text.split(title)[1].split("└")[0]
    return "".join("".join(line.strip("│").split("│")[0].split()) for line in table.splitlines()
                   if line.startswith("│"))


def test_wide_prints_whole_kernel_names(raw, imported):
    root, run_id = imported
    longest = max({e["name"] for e in raw if _cat(e) == "kernel"}, key=len)
    assert len(longest) > 70
    plain = _invoke("show", run_id, "--out", root, "--top", "200").stdout
    wide = _invoke("show", run_id, "--out", root, "--top", "200", "--wide").stdout
    squeezed = "".join(longest.split())
    assert squeezed not in _name_column(plain, "top kernels") and "`--wide` prints them whole" in plain
    assert squeezed in _name_column(wide, "top kernels")


def test_top_ops_leave_out_profiler_wrappers_unless_asked(raw, imported, summary):
    root, run_id = imported
    steps = {e["name"] for e in raw if e["name"].startswith("ProfilerStep#")}
    assert steps
    assert not steps & {row["name"] for row in summary["top_ops"]}
    everything = json.loads(_invoke("show", run_id, "--out", root, "--json", "--all-ops").stdout)
    assert everything["top_ops"][1]["name"] in steps  # they span whole steps: they lead when ranked
    text = _invoke("show", run_id, "--out", root).stdout
    assert "(--all-ops ranks them)" in text
    assert not re.search(r"^│ ProfilerStep#\d", text, re.M)
    assert re.search(r"^│ ProfilerStep#\d", _invoke("show", run_id, "--out", root, "--all-ops").stdout, re.M)


@pytest.mark.parametrize("width", [160, 100])
def test_ls_never_cuts_ids(imported, monkeypatch, tmp_path, width):
    root, run_id = imported
    experiment = "20261204-221134-exp-a-rather-long-experiment-name-with-many-parts-0f3a"
    path = root / run_id / "run.json"
    record = json.loads(path.read_text())
    monkeypatch.setattr(render.out, "width", width)  # a pipe's width, and a narrower terminal's
    try:
        path.write_text(json.dumps({**record, "experiment": experiment, "model": "a-model-name-of-some-length"}))
        text = _invoke("ls", "--out", root).stdout
    finally:
        path.write_text(json.dumps(record))
    assert run_id in text and experiment in text, text
    assert "…" not in text


def test_bokeh_table_escapes_a_name_with_markup(tmp_path):
    evil = '<img src=x onerror="alert(1)">' + "k" * 80
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100, "dur": 10},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 101, "dur": 2,
         "args": {"correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": evil, "pid": 0, "tid": 7, "ts": 104, "dur": 4,
         "args": {"correlation": 5, "device": 0, "stream": 7}},
    ]
    trace = read_trace(write_trace(tmp_path / "trace.json", events))
    table = op_table_view(trace, ("kernel",)).select_one({"name": OP_TABLE_NAME})
    data = table.source.data
    assert list(data["name"]) == [evil]  # the raw name for sorting and the timeline link
    assert list(data["name_escaped"]) == [html.escape(evil, quote=True)]
    assert "<" not in data["name_escaped"][0] and '"' not in data["name_escaped"][0]
    name = next(c for c in table.columns if c.field == "name")
    assert "name_escaped" in name.formatter.template and "<%= name %>" not in name.formatter.template
    assert "<%= value %>" not in name.formatter.template  # `value` would be the raw name
    device = next(c for c in table.columns if c.field == "device")
    assert device.title == "device (µs)" and list(data["device"]) == [4.0]  # the kernel's own 4 µs


def test_a_hover_column_whose_field_has_a_space_renders(tmp_path):
    """A field such as "source ops" gets an identifier for its escaped copy: the cell's template must parse."""
    import pandas as pd
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    from workbench.views._table import data_table

    table = data_table(pd.DataFrame({"source ops": ["<b>add</b>, mul"]}), [("source ops", "source ops", None)],
                       width=300, height=100, hover=("source ops",))
    template = table.columns[0].formatter.template
    assert "source_ops_escaped" in template and "source ops_escaped" not in template
    assert list(table.source.data["source_ops_escaped"]) == ["&lt;b&gt;add&lt;/b&gt;, mul"]
    (tmp_path / "t.html").write_text(file_html(table, INLINE))
