"""The quantization lab: a model, the data it is measured on, and the two questions users ask of it.

`quant_task` loads a model with what it is judged on: the trained built-ins with their held-out data and metric
(tiny-gpt: perplexity on held-out standard-library source; convnet: top-1 on held-out digits), any other model
with seeded inputs and the output's SQNR/KL alone. `sensitivity_scan` asks which layers and tensor kinds can take
which format (per-layer and per-kind sensitivity, activation outliers with SmoothQuant, weight error
histograms); `compare_recipes` asks what each recipe costs and gives: accuracy, weight and KV-cache bytes, the
projected time on a target device, and the measured CPU latency where a real kernel for the recipe exists
(`REAL_KERNELS`). The CLI (`workbench quant`), the notebook (`wb.quant_sensitivity`, `wb.quant_compare`) and the
report all call these.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from workbench.backends.benchmark import Workload, run_benchmark
from workbench.errors import WorkbenchError
from workbench.hardware import resolve_device_spec
from workbench.hardware.device import DeviceSpec
from workbench.quant.cost import cache_layouts, kv_cache_bytes, projected_time, weight_footprint
from workbench.quant.formats import FormatError, parse_spec
from workbench.quant.layers import layer_work
from workbench.quant.outliers import activation_outliers, channel_profile, smoothing
from workbench.quant.recipe import Recipe, parse_recipe, quantized
from workbench.quant.results import Sensitivity
from workbench.quant.sensitivity import (
    TENSOR_KINDS,
    Evaluate,
    layer_sensitivity,
    output_error,
    tensor_sensitivity,
    weight_error_histograms,
)

DEFAULT_FORMATS = ("fp8-e4m3/channel", "mxfp8", "mxfp6", "mxfp4", "nvfp4", "int8/channel", "int4/group32")
"""What a sensitivity scan tries by default: the formats of current GPUs' weights."""

DEFAULT_RECIPES = (
    "*.weight=bf16,*.input=bf16",
    "*.weight=int8/channel",
    "*.weight=int8/channel,*.input=int8/token",
    "*.weight=fp8-e4m3/channel,*.input=fp8-e4m3/token,kv=fp8-e4m3/head",
    "*.weight=mxfp6,*.input=mxfp8",
    "*.weight=mxfp4,*.input=mxfp8",
    "*.weight=nvfp4,*.input=nvfp4,kv=nvfp4",
    "*.weight=int4/group32/asym",
)
"""What `compare_recipes` lays side by side by default (the fp32 reference comes first): `*` names every layer,
Linears and convolutions; a rule on `kv` applies where the model has attention."""


@dataclass
class QuantTask:
    """A model and what it is measured on: calibration `inputs` (one forward), a held-out `evaluate` with its
    `metric` name (None: output error only), `about` (how its weights came to be)."""

    name: str
    module: nn.Module
    inputs: tuple[Any, ...]
    about: str
    metric: str | None = None
    evaluate: Evaluate | None = None
    higher_is_better: bool = False
    facts: dict[str, Any] = field(default_factory=dict)


def quant_task(model: str = "tiny-gpt", *, weights: str | None = None, batch: int = 16, seq: int | None = None,
               overrides: dict[str, Any] | None = None, calibration_seed: int = 0) -> QuantTask:
    """`model` (any reference `load_model` takes) with seeded inputs of `batch` × `seq`. A built-in with trained
    weights (tiny-gpt, convnet) gets them by default (`weights` "trained"; "random" for seeded ones), its
    held-out data and metric, and calibration inputs drawn from its training data with `calibration_seed` (never
    the held-out data it is scored on); any other model is judged by its output's error alone, on its seeded
    example inputs."""
    from workbench.models.registry import BUILTINS, load_model
    from workbench.models.trained.recipes import RECIPES, held_out_score

    overrides = dict(overrides or {})
    if model in BUILTINS:
        overrides.setdefault("weights", weights or ("trained" if model in RECIPES else "random"))
    elif weights is not None:
        raise WorkbenchError(f"--weights applies to the built-in models; '{model}' brings its own weights")
    loaded = load_model(model, **overrides)
    module = loaded.module.eval()
    if loaded.weights != "trained":
        if calibration_seed:
            raise WorkbenchError("a calibration seed applies to the trained built-ins (their training data); "
                                 f"'{loaded.name}' with {loaded.weights} weights takes its seeded example inputs")
        inputs = tuple(loaded.make_inputs(batch=batch, seq=seq) if loaded.default_seq is not None
                       else loaded.make_inputs(batch=batch))
        return QuantTask(loaded.name, module, inputs, about=(
            f"{loaded.name}: {loaded.weights} weights: accuracy is the output's error against the fp32 model "
            "alone (tiny-gpt and convnet have trained weights with held-out data: --weights trained)"))
    training = loaded.training or {}
    metric = str(training.get("metric", "held-out score"))
    inputs = _calibration(loaded.name, batch, seq or loaded.default_seq, calibration_seed)
    return QuantTask(loaded.name, module, inputs, about=f"{loaded.name}: {training.get('description', 'trained')}",
                     metric=metric, evaluate=lambda m: held_out_score(loaded.name, loaded.config, m),
                     higher_is_better=metric.endswith("top-1"), facts=training)


def _calibration(name: str, batch: int, seq: int | None, seed: int) -> tuple[torch.Tensor]:
    """`batch` calibration inputs of a trained built-in from its training data, drawn with `seed`: windows of
    `seq` bytes of the training text (tiny-gpt), training digits (convnet)."""
    generator = torch.Generator().manual_seed(seed)
    if name == "tiny-gpt":
        from workbench.models.trained.corpus import byte_tokens, stdlib_corpus

        tokens = byte_tokens(stdlib_corpus().train)
        starts = torch.randint(0, len(tokens) - seq, (batch, 1), generator=generator)
        return (tokens[starts + torch.arange(seq)],)
    from workbench.models.trained.digits import digits_split

    digits = digits_split()
    return (digits.train_images[torch.randperm(len(digits.train_labels), generator=generator)[:batch]],)


def sensitivity_scan(task: QuantTask, formats: Sequence[str] = DEFAULT_FORMATS, *,
                     kinds: Sequence[str] = TENSOR_KINDS, outlier_layers: int = 3, histogram_layers: int = 6,
                     metric: bool = True, progress: Callable[[int, int], None] | None = None) -> Sensitivity:
    """Every layer × format and tensor kind × format (with the held-out metric when `metric` and the task has
    one), the outliers of every Linear input and the profiles of the `outlier_layers` worst, and the error
    histograms of the `histogram_layers` most sensitive weights."""
    for fmt in formats:
        parse_spec(fmt)  # every bad spec fails before the first forward
    evaluate = task.evaluate if metric else None
    layers = layer_sensitivity(task.module, task.inputs, formats, evaluate=evaluate, progress=progress)
    kinds = [k for k in kinds if k not in ("kv", "q", "p") or _has_attention(task)]
    tensors = tensor_sensitivity(task.module, task.inputs, formats, kinds=kinds, evaluate=evaluate)
    outliers = activation_outliers(task.module, task.inputs)
    smoothed = smoothing(task.module, task.inputs)
    profile = channel_profile(task.module, task.inputs, outliers["layer"].head(outlier_layers).tolist())
    worst = layers.sort_values("sqnr_db")["layer"].drop_duplicates().head(histogram_layers).tolist()
    histograms = weight_error_histograms(task.module, formats, layers=worst)
    return Sensitivity(layers, tensors, outliers, smoothed, profile, histograms)


def _has_attention(task: QuantTask) -> bool:
    """Whether the model runs attention through SDPA (the lab reaches its operands only there)."""
    probe = quantized(task.module, "q=bf16")
    with torch.no_grad():
        probe(*task.inputs)
    return not probe.unreached()


RealKernel = Callable[[nn.Module], tuple[Callable[..., Any], str]]


def _bf16(module: nn.Module) -> tuple[Callable[..., Any], str]:
    def run(*inputs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return module(*inputs)
    return run, "torch.autocast(bfloat16)"


def _torchao(function: str) -> RealKernel:
    """The real kernel of `workbench.backends.quantize.<function>` (torchao's int8 configs) on a copy of the model."""
    def build(module: nn.Module) -> tuple[Callable[..., Any], str]:
        from workbench.backends import quantize

        return getattr(quantize, function)(copy.deepcopy(module), torch.device("cpu"))
    return build


REAL_KERNELS: dict[str, tuple[RealKernel, bool]] = {
    "*.weight=bf16,*.input=bf16": (_bf16, True),
    "*.weight=int8/channel": (_torchao("quantize_int8_weight_only"), False),
    "*.weight=int8/channel,*.input=int8/token": (_torchao("quantize_int8_dynamic"), False),
}
"""Recipes (canonical text) with a real CPU kernel whose latency can be measured beside the fp32 model, and whether
that kernel covers convolutions too (autocast does; torchao's int8 configs quantize Linears only, so on a model
with convolutions they would run a different recipe: it is left emulated). The others are emulated only and their
time is projected."""


def compare_recipes(task: QuantTask, recipes: Sequence[str] = DEFAULT_RECIPES, *, device: str = "b200",
                    measure: bool = True, iterations: int = 20, warmup: int = 3, kv_context: int = 4096,
                    strict: bool = True) -> pd.DataFrame:
    """Per recipe (the fp32 reference first): | recipe | sqnr_db | kl | metric | metric_delta | weight_bytes |
    kv_bytes_per_token | projected_us | measured_ms | kernel |. Latencies of the reference and the recipes with a
    real kernel are measured interleaved in one benchmark (medians); projections are on `device`. A recipe the
    model's tensors cannot take (groups that do not divide a layer) raises `FormatError` when `strict`, else its
    row says why in `kernel` and has no figures."""
    parsed = [parse_recipe(r) for r in recipes]  # every bad recipe fails before any work
    spec = resolve_device_spec(device)
    with torch.no_grad():
        reference = task.module(*task.inputs)
    base_metric = task.evaluate(task.module) if task.evaluate else None
    work = layer_work(task.module, task.inputs)
    has_conv = (work["kind"] == "conv").any()
    rows = [_recipe_row(task, None, "fp32 (reference)", reference, base_metric, spec, work, kv_context)]
    workloads = {"fp32 (reference)": Workload(lambda: task.module(*task.inputs))}
    kernels = {"fp32 (reference)": "torch eager fp32"}
    for recipe in parsed:
        name = str(recipe)
        try:
            rows.append(_recipe_row(task, recipe, name, reference, base_metric, spec, work, kv_context))
        except FormatError as cannot:
            if strict:
                raise
            rows.append({"recipe": name})
            kernels[name] = f"cannot: {cannot}"
            continue
        # without convolutions, `linear.` names every layer, as `*.` does
        key = name if has_conv else name.replace("linear.weight=", "*.weight=").replace("linear.input=", "*.input=")
        kernel, covers_conv = REAL_KERNELS.get(key, (None, True))
        if measure and kernel is not None and (covers_conv or not has_conv):
            run, kernels[name] = kernel(task.module)
            workloads[name] = Workload(lambda run=run: run(*task.inputs))
        elif kernel is not None and has_conv and not covers_conv:
            kernels[name] = "emulated only: the int8 kernel quantizes Linears, not this model's convolutions"
    table = pd.DataFrame(rows)
    measured = {}
    if measure:
        with torch.no_grad():
            measured = {name: s.p50 for name, s in run_benchmark(workloads, warmup=warmup,
                                                                  iterations=iterations).items()}
    table["measured_ms"] = table["recipe"].map(measured).astype(float)
    table["kernel"] = table["recipe"].map(kernels).fillna("emulated only: no real kernel here")
    return table


def _recipe_row(task: QuantTask, recipe: Recipe | None, name: str, reference: torch.Tensor,
                base_metric: float | None, spec: DeviceSpec, work: pd.DataFrame, kv_context: int) -> dict[str, Any]:
    """One recipe's accuracy (against the reference's output and the held-out metric), bytes and projection; the
    reference (`recipe` None) in fp32, unprojected (the bf16 recipe is the projected baseline)."""
    model = quantized(task.module, recipe) if recipe is not None else task.module
    with torch.no_grad():
        out = model(*task.inputs)
    error = (output_error(reference, out) if recipe is not None
             else {"sqnr_db": float("inf"), "kl": 0.0, "max_abs_error": 0.0})
    metric = task.evaluate(model) if task.evaluate else None
    base = "bf16" if recipe is not None else "fp32"
    kv = (recipe.attention("k") if recipe is not None else None) or parse_spec(base)
    return {"recipe": name, **error, "metric": metric,
            "metric_delta": None if metric is None or base_metric is None else metric - base_metric,
            "weight_bytes": int(weight_footprint(task.module, recipe, base=base)["bytes"].sum()),
            "kv_bytes_per_token": kv_cache_bytes(task.module, kv, batch=1, context=kv_context) / kv_context
            if cache_layouts(task.module) else None,
            "projected_us": None if recipe is None
            else float(projected_time(task.module, recipe, spec, work)["time_s"].sum()) * 1e6}
