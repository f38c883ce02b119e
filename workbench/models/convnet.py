"""`convnet`: a small ResNet-style CNN, images [B, 3, S, S] → logits [B, num_classes].

A stride-2 stem, then `stages` stages of `blocks_per_stage` BasicBlocks (the width doubles and the
resolution halves at each stage after the first), global average pooling and a linear classifier.
Built in eval mode, so BatchNorm uses its running statistics and can be folded by compilers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.seeding import input_generator, materialize
from workbench.models.spec import BuiltinSpec, Config, require_int


def conv_bn(cin: int, cout: int, kernel: int, stride: int) -> nn.Sequential:
    """Conv (no bias) followed by BatchNorm."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False), nn.BatchNorm2d(cout)
    )


class BasicBlock(nn.Module):
    """Two 3×3 conv-BN layers with a residual; a 1×1 conv-BN shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv_bn(cin, cout, 3, stride)
        self.conv2 = conv_bn(cout, cout, 3, 1)
        self.shortcut = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv2(F.relu(self.conv1(x))) + self.shortcut(x))


class ConvNet(nn.Module):
    """Stem, residual stages, global average pool, classifier."""

    def __init__(self, width: int, stages: int, blocks_per_stage: int, num_classes: int) -> None:
        super().__init__()
        self.stem = conv_bn(3, width, 3, 2)
        blocks: list[nn.Module] = []
        cin = width
        for stage in range(stages):
            cout = width * 2**stage
            for index in range(blocks_per_stage):
                blocks.append(BasicBlock(cin, cout, stride=2 if stage > 0 and index == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu(self.stem(images)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build(config: Config) -> ConvNet:
    """The ConvNet with seeded weights for a full config."""
    for key in ("width", "stages", "blocks_per_stage", "num_classes", "image_size"):
        require_int("convnet", config, key)
    return materialize(
        lambda: ConvNet(config["width"], config["stages"], config["blocks_per_stage"], config["num_classes"]),
        config["seed"],
    )


def make_inputs(config: Config, batch: int, seq: int | None) -> tuple[torch.Tensor, ...]:
    """Seeded standard-normal images, float32 [batch, 3, image_size, image_size]."""
    gen = input_generator(config["seed"])
    size = config["image_size"]
    return (torch.randn(batch, 3, size, size, generator=gen),)


SPEC = BuiltinSpec(
    name="convnet",
    summary="ResNet-style CNN, images [B, 3, 64, 64] → logits [B, num_classes]",
    defaults={
        "width": 32,
        "stages": 3,
        "blocks_per_stage": 1,
        "num_classes": 1000,
        "image_size": 64,
        "seed": 0,
    },
    build=build,
    make_inputs=make_inputs,
)
