"""The JAX ports of the built-in models against the PyTorch modules, on the same weights and inputs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from functools import cache
from typing import Any

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from workbench.backends.numerics import compare_outputs as compare  # noqa: E402
from workbench.errors import VariantUnavailable, WorkbenchError  # noqa: E402
from workbench.models import LoadedModel, load_model  # noqa: E402
from workbench.models.jax_port import JaxModel, jax_inputs, jax_model  # noqa: E402

GPT = {"vocab": 128, "layers": 2, "d_model": 64, "heads": 4, "max_seq": 32}
# name → (model ref, config overrides, seq)
CASES: dict[str, tuple[str, dict[str, Any], int | None]] = {
    "gpt-mha": ("tiny-gpt", GPT, 16),
    "gpt-gqa": ("tiny-gpt", {**GPT, "kv_heads": 2}, 16),
    "gpt-mqa": ("tiny-gpt", {**GPT, "kv_heads": 1}, 16),
    "mlp": ("mlp", {"in_features": 32, "hidden": 64, "hidden_layers": 1, "num_classes": 10}, None),
    "convnet": ("convnet", {"width": 8, "stages": 2, "blocks_per_stage": 2, "num_classes": 10, "image_size": 16}, None),
}

# fp32 in both frameworks differs only by summation order: a few ulps (~1e-7 relative) per op,
# ~4e-7 of the output scale measured here. 1e-4 leaves two orders of margin yet is far below what
# any semantic slip (a wrong kv-head grouping, tanh GELU, a missing causal mask or shortcut) produces.
FP32_REL_TOL = 1e-4
# bf16 keeps 8 significant bits (relative step 2^-8 ≈ 4e-3); through a few layers the error was
# 0.6-1.5% of the output scale here and the SQNR ~40 dB. fp16 (11 bits) is ~8× tighter.
LOW_PRECISION_MIN_SQNR_DB = {"bfloat16": 30.0, "float16": 45.0}


@cache
def _case(name: str) -> tuple[JaxModel, tuple[np.ndarray, ...], torch.Tensor]:
    """The JAX port, its inputs and the torch fp32 eager output for one case (built once)."""
    ref, overrides, seq = CASES[name]
    loaded = load_model(ref, **overrides)
    inputs = loaded.make_inputs(2, seq)
    with torch.no_grad():
        expected = loaded.module(*inputs)
    return jax_model(loaded), jax_inputs(inputs), expected


def _run(model: JaxModel, inputs: tuple[np.ndarray, ...]) -> jax.Array:
    return jax.jit(model.apply)(model.params, *inputs)


def _as_torch(out: jax.Array) -> torch.Tensor:
    return torch.from_numpy(np.array(out.astype(jnp.float32)))


@pytest.mark.parametrize("name", list(CASES))
def test_fp32_jit_matches_torch_eager(name):
    model, inputs, expected = _case(name)
    out = _run(model, inputs)
    assert out.dtype == jnp.float32 and out.shape == tuple(expected.shape)
    error = compare(expected, _as_torch(out))
    scale = float(expected.abs().max())
    assert error.max_abs_error <= FP32_REL_TOL * scale, (name, error, scale)
    assert error.top1_agreement == 1.0


@pytest.mark.parametrize("name", list(CASES))
def test_params_are_the_float_state_dict_in_fp32(name):
    ref, overrides, _ = CASES[name]
    loaded = load_model(ref, **overrides)
    model, _, _ = _case(name)
    state = {k: v for k, v in loaded.module.state_dict().items() if v.is_floating_point()}
    assert set(model.params) == set(state)
    for key, value in model.params.items():
        assert value.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(value), state[key].numpy())


@pytest.mark.parametrize(
    ("name", "dtype"), [("gpt-gqa", "bfloat16"), ("gpt-mqa", "float16"), ("mlp", "bfloat16"), ("convnet", "bfloat16")]
)
def test_low_precision_params_run_and_stay_close(name, dtype):
    model, inputs, expected = _case(name)
    low = model.with_dtype(dtype)
    assert low.dtype == jnp.dtype(dtype) and model.dtype == jnp.float32  # the original is untouched
    assert all(value.dtype == jnp.dtype(dtype) for value in low.params.values())
    out = _run(low, inputs)
    assert out.dtype == jnp.dtype(dtype)
    error = compare(expected, _as_torch(out))
    assert error.sqnr_db >= LOW_PRECISION_MIN_SQNR_DB[dtype], error
    assert error.cosine_similarity > 0.999, error


def test_with_dtype_accepts_jnp_dtypes_and_rejects_non_floats():
    model, _, _ = _case("mlp")
    assert model.with_dtype(jnp.bfloat16).dtype == jnp.bfloat16
    with pytest.raises(WorkbenchError, match="float dtype"):
        model.with_dtype("int8")
    with pytest.raises(WorkbenchError, match="unknown dtype"):
        model.with_dtype("not-a-dtype")


def test_jax_inputs_keep_token_ids_integer_and_features_float32():
    tokens = torch.tensor([[0, 5, 1023]], dtype=torch.int64)
    features = torch.randn(2, 3, dtype=torch.float64)
    got_tokens, got_features = jax_inputs((tokens, features))
    assert got_tokens.dtype == np.int32 and got_tokens.tolist() == [[0, 5, 1023]]
    assert got_features.dtype == np.float32 and got_features.shape == (2, 3)


def test_jax_inputs_reject_what_jax_cannot_take_as_is():
    with pytest.raises(WorkbenchError, match="outside the int32 range"):
        jax_inputs((torch.tensor([2**40]),))
    with pytest.raises(WorkbenchError, match="input 0 is a list"):
        jax_inputs(([1, 2],))  # type: ignore[arg-type]


def test_tiny_gpt_rejects_sequences_beyond_max_seq():
    model, _, _ = _case("gpt-mha")
    with pytest.raises(WorkbenchError, match="exceeds max_seq 32"):
        model.apply(model.params, np.zeros((1, 33), np.int32))


FACTORY_SOURCE = """
import torch


def make():
    return torch.nn.Linear(3, 2), (torch.ones(1, 3),)
"""


def test_models_without_a_port_are_unavailable(tmp_path, monkeypatch):
    name = f"wb_jax_user_model_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FACTORY_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    factory = load_model(f"{name}:make")
    with pytest.raises(VariantUnavailable, match=r"factory model: JAX variants support only .*convnet, mlp, tiny-gpt"):
        jax_model(factory)
    # A factory that reuses a built-in's name is still not the built-in.
    impostor = LoadedModel(
        name="mlp", module=factory.module, config={}, source="factory", input_maker=factory.input_maker
    )
    with pytest.raises(VariantUnavailable, match="JAX variants support only"):
        jax_model(impostor)


def test_importing_workbench_models_does_not_import_jax():
    code = "import sys, workbench.models; assert 'jax' not in sys.modules, 'jax was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
