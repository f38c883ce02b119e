"""workbench: a profiling workbench for deep-learning inference.

    import workbench as wb
    runs = wb.capture(model="tiny-gpt", variants=("eager", "bf16"))
    wb.show(runs)
    wb.findings(runs[1]); wb.roofline(runs[1], device="cpu"); wb.diff(runs[0], runs[1])

Importing the package loads nothing (no torch, jax, bokeh or pyarrow): the front door's functions
(`workbench.notebook`) load on first use, so `import workbench.trace` stays light too.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING would import typing before the CLI catches Ctrl-C (interrupts.py)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["call_tree", "capture", "compare", "comparison", "critical_path", "crossovers", "diff", "findings",
           "fusion", "fusion_detail", "idle", "pareto", "project", "project_guidance", "provenance", "quant_compare",
           "quant_plan", "quant_sensitivity", "ranks", "replay", "roofline", "serve", "show", "show_diff",
           "show_ranks", "show_serving", "sql", "sweep_table"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from workbench import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
