"""The roofline's legends and ceiling labels: the legends show the bounds' colours and the kinds' markers at one
readable size, and the labels of the dtype ceilings never overlap each other or cross their own line."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from bokeh.models import Scatter, Text

from workbench.hardware import resolve_device_spec
from workbench.views.roofline import (
    BOUND_COLORS,
    KIND_MARKERS,
    LABEL_PX,
    LEGEND_POINT_PX,
    MAX_POINT_PX,
    ceiling_labels,
    roofline_figure,
)

POINTS = pd.DataFrame({
    "name": ["mm", "add", "gemm_kernel"], "kind": ["op", "op", "kernel"], "dtype": ["fp32"] * 3,
    "calls": [1.0, 1.0, 1.0], "time_ns": [1e6, 1e3, 5e5], "intensity": [50.0, 0.1, 20.0],
    "achieved_flops_per_s": [1e13, 1e10, 5e12], "achieved_bytes_per_s": [2e11, 1e11, 2.5e11],
    "fraction_of_roof": [0.5, 0.1, 0.3], "peak_dtype": ["fp32"] * 3, "bound": ["compute", "memory", "memory"],
})


def test_legends_show_each_bound_and_kind_at_one_size():
    fig = roofline_figure(POINTS, resolve_device_spec("h100"))
    bounds, kinds = fig.legend
    assert [item.label.value for item in bounds.items] == ["compute", "memory"]
    assert [item.label.value for item in kinds.items] == ["op", "kernel"]
    for item, color in zip(bounds.items, (BOUND_COLORS["compute"], BOUND_COLORS["memory"]), strict=True):
        (renderer,) = item.renderers
        assert isinstance(renderer.glyph, Scatter)
        assert (renderer.glyph.fill_color, renderer.glyph.size, renderer.glyph.marker) == (
            color, LEGEND_POINT_PX, "circle")
        assert all(np.isnan(renderer.data_source.data["x"]))  # drawn in the legend only
    assert [item.renderers[0].glyph.marker for item in kinds.items] == [KIND_MARKERS["op"], KIND_MARKERS["kernel"]]
    assert LEGEND_POINT_PX < MAX_POINT_PX


@pytest.mark.parametrize("device", ["h100", "a100", "cpu"])
def test_ceiling_labels_do_not_overlap(device):
    spec = resolve_device_spec(device)
    peaks = sorted(((str(d), float(p)) for d, p in spec.peak_flops.items()), key=lambda item: -item[1])
    y_range, plot_px = (min(p for _, p in peaks) / 1e4, max(p for _, p in peaks) * 3), 470.0
    labels = ceiling_labels(peaks, y_range, plot_px)
    assert len(labels) == len({p for _, p in peaks})  # dtypes of one peak share a label
    assert all(any(dtype in label.text for label in labels) for dtype, _ in peaks)
    span = np.log10(y_range[1]) - np.log10(y_range[0])
    boxes = []
    for label in labels:
        line = plot_px * (np.log10(y_range[1]) - np.log10(label.peak)) / span
        top = line - LABEL_PX + label.offset_px
        assert top + LABEL_PX <= line or top > line  # on its line or under it, never across it
        boxes.append((top, top + LABEL_PX))
    for (top_a, bottom_a), (top_b, bottom_b) in itertools.combinations(boxes, 2):
        assert bottom_a <= top_b or bottom_b <= top_a


def test_the_figure_draws_those_labels():
    spec = resolve_device_spec("h100")
    fig = roofline_figure(POINTS, spec)
    (text,) = fig.select({"name": "ceiling labels"})
    assert isinstance(text.glyph, Text)
    drawn = text.data_source.data
    assert any("bf16, fp16" in t for t in drawn["text"])  # H100's bf16 and fp16 peaks are equal
    assert len(drawn["y_offset"]) == len(drawn["text"]) == len(set(spec.peak_flops.values()))
