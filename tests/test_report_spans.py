"""What a static report's timeline embeds (`workbench.report_spans`): all spans of a trace within the budget,
packed, in a page under 10 MB; else the busiest steps, listed, with density elsewhere."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from bokeh.models import CustomJS
from spans_data import CPU, gpu_steps, write_run

from workbench.report import report_layout, write_report
from workbench.report_spans import UNPACK, report_dashboard, report_plan, unpack
from workbench.trace.store.bundle import open_bundle
from workbench.views.timeline import SPANS_SOURCE, WINDOWS

MB = 1_000_000


def overlapping(run, start_ns, end_ns):
    """Rows of the run's events overlapping [start_ns, end_ns), read from the Parquet with pyarrow."""
    table = pq.read_table(run / "events.parquet", columns=["start_ns", "dur_ns"])
    start, dur = table["start_ns"].to_numpy(), table["dur_ns"].to_numpy()
    return set(np.flatnonzero((start < end_ns) & (np.maximum(start + dur, start + 1) > start_ns)).tolist())


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """20 steps, 36k events."""
    root = tmp_path_factory.mktemp("report")
    write_run(root, "steps", gpu_steps(steps=20, ops_per_step=600))
    return open_bundle("steps", root)


@pytest.mark.slow
def test_a_200k_event_trace_embeds_every_span_within_10_mb(tmp_path):
    root = tmp_path / "traces"
    write_run(root, "big", gpu_steps(steps=40, ops_per_step=1_660))
    bundle = open_bundle("big", root)
    events = pq.ParquetFile(bundle.path / "events.parquet").metadata.num_rows
    assert 195_000 <= events <= 205_000
    layout = report_layout([bundle])
    (unpacker,) = [cb for cb in layout.select({"type": CustomJS}) if cb.code == UNPACK]
    reply = unpack(unpacker.args["packed"])
    rows = [row for lane in reply["lanes"] for row in lane["spans"]["row"]]
    assert sorted(rows) == list(range(events))  # every event, once
    path = write_report(layout, tmp_path / "big.html", "big")
    assert path.stat().st_size <= 10 * MB
    assert unpacker.args["packed"] in path.read_text(encoding="utf-8")


def test_a_trace_over_the_budget_embeds_its_busiest_steps_and_lists_them(steps):
    plan = report_plan(steps, budget=10_000, window_budget=5_000)
    assert not plan.complete and plan.events == 36_040
    assert plan.windows and all(label.startswith("ProfilerStep#") for _, _, label in plan.windows)
    counted = [len(overlapping(steps.path, start, end)) for start, end, _ in plan.windows]
    assert plan.spans == sum(counted) <= 5_000
    labels = [label for _, _, label in plan.windows]
    assert all(label.endswith(f": {count:,} events") for count, label in zip(counted, labels, strict=True))
    layout = report_dashboard(steps, plan)
    windows = layout.select_one({"name": WINDOWS}).data
    assert list(zip(windows["left"], windows["right"], windows["label"], strict=True)) == \
        [(float(s), float(e), label) for s, e, label in plan.windows]
    embedded = set(layout.select_one({"name": SPANS_SOURCE}).data["row"])
    assert embedded == set().union(*(overlapping(steps.path, s, e) for s, e, _ in plan.windows))


def test_a_trace_within_the_budget_is_one_complete_window(steps):
    plan = report_plan(steps)
    assert plan.complete and plan.spans == plan.events == 36_040
    assert [label for _, _, label in plan.windows] == ["whole trace"]


def test_without_steps_the_busiest_slices_are_embedded(tmp_path):
    # a dense burst in the middle of a sparse trace, no step markers
    rows = [{"start_ns": 1_000 * i, "dur_ns": 10, "name": "sparse", "track": CPU} for i in range(2_000)]
    rows += [{"start_ns": 1_000_000 + i, "dur_ns": 1, "name": "dense", "track": CPU} for i in range(3_000)]
    run = write_run(tmp_path, "flat", rows)
    plan = report_plan(run, budget=1_000, window_budget=1_000)
    assert not plan.complete and plan.windows
    assert all(label.startswith("slice ") for _, _, label in plan.windows)
    assert plan.spans == sum(len(overlapping(run, s, e)) for s, e, _ in plan.windows) <= 1_000


def test_a_trace_without_spans_reports_its_dashboard(tmp_path):
    """A bundle with an events table of no rows (an import of counters only) has nothing to embed."""
    root = tmp_path / "traces"
    write_run(root, "empty", [])
    bundle = open_bundle("empty", root)
    plan = report_plan(bundle)
    assert plan.complete and plan.windows == [] and plan.events == 0
    path = write_report(report_layout([bundle]), tmp_path / "empty.html", "empty")
    assert "empty" in path.read_text(encoding="utf-8")
