"""How well a model does on held-out data: perplexity of a next-token model on held-out text, top-1 of a
classifier on held-out images. Each takes any `nn.Module` (or plain forward function) with the built-in's call
signature, so a quantized or compiled copy is scored on exactly the same data as the original. The data is fixed
(no randomness): evenly spaced windows of the held-out text, every held-out image, in fixed batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from workbench.errors import WorkbenchError

EVAL_WINDOWS = 64
"""Held-out windows a perplexity is measured on."""

Model = Callable[[torch.Tensor], torch.Tensor]
"""An `nn.Module` or a forward function: inputs of the built-in's shape → logits."""


def held_out_windows(tokens: torch.Tensor, seq: int, count: int = EVAL_WINDOWS) -> torch.Tensor:
    """`count` windows of `seq + 1` tokens (int64 [count, seq + 1]) at evenly spaced offsets of `tokens`."""
    if len(tokens) < seq + 1 + count:
        raise WorkbenchError(f"held-out text of {len(tokens)} tokens is too short for {count} windows of {seq + 1}")
    starts = torch.linspace(0, len(tokens) - seq - 1, count).round().to(torch.int64)
    return tokens[starts[:, None] + torch.arange(seq + 1)]


def _placement(model: Model) -> tuple[torch.device, torch.dtype]:
    """Where a module's tensors live and the dtype of its first floating-point parameter; CPU and float32 for a
    module without tensors or a plain function."""
    tensors = [*model.parameters(), *model.buffers()] if isinstance(model, nn.Module) else []
    device = tensors[0].device if tensors else torch.device("cpu")
    dtype = next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)
    return device, dtype


@torch.no_grad()
def perplexity(model: Model, windows: torch.Tensor, batch: int = 16) -> float:
    """exp of the mean negative log-likelihood of each window's tokens 1.. given the tokens before them."""
    device, _ = _placement(model)
    total, count = 0.0, 0
    for chunk in windows.split(batch):
        chunk = chunk.to(device)
        logits = model(chunk[:, :-1]).float()
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1),
                                 reduction="sum").item()
        count += chunk[:, 1:].numel()
    return math.exp(total / count)


def unigram_perplexity(train: torch.Tensor, windows: torch.Tensor, vocab: int) -> float:
    """The baseline a language model must beat: perplexity on the windows' predicted tokens of the token
    frequencies of `train` (add-one smoothed), a model that ignores all context."""
    counts = torch.bincount(train, minlength=vocab).to(torch.float64) + 1.0
    log_probs = (counts / counts.sum()).log()
    return math.exp(-log_probs[windows[:, 1:].reshape(-1)].mean().item())


@torch.no_grad()
def top1(model: Model, images: torch.Tensor, labels: torch.Tensor, batch: int = 256) -> float:
    """Fraction of `images` whose highest logit is their label (images cast to the model's float dtype)."""
    device, dtype = _placement(model)
    correct = 0
    for chunk, expected in zip(images.split(batch), labels.split(batch), strict=True):
        predicted = model(chunk.to(device=device, dtype=dtype)).argmax(dim=-1).cpu()
        correct += int((predicted == expected).sum())
    return correct / len(labels)
