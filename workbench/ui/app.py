"""`Workbench`: the notebook app, an ipywidgets panel that captures an experiment and shows its views.

    from workbench.ui import Workbench
    Workbench()          # pick a model and variants, press Run

The widgets describe an `ExperimentSettings`; Run calls `run_experiment` (the CLI's and the server's
code) in a background thread, so the kernel stays responsive, with a `WidgetProgress` on the bar. The
results are the experiment's comparison and one run's dashboard (a picker chooses which), the same
Bokeh layouts as `wb.show` and the HTML report, placed as live `jupyter_bokeh.BokehModel` widgets: the
dashboard's timeline takes the spans of each view from Python as it is zoomed (`workbench.ui.live`, the
same `window` function the Lab panel's server route answers with). Errors are
shown in the app, escaped (model, variant and op names are the user's text).
"""

from __future__ import annotations

import html
import json
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import MissingDependency, WorkbenchError
from workbench.notebook import load_bokehjs
from workbench.paths import traces_root

try:
    import ipywidgets as widgets
    from jupyter_bokeh import BokehModel
except ImportError as exc:  # the `lab` extra
    raise MissingDependency(exc.name or "ipywidgets", "lab") from exc

from workbench.ui.progress import WidgetProgress

if TYPE_CHECKING:
    from workbench.experiment import ExperimentResult, ExperimentSettings
    from workbench.trace.store.bundle import Bundle


class Workbench(widgets.VBox):
    """The notebook app: model, variant and device pickers, batch, sequence length, threads, benchmark
    rounds, a profile toggle, Run, a progress bar, and the views of the last experiment.

    `settings` fills the widgets (default: the default experiment); the model's config keys each get a
    field, prefilled with `settings.model_overrides`. Runs are written under `root` (the traces root,
    see `workbench.paths.traces_root`). `max_spans` bounds the real spans a timeline holds at once.
    Programmatic use: `settings()` reads the widgets, `run()` runs in the calling thread, `start()` in a
    background thread (what Run does), `show_runs(runs)` shows existing runs.
    """

    def __init__(self, settings: ExperimentSettings | None = None, root: str | Path | None = None, *,
                 max_spans: int = 20_000, **kwargs: Any) -> None:
        from workbench.backends import available_devices, get_variant, list_variants
        from workbench.experiment import ExperimentSettings
        from workbench.models import list_models

        settings = settings or ExperimentSettings()
        self.root = traces_root(root)
        self.max_spans = max_spans
        self.result: ExperimentResult | None = None
        self.bundles: list[Bundle] = []
        self._profile_settings = settings.profile_settings
        self._thread: threading.Thread | None = None
        self._builtins = list_models()
        self._other_overrides: dict[str, Any] = {}

        models = self._builtins + ([settings.model] if settings.model not in self._builtins else [])
        self.model_picker = widgets.Dropdown(options=models, value=settings.model, description="model")
        variants = list_variants()
        for name in settings.variants:
            get_variant(name)  # an unknown one raises, naming the valid ones
        self.variant_picker = widgets.SelectMultiple(options=variants, value=settings.variants,
                                                     rows=min(len(variants), 8), description="variants")
        devices = available_devices()
        devices += [settings.device] if settings.device not in devices else []
        self.device_picker = widgets.Dropdown(options=devices, value=settings.device, description="device")
        self.batch_input = _int_input("batch", settings.batch, 1)
        self.seq_input = _int_input("seq", settings.seq or 0, 0, "sequence length; 0: the model's default")
        self.threads_input = _int_input("threads", settings.threads or 0, 0, "torch threads; 0: leave torch's setting")
        self.iterations_input = _int_input("iterations", settings.iterations, 1, "timed rounds (interleaved)")
        self.warmup_input = _int_input("warmup", settings.warmup, 0, "untimed rounds first")
        self.profile_toggle = widgets.Checkbox(value=settings.profile, description="profile (torch.profiler / XProf)")
        self.variant_help = widgets.HTML()
        self.config_inputs: dict[str, widgets.Text] = {}
        self.config_box = widgets.VBox()
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play",
                                         tooltip="capture the experiment in the background")
        self.progress_bar = widgets.IntProgress(min=0, max=100, value=0, description="progress")
        self.progress_label = widgets.Label()
        self.status = widgets.HTML()
        self.views = widgets.VBox()

        self._fill_config(settings.model, settings.model_overrides)
        self._describe_variants()
        self.model_picker.observe(lambda change: self._fill_config(change["new"], {}), names="value")
        self.variant_picker.observe(lambda _change: self._describe_variants(), names="value")
        self.run_button.on_click(lambda _button: self._on_run())

        form = widgets.HBox([
            widgets.VBox([self.model_picker, self.device_picker, self.batch_input, self.seq_input,
                          self.threads_input, self.iterations_input, self.warmup_input, self.profile_toggle]),
            widgets.VBox([self.variant_picker, self.variant_help]),
            self.config_box,
        ])
        controls = widgets.HBox([self.run_button, self.progress_bar, self.progress_label])
        super().__init__(children=[form, controls, self.status, self.views], **kwargs)

    def settings(self) -> ExperimentSettings:
        """The experiment the widgets describe; bad values raise WorkbenchError naming the field."""
        from workbench.experiment import ExperimentSettings

        return ExperimentSettings(
            model=self.model_picker.value,
            variants=tuple(self.variant_picker.value),
            batch=self.batch_input.value,
            seq=self.seq_input.value or None,
            device=self.device_picker.value,
            warmup=self.warmup_input.value,
            iterations=self.iterations_input.value,
            profile=self.profile_toggle.value,
            profile_settings=self._profile_settings,
            threads=self.threads_input.value or None,
            model_overrides=self._overrides(),
        )

    def run(self) -> ExperimentResult | None:
        """Run the experiment the widgets describe, in this thread, and show its runs. Returns the result,
        or None when it could not run (the error is shown in the app). Variants that fail are listed in
        the app; the others are shown."""
        from workbench.experiment import run_experiment
        from workbench.trace.store.bundle import open_bundle

        self.run_button.disabled = True
        self.status.value = ""
        self.views.children = ()
        progress = WidgetProgress(self.progress_bar, self.progress_label)
        try:
            settings = self.settings()
            progress = WidgetProgress(self.progress_bar, self.progress_label,
                                      WidgetProgress.expected_tasks(settings.variants, settings.profile))
            self.progress_label.value = f"loading {settings.model}"
            result = run_experiment(settings, self.root, progress)
            self.result = result
            self.progress_label.value = "building the views"
            self.show_runs([open_bundle(run.path, self.root) for run in result.runs])
            self.status.value = _failures_html(result)
            failed = f", {len(result.failed)} failed" if result.failed else ""
            progress.complete(f"experiment {result.experiment_id}: {len(result.runs)} runs{failed}")
            return result
        except Exception as exc:  # the app shows every error instead of losing it in a thread
            progress.fail("failed")
            self.status.value = _error_html(exc)
            return None
        finally:
            self.run_button.disabled = False

    def start(self) -> threading.Thread:
        """`run` in a background thread (the kernel stays responsive); returns the thread. One run at a time."""
        if self._thread is not None and self._thread.is_alive():
            raise WorkbenchError("an experiment is already running in this app; wait for it to end")
        self.run_button.disabled = True
        self._thread = threading.Thread(target=self.run, name="workbench-app-run", daemon=True)
        self._thread.start()
        return self._thread

    def show_runs(self, runs: Sequence[str | Path | Bundle]) -> None:
        """Show runs (bundles, run ids, bundle paths or experiment ids under the app's root): their
        comparison when there are several, and the dashboard of the one the picker names."""
        from workbench.trace.store.bundle import Bundle
        from workbench.trace.store.records import display_name
        from workbench.trace.store.resolve import resolve_runs
        from workbench.views.experiments import experiments_view

        bundles: list[Bundle] = []
        for ref in runs:
            bundles += [ref] if isinstance(ref, Bundle) else resolve_runs([ref], self.root)
        if not bundles:
            raise WorkbenchError("no runs to show")
        self.bundles = bundles
        parts: list[widgets.Widget] = []
        if len(bundles) > 1:
            parts += [widgets.HTML(f"<b>{len(bundles)} runs compared</b>"), BokehModel(experiments_view(bundles))]
        labels = [f"{display_name(b.record)} ({b.record.status})" for b in bundles]
        first = next((i for i, b in enumerate(bundles) if b.has_trace), 0)
        picker = widgets.Dropdown(options=[(label, i) for i, label in enumerate(labels)], value=first,
                                  description="dashboard")
        board = widgets.VBox()
        picker.observe(lambda change: self._show_dashboard(board, bundles[change["new"]]), names="value")
        self._show_dashboard(board, bundles[first])
        self.views.children = (*parts, picker, board)

    def _show_dashboard(self, board: widgets.VBox, bundle: Bundle) -> None:
        from workbench.ui.live import follow_zoom
        from workbench.views.dashboard import dashboard

        layout = dashboard(bundle, max_spans=self.max_spans)
        if bundle.has_trace:
            follow_zoom(layout, bundle, self.max_spans)
        board.children = (BokehModel(layout),)

    def _on_run(self) -> None:
        """Run's click: start in the background, or say why not."""
        try:
            self.start()
        except WorkbenchError as exc:
            self.status.value = _error_html(exc)

    def _fill_config(self, model: str, overrides: Mapping[str, Any]) -> None:
        """One field per config key of a built-in model, holding its value as JSON (the default unless
        overridden); a model given by reference keeps the overrides it came with."""
        from workbench.models import describe_model

        self.config_inputs = {}
        if model not in self._builtins:
            self._other_overrides = dict(overrides)
            note = html.escape(json.dumps(self._other_overrides)) if overrides else "none"
            self.config_box.children = (widgets.HTML(f"config overrides: {note}"),)
            return
        values = {**describe_model(model), **overrides}
        self.config_inputs = {key: widgets.Text(value=json.dumps(value), description=key,
                                                tooltip="JSON value, e.g. 4, null, \"gelu\"")
                              for key, value in values.items()}
        self.config_box.children = (widgets.HTML("<b>model config</b>"), *self.config_inputs.values())

    def _overrides(self) -> dict[str, Any]:
        """The model config fields that differ from the built-in model's defaults, parsed as JSON
        (a field that is not JSON is taken as a string)."""
        from workbench.models import describe_model

        model = self.model_picker.value
        if model not in self._builtins:
            return dict(self._other_overrides)
        defaults = describe_model(model)
        overrides: dict[str, Any] = {}
        for key, field in self.config_inputs.items():
            text = field.value.strip()
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                value = text
            if key not in defaults or value != defaults[key]:
                overrides[key] = value
        return overrides

    def _describe_variants(self) -> None:
        from workbench.backends import get_variant

        lines = [f"<b>{html.escape(name)}</b>: {html.escape(get_variant(name).description)}"
                 for name in self.variant_picker.value]
        self.variant_help.value = "<br>".join(lines)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        """Load BokehJS into the page (inline, so it works offline) before the app is drawn: the views
        are jupyter_bokeh widgets, which need it."""
        load_bokehjs()
        return super()._repr_mimebundle_(**kwargs)


def _int_input(name: str, value: int, minimum: int, tooltip: str | None = None) -> widgets.BoundedIntText:
    return widgets.BoundedIntText(value=value, min=minimum, max=2**31 - 1, description=name, tooltip=tooltip)


def _failures_html(result: ExperimentResult) -> str:
    """The failed variants of `result` and why, escaped; empty when none failed."""
    if not result.failed:
        return ""
    items = "".join(f"<li>{html.escape(run.error or run.variant + ' failed')}</li>" for run in result.failed)
    return f"<div style='color:#a15c00'><b>{len(result.failed)} variant(s) failed</b><ul>{items}</ul></div>"


def _error_html(exc: BaseException) -> str:
    """`exc` as an escaped message; for an unexpected error (not a WorkbenchError), its traceback below."""
    if isinstance(exc, WorkbenchError):
        return f"<div style='color:#b00020'><b>error:</b> {html.escape(str(exc))}</div>"
    trace = html.escape("".join(traceback.format_exception(exc)))
    return (f"<div style='color:#b00020'><b>error:</b> {html.escape(f'{type(exc).__name__}: {exc}')}"
            f"<details><summary>traceback</summary><pre>{trace}</pre></details></div>")
