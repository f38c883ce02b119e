"""`Variant`: one named way to run a model (backend × precision × compile × fusion × device × batch).

Variants are data: each backend module declares its own (`VARIANTS`) in its `BackendSpec`, and
`workbench.backends.registry` lists them, looks them up and prepares them through their backend.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Precision = Literal["fp32", "bf16", "fp16", "int8", "int8-weight-only", "fp8"]

REFERENCE = "eager"
"""The variant every other one is compared against (fp32, eager)."""


@dataclass(frozen=True)
class Variant:
    """A value naming an inference path. `compile` is the compiler: a torch.compile backend name, "xla"
    for JAX (always jitted), or None (eager); `compile_mode` a torch.compile mode (max-autotune,
    reduce-overhead); `fusion` False asks the compiler not to fuse (XLA's fusion passes off), for
    fusion experiments."""

    name: str
    backend: str = "torch"
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
