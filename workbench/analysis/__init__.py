"""Analyses: pure functions over a Trace or run bundles, returning DataFrames and plain dicts.

Two rooms: `spans/` answers the timeline's windowed queries from a run's span index, and `findings/` holds the
bottleneck detectors and their ranking. The other modules each hold one analysis.
"""

from workbench.moved import keep_importable

MOVED = {
    "span_build": "spans.build", "span_file": "spans.mapped", "span_index": "spans.index",
    "span_lanes": "spans.lanes", "finding": "findings.finding", "bottlenecks": "findings.bottlenecks",
    "device_findings": "findings.device", "compiler_findings": "findings.compiler",
}
"""Modules of the earlier flat layout (old name: new name, relative to this package), still importable by
their old names (`workbench.moved`). `spans` is a package now: its queries are `spans.queries`."""

keep_importable(__name__, MOVED)
