"""`mlp`: a stack of Linear + GELU layers, features [B, in_features] → logits [B, num_classes].

Shape with the defaults: 512 → 2048 → 2048 → 512 → 1000. A GEMM-only model, the simplest case
for quantization and fusion comparisons.
"""

from __future__ import annotations

from itertools import pairwise

import torch
from torch import nn

from workbench.models.seeding import input_generator, materialize
from workbench.models.spec import BuiltinSpec, Config, require_int


def _layers(config: Config) -> list[nn.Module]:
    hidden = [config["hidden"]] * (config["hidden_layers"] + 1)
    widths = [config["in_features"], *hidden, config["in_features"]]
    layers: list[nn.Module] = []
    for fan_in, fan_out in pairwise(widths):
        layers += [nn.Linear(fan_in, fan_out), nn.GELU()]
    layers.append(nn.Linear(config["in_features"], config["num_classes"]))
    return layers


def build(config: Config) -> nn.Sequential:
    """The MLP with seeded weights for a full config."""
    for key in ("in_features", "hidden", "num_classes"):
        require_int("mlp", config, key)
    require_int("mlp", config, "hidden_layers", minimum=0)
    return materialize(lambda: nn.Sequential(*_layers(config)), config["seed"])


def make_inputs(config: Config, batch: int, seq: int | None) -> tuple[torch.Tensor, ...]:
    """Seeded standard-normal features, float32 [batch, in_features]."""
    gen = input_generator(config["seed"])
    return (torch.randn(batch, config["in_features"], generator=gen),)


SPEC = BuiltinSpec(
    name="mlp",
    summary="Linear+GELU stack, features [B, in_features] → logits [B, num_classes]",
    defaults={"in_features": 512, "hidden": 2048, "hidden_layers": 1, "num_classes": 1000, "seed": 0},
    build=build,
    make_inputs=make_inputs,
)
