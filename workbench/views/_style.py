"""The views' shared look: one colour per event kind, so a kernel has the same colour in every view."""

from __future__ import annotations

from bokeh.models import CustomJSTickFormatter

from workbench.trace.schema import KINDS

KIND_COLORS: dict[str, str] = {
    "op": "#4c72b0",
    "kernel": "#55a868",
    "memcpy": "#c44e52",
    "memset": "#8172b2",
    "runtime": "#ccb974",
    "annotation": "#dd8452",
    "python": "#da8bc3",
    "hlo": "#64b5cd",
    "module": "#6d6d6d",
    "layer": "#937860",
    "other": "#b0b0b0",
}
"""Colour of each event kind (every value of `workbench.trace.schema.KINDS`)."""

KIND_PALETTE: tuple[str, ...] = tuple(KIND_COLORS[kind] for kind in KINDS)
"""`KIND_COLORS` in the order of `KINDS`, for colour mappers keyed by kind or kind index."""

STEP_BAND_COLORS: tuple[str, str] = ("#9ecae1", "#fdd0a2")
"""Alternating fills of consecutive step bands, so neighbouring steps stay apart."""

PHASE_BAND_COLOR = "#c7e9c0"
"""Fill of lifecycle phase bands (load, compile, warmup, measure)."""


def time_ticks() -> CustomJSTickFormatter:
    """Tick labels for an axis in ns from the trace origin, in the unit that suits the tick spacing."""
    return CustomJSTickFormatter(code="""
        const step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : Math.abs(tick)
        const [scale, unit] = step >= 1e9 ? [1e9, "s"] : step >= 1e6 ? [1e6, "ms"]
            : step >= 1e3 ? [1e3, "µs"] : [1, "ns"]
        return `${+(tick / scale).toFixed(3)} ${unit}`
    """)
