"""The notebook app (`workbench.ui.Workbench`) driven from Python, as a notebook would, without a browser."""
# ruff: noqa: E402 (workbench.ui is imported after the skips: it needs the lab extra)

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

LAB = "the app needs the lab extra: pip install -e '.[lab]'"
widgets = pytest.importorskip("ipywidgets", reason=LAB)
BokehModel = pytest.importorskip("jupyter_bokeh", reason=LAB).BokehModel

import workbench.experiment
from workbench.analysis.spans.queries import window
from workbench.errors import WorkbenchError
from workbench.experiment import ExperimentSettings
from workbench.ui import Workbench
from workbench.ui.live import follow_zoom
from workbench.ui.progress import WidgetProgress
from workbench.views.timeline import REMOTE, TIMELINE_PLOT

TINY = ExperimentSettings(model="tiny-gpt", variants=("eager", "bf16"), batch=2, seq=8, iterations=3, warmup=1,
                          threads=1, model_overrides={"d_model": 32, "layers": 1, "heads": 2})
MAX_SPANS = 40
"""Small enough that a tiny capture's timeline cannot embed all its spans, so zooming needs new ones."""


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """An app that ran the tiny experiment in its background thread, with what its widgets went through."""
    app = Workbench(TINY, root=tmp_path_factory.mktemp("ui") / "traces", max_spans=MAX_SPANS)
    seen: dict[str, list] = {"bar": [], "label": [], "disabled": []}
    app.progress_bar.observe(lambda change: seen["bar"].append(change["new"]), names="value")
    app.progress_label.observe(lambda change: seen["label"].append(change["new"]), names="value")
    app.run_button.observe(lambda change: seen["disabled"].append(change["new"]), names="disabled")
    thread = app.start()
    assert thread is not threading.current_thread()
    thread.join(timeout=600)
    assert not thread.is_alive()
    return app, seen


def test_widgets_start_from_the_settings_and_describe_the_experiment(tmp_path):
    app = Workbench(TINY, root=tmp_path)
    assert app.model_picker.value == "tiny-gpt"
    assert app.variant_picker.value == ("eager", "bf16")
    assert "bfloat16" in app.variant_help.value
    assert app.config_inputs["d_model"].value == "32"
    assert app.settings() == TINY

    app.variant_picker.value = ("eager", "int8")
    app.batch_input.value = 3
    app.seq_input.value = 0  # the model's default
    app.threads_input.value = 0  # leave torch's setting
    app.config_inputs["layers"].value = "2"
    app.config_inputs["kv_heads"].value = "1"
    settings = app.settings()
    assert settings.variants == ("eager", "int8")
    assert (settings.batch, settings.seq, settings.threads) == (3, None, None)
    # only the keys that differ from the built-in defaults are overrides (layers=2 is tiny-gpt's default)
    assert settings.model_overrides == {"d_model": 32, "heads": 2, "kv_heads": 1}

    app.model_picker.value = "mlp"  # another model: its own config keys, at their defaults
    assert "hidden" in app.config_inputs and "d_model" not in app.config_inputs
    assert app.settings().model_overrides == {}

    with pytest.raises(WorkbenchError, match="unknown variant 'fp64'; valid variants: eager"):
        Workbench(ExperimentSettings(variants=("eager", "fp64")), root=tmp_path)


def test_run_shows_progress_and_the_views(ran):
    app, seen = ran
    assert app.result is not None and [run.status for run in app.result.runs] == ["ok", "ok"]
    assert app.progress_bar.value == 100 and app.progress_bar.bar_style == "success"
    assert seen["bar"] == sorted(seen["bar"]) and 0 < seen["bar"][0] < 100  # moved forward, in steps
    assert app.result.experiment_id in app.progress_label.value
    for task in ("prepare", "benchmark", "profile eager", "profile bf16", "write"):
        assert any(label.startswith(task) for label in seen["label"]), task
    assert seen["disabled"] == [True, False] and not app.run_button.disabled
    assert app.status.value == ""

    compare_view, picker, board = app.views.children[-3:]
    assert isinstance(compare_view, BokehModel)
    assert isinstance(picker, widgets.Dropdown)
    assert [label for label, _ in picker.options] == ["eager (ok)", "bf16 (ok)"]
    (dashboard,) = board.children
    assert isinstance(dashboard, BokehModel)
    assert app.bundles[0].run_id in repr(dashboard.render_bundle["docs_json"])

    picker.value = 1  # the bf16 run's dashboard replaces the eager one's
    (other,) = board.children
    assert isinstance(other, BokehModel) and other is not dashboard
    assert app.bundles[1].run_id in repr(other.render_bundle["docs_json"])


def test_show_runs_takes_ids_of_runs_and_experiments(ran):
    app, _ = ran
    eager, bf16 = app.bundles
    app.show_runs([bf16.run_id])  # one run: its dashboard, no comparison
    picker, board = app.views.children
    assert [label for label, _ in picker.options] == ["bf16 (ok)"] and isinstance(board.children[0], BokehModel)
    app.show_runs([app.result.experiment_id])
    assert [b.run_id for b in app.bundles] == [eager.run_id, bf16.run_id]
    assert isinstance(app.views.children[-3], BokehModel)
    with pytest.raises(WorkbenchError, match="no runs"):
        app.show_runs([])


def test_dashboard_spans_follow_the_zoom(ran):
    app, _ = ran
    (dashboard,) = app.views.children[-1].children
    remote = dashboard._model.select_one({"name": REMOTE})
    plot = dashboard._model.select_one({"name": TIMELINE_PLOT})
    first, last = plot.x_range.bounds
    assert remote.tags == []
    # zoom on the end of the trace, outside the window whose spans the page holds
    plot.x_range.update(start=last - (last - first) / 40, end=last)
    (reply,) = remote.tags
    assert reply["start_ns"] <= plot.x_range.start and plot.x_range.end <= reply["end_ns"]
    assert reply == window(app.bundles[0], reply["start_ns"], reply["end_ns"], reply["width_px"], max_spans=MAX_SPANS)
    assert 0 < reply["spans"] <= MAX_SPANS
    for lane in reply["lanes"]:
        if lane["mode"] == "spans":
            ends = [s + d for s, d in zip(lane["spans"]["start_ns"], lane["spans"]["dur_ns"], strict=True)]
            assert all(end >= reply["start_ns"] for end in ends)
            assert all(start < reply["end_ns"] for start in lane["spans"]["start_ns"])
    plot.x_range.update(start=plot.x_range.start + 1, end=plot.x_range.end - 1)
    assert remote.tags[0] is reply  # a view inside the last reply needs no new one


def test_follow_zoom_needs_a_timeline(ran):
    app, _ = ran
    compare_view = app.views.children[-3]
    assert follow_zoom(compare_view._model.children[0], app.bundles[0]) is None  # a paragraph


def test_errors_are_shown_escaped(tmp_path):
    payload = "<img src=x onerror=alert(1)>"
    app = Workbench(ExperimentSettings(model=payload, variants=("eager",)), root=tmp_path)
    assert app.run() is None
    assert app.progress_bar.bar_style == "danger"
    assert "unknown model" in app.status.value
    assert payload not in app.status.value and "&lt;img src=x onerror=alert(1)&gt;" in app.status.value

    app = Workbench(TINY, root=tmp_path)
    app.config_inputs["vocab"].value = payload  # not JSON: taken as a string, refused by the model
    app.variant_picker.value = ()
    assert app.run() is None and "at least one variant" in app.status.value
    app.variant_picker.value = ("eager",)
    assert app.run() is None and "vocab must be an integer" in app.status.value
    assert payload not in app.status.value
    assert not list(tmp_path.iterdir())  # nothing was written


def test_one_run_at_a_time_and_unexpected_errors_show_their_traceback(tmp_path, monkeypatch):
    entered, release = threading.Event(), threading.Event()

    def stuck(settings, root, progress):
        entered.set()
        progress.start("prepare", 2)
        progress.advance("prepare")
        release.wait(30)
        raise RuntimeError("broken <b>here</b>")

    monkeypatch.setattr(workbench.experiment, "run_experiment", stuck)
    app = Workbench(TINY, root=tmp_path)
    thread = app.start()
    with pytest.raises(WorkbenchError, match="already running"):
        app.start()
    assert entered.wait(30)  # the run has begun (and cleared the status)
    app.run_button.click()  # the button says so in the app instead
    assert "already running" in app.status.value
    release.set()
    thread.join(timeout=30)
    assert "RuntimeError: broken &lt;b&gt;here&lt;/b&gt;" in app.status.value
    assert "<details>" in app.status.value and "Traceback" in app.status.value
    assert app.progress_bar.bar_style == "danger" and 0 < app.progress_bar.value < 100
    assert not app.run_button.disabled


def test_widget_progress_counts_every_task_alike_and_never_goes_back():
    bar, label = widgets.IntProgress(), widgets.Label()
    expected = WidgetProgress.expected_tasks(["eager", "bf16"], profile=True)
    assert expected == ["prepare", "benchmark", "profile eager", "profile bf16", "write"]
    progress = WidgetProgress(bar, label, expected)
    progress.start("prepare", 4)
    progress.advance("prepare", 2)
    assert bar.value == 10 and label.value == "prepare: 2/4"  # half of one task in five
    progress.finish("prepare")
    progress.start("benchmark", None)
    progress.advance("benchmark")
    assert bar.value == 20 and label.value == "benchmark: 1"  # no total: counts once finished
    progress.start("prepare", 4)  # restarted: the bar stays
    assert bar.value == 20
    progress.start("compile int8", 1)  # a task not expected joins the count
    progress.finish("compile int8")
    assert progress.fraction == pytest.approx(1 / 6)
    for task in [*expected, "compile int8"]:
        progress.finish(task)
    assert bar.value == 100 and label.value == "compile int8: done"
    assert WidgetProgress.expected_tasks(["eager"], profile=False) == ["prepare", "benchmark", "write"]


def test_missing_lab_extra_names_it():
    code = "import sys; sys.modules['jupyter_bokeh'] = None; import workbench.ui"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert "MissingDependency" in done.stderr and "pip install 'workbench[lab]'" in done.stderr
