"""Seeded, reproducible training of a built-in model, bounded in steps rather than wall time.

Everything random (which windows or images form a batch) comes from a generator seeded with the model's seed,
and training runs on one CPU thread with torch's deterministic algorithms, so the same module, data, budget and
seed give bit-identical weights on one machine (another CPU or torch build may round differently). AdamW with a
linear warm-up and a cosine decay; gradients are clipped to norm 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workbench.errors import WorkbenchError

Batch = tuple[torch.Tensor, torch.Tensor]
"""(inputs, targets) of one training step."""


@dataclass(frozen=True)
class Budget:
    """What a training run may spend: `steps` optimizer steps of `batch` items (token windows of `seq`
    tokens for a language model), at peak learning rate `lr` after `warmup` steps."""

    steps: int
    batch: int
    lr: float
    warmup: int = 0
    seq: int | None = None
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or not self.lr > 0 or not 0 <= self.warmup <= self.steps:
            raise WorkbenchError(f"invalid training budget {self}")

    def to_dict(self) -> dict[str, object]:
        """JSON-ready, for a checkpoint's key and metadata."""
        return asdict(self)


@contextmanager
def deterministic() -> Iterator[None]:
    """One torch thread and deterministic algorithms for the block; the caller's settings (and its global RNG,
    which nothing here should draw from) are restored after."""
    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(strict)


def _learning_rate(budget: Budget, step: int) -> float:
    """Linear warm-up to `lr`, then cosine decay to a tenth of it at the last step."""
    if step < budget.warmup:
        return budget.lr * (step + 1) / budget.warmup
    progress = (step - budget.warmup) / max(1, budget.steps - budget.warmup)
    return budget.lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * progress)))


def _fit(module: nn.Module, batches: Callable[[torch.Generator], Batch], loss: Callable[[torch.Tensor,
         torch.Tensor], torch.Tensor], budget: Budget, seed: int) -> nn.Module:
    """Run the budget's steps on `module` in place and return it in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    decay = [p for p in module.parameters() if p.ndim >= 2]
    rest = [p for p in module.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": budget.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}],
                                  lr=budget.lr, betas=(0.9, 0.95), foreach=False)
    with deterministic():
        module.train()
        for step in range(budget.steps):
            for group in optimizer.param_groups:
                group["lr"] = _learning_rate(budget, step)
            inputs, targets = batches(gen)
            optimizer.zero_grad(set_to_none=True)
            loss(module(inputs), targets).backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0, foreach=False)
            optimizer.step()
    return module.eval()


def train_language_model(module: nn.Module, tokens: torch.Tensor, budget: Budget, seed: int) -> nn.Module:
    """Train a next-token model (token ids [B, T] → logits [B, T, vocab]) on random windows of `tokens`
    (int64 [N]) of `budget.seq` tokens."""
    seq = budget.seq
    if seq is None or len(tokens) <= seq + 1:
        raise WorkbenchError(f"language-model training needs a budget seq shorter than the text ({len(tokens)} "
                             f"tokens), got {seq}")
    span = torch.arange(seq + 1)

    def batches(gen: torch.Generator) -> Batch:
        starts = torch.randint(0, len(tokens) - seq - 1, (budget.batch, 1), generator=gen)
        windows = tokens[starts + span]
        return windows[:, :-1], windows[:, 1:]

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return _fit(module, batches, loss, budget, seed)


def train_classifier(module: nn.Module, images: torch.Tensor, labels: torch.Tensor, budget: Budget,
                     seed: int) -> nn.Module:
    """Train a classifier (images → logits [B, classes]) on random batches of `images` with `labels`."""

    def batches(gen: torch.Generator) -> Batch:
        index = torch.randint(0, len(labels), (budget.batch,), generator=gen)
        return images[index], labels[index]

    return _fit(module, batches, F.cross_entropy, budget, seed)
