"""`LoadedModel`: a ready-to-run fp32 module with its config and an example-input maker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from workbench.errors import WorkbenchError

Source = Literal["builtin", "factory", "export", "onnx", "hf", "hf-config", "torchvision", "timm"]
Weights = Literal["real", "random", "trained"]
"""'random': seeded weights the workbench made (built-ins, hf-config:, a vision model without cached
weights); 'real': the weights the source brought (a checkpoint, a file, a user factory's module); 'trained': a
built-in trained by the workbench on data every machine has (`workbench.models.trained`)."""
InputMaker = Callable[[int, int | None], tuple[torch.Tensor, ...]]


def count_parameters(module: nn.Module) -> int:
    """Number of parameter elements (shared parameters counted once)."""
    return sum(p.numel() for p in module.parameters())


@dataclass
class LoadedModel:
    """A model resolved from a reference: CPU, fp32, eval mode, never mutated by backends.

    `default_seq` is the sequence length used when `make_inputs` gets none, or None when the model
    has no sequence axis (then it takes no `seq` and processes no tokens).
    """

    name: str
    module: nn.Module
    config: dict[str, Any]
    source: Source
    input_maker: InputMaker = field(repr=False)
    default_seq: int | None = None
    backends: tuple[str, ...] | None = None
    """The backends that can run it (an ONNX file: onnxruntime only); None for every backend."""
    reference: str | None = None
    """The variant whose output is its numerics reference (an ONNX file: ort-noopt); None for the default."""
    weights: Weights = "real"
    """Whether the weights are trained ones or seeded random ones (see `Weights`)."""
    training: dict[str, Any] | None = None
    """For weights "trained", JSON-ready facts of the training: `description` (the sentence surfaces print:
    "trained on ..., held-out perplexity X"), `metric` and `value` (the held-out score), `data`, `budget`,
    `seed`, `train_seconds`; None for other weights."""
    hf_model: Any = field(default=None, repr=False)
    """The transformers model behind `module` (hf:, hf-config:), for generation; None for other sources."""

    def _seq(self, seq: int | None) -> int | None:
        if self.default_seq is None:
            if seq is not None:
                raise WorkbenchError(f"model '{self.name}' has no sequence axis; it takes no seq (got {seq})")
            return None
        return self.default_seq if seq is None else seq

    def make_inputs(self, batch: int, seq: int | None = None) -> tuple[torch.Tensor, ...]:
        """Example inputs for one call with `batch` items (and `seq` tokens each, if sequential)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise WorkbenchError(f"batch must be a positive integer, got {batch!r}")
        return self.input_maker(batch, self._seq(seq))

    def items(self, batch: int, seq: int | None = None) -> int:
        """Items (samples) one call processes."""
        self._seq(seq)
        return batch

    def tokens(self, batch: int, seq: int | None = None) -> int | None:
        """Tokens one call processes (batch × seq), or None for models without a sequence axis."""
        resolved = self._seq(seq)
        return None if resolved is None else batch * resolved

    @property
    def parameter_count(self) -> int:
        """Number of parameter elements of the module."""
        return count_parameters(self.module)
