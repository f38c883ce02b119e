"""Numerics against the reference, on tensors whose answers are known exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch

from workbench.backends.numerics import compare_outputs as compare
from workbench.errors import WorkbenchError


def test_identical_outputs():
    ref = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.25, -1.0]])
    result = compare(ref, ref.clone())
    assert result.max_abs_error == 0.0
    assert result.mean_abs_error == 0.0
    assert result.cosine_similarity == 1.0
    assert result.sqnr_db == math.inf
    assert result.top1_agreement == 1.0
    assert result.to_dict()["sqnr_db"] == "inf"
    json.dumps(result.to_dict(), allow_nan=False)


def test_known_errors():
    ref = torch.tensor([3.0, 4.0])
    cand = torch.tensor([3.0, 0.0])
    result = compare(ref, cand)
    assert result.max_abs_error == 4.0
    assert result.mean_abs_error == 2.0
    assert result.cosine_similarity == pytest.approx(9.0 / (5.0 * 3.0))
    assert result.sqnr_db == pytest.approx(10 * math.log10(25.0 / 16.0))
    assert result.top1_agreement == 0.0  # argmax 1 vs 0 over the only position


def test_top1_agreement_is_per_position_over_the_last_dim():
    ref = torch.tensor([[[1.0, 2.0], [3.0, 1.0]], [[0.0, 5.0], [2.0, 2.5]]])
    cand = torch.tensor([[[1.0, 3.0], [1.0, 3.0]], [[0.0, 4.0], [9.0, 2.5]]])
    # argmax ref: [[1, 0], [1, 1]]; cand: [[1, 1], [1, 0]] -> 2 of 4 positions agree
    assert compare(ref, cand).top1_agreement == 0.5


def test_top1_is_undefined_for_a_single_class():
    assert compare(torch.ones(4, 1), torch.ones(4, 1)).top1_agreement is None
    assert compare(torch.tensor(2.0), torch.tensor(2.0)).top1_agreement is None


def test_computed_in_float64():
    ref = torch.tensor([1e8 + 1.0], dtype=torch.float64)
    cand = torch.tensor([1e8], dtype=torch.float64)
    assert compare(ref, cand).max_abs_error == 1.0  # float32 would round both to 1e8


def test_low_precision_candidate_against_fp32_reference():
    ref = torch.tensor([1.0, 2.0, 3.0])
    cand = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    result = compare(ref, cand)
    assert result.max_abs_error == 0.0
    assert result.sqnr_db == math.inf


def test_zero_reference_and_sign_flip():
    zero = compare(torch.zeros(3), torch.tensor([0.0, 1.0, 0.0]))
    assert zero.sqnr_db == -math.inf
    assert zero.cosine_similarity == 0.0
    assert zero.to_dict()["sqnr_db"] == "-inf"
    flipped = compare(torch.tensor([1.0, -2.0]), torch.tensor([-1.0, 2.0]))
    assert flipped.cosine_similarity == -1.0
    assert flipped.sqnr_db == pytest.approx(10 * math.log10(5.0 / 20.0))


def test_nan_candidate_is_reported_json_safe():
    result = compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, float("nan")]))
    assert math.isnan(result.max_abs_error)
    assert result.to_dict()["max_abs_error"] == "nan"
    json.dumps(result.to_dict(), allow_nan=False)


def test_shape_mismatch_is_an_error():
    with pytest.raises(WorkbenchError, match=r"shapes \(2, 3\) and \(3, 2\)"):
        compare(torch.zeros(2, 3), torch.zeros(3, 2))
