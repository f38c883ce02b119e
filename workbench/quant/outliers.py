"""Activation outlier channels, and what SmoothQuant-style scaling does to them.

A few input channels of a Linear often carry values far above the rest; one scale per tensor (or per token) must
then cover them, and the small channels lose their bits in INT8/FP8. `activation_outliers` records each Linear's
inputs on calibration data and reports per layer the channel absmax's max / median ratio (the figure that breaks
INT8), the top channels, and the SQNR of the input stored in a format. `smoothing` applies SmoothQuant's
migration (Xiao et al. 2023): per input channel j, s_j = max|X_j|^α / max|W_j|^(1-α), X/s and W·s (the product is
unchanged), and measures the ratio and the SQNR of the layer's output X·Wᵀ with both operands quantized, before
and after.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from workbench.backends.numerics import compare_outputs
from workbench.quant.formats import fake_quantize
from workbench.quant.layers import observed_forward, weight_layers

MAX_ROWS = 4096
"""Input rows (tokens, or samples) kept per layer: enough for channel statistics, bounded whatever the data."""


def layer_inputs(model: nn.Module, inputs: Sequence[Any], *, max_rows: int = MAX_ROWS) -> dict[str, torch.Tensor]:
    """Each Linear's input over one forward of `inputs`, as [rows, in_features] (at most `max_rows`, evenly
    spaced)."""
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:  # returns None: the input passes unchanged
            seen.setdefault(name, _rows(args[0], module, max_rows))
        return hook

    observed_forward(model, inputs, [(layer, keep(name), True) for name, layer in weight_layers(model)])
    return seen


def _rows(x: torch.Tensor, module: nn.Module, max_rows: int) -> torch.Tensor:
    """`x` as the [rows, channels] matrix the layer's GEMM reads (a convolution's input channels-last)."""
    x = x.detach().float()
    if not isinstance(module, nn.Linear) and x.ndim >= 3:
        x = x.movedim(1, -1)
    rows = x.reshape(-1, x.shape[-1])
    if len(rows) > max_rows:
        rows = rows[torch.linspace(0, len(rows) - 1, max_rows).long()]
    return rows


def channel_absmax(rows: torch.Tensor) -> torch.Tensor:
    """Per input channel, the largest |value| over the rows."""
    return rows.abs().amax(dim=0)


def outlier_ratio(absmax: torch.Tensor) -> float:
    """max / median of the channels' absmax: 1 for even channels; tens to hundreds where INT8 per tensor fails."""
    median = float(absmax.median())
    return float(absmax.max()) / median if median > 0 else float("inf")


def activation_outliers(model: nn.Module, inputs: Sequence[Any], *, fmt: str = "int8/tensor",
                        top: int = 4) -> pd.DataFrame:
    """Per layer (a convolution's input channels-last): | layer | channels | absmax | median_absmax | ratio |
    top_channels | sqnr_db |, `sqnr_db` of its input stored in `fmt`; sorted by ratio, highest first."""
    rows = []
    for name, x in layer_inputs(model, inputs).items():
        absmax = channel_absmax(x)
        order = torch.argsort(absmax, descending=True)[:top]
        rows.append({"layer": name, "channels": int(x.shape[1]), "absmax": float(absmax.max()),
                     "median_absmax": float(absmax.median()), "ratio": outlier_ratio(absmax),
                     "top_channels": [int(c) for c in order],
                     "sqnr_db": compare_outputs(x, fake_quantize(x, fmt)).sqnr_db})
    return pd.DataFrame(rows).sort_values("ratio", ascending=False, ignore_index=True)


def smoothing_scales(x_absmax: torch.Tensor, weight: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """SmoothQuant's per-input-channel scales s_j = max|X_j|^α / max|W_j|^(1-α) (1 where a channel is all zero)."""
    w_absmax = weight.detach().float().abs().amax(dim=0)
    scales = x_absmax.clamp(min=1e-8) ** alpha / w_absmax.clamp(min=1e-8) ** (1 - alpha)
    return torch.where((x_absmax > 0) & (w_absmax > 0), scales, torch.ones_like(scales))


def smoothing(model: nn.Module, inputs: Sequence[Any], *, alpha: float = 0.5, fmt: str = "int8/tensor",
              weight_fmt: str = "int8/channel") -> pd.DataFrame:
    """Per Linear (SmoothQuant's migration is a matmul's), before and after SmoothQuant scaling: | layer |
    ratio_before | ratio_after | sqnr_before_db | sqnr_after_db | gain_db |, the SQNR of X·Wᵀ with X in `fmt` and W
    in `weight_fmt` against the exact product."""
    layers = {name: m for name, m in weight_layers(model) if isinstance(m, nn.Linear)}  # SmoothQuant: Linears
    rows = []
    for name, x in layer_inputs(model, inputs).items():
        if name not in layers:
            continue
        weight = layers[name].weight.detach().float()
        exact = x @ weight.T
        absmax = channel_absmax(x)
        scales = smoothing_scales(absmax, weight, alpha)
        before = fake_quantize(x, fmt) @ fake_quantize(weight, weight_fmt).T
        smoothed_x, smoothed_w = x / scales, weight * scales
        after = fake_quantize(smoothed_x, fmt) @ fake_quantize(smoothed_w, weight_fmt).T
        sqnr_before, sqnr_after = (compare_outputs(exact, y).sqnr_db for y in (before, after))
        rows.append({"layer": name, "ratio_before": outlier_ratio(absmax),
                     "ratio_after": outlier_ratio(channel_absmax(smoothed_x)), "sqnr_before_db": sqnr_before,
                     "sqnr_after_db": sqnr_after, "gain_db": sqnr_after - sqnr_before})
    return pd.DataFrame(rows)


def channel_profile(model: nn.Module, inputs: Sequence[Any], layers: Sequence[str], *,
                    alpha: float = 0.5) -> pd.DataFrame:
    """Per named Linear and input channel: | layer | channel | absmax | smoothed_absmax |, the channel's largest
    |input| before and after SmoothQuant scaling (what the outlier-channel plot draws)."""
    modules = dict(weight_layers(model))
    frames = []
    for name, x in layer_inputs(model, inputs).items():
        if name not in layers or not isinstance(modules[name], nn.Linear):
            continue
        absmax = channel_absmax(x)
        smoothed = absmax / smoothing_scales(absmax, modules[name].weight, alpha)
        frames.append(pd.DataFrame({"layer": name, "channel": np.arange(len(absmax)), "absmax": absmax.numpy(),
                                    "smoothed_absmax": smoothed.numpy()}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["layer", "channel", "absmax", "smoothed_absmax"])
