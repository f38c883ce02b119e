"""Inference backends behind a registry keyed by name, shaped like the trace readers' registry.

A backend is one module that declares a `BackendSpec` and registers it with `register_backend` when it
is imported: its variants (data), how to prepare one, the framework profiler that records it, what a
profiled run of it adds (a CUDA allocator history, NVTX ranges under Nsight Systems, a phase after the
profiler closes) and the enrichers that complete its traces. The built-in backend modules (`BUILTIN`) are
imported the first time the registry is asked anything; each imports its framework (torch, jax,
TensorRT) lazily, so nothing here probes hardware. Adding a backend is a new module plus its entry in
`BUILTIN` (or, for a backend outside this package, an import of its module before use).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from workbench.backends.devices import check_device_name
from workbench.backends.variants import Variant
from workbench.errors import VariantUnavailable, WorkbenchError
from workbench.plugins import Plugins

if TYPE_CHECKING:
    from workbench.backends.prepared import Prepared
    from workbench.models import LoadedModel
    from workbench.profiling.result import ProfiledRun
    from workbench.trace import Trace

BUILTIN = {"torch": "workbench.backends.torch_backend", "jax": "workbench.backends.jax_backend",
           "tensorrt": "workbench.backends.tensorrt", "onnxruntime": "workbench.backends.onnxruntime"}
"""The built-in backends and their modules, in the order their variants are listed."""


class PrepareFn(Protocol):
    """Turns a variant and a loaded model into a runnable prepared variant (VariantUnavailable when this
    machine cannot run it). `kernel_profile` asks for compiler-generated kernels to be named in traces."""

    def __call__(self, variant: Variant, loaded: LoadedModel, *, kernel_profile: bool = False) -> Prepared: ...


@dataclass(frozen=True)
class Enriched:
    """What an enricher made of a profiled trace: the trace, folders to move into the bundle (bundle name →
    folder) and fields to add to run.json."""

    trace: Trace
    folders: Mapping[str, Path] = field(default_factory=dict)
    info: Mapping[str, Any] = field(default_factory=dict)


Enricher = Callable[["Trace", Variant, "ProfiledRun", Path], Enriched]
"""Completes a trace read back from the backend's framework profiler (trace, variant, profiled run, the
run's temporary profile folder) with what only the backend knows: XLA's HLO costs, TensorRT's layer timings."""

AfterProfile = Callable[[Any, Sequence[Any], "ProfiledRun", Path, int, dict], "ProfiledRun"]
"""A phase after the framework profiler has closed (prepared variant, placed inputs, the profiled run, the
profile folder, measured steps, phase timings) returning the profiled run with what it added."""


@dataclass(frozen=True)
class BackendSpec:
    """A registered backend. `framework_profiler` names the profiler session its framework records with
    (`workbench.profiling.sessions`); `cuda_memory_history` says whether a profiled run on CUDA records the
    caching allocator's history; `emits_nvtx` whether its ops can emit NVTX ranges (for Nsight Systems)."""

    name: str
    variants: tuple[Variant, ...]
    prepare: PrepareFn
    framework_profiler: str
    enrichers: tuple[Enricher, ...] = ()
    after_profile: AfterProfile | None = None
    cuda_memory_history: bool = False
    emits_nvtx: bool = False

    def __post_init__(self) -> None:
        stray = [v.name for v in self.variants if v.backend != self.name]
        if stray:
            raise WorkbenchError(f"backend {self.name}: variants {', '.join(stray)} name another backend")


_BACKENDS: Plugins[BackendSpec] = Plugins(BUILTIN)


def register_backend(spec: BackendSpec) -> None:
    """Add (or replace) a backend; a variant name already taken by another backend is refused."""
    for other in _BACKENDS.registered().values():
        if other.name != spec.name:
            taken = {v.name for v in other.variants} & {v.name for v in spec.variants}
            if taken:
                raise WorkbenchError(f"backend {spec.name}: variant names {', '.join(sorted(taken))} are "
                                     f"already registered by backend {other.name}")
    _BACKENDS.register(spec.name, spec)


def _registry() -> dict[str, BackendSpec]:
    """The registered backends, the built-in ones first in `BUILTIN` order."""
    return _BACKENDS.entries()


def backends() -> list[str]:
    """Names of the registered backends."""
    return list(_registry())


def get_backend(name: str) -> BackendSpec:
    """The registered backend `name`."""
    registry = _registry()
    if name not in registry:
        raise VariantUnavailable(f"backend '{name}' is not available; known backends: {', '.join(registry)}")
    return registry[name]


def _variants() -> dict[str, Variant]:
    return {v.name: v for spec in _registry().values() for v in spec.variants}


def list_variants(backend: str | None = None) -> list[str]:
    """Registered variant names (of one backend, if given), the reference first."""
    return [name for name, variant in _variants().items() if backend is None or variant.backend == backend]


def get_variant(name: str, batch: int = 1, device: str = "cpu") -> Variant:
    """The registered variant `name` for `batch` items per call on `device`.

    Only the names are checked here; whether the device exists is `prepare`'s question.
    """
    variants = _variants()
    if name not in variants:
        raise WorkbenchError(f"unknown variant '{name}'; valid variants: {', '.join(variants)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise WorkbenchError(f"batch must be a positive integer, got {batch!r}")
    check_device_name(device)
    return replace(variants[name], batch=batch, device=device)


def prepare(variant: Variant, loaded: LoadedModel, *, kernel_profile: bool = False) -> Prepared:
    """A runnable copy of `loaded` for `variant`, by its backend; VariantUnavailable if it cannot run here.

    `kernel_profile` makes compiler-generated kernels appear as named profiler events where the backend
    supports it (inductor's CPU kernels); notes["kernel_profile"] says whether it applied. A model that only
    some backends run (an ONNX file: onnxruntime) is VariantUnavailable on the others.
    """
    if loaded.backends is not None and variant.backend not in loaded.backends:
        runnable = [name for name in list_variants() if _variants()[name].backend in loaded.backends]
        raise VariantUnavailable(f"variant {variant.name}: model {loaded.name} ({loaded.source}) runs only on "
                                 f"{', '.join(loaded.backends)} variants: {', '.join(runnable)}")
    return get_backend(variant.backend).prepare(variant, loaded, kernel_profile=kernel_profile)
