"""workbench: a profiling workbench for deep-learning inference.

    import workbench as wb
    runs = wb.capture(model="tiny-gpt", variants=("eager", "bf16"))
    wb.show(runs)

Importing the package loads nothing heavy (no torch, jax or bokeh); the front door's functions
import what they need when called.
"""

from workbench.notebook import capture, compare, show

__all__ = ["capture", "compare", "show"]
