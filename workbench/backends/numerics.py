"""Numerical agreement of a candidate output with the fp32 reference computed on the same inputs.

Everything is computed in float64 on the CPU so the comparison adds no error of its own.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from workbench.errors import WorkbenchError


def _json_float(value: float | None) -> float | str | None:
    """JSON has no infinities or NaN: they become the strings "inf", "-inf", "nan"."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


@dataclass(frozen=True)
class Numerics:
    """Errors of a candidate against the reference.

    sqnr_db is 10·log10(‖ref‖² / ‖ref − cand‖²): inf when identical. top1_agreement is the fraction
    of positions (all but the last dim) whose argmax over the last dim matches; None when the
    output has fewer than 2 entries along its last dim.
    """

    max_abs_error: float
    mean_abs_error: float
    cosine_similarity: float
    sqnr_db: float
    top1_agreement: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields; non-finite floats become "inf" / "-inf" / "nan" strings."""
        return {key: _json_float(value) for key, value in asdict(self).items()}


def _sqnr_db(signal: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _cosine(ref: torch.Tensor, cand: torch.Tensor) -> float:
    # sqrt of the product of squared norms: exactly ±1 for (anti)parallel equal-size vectors.
    norms = math.sqrt(float(ref.dot(ref)) * float(cand.dot(cand)))
    if norms == 0.0:
        return 1.0 if torch.equal(ref, cand) else 0.0
    return max(-1.0, min(1.0, float(ref.dot(cand)) / norms))


def compare_outputs(reference: torch.Tensor, candidate: torch.Tensor) -> Numerics:
    """Compare two outputs of the same shape (any dtype, any device)."""
    if reference.shape != candidate.shape:
        raise WorkbenchError(
            f"cannot compare outputs of shapes {tuple(reference.shape)} and {tuple(candidate.shape)}"
        )
    if reference.numel() == 0:
        raise WorkbenchError("cannot compare empty outputs")
    ref = reference.detach().to("cpu", torch.float64)
    cand = candidate.detach().to("cpu", torch.float64)
    diff = (ref - cand).abs()
    flat_ref, flat_cand = ref.flatten(), cand.flatten()
    top1 = None
    if ref.dim() > 0 and ref.shape[-1] >= 2:
        top1 = float((ref.argmax(dim=-1) == cand.argmax(dim=-1)).double().mean())
    return Numerics(
        max_abs_error=float(diff.max()),
        mean_abs_error=float(diff.mean()),
        cosine_similarity=_cosine(flat_ref, flat_cand),
        sqnr_db=_sqnr_db(float(flat_ref.dot(flat_ref)), float(diff.flatten().dot(diff.flatten()))),
        top1_agreement=top1,
    )
