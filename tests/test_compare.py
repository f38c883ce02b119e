"""Experiments side by side: the comparison analyses and view on a real captured experiment."""

from __future__ import annotations

import json

import pytest
from bokeh.embed import file_html
from bokeh.models import DataTable, Div, StringFormatter
from bokeh.plotting import figure as figure_type
from bokeh.resources import INLINE
from click.testing import CliRunner
from conftest import TINY_CAPTURE

from workbench.analysis.experiment_tables import latency_samples, op_comparison, variant_table
from workbench.analysis.fusion import fusion_inputs, fusion_table
from workbench.cli import main
from workbench.trace.store.bundle import open_bundle
from workbench.views.experiments import experiments_view as compare


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    args = ["capture", *TINY_CAPTURE, "--variants", "eager,bf16", "--out", str(root), "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)["runs"]
    return [open_bundle(run["run_id"], root) for run in runs]


def test_variant_table(experiment):
    table = variant_table(experiment)
    assert table["variant"].tolist() == ["eager", "bf16"]
    assert table.loc[0, "speedup"] == pytest.approx(1.0)
    assert table.loc[1, "speedup"] == pytest.approx(table.loc[0, "p50_ms"] / table.loc[1, "p50_ms"])
    assert table.loc[0, "sqnr_db"] == float("inf")
    assert 0 < table.loc[1, "top1"] <= 1
    assert (table["peak_bytes"] > 0).all()


def test_latency_samples_are_every_timed_iteration(experiment):
    samples = latency_samples(experiment)
    assert samples.groupby("variant").size().to_dict() == {"eager": 3, "bf16": 3}


def test_ops_aligned_per_step(experiment):
    traces = {b.info["variant"]["name"]: b.trace() for b in experiment}
    ops = op_comparison(traces)
    assert {"eager calls", "eager ms", "bf16 calls", "bf16 ms"} <= set(ops.columns)
    linear = ops[(ops["name"] == "aten::linear") & (ops["kind"] == "op")].iloc[0]
    # one block: q, k, v, o, fc_in, fc_out, plus the LM head, in every profiled step
    assert linear["eager calls"] == 7
    fusion = fusion_table([fusion_inputs(b) for b in experiment]).set_index("variant")
    assert fusion.loc["eager", "kernels"] > 0 and fusion.loc["eager", "elementwise_ops"] > 0
    assert fusion.loc["eager", "framework"] == "torch" and fusion.loc["eager", "steps"] == 3


def test_compare_view_builds_and_escapes_names(experiment):
    layout = compare(experiment)
    tables = list(layout.select({"type": DataTable}))
    # summary, fusion, the trace comparison's step time and op deltas, ops aligned (a CPU run: no kernels, no devices)
    assert len(tables) == 5
    summary = next(t for t in tables if "p50_ms" in t.source.data)
    assert summary.source.data["variant"].tolist() == ["eager", "bf16"]
    assert all(isinstance(c.formatter, StringFormatter) for c in summary.columns if c.field == "variant")
    html = file_html(layout, INLINE, "compare")
    assert "aten::linear" in html
    titles = {f.title.text for f in layout.select({"type": figure_type})}
    assert {"latency per call (ms)", "speedup vs reference (median)"} <= titles
    texts = [d.text for d in layout.select({"type": Div})]
    assert any(t.startswith("2 runs (eager, bf16) compared against eager") for t in texts)
    assert any(t.startswith("ops, bf16 against eager") for t in texts)


def test_fusion_counts_render_as_integers(experiment):
    layout = compare(experiment)
    fusion = next(t for t in layout.select({"type": DataTable}) if "fusions" in t.source.data)
    formats = {c.field: c.formatter.format for c in fusion.columns if hasattr(c.formatter, "format")}
    assert formats["steps"] == "0,0" and formats["kernels"] == "0,0.[0]"
    # a figure no run has (XLA's bytes and FLOPs of a torch run on CPU) gets no empty column
    assert "bytes_accessed" not in formats and "hlo_kernels" not in formats


def test_compare_against_a_chosen_baseline(experiment):
    layout = compare(experiment, baseline="bf16")
    texts = [d.text for d in layout.select({"type": Div})]
    assert any(t.startswith("2 runs (eager, bf16) compared against bf16") for t in texts)
    assert any(t.startswith("ops, eager against bf16") for t in texts)


def test_stacked_timelines_share_an_axis_aligned_on_step_zero(experiment):
    from bokeh.plotting import figure as figure_type

    from workbench.analysis.steps import aligned_on_first_step, first_step_ns

    layout = compare(experiment)
    timelines = [f for f in layout.select({"type": figure_type}) if str(f.title.text).startswith("Timeline")]
    assert len(timelines) == 2
    assert timelines[0].x_range is timelines[1].x_range
    trace = experiment[0].trace()
    aligned = aligned_on_first_step(trace)
    assert first_step_ns(aligned) == 0
    assert aligned.metadata["aligned_offset_ns"] == first_step_ns(trace) > 0
