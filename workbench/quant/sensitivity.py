"""Sensitivity: which layers and tensor kinds can take which format, measured one at a time on the model's output.

`layer_sensitivity` stores one Linear's weight (or input) in one format at a time, everything else as it was, and
measures the output against the unquantized model's: SQNR (dB), the KL divergence of the output distributions
(the logits' softmax over the last dim), the largest absolute error, and a task metric when an `evaluate` is
given (held-out perplexity, top-1). `tensor_sensitivity` does the same per tensor kind over the whole model (all
weights, all Linear inputs, the KV cache, the Q·Kᵀ operands, the softmax output). Layers are changed in place and
restored, so a scan costs one forward per layer and format and no copies of the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from workbench.backends.numerics import compare_outputs
from workbench.quant.formats import FormatError, QuantSpec, parse_spec
from workbench.quant.layers import quantize_input, quantize_weight, weight_layers
from workbench.quant.recipe import quantized

Evaluate = Callable[[Callable[..., torch.Tensor]], float]
"""A task metric of a model (called with the forward to use): held-out perplexity, top-1."""

TENSOR_KINDS = ("linear.weight", "linear.input", "kv", "q", "p")
"""The tensor kinds `tensor_sensitivity` scans, as recipe targets."""

_NO_ERROR = {"sqnr_db": np.nan, "kl": np.nan, "max_abs_error": np.nan}
"""The error figures of a combination that could not be quantized (its `note` says why)."""


def kl_divergence(reference: torch.Tensor, candidate: torch.Tensor) -> float:
    """Mean over positions of KL(softmax(reference) ‖ softmax(candidate)) along the last dim, in nats."""
    ref = F.log_softmax(reference.detach().double(), dim=-1)
    cand = F.log_softmax(candidate.detach().double(), dim=-1)
    return float(F.kl_div(cand.flatten(0, -2), ref.flatten(0, -2), log_target=True, reduction="batchmean"))


def output_error(reference: torch.Tensor, candidate: torch.Tensor) -> dict[str, float]:
    """SQNR (dB), KL divergence of the output distributions and the largest absolute error."""
    numerics = compare_outputs(reference, candidate)
    return {"sqnr_db": numerics.sqnr_db, "kl": kl_divergence(reference, candidate),
            "max_abs_error": numerics.max_abs_error}


def layer_sensitivity(model: nn.Module, inputs: Sequence[Any], formats: Sequence[str], *, tensor: str = "weight",
                      evaluate: Evaluate | None = None,
                      progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """One row per layer (Linear or convolution) × format: | layer | format | params | bits | sqnr_db | kl |
    max_abs_error | metric | metric_delta | note | rank |, `rank` 1 for the layer whose quantization hurts the
    output most (lowest SQNR) within its format; a combination the format cannot store (a group that does not
    divide the layer) has no figures and a `note`. `tensor` is "weight" or "input"; `progress(done, total)`
    follows the scan."""
    specs = [parse_spec(f) for f in formats]
    layers = weight_layers(model)
    model.eval()
    with torch.no_grad():
        reference = model(*inputs)
        base_metric = evaluate(model) if evaluate else None
        rows, total = [], len(layers) * len(specs)
        for name, layer in layers:
            for spec in specs:
                error, metric, note = _NO_ERROR, None, ""
                try:
                    with _one_layer(layer, tensor, spec):
                        error = output_error(reference, model(*inputs))
                        metric = evaluate(model) if evaluate else None
                except FormatError as cannot:  # e.g. groups that do not divide this layer's width
                    note = str(cannot)
                rows.append({"layer": name, "format": str(spec), "params": layer.weight.numel(),
                             "bits": spec.bits_per_value, **error, "metric": metric,
                             "metric_delta": None if metric is None else metric - base_metric, "note": note})
                if progress:
                    progress(len(rows), total)
    table = pd.DataFrame(rows)
    table["rank"] = table.groupby("format")["sqnr_db"].rank(method="first").astype("Int64")
    return table


def tensor_sensitivity(model: nn.Module, inputs: Sequence[Any], formats: Sequence[str], *,
                       kinds: Sequence[str] = TENSOR_KINDS, evaluate: Evaluate | None = None) -> pd.DataFrame:
    """One row per tensor kind × format, that kind quantized across the whole model: | tensor | format | bits |
    sqnr_db | kl | max_abs_error | metric | metric_delta | reached | note |; `reached` counts what the rule
    quantized (0 for attention the model does not compute with SDPA: no figure is given then); `note` says why a
    combination has no figures (a group that does not divide a tensor)."""
    model.eval()
    rows = []
    with torch.no_grad():
        reference = model(*inputs)
        base_metric = evaluate(model) if evaluate else None
        for kind in kinds:
            for fmt in formats:
                spec = parse_spec(fmt)
                error, metric, reached, note = _NO_ERROR, None, 0, ""
                try:
                    q = quantized(model, f"{kind}={spec}")
                    out = q(*inputs)
                    reached = sum(q.reached.values())
                    if reached:
                        error = output_error(reference, out)
                        metric = evaluate(q) if evaluate else None
                    else:
                        note = "not reached: the model computes no such tensor through SDPA"
                except FormatError as cannot:
                    note = str(cannot)
                rows.append({"tensor": kind, "format": str(spec), "bits": spec.bits_per_value, **error,
                             "metric": metric, "metric_delta": None if metric is None else metric - base_metric,
                             "reached": reached, "note": note})
    return pd.DataFrame(rows)


@contextmanager
def _one_layer(layer: nn.Module, tensor: str, spec: QuantSpec) -> Iterator[None]:
    """Inside: `layer`'s weight stored in `spec` (or its input rounded to it); restored on the way out."""
    if tensor == "weight":
        original = layer.weight.detach().clone()
        layer.weight.copy_(quantize_weight(original, spec))
        try:
            yield
        finally:
            layer.weight.copy_(original)
        return
    if tensor != "input":
        raise ValueError(f"tensor must be 'weight' or 'input', not {tensor!r}")
    handle = layer.register_forward_pre_hook(lambda m, args: (quantize_input(args[0], spec, m), *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def weight_error_histograms(model: nn.Module, formats: Sequence[str], *, bins: int = 41,
                            layers: Sequence[str] | None = None) -> pd.DataFrame:
    """Per layer weight (or the named `layers`) and format, the histogram of its rounding error relative to the
    tensor's largest |value|: | layer | format | left | right | count |, over one fixed range per layer so the
    formats' histograms compare bin for bin."""
    rows = []
    chosen = set(layers) if layers is not None else None
    for name, layer in weight_layers(model):
        if chosen is not None and name not in chosen:
            continue
        weight = layer.weight.detach().float()
        scale = float(weight.abs().max()) or 1.0
        errors = {str(parse_spec(f)): ((quantize_weight(weight, parse_spec(f)) - weight) / scale).flatten()
                  for f in formats}
        reach = max(float(e.abs().max()) for e in errors.values()) or 1e-12
        edges = np.linspace(-reach, reach, bins + 1)
        for fmt, error in errors.items():
            counts, _ = np.histogram(error.numpy(), bins=edges)
            rows.extend({"layer": name, "format": fmt, "left": float(edges[k]), "right": float(edges[k + 1]),
                         "count": int(counts[k])} for k in range(bins))
    return pd.DataFrame(rows, columns=["layer", "format", "left", "right", "count"])
