"""The torch backend: eager, autocast, torch.compile and quantized (torchao) variants of a model's module.

Preparation never touches the loaded model: it deep-copies the module (quantization mutates it),
moves the copy to the variant's device, quantizes it per the precision recipe and wraps it in
torch.compile. Compilation is lazy, so the first call pays for it; `first_call` times that call
on its own so the caller can report compile time apart from steady-state latency.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.backends.benchmark import CudaEventTimer, Timer, WallClockTimer
from workbench.backends.devices import resolve_device, synchronize
from workbench.backends.inductor_record import INDUCTOR_GRAPHS, record_inductor
from workbench.backends.prepared import time_first_call
from workbench.backends.quantize import quantize_fp8_dynamic, quantize_int8_dynamic, quantize_int8_weight_only
from workbench.backends.registry import BackendSpec, register_backend
from workbench.backends.variants import REFERENCE, Variant
from workbench.errors import VariantUnavailable, WorkbenchError
from workbench.models import LoadedModel

Quantizer = Callable[[nn.Module, torch.device], tuple[nn.Module, str]]

@dataclass(frozen=True)
class PrecisionRecipe:
    """How a precision is realized: an autocast dtype around each call and/or a weight quantizer."""

    autocast_dtype: torch.dtype | None = None
    quantizer: Quantizer | None = None


PRECISIONS: dict[str, PrecisionRecipe] = {
    "fp32": PrecisionRecipe(),
    "bf16": PrecisionRecipe(autocast_dtype=torch.bfloat16),
    "fp16": PrecisionRecipe(autocast_dtype=torch.float16),
    "fp8": PrecisionRecipe(quantizer=quantize_fp8_dynamic),
    "int8": PrecisionRecipe(quantizer=quantize_int8_dynamic),
    "int8-weight-only": PrecisionRecipe(quantizer=quantize_int8_weight_only),
}


def _compile_failures() -> tuple[type[BaseException], ...]:
    """Exception types meaning "the compiler could not build this here" (not a model bug)."""
    import torch._dynamo.exc as dynamo_exc
    import torch._inductor.exc as inductor_exc

    candidates = (
        getattr(dynamo_exc, "BackendCompilerFailed", None),
        getattr(inductor_exc, "InductorError", None),  # torch >= 2.7
    )
    return tuple(cls for cls in candidates if cls is not None)


def _root_reason(exc: BaseException) -> str:
    """First line of the innermost cause: compiler wrappers put the real reason there."""
    while (inner := getattr(exc, "inner_exception", None) or exc.__cause__) is not None:
        exc = inner
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _as_float_tensor(output: Any) -> torch.Tensor:
    """The model's output as a float32 tensor; tuples/lists give their first element."""
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    if not isinstance(output, torch.Tensor):
        raise WorkbenchError(
            f"model output must be a tensor (or a tuple starting with one), got {type(output).__name__}"
        )
    return output.float()


class PreparedVariant:
    """A variant ready to run: `run(inputs)` returns the output as a float tensor on the device."""

    def __init__(
        self,
        variant: Variant,
        module: nn.Module,
        device: torch.device,
        recipe: PrecisionRecipe,
        notes: dict[str, Any],
        record_compile: bool = False,
    ) -> None:
        self.variant = variant
        self.module = module
        self.device = device
        self.notes = notes
        self.artifacts: dict[str, str] = {}
        self._record_compile = record_compile
        self._autocast_dtype = recipe.autocast_dtype
        self._compile_failures = _compile_failures() if variant.compile else ()

    def place(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The inputs on this variant's device (a no-op for tensors already there)."""
        return tuple(t.to(self.device) for t in inputs)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._autocast_dtype)

    def run(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """One inference call (inference mode; autocast for bf16).

        Inputs are moved to the device if needed; `place` them beforehand to time compute only.
        """
        try:
            with torch.inference_mode(), self._autocast():
                return _as_float_tensor(self.module(*self.place(inputs)))
        except self._compile_failures as exc:
            raise VariantUnavailable(
                f"variant {self.variant.name}: torch.compile ({self.variant.compile}) failed here: "
                f"{_root_reason(exc)}"
            ) from exc

    def sync(self) -> None:
        """Wait until queued device work is done (no-op on CPU)."""
        synchronize(self.device)

    def timer(self) -> Timer:
        """How the benchmark times a call: CUDA events on a GPU (device time, after a sync), else the
        wall clock between syncs."""
        return CudaEventTimer() if self.device.type == "cuda" else WallClockTimer(sync=self.sync)

    def first_call(self, inputs: Sequence[torch.Tensor]) -> float:
        """Run once and return its wall time in seconds: includes compilation for compiled variants.

        Also recorded as notes["first_call_s"]. With `record_compile` (a profiled inductor compile), what inductor
        says about the compilation is kept in `artifacts` (`inductor_record.INDUCTOR_GRAPHS`).
        """
        if not self._record_compile:
            return time_first_call(self, inputs)
        with record_inductor() as recorder:
            elapsed = time_first_call(self, inputs)
        if recorder.graphs:
            self.artifacts[INDUCTOR_GRAPHS] = recorder.document()
        return elapsed


def _compile(module: nn.Module, backend: str, mode: str | None, extra: dict[str, Any]) -> nn.Module:
    """torch.compile with `mode`'s settings and the `extra` inductor options; options apply to this
    compilation only, so inductor's global config is left as it was (torch.compile takes a mode or options,
    so a mode is spelled out as its options when options are added)."""
    if not extra:
        return torch.compile(module, backend=backend, mode=mode)
    from torch._inductor import list_mode_options

    options = {**(list_mode_options(mode) if mode else {}), **extra}
    return torch.compile(module, backend=backend, options=options)


def _check_precision(variant: Variant, device: torch.device) -> PrecisionRecipe:
    if variant.precision not in PRECISIONS:
        raise WorkbenchError(f"variant {variant.name}: unknown precision '{variant.precision}'")
    recipe = PRECISIONS[variant.precision]
    bf16 = recipe.autocast_dtype is torch.bfloat16
    if bf16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        gpu = torch.cuda.get_device_name(device)
        raise VariantUnavailable(f"variant {variant.name}: {gpu} has no bf16 support")
    if variant.compile_mode == "reduce-overhead" and device.type != "cuda":
        raise VariantUnavailable(f"variant {variant.name}: reduce-overhead replays CUDA graphs; it needs a CUDA device")
    return recipe


def prepare_torch(variant: Variant, loaded: LoadedModel, *, kernel_profile: bool = False) -> PreparedVariant:
    """A runnable copy of `loaded.module` for `variant`; VariantUnavailable if it cannot run here.

    `kernel_profile` makes inductor's generated CPU kernels appear as named profiler events
    (`cpp.enable_kernel_profile`). It only applies to inductor on CPU (GPU kernels are named in
    traces anyway) and is ignored elsewhere; notes["kernel_profile"] says whether it applied. For an inductor
    variant it also turns on inductor's provenance tracking and keeps what the compile reports in `artifacts`
    (`workbench.backends.inductor_record`), so each kernel of the trace can be traced to its source ops.
    """
    device = resolve_device(variant.device)
    recipe = _check_precision(variant, device)
    module = copy.deepcopy(loaded.module).to(device)
    quantization = None
    if recipe.quantizer is not None:
        module, quantization = recipe.quantizer(module, device)
    record_compile = kernel_profile and variant.compile == "inductor"
    profile_cpu_kernels = record_compile and device.type == "cpu"
    if variant.compile:
        extra: dict[str, Any] = {"trace.provenance_tracking_level": 1} if record_compile else {}
        if profile_cpu_kernels:
            extra["cpp.enable_kernel_profile"] = True
        module = _compile(module, variant.compile, variant.compile_mode, extra)
    notes: dict[str, Any] = {
        "device": str(device),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "quantization": quantization,
        "autocast": str(recipe.autocast_dtype).removeprefix("torch.") if recipe.autocast_dtype else None,
        "compile": variant.compile,
        "compile_mode": variant.compile_mode,
        "kernel_profile": profile_cpu_kernels,
    }
    if device.type == "cpu":
        notes["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    else:
        notes["device_name"] = torch.cuda.get_device_name(device)
    return PreparedVariant(variant, module, device, recipe, notes, record_compile)


VARIANTS = (
    Variant(REFERENCE, description="fp32 eager, the numerics reference"),
    Variant("bf16", precision="bf16", description="eager under torch.autocast(bfloat16)"),
    Variant("fp16", precision="fp16", description="eager under torch.autocast(float16)"),
    Variant("compile", compile="inductor", description="fp32, torch.compile (inductor)"),
    Variant(
        "compile-max-autotune", compile="inductor", compile_mode="max-autotune",
        description="fp32, torch.compile (inductor) autotuning GEMM templates and kernel configs",
    ),
    Variant(
        "compile-reduce-overhead", compile="inductor", compile_mode="reduce-overhead",
        description="fp32, torch.compile (inductor) replaying CUDA graphs (CUDA only)",
    ),
    Variant(
        "compile-bf16", precision="bf16", compile="inductor",
        description="torch.compile (inductor) under torch.autocast(bfloat16)",
    ),
    Variant(
        "int8", precision="int8", compile="inductor",
        description="dynamic int8 activations and int8 weights (torchao), compiled",
    ),
    Variant(
        "int8-weight-only", precision="int8-weight-only", compile="inductor",
        description="int8 weights, fp32 activations (torchao), compiled",
    ),
    Variant(
        "fp8", precision="fp8", compile="inductor",
        description="dynamic fp8 activations and weights (torchao), compiled (CUDA, sm_89+)",
    ),
)
"""The torch variants; `eager` is the reference every variant is compared with."""

register_backend(BackendSpec("torch", VARIANTS, prepare_torch, framework_profiler="torch.profiler",
                             cuda_memory_history=True, emits_nvtx=True))
