"""The cost side of a recipe: weight and KV-cache bytes, and a projected time on target hardware.

Bytes are exact (`formats.storage_bytes`: packed elements, scales, zero points). Parameters outside the recipe's
Linears (embeddings, norms, biases) count in `base` (bf16 by default). The KV cache follows the model's
`cache_layout` (tiny-gpt: K and V of the kv heads, or MLA's latent) for a batch and context; `kv_cache_bytes`
is the closed form and `measured_kv_bytes` stores the K and V a forward actually produces, so the two can be
checked against each other.

`projected_time` is a roofline per layer (a Linear, or a convolution's implicit GEMM; sizes measured on one
forward, `layers.layer_work`) on a device of the hardware table: the matmul runs at the device's
peak for the narrowest dtype both operands are stored in (FP8 × FP8 on FP8 tensor cores, MXFP4/NVFP4 × same on
FP4 ones, INT8 × INT8 on INT8 units; a weight-only format computes in bf16 after dequantizing), and reads its
weight and activations at the memory bandwidth; the time is the larger of the two. It is labelled projected: no
kernel ran.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch
from torch import nn

from workbench.hardware.device import DeviceSpec
from workbench.quant.formats import QuantSpec, parse_spec, storage_bytes
from workbench.quant.layers import observed_forward, weight_layers
from workbench.quant.recipe import Recipe, parse_recipe

COMPUTE_DTYPE = {"e4m3": "fp8", "e5m2": "fp8", "e2m1": "fp4", "int8": "int8", "int4": "int4", "fp16": "fp16",
                 "e2m3": "fp8", "e3m2": "fp8"}
"""The tensor-core dtype whose peak a matmul of two operands stored with this element runs at (FP6 runs on FP8
units, as on B200); anything else computes in bf16."""


def weight_footprint(model: nn.Module, recipe: Recipe | str | None, *, base: str = "bf16") -> pd.DataFrame:
    """Per parameter tensor: | tensor | params | format | bytes |, weights of the recipe's layers in their
    formats (as their GEMM's [N, K] matrix) and every other parameter in `base`."""
    recipe = parse_recipe(recipe) if isinstance(recipe, str) else recipe
    base_spec = parse_spec(base)
    chosen = {f"{name}.weight": recipe.layer(name, module, "weight") if recipe else None
              for name, module in weight_layers(model)}
    rows = []
    for name, param in model.named_parameters():
        spec = chosen.get(name)
        shape = (param.shape[0], param[0].numel()) if spec is not None else tuple(param.shape)  # the GEMM's [N, K]
        spec = spec or base_spec
        rows.append({"tensor": name, "params": param.numel(), "format": str(spec),
                     "bytes": storage_bytes(spec, shape)})
    return pd.DataFrame(rows)


def cache_layouts(model: nn.Module) -> list[Any]:
    """The `cache_layout` of each attention module that declares one (tiny-gpt's), in layer order."""
    return [m.cache_layout for m in model.modules() if hasattr(m, "cache_layout")]


def kv_cache_bytes(model: nn.Module, spec: QuantSpec | str | None, *, batch: int, context: int,
                   base: str = "bf16") -> int:
    """Closed form of the KV cache's bytes for `batch` sequences of `context` tokens: per layer and cached tensor,
    batch · groups · context · width elements in the spec's bits, plus its scales (one per tensor, head, token
    vector, group or block as the granularity says) and zero points."""
    spec = parse_spec(spec or base) if not isinstance(spec, QuantSpec) else spec
    element, fmt = spec.format.element, spec.format
    total = 0
    for layout in cache_layouts(model):
        shape = (batch, layout.groups, context, layout.width)
        numel = math.prod(shape)
        if fmt.scale == "none":
            per_tensor = numel * element.bits // 8
        elif fmt.block is not None:
            blocks = batch * layout.groups * context * -(-layout.width // fmt.block)
            per_tensor = blocks * fmt.block * element.bits // 8 + blocks + (4 if fmt.tensor_scale else 0)
        else:
            scales = {"tensor": 1, "channel": batch, "token": batch * layout.groups * context,
                      "head": layout.groups, "group": numel // (spec.size or 1),
                      "block": numel // (spec.size or 1) ** 2}[spec.granularity]
            zero = scales * element.bits // 8 if element.is_int and not spec.symmetric else 0
            per_tensor = -(-numel * element.bits // 8) + 4 * scales + zero
        total += layout.tensors * per_tensor
    return total


def measured_kv_bytes(model: nn.Module, inputs: Sequence[Any], spec: QuantSpec | str) -> int:
    """Bytes of the K and V a forward of `inputs` produces (every attention module with K and V projections and
    a `cache_layout`), each stored as [batch, groups, tokens, width] in `spec`."""
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    sizes: list[int] = []

    def record(layout: Any):
        def hook(_module: nn.Module, _args: tuple[Any, ...], out: torch.Tensor) -> None:
            b, t, _ = out.shape
            sizes.append(storage_bytes(spec, (b, layout.groups, t, layout.width)))
        return hook

    observed_forward(model, inputs, [(proj, record(m.cache_layout), False) for m in model.modules()
                                     if hasattr(m, "cache_layout") and hasattr(m, "k_proj")
                                     for proj in (m.k_proj, m.v_proj)])
    return sum(sizes)


def projected_time(model: nn.Module, recipe: Recipe | str | None, device: DeviceSpec,
                   work: pd.DataFrame) -> pd.DataFrame:
    """Per layer of `work` (`layers.layer_work` of one forward): | layer | flops | bytes | compute_dtype |
    compute_s | memory_s | time_s | bound | note |, a roofline on `device` (see the module docstring); projected,
    not measured."""
    recipe = parse_recipe(recipe) if isinstance(recipe, str) else recipe
    bf16 = parse_spec("bf16")
    modules = dict(weight_layers(model))
    rows = []
    for w in work.itertuples(index=False):
        layer = modules[w.layer]
        weight = (recipe.layer(w.layer, layer, "weight") if recipe else None) or bf16
        act = (recipe.layer(w.layer, layer, "input") if recipe else None) or bf16
        dtype = _compute_dtype(weight, act)
        nbytes = (storage_bytes(weight, (w.n, w.k)) + storage_bytes(act, (w.input_rows, w.input_features))
                  + 2 * w.m * w.n)
        note = ""
        if dtype not in device.peak_flops:  # no such units (FP4 on H100): the kernel dequantizes to bf16
            note, dtype = f"no {dtype} units on {device.name}: computed in bf16", "bf16"
        used, peak = device.peak(dtype)
        compute, memory = w.flops / peak, nbytes / device.memory_bw_bytes_per_s
        rows.append({"layer": w.layer, "flops": w.flops, "bytes": nbytes, "compute_dtype": used, "compute_s": compute,
                     "memory_s": memory, "time_s": max(compute, memory),
                     "bound": "compute" if compute >= memory else "memory", "note": note})
    return pd.DataFrame(rows)


def _compute_dtype(weight: QuantSpec, act: QuantSpec) -> str:
    """The matmul's dtype: the two operands' common low-bit unit, else bf16 (a weight-only format dequantizes)."""
    w, a = (COMPUTE_DTYPE.get(s.format.element.name) for s in (weight, act))
    if w and w == a:
        return w
    if {w, a} == {"fp8", "fp4"}:
        return "fp8"
    return "bf16"
