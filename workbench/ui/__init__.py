"""The notebook app: `Workbench()`, an ipywidgets panel that captures experiments and shows their views
(needs the `lab` extra: ipywidgets, jupyter_bokeh). See `workbench.ui.app`."""

from workbench.ui.app import Workbench

__all__ = ["Workbench"]
