"""`Variant`: one named way to run a model (backend × precision × compile × fusion × device × batch).

The registry below is data: adding a variant is adding one entry. `prepare` (in
`workbench.backends.prepare`) turns a Variant into something runnable: torch variants there, JAX
variants in `workbench.backends.jax_backend`, TensorRT ones in `workbench.backends.tensorrt`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from workbench.backends.devices import check_device_name
from workbench.errors import WorkbenchError

Precision = Literal["fp32", "bf16", "fp16", "int8", "int8-weight-only", "fp8"]
Backend = Literal["torch", "jax", "tensorrt"]

REFERENCE = "eager"
"""The variant every other one is compared against (fp32, eager)."""


@dataclass(frozen=True)
class Variant:
    """A value naming an inference path. `compile` is the compiler: a torch.compile backend name, "xla"
    for JAX (always jitted), or None (eager); `compile_mode` a torch.compile mode (max-autotune,
    reduce-overhead); `fusion` False asks the compiler not to fuse (XLA's fusion passes off), for
    fusion experiments."""

    name: str
    backend: Backend = "torch"
    precision: Precision = "fp32"
    compile: str | None = None
    compile_mode: str | None = None
    fusion: bool = True
    device: str = "cpu"
    batch: int = 1
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (for run.json)."""
        return asdict(self)


_REGISTRY: dict[str, Variant] = {
    variant.name: variant
    for variant in (
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
        Variant("jax-jit", backend="jax", compile="xla", description="the model's JAX port, fp32, jax.jit (XLA)"),
        Variant(
            "jax-jit-bf16", backend="jax", precision="bf16", compile="xla",
            description="the JAX port with bfloat16 weights and activations, jax.jit (XLA)",
        ),
        Variant(
            "jax-jit-fp16", backend="jax", precision="fp16", compile="xla",
            description="the JAX port with float16 weights and activations, jax.jit (XLA; not on TPU)",
        ),
        *(
            Variant(f"trt-{precision}", backend="tensorrt", precision=precision, compile="tensorrt",
                    description=f"TensorRT engine, {precision} set in the ONNX graph (strongly typed; NVIDIA GPUs)")
            for precision in ("fp16", "bf16", "int8", "fp8")
        ),
        Variant(
            "jax-nofusion", backend="jax", compile="xla", fusion=False,
            description="the JAX port, fp32, jax.jit with XLA's fusion passes disabled",
        ),
    )
}


def list_variants(backend: Backend | None = None) -> list[str]:
    """Registered variant names (of one backend, if given), the reference first."""
    return [name for name, variant in _REGISTRY.items() if backend is None or variant.backend == backend]


def get_variant(name: str, batch: int = 1, device: str = "cpu") -> Variant:
    """The registered variant `name` for `batch` items per call on `device`.

    Only the names are checked here; whether the device exists is `prepare`'s question.
    """
    if name not in _REGISTRY:
        raise WorkbenchError(f"unknown variant '{name}'; valid variants: {', '.join(_REGISTRY)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise WorkbenchError(f"batch must be a positive integer, got {batch!r}")
    check_device_name(device)
    return replace(_REGISTRY[name], batch=batch, device=device)
