"""The trace comparison of runs against a baseline (`trace_comparison`, `workbench diff`, the compare view),
checked on the imported control/test pair against figures computed straight from the raw gzip JSON."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import fixture_path

from workbench.analysis.diff import trace_comparison
from workbench.cli import main
from workbench.imports import import_traces
from workbench.trace.store.bundle import open_bundle

RAW_KIND = {"kernel": "kernel", "cpu_op": "op"}
NAMES = ("diff_control", "diff_test")


def raw_figures(path: Path) -> dict[str, tuple[Counter, Counter]]:
    """Per kind: calls and total ns by name of the complete events of that category, from the gzip JSON."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    figures = {kind: (Counter(), Counter()) for kind in RAW_KIND.values()}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in RAW_KIND:
            count, time = figures[RAW_KIND[e["cat"]]]
            count[e["name"]] += 1
            time[e["name"]] += round(e["dur"] * 1000)
    return figures


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    paths = [fixture_path("kineto", f"{name}.json.gz") for name in NAMES]
    root = tmp_path_factory.mktemp("traces")
    run_ids = import_traces(paths, root)
    return {"root": root, "runs": run_ids, "bundles": [open_bundle(r, root) for r in run_ids],
            "raw": [raw_figures(p) for p in paths]}


def test_op_and_kernel_deltas_match_the_raw_json(imported) -> None:
    comparison = trace_comparison(imported["bundles"])
    assert comparison.baseline.name == "diff_control" and [r.name for r in comparison.runs] == list(NAMES)
    (pair,) = comparison.pairs
    assert pair.name == "diff_test"
    base, test = imported["raw"]
    for kind in ("op", "kernel"):
        rows = pair.table[pair.table["kind"] == kind].set_index("name")
        for side, raw in (("a", base), ("b", test)):
            count, time = raw[kind]
            present = rows[rows[f"count_{side}"] > 0]
            assert dict(present[f"count_{side}"]) == dict(count)
            assert dict(present[f"time_{side}_ns"]) == dict(time)
        # the largest regressions, by the raw figures, come first
        delta = {n: test[kind][1][n] - base[kind][1][n] for n in set(base[kind][1]) | set(test[kind][1])}
        top = sorted((d for d in delta.values() if d > 0), reverse=True)[:5]
        assert pair.deltas(kind, 5)["delta_ns"].head(len(top)).tolist() == top
        new = set(test[kind][0]) - set(base[kind][0])
        vanished = set(base[kind][0]) - set(test[kind][0])
        assert set(rows.index[rows["status"] == "new"]) == new
        assert set(rows.index[rows["status"] == "vanished"]) == vanished
        assert pair.names(kind)["new"] == len(new) and pair.names(kind)["vanished"] == len(vanished)
        name = max(test[kind][1], key=test[kind][1].get)  # the test run's costliest name
        assert rows.loc[name, "mean_b_ns"] == pytest.approx(test[kind][1][name] / test[kind][0][name])


def test_json_names_runs_by_display_name(imported) -> None:
    result = CliRunner().invoke(main, ["diff", *imported["runs"], "--out", str(imported["root"]), "--json",
                                       "--top", "3"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["baseline"] == "diff_control" and [r["name"] for r in out["runs"]] == list(NAMES)
    (pair,) = out["comparisons"]
    assert pair["name"] == "diff_test"
    base, test = imported["raw"]
    kernels = pair["kernel"]
    assert kernels["count"] == {"baseline": sum(base["kernel"][0].values()), "run": sum(test["kernel"][0].values())}
    assert kernels["time_ns"]["baseline"] == sum(base["kernel"][1].values())
    assert kernels["time_ns"]["run"] == sum(test["kernel"][1].values())
    assert len(kernels["regressions"]) == 3 and all(isinstance(r["count"], int) for r in kernels["regressions"])
    new = {r["name"] for r in kernels["new"]}
    assert new <= set(test["kernel"][0]) - set(base["kernel"][0]) and len(new) == 3
    steps = {r["name"]: r["steps"] for r in out["runs"]}
    assert steps["diff_test"]["source"] == "step annotations" and isinstance(steps["diff_test"]["steps"], int)
    assert all(r["devices"] for r in out["runs"])  # both have kernels: busy, idle and copy overlap per device
    assert "eager" not in result.stdout


def test_text_names_both_runs_and_baseline_option(imported) -> None:
    root = str(imported["root"])
    result = CliRunner().invoke(main, ["diff", *imported["runs"], "--out", root, "--baseline", "diff_test"])
    assert result.exit_code == 0, result.output
    assert "compared against diff_test" in result.stdout and "diff_control" in result.stdout
    assert "eager" not in result.stdout
    assert not any(run in result.stdout for run in imported["runs"])
    step_rows = [line for line in result.stdout.splitlines() if "step annotations" in line]
    assert len(step_rows) == 2 and all("│     6 │" in line for line in step_rows)  # counts print as integers


def test_the_report_compares_against_the_baseline_given(imported, tmp_path) -> None:
    root = str(imported["root"])
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", *imported["runs"], "--out", root, "--baseline", "diff_test",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "compared against diff_test" in out.read_text()
    wrong = CliRunner().invoke(main, ["report", *imported["runs"], "--out", root, "--baseline", "nope",
                                      "-o", str(tmp_path / "other.html")])
    assert wrong.exit_code == 2 and "baseline 'nope' is none of the compared runs (diff_control, diff_test)" in \
        wrong.stderr and not (tmp_path / "other.html").exists()


def test_a_missing_run_exits_2_with_one_line(imported) -> None:
    result = CliRunner().invoke(main, ["diff", imported["runs"][0], "no-such-run", "--out", str(imported["root"])])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "no-such-run" in result.stderr


def test_import_only_comparison_view_draws_no_latency_or_speedup(imported) -> None:
    from bokeh.models import DataTable, Div
    from bokeh.plotting import figure

    from workbench.views.experiments import experiments_view

    layout = experiments_view(imported["bundles"])
    titles = {str(f.title.text) for f in layout.select({"type": figure})}
    assert not {"latency per call (ms)", "speedup vs reference (median)"} & titles
    texts = [d.text for d in layout.select({"type": Div})]
    assert layout.children[0].text == "2 runs (diff_control, diff_test) compared against diff_control"
    assert not any("eager" in t for t in texts)
    assert not any(run in t for t in texts for run in imported["runs"])
    tables = list(layout.select({"type": DataTable}))
    steps = next(t for t in tables if "source" in t.source.data)
    assert list(steps.source.data["run"]) == list(NAMES)
    kernels = next(t for t in tables if "mean_a_us" in t.source.data and "split_embedding" in
                   " ".join(t.source.data["name"]))
    formats = {c.field: c.formatter.format for c in kernels.columns if hasattr(c.formatter, "format")}
    assert formats["count_a"] == "0,0" and formats["delta_count"] == "+0,0"


def test_notebook_comparison_and_compare(imported, monkeypatch) -> None:
    import workbench.notebook as wb

    out = wb.comparison(imported["runs"], baseline="diff_test", top=2, root=imported["root"])
    assert out["baseline"] == "diff_test" and out["comparisons"][0]["name"] == "diff_control"
    shown = []
    monkeypatch.setattr(wb, "_render", shown.append)
    wb.compare(imported["runs"], root=imported["root"], baseline=1)
    (layout,) = shown
    assert layout.children[0].text.endswith("compared against diff_test")


def test_diff_view_counts_render_as_integers(imported) -> None:
    from bokeh.models import DataTable

    from workbench.views.diff import DIFF_TABLE, diff_view

    a, b = (bundle.trace() for bundle in imported["bundles"])
    table = diff_view(a, b, NAMES, top=5).select_one({"name": DIFF_TABLE, "type": DataTable})
    formats = {c.field: c.formatter.format for c in table.columns if hasattr(c.formatter, "format")}
    assert formats["count_a"] == "0,0" and formats["delta_count"] == "+0,0"
