"""The layers a recipe quantizes (Linears and convolutions), and how their tensors meet a format.

A layer is a GEMM: a Linear's weight is [N, K] against inputs of K features; a convolution's weight [Cout, Cin/g,
kh, kw] is the implicit GEMM's [N, K] with K = Cin/g·kh·kw, so its weight is scaled as that 2-D matrix (a channel
is an output channel; groups and MX blocks run along K), and its input channels-last (a token is a pixel's channel
vector), as the low-bit convolution kernels lay them out. `layer_work` measures each layer's GEMM sizes on real
inputs for the cost model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch
from torch import nn

from workbench.quant.formats import QuantSpec, fake_quantize

LAYER_KINDS: dict[str, tuple[type[nn.Module], ...]] = {"linear": (nn.Linear,),
                                                       "conv": (nn.Conv1d, nn.Conv2d, nn.Conv3d)}
"""The layers a recipe reaches, by the word a recipe pattern uses for all of them (`linear.weight`, `conv.input`)."""

LAYER_TYPES = tuple(t for kinds in LAYER_KINDS.values() for t in kinds)


def weight_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's Linears and convolutions by qualified name, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LAYER_TYPES)]


def layer_kind(module: nn.Module) -> str:
    """"linear" or "conv"."""
    return next(kind for kind, types in LAYER_KINDS.items() if isinstance(module, types))


def quantize_weight(weight: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """A layer's weight stored in `spec`, scaled as its GEMM's [N, K] matrix."""
    return fake_quantize(weight.reshape(weight.shape[0], -1), spec).reshape(weight.shape)


def quantize_input(x: torch.Tensor, spec: QuantSpec, module: nn.Module) -> torch.Tensor:
    """A layer's input stored in `spec`: a Linear's as it is (features last), a convolution's channels-last."""
    if isinstance(module, nn.Linear) or x.ndim < 3:
        return fake_quantize(x, spec)
    return fake_quantize(x.movedim(1, -1), spec).movedim(-1, 1)


def gemm_input_shape(x_shape: Sequence[int], module: nn.Module) -> tuple[int, int]:
    """The [rows, features] matrix a layer's input is stored as (a convolution's channels-last)."""
    features = x_shape[-1] if isinstance(module, nn.Linear) else x_shape[1]
    total = 1
    for size in x_shape:
        total *= size
    return total // features, features


def observed_forward(model: nn.Module, inputs: Sequence[Any],
                     hooks: Sequence[tuple[nn.Module, Callable, bool]]) -> None:
    """One forward of `model` on `inputs` (eval mode, no grad) with each `(module, hook, pre)` registered as a
    forward hook (or a forward pre-hook when `pre`), all removed after it, whatever happens. The hooks observe:
    each returns None, so the forward computes what it would without them."""
    handles = [module.register_forward_pre_hook(hook) if pre else module.register_forward_hook(hook)
               for module, hook, pre in hooks]
    try:
        with torch.no_grad():
            model.eval()(*inputs)
    finally:
        for handle in handles:
            handle.remove()


def layer_work(model: nn.Module, inputs: Sequence[Any]) -> pd.DataFrame:
    """Per layer, over one forward of `inputs`: | layer | kind | m | k | n | flops | input_rows | input_features |,
    the GEMM's sizes (M rows of output, K reduced, N outputs; a convolution's implicit GEMM), its FLOPs (2·M·K·N)
    and the [rows, features] matrix its input is stored as."""
    rows: list[dict[str, Any]] = []

    def record(name: str):
        def hook(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
            x = args[0]
            k = module.weight[0].numel()
            n = module.weight.shape[0]
            m = out.numel() // n
            input_rows, features = gemm_input_shape(tuple(x.shape), module)
            rows.append({"layer": name, "kind": layer_kind(module), "m": m, "k": k, "n": n, "flops": 2.0 * m * k * n,
                         "input_rows": input_rows, "input_features": features})
        return hook

    observed_forward(model, inputs, [(module, record(name), False) for name, module in weight_layers(model)])
    frame = pd.DataFrame(rows, columns=["layer", "kind", "m", "k", "n", "flops", "input_rows", "input_features"])
    # a layer called more than once (shared) counts each call's work
    return frame.groupby("layer", sort=False, as_index=False).agg(
        {"kind": "first", "m": "sum", "k": "first", "n": "first", "flops": "sum", "input_rows": "sum",
         "input_features": "first"})
