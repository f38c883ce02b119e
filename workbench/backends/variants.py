"""`Variant`: one named way to run a model (backend × precision × compile × device × batch).

The registry below is data: adding a variant is adding one entry. `prepare` (in
`workbench.backends.prepare`) turns a Variant into something runnable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from workbench.backends.devices import parse_device
from workbench.errors import WorkbenchError

Precision = Literal["fp32", "bf16", "int8", "int8-weight-only"]

REFERENCE = "eager"
"""The variant every other one is compared against (fp32, eager)."""


@dataclass(frozen=True)
class Variant:
    """A value naming an inference path. `compile` is a torch.compile backend name, or None (eager)."""

    name: str
    backend: str = "torch"
    precision: Precision = "fp32"
    compile: str | None = None
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
        Variant("compile", compile="inductor", description="fp32, torch.compile (inductor)"),
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
    )
}


def list_variants() -> list[str]:
    """Registered variant names, the reference first."""
    return list(_REGISTRY)


def get_variant(name: str, batch: int = 1, device: str = "cpu") -> Variant:
    """The registered variant `name` for `batch` items per call on `device`.

    Only the names are checked here; whether the device exists is `prepare`'s question.
    """
    if name not in _REGISTRY:
        raise WorkbenchError(f"unknown variant '{name}'; valid variants: {', '.join(_REGISTRY)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise WorkbenchError(f"batch must be a positive integer, got {batch!r}")
    parse_device(device)
    return replace(_REGISTRY[name], batch=batch, device=device)
