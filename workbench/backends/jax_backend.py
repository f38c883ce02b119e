"""JAX/XLA variants: a built-in model's JAX port, jitted and compiled ahead of time by XLA.

`prepare_jax` gives a `PreparedJaxVariant` with the same surface as the torch `PreparedVariant`
(`place`, `run`, `sync`, `first_call`, `notes`), so the experiment runner benchmarks, checks and
profiles both alike. The first call lowers and compiles (`jax.jit(...).lower(...).compile(...)`),
which is what the `compile` phase then measures, and keeps the compile-stage facts XLA offers: the
lowered StableHLO, the optimized HLO, `cost_analysis()` and `memory_analysis()`.

`jax-nofusion` compiles the same lowering with XLA's fusion passes disabled through per-compile
compiler options (no process-wide XLA_FLAGS needed, so it runs interleaved with the others).
Outputs are cast to float32 inside the jitted function and handed to torch through DLPack (no copy
on CPU), so numerics compare against the torch reference like any other variant.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from workbench.backends.benchmark import WallClockTimer
from workbench.backends.registry import BackendSpec, Enriched, register_backend
from workbench.backends.variants import Variant
from workbench.errors import MissingDependency, VariantUnavailable, WorkbenchError
from workbench.models import LoadedModel

if TYPE_CHECKING:
    from workbench.profiling.result import ProfiledRun
    from workbench.trace import Trace

FUSION_OFF = {
    "xla_disable_hlo_passes": "fusion,cpu-instruction-fusion,loop-fusion,multi_output_fusion,"
                              "priority-fusion,horizontal-loop-fusion,variadic-op-splitter",
    "xla_cpu_experimental_ynn_fusion_type": "",
    "xla_cpu_use_xnnpack": False,
}
"""XLA compiler options that turn fusion off: the generic and GPU fusion passes by name, and on
XLA:CPU the YNNPACK/XNNPACK custom fusions of dots with their epilogues. (XLA:CPU still wraps each
remaining elementwise op in a one-instruction `wrapped_*` fusion to generate code for it.)"""

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""jnp dtype name per precision a JAX variant can take."""

_DEVICE = re.compile(r"^(cpu|cuda|gpu|tpu)(?::(\d+))?$")
_PLATFORM = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "tpu": "tpu"}

ARTIFACTS = {"lowered": "lowered.stablehlo.txt", "optimized": "optimized.hlo.txt"}
"""File names of the compile-stage texts a prepared JAX variant keeps (`PreparedJaxVariant.artifacts`)."""


def _jax() -> Any:
    try:
        import jax
    except ImportError as exc:
        raise MissingDependency("jax (for the jax-* variants)", "jax") from exc
    return jax


def jax_device(device: str) -> Any:
    """The jax.Device for a workbench device name (cpu, cuda:N / gpu:N, tpu:N); VariantUnavailable
    when this machine's jax has no such platform or index."""
    jax = _jax()
    match = _DEVICE.match(device)
    if match is None:
        raise VariantUnavailable(f"device {device}: JAX variants run on cpu, cuda[:N] or tpu[:N]")
    platform, index = _PLATFORM[match[1]], int(match[2] or 0)
    try:
        devices = jax.devices(platform)
    except RuntimeError as exc:
        hint = {"gpu": "pip install 'jax[cuda12]'", "tpu": "pip install 'jax[tpu]'"}.get(platform, "")
        raise VariantUnavailable(
            f"device {device}: jax {jax.__version__} has no {platform} backend here"
            + (f" (on such a machine: {hint})" if hint else "")
        ) from exc
    if index >= len(devices):
        raise VariantUnavailable(f"device {device}: only {len(devices)} {platform} device(s) visible to jax")
    return devices[index]


def _numeric(value: Any) -> dict[str, float]:
    """XLA's cost analysis as {name: float} (older jax returns a one-element list of dicts)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else {}
    return {str(k): float(v) for k, v in (value or {}).items() if isinstance(v, (int, float))}


def memory_stats(compiled: Any) -> dict[str, int]:
    """`compiled.memory_analysis()` as {field: bytes} (argument, output, temp, alias, peak...)."""
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    return {name: int(getattr(stats, name)) for name in dir(stats)
            if name.endswith("_in_bytes") and isinstance(getattr(stats, name), int)}


class PreparedJaxVariant:
    """A JAX variant ready to run: `run(inputs)` returns the output as a float32 torch tensor.

    Compilation happens on the first call (`first_call`, or `run` if called first), for the shapes
    of the inputs it gets; afterwards `artifacts` holds the compile-stage texts (see ARTIFACTS) and
    `notes["xla"]` the cost and memory analyses.
    """

    def __init__(self, variant: Variant, apply: Any, params: Any, device: Any, notes: dict[str, Any]) -> None:
        self.variant = variant
        self.device = device
        self.notes = notes
        self.artifacts: dict[str, str] = {}
        self._apply = apply
        self._params = params
        self._compiled: Any = None

    def place(self, inputs: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        """The inputs as jax arrays on this variant's device, floats in the variant's dtype."""
        jax = _jax()
        dtype = DTYPES[self.variant.precision]
        arrays = []
        for tensor in inputs:
            array = tensor.detach().cpu().numpy()
            if np.issubdtype(array.dtype, np.floating):
                array = jax.numpy.asarray(array, dtype=dtype)
            elif array.dtype == np.int64:
                array = array.astype(np.int32)  # JAX runs without x64 by default
            arrays.append(jax.device_put(array, self.device))
        return tuple(arrays)

    def _compile(self, placed: Sequence[Any]) -> None:
        jax = _jax()
        options = None if self.variant.fusion else dict(FUSION_OFF)
        start = time.perf_counter()
        lowered = jax.jit(self._apply).lower(self._params, *placed)
        lowered_s = time.perf_counter() - start
        compiled = lowered.compile(compiler_options=options)
        compile_s = time.perf_counter() - start - lowered_s
        self.artifacts = {ARTIFACTS["lowered"]: lowered.as_text(), ARTIFACTS["optimized"]: compiled.as_text()}
        self.notes["xla"] = {
            "lower_s": lowered_s,
            "compile_s": compile_s,
            "compiler_options": options,
            "cost_analysis": _numeric(compiled.cost_analysis()),
            "memory_analysis": memory_stats(compiled),
            "artifacts": sorted(self.artifacts),
        }
        self._compiled = compiled

    def run(self, inputs: Sequence[Any]) -> torch.Tensor:
        """One inference call, blocking until the result is ready (compiles first if needed)."""
        placed = self.place(inputs) if inputs and isinstance(inputs[0], torch.Tensor) else tuple(inputs)
        if self._compiled is None:
            self._compile(placed)
        out = self._compiled(self._params, *placed)
        out.block_until_ready()
        try:
            return torch.from_dlpack(out)
        except (RuntimeError, TypeError, BufferError):  # e.g. a GPU array with a CPU-only torch
            return torch.from_numpy(np.array(out, dtype=np.float32))

    def sync(self) -> None:
        """Nothing to wait for: `run` blocks on its result (`block_until_ready`)."""

    def timer(self) -> WallClockTimer:
        """The benchmark's timer: the wall clock around `run`, which blocks until the result is ready."""
        return WallClockTimer()

    def first_call(self, inputs: Sequence[Any]) -> float:
        """Compile (lower + XLA compile) and run once; returns the wall seconds of both together,
        also recorded as notes["first_call_s"] (the split is in notes["xla"])."""
        start = time.perf_counter()
        self.run(inputs)
        elapsed = time.perf_counter() - start
        self.notes["first_call_s"] = elapsed
        return elapsed


def _output_as_float32(apply: Any) -> Any:
    """`apply` with its output cast to float32 inside the jitted function (the first element of a
    tuple output), so every precision hands the same dtype to the numerics check."""

    def wrapped(params: Any, *inputs: Any) -> Any:
        out = apply(params, *inputs)
        if isinstance(out, (tuple, list)):
            out = out[0]
        return out.astype("float32")

    return wrapped


def prepare_jax(variant: Variant, loaded: LoadedModel, *, kernel_profile: bool = False) -> PreparedJaxVariant:
    """A runnable JAX port of `loaded` for `variant`; VariantUnavailable when the model has no JAX
    port, the device has no JAX backend, or the precision cannot run on it (fp16 on TPU).
    `kernel_profile` changes nothing: XLA's kernels are named in its traces anyway."""
    jax = _jax()
    from workbench.models.jax_port import jax_model

    device = jax_device(variant.device)
    if variant.precision not in DTYPES:
        raise VariantUnavailable(f"variant {variant.name}: precision {variant.precision} has no JAX recipe")
    if variant.precision == "fp16" and device.platform == "tpu":
        raise VariantUnavailable(f"variant {variant.name}: TPUs have no float16 arithmetic; use jax-jit-bf16")
    model = jax_model(loaded)
    if variant.precision != "fp32":
        model = model.with_dtype(DTYPES[variant.precision])
    params = jax.device_put(model.params, device)
    notes: dict[str, Any] = {
        "device": {"cpu": "cpu", "gpu": f"cuda:{device.id}"}.get(device.platform, f"{device.platform}:{device.id}"),
        "jax_device": str(device),
        "device_name": getattr(device, "device_kind", None),
        "jax_version": jax.__version__,
        "platform": device.platform,
        "dtype": DTYPES[variant.precision],
        "fusion": variant.fusion,
        "compile": "xla",
    }
    return PreparedJaxVariant(variant, _output_as_float32(model.apply), params, device, notes)


XPROF_DIR = "xprof"
"""Bundle folder of a JAX run's XProf tool data (trace viewer, memory viewer, graph viewer...)."""


def with_hlo_costs(trace: Trace, variant: Variant, profiled: ProfiledRun, folder: Path) -> Enriched:
    """The trace's XLA ops with the FLOPs, transcendentals and bytes of their instructions in the
    optimized HLO (`workbench.analysis.hlo_cost`)."""
    from workbench.analysis.hlo_cost import attach_hlo_costs

    return Enriched(attach_hlo_costs(trace, profiled.artifacts[ARTIFACTS["optimized"]]))


def with_xprof_tools(trace: Trace, variant: Variant, profiled: ProfiledRun, folder: Path) -> Enriched:
    """XProf's tool data for the run's XSpace, written to `folder/xprof` (the bundle's xprof/) and indexed
    in run.json's `xprof`. The tools are extras beside the trace: when they cannot be made, the index says
    why and the run stays ok."""
    from workbench.profiling.xprof_tools import export_tool_data

    out = folder / XPROF_DIR
    (xspace, *_) = sorted(Path(profiled.trace_path).glob("*.xplane.pb"))
    try:
        index: dict[str, Any] = {"tools": export_tool_data(xspace, out)}
    except WorkbenchError as exc:
        index = {"tools": {}, "error": str(exc)}
    return Enriched(trace, folders={XPROF_DIR: out} if out.is_dir() else {}, info={"xprof": index})


VARIANTS = (
    Variant("jax-jit", backend="jax", compile="xla", description="the model's JAX port, fp32, jax.jit (XLA)"),
    Variant(
        "jax-jit-bf16", backend="jax", precision="bf16", compile="xla",
        description="the JAX port with bfloat16 weights and activations, jax.jit (XLA)",
    ),
    Variant(
        "jax-jit-fp16", backend="jax", precision="fp16", compile="xla",
        description="the JAX port with float16 weights and activations, jax.jit (XLA; not on TPU)",
    ),
    Variant(
        "jax-nofusion", backend="jax", compile="xla", fusion=False,
        description="the JAX port, fp32, jax.jit with XLA's fusion passes disabled",
    ),
)
"""The JAX variants (on the built-in models' JAX ports)."""

register_backend(BackendSpec("jax", VARIANTS, prepare_jax, framework_profiler="jax.profiler",
                             enrichers=(with_hlo_costs, with_xprof_tools)))
