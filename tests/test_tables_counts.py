"""Every table of every view prints its counts as integers: each DataTable of the dashboard (a real GPU trace), the
comparison of two imported traces, a captured sweep and the quantization lab is walked, and every column that
counts things (calls, launches, steps, kernels, events, ...) must have a numeral format without mandatory decimals
("8,868", never "8,868.0"), and a column printed as integers must hold whole numbers (a per-step average such as
1.5 calls may show optional decimals instead)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from bokeh.models import DataTable, NumberFormatter
from conftest import fixture_path

from workbench.imports import import_traces
from workbench.trace.store.bundle import open_bundle

COUNT_COLUMN = re.compile(r"(^|_| )(count|calls|launches|steps|kernels|fusions|events|ops|fused_ops|unfused_ops|"
                          r"elementwise_ops|channels|params|requests|rank|op calls|launched)(_a|_b|$| )", re.I)
"""Column fields or titles that count things."""


def count_columns(layout) -> list[tuple[str, str, str, list]]:
    """(table's first field, column field, numeral format, values) of every counting column with a number
    format in `layout`."""
    found = []
    for table in layout.select({"type": DataTable}):
        data = table.source.data
        for column in table.columns:
            if not isinstance(column.formatter, NumberFormatter):
                continue
            if COUNT_COLUMN.search(column.field) or COUNT_COLUMN.search(str(column.title)):
                found.append((table.columns[0].field, column.field, column.formatter.format,
                              list(data.get(column.field, []))))
    return found


def assert_integer_counts(layout) -> int:
    columns = count_columns(layout)
    for table, field, numeral, values in columns:
        # no mandatory decimals: "0,0", or optional ones ("0,0.[00]") for a per-step average such as 1.5 calls
        assert not re.search(r"\.0", re.sub(r"\[.*?\]", "", numeral)), (table, field, numeral)
        if "[" not in numeral:  # printed as an integer: it must be one, not a rounded average
            whole = [v for v in values if v is not None and not (isinstance(v, float) and np.isnan(v))]
            assert all(float(v).is_integer() for v in whole), (table, field, whole[:5])
    return len(columns)


@pytest.fixture(scope="module")
def imports(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    names = ["resnet50_v100_train.pt.trace.json.gz", "diff_control.json.gz", "diff_test.json.gz"]
    runs = import_traces([fixture_path("kineto", name) for name in names], root)
    return [open_bundle(run, root) for run in runs]


def test_the_dashboard_of_a_gpu_trace(imports):
    from workbench.views.dashboard import dashboard

    assert assert_integer_counts(dashboard(imports[0], width=900)) >= 4  # ops, kernels, call tree, more


def test_the_comparison_of_two_imported_traces(imports):
    from workbench.views.experiments import experiments_view

    assert assert_integer_counts(experiments_view(imports[1:], width=900)) >= 3


def test_a_captured_sweep(tmp_path):
    from workbench.experiment import ExperimentSettings, run_experiment
    from workbench.views.experiments import experiments_view

    settings = ExperimentSettings(model="tiny-gpt", variants=("eager",), batch=(1, 2), seq=8, warmup=1,
                                  iterations=2, threads=1, model_overrides={"d_model": 32, "layers": 1, "heads": 2})
    result = run_experiment(settings, tmp_path)
    bundles = [open_bundle(run.run_id, tmp_path) for run in result.runs]
    assert assert_integer_counts(experiments_view(bundles, width=900)) >= 1


def test_the_quantization_lab():
    pytest.importorskip("torch")
    from workbench.quant import lab
    from workbench.views.quant import quant_view

    task = lab.quant_task("tiny-gpt", weights="random", batch=1, seq=16,
                          overrides={"d_model": 32, "layers": 1, "heads": 2})
    sensitivity = lab.sensitivity_scan(task, ["int8/channel", "mxfp4"])
    table = lab.compare_recipes(task, ["*.weight=mxfp4"], measure=False)
    assert assert_integer_counts(quant_view(task.about, table, sensitivity)) >= 3
