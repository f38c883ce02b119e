"""Deterministic weights for built-in models, without touching the global RNG.

A model is constructed on the meta device (so torch's default initializers draw nothing), then
materialized on the CPU and filled from a local `torch.Generator`. The same factory and seed give
bit-identical weights in any process, whatever else has used torch's global random state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

Initializer = Callable[[nn.Module, torch.Generator], None]


def _init_linear(module: nn.Linear, gen: torch.Generator) -> None:
    # LeCun normal keeps activations O(1) through the stack, so outputs are not vanishingly small.
    module.weight.normal_(0.0, 1.0 / math.sqrt(module.in_features), generator=gen)
    if module.bias is not None:
        module.bias.normal_(0.0, 0.02, generator=gen)


def _init_embedding(module: nn.Embedding, gen: torch.Generator) -> None:
    module.weight.normal_(0.0, 1.0, generator=gen)


def _init_layer_norm(module: nn.LayerNorm, gen: torch.Generator) -> None:
    module.weight.fill_(1.0)
    module.bias.zero_()


def _init_conv(module: nn.Conv2d, gen: torch.Generator) -> None:
    nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu", generator=gen)
    if module.bias is not None:
        module.bias.zero_()


def _init_batch_norm(module: nn.BatchNorm2d, gen: torch.Generator) -> None:
    module.weight.fill_(1.0)
    module.bias.zero_()
    module.running_mean.zero_()
    module.running_var.fill_(1.0)
    module.num_batches_tracked.zero_()


# One rule per leaf type that owns tensors. A type missing here fails loudly instead of leaving the
# uninitialized memory `to_empty` hands out.
_RULES: dict[type[nn.Module], Initializer] = {
    nn.Linear: _init_linear,
    nn.Embedding: _init_embedding,
    nn.LayerNorm: _init_layer_norm,
    nn.Conv2d: _init_conv,
    nn.BatchNorm2d: _init_batch_norm,
}


def materialize(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    """Build `factory()` with weights drawn from a generator seeded with `seed`; eval mode, fp32, CPU."""
    with torch.device("meta"):
        module = factory()
    module = module.to_empty(device="cpu")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, sub in module.named_modules():
            owns_tensors = any(True for _ in sub.parameters(recurse=False)) or any(
                True for _ in sub.buffers(recurse=False)
            )
            if not owns_tensors:
                continue
            rule = _RULES.get(type(sub))
            if rule is None:
                raise TypeError(f"no seeded initializer for {type(sub).__name__} at '{name}'")
            rule(sub, gen)
    return module.eval()


def input_generator(seed: int) -> torch.Generator:
    """A generator for example inputs, on a stream separate from the weights' one."""
    return torch.Generator(device="cpu").manual_seed(seed + 1_000_003)


@contextmanager
def seeded_global_rng(seed: int) -> Iterator[None]:
    """Run a third-party constructor that draws its initial weights from torch's global RNG (transformers,
    torchvision, timm) with that RNG seeded to `seed`; the caller's global random state is restored after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
