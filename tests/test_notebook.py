"""The notebook front door: `import workbench as wb` stays light; wb.capture/show/compare place the views."""

from __future__ import annotations

import subprocess
import sys

import bokeh.io
from bokeh.models import Tabs

import workbench as wb

TINY = {"model": "tiny-gpt", "model_overrides": {"d_model": 32, "layers": 1, "heads": 2}, "batch": 2, "seq": 8,
        "iterations": 3, "warmup": 1}


def test_import_loads_nothing_heavy():
    code = "import sys, workbench; print(sorted(m for m in ('torch', 'jax', 'bokeh') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_capture_is_the_front_door_even_after_the_profiling_package_is_imported():
    import workbench.notebook
    import workbench.profiling  # as the experiment runner and the CLI do

    assert wb.capture is workbench.notebook.capture


def test_capture_show_compare(tmp_path, monkeypatch):
    shown = []
    monkeypatch.setattr(bokeh.io, "show", shown.append)
    monkeypatch.setattr(bokeh.io, "output_notebook", lambda *args, **kwargs: None)
    runs = wb.capture(root=tmp_path, variants=("eager", "bf16"), **TINY)
    assert [b.info["variant"]["name"] for b in runs] == ["eager", "bf16"]
    wb.show(runs[1])
    wb.show(runs)
    wb.compare([runs[0].run_id, runs[1]], root=tmp_path)
    assert len(shown) == 3
    assert isinstance(shown[1], Tabs)
    assert [panel.title for panel in shown[1].tabs] == ["compare", "eager", "bf16"]
