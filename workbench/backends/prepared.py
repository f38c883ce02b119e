"""What every backend's prepared variant offers, and the first-call timer they share.

`Prepared` is the surface the benchmark, the numerics check and the profiled lifecycle use, whatever
the backend (torch module, jitted JAX function, TensorRT engine): `place` inputs on the device, `run`
one call, `sync`, a `timer` for the benchmark, `first_call` (where compilers compile) and `notes` for
run.json. It lives apart from every backend so that none imports another.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from workbench.backends.benchmark import Timer
from workbench.backends.variants import Variant


class Prepared(Protocol):
    """A variant ready to run on its device."""

    variant: Variant
    notes: dict[str, Any]

    def place(self, inputs: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        """The inputs on this variant's device."""

    def run(self, inputs: Sequence[Any]) -> torch.Tensor:
        """One inference call; the output as a float tensor."""

    def sync(self) -> None:
        """Wait until queued device work is done."""

    def timer(self) -> Timer:
        """How the benchmark times a call on this variant's device."""

    def first_call(self, inputs: Sequence[Any]) -> float:
        """Run once and return its wall seconds (compilation included); kept as notes["first_call_s"]."""


def time_first_call(prepared: Prepared, inputs: Sequence[Any]) -> float:
    """Wall seconds of `prepared`'s first call on `inputs` (placed first, synchronized around), where
    compiling variants compile; recorded as its notes["first_call_s"]. Shared by every kind of
    prepared variant."""
    placed = prepared.place(inputs)
    prepared.sync()
    start = time.perf_counter()
    prepared.run(placed)
    prepared.sync()
    elapsed = time.perf_counter() - start
    prepared.notes["first_call_s"] = elapsed
    return elapsed
