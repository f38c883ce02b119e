"""KV caches: the size formula against the allocated tensors, int8 storage, and attention over the cache."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from workbench.errors import WorkbenchError
from workbench.llm.kv_cache import CACHE_FORMATS as KV_DTYPES
from workbench.llm.kv_cache import KVCache, kv_cache_bytes
from workbench.models import load_model
from workbench.models.tiny_gpt import CacheLayout, cache_layout, expand_kv

SMALL = {"vocab": 256, "layers": 2, "d_model": 64, "heads": 4, "max_seq": 64}
HEAD_DIM = SMALL["d_model"] // SMALL["heads"]
ATTENTIONS = {"mha": {}, "gqa": {"kv_heads": 2}, "mqa": {"attention": "mqa"}, "mla": {"attention": "mla"}}


def test_formula_for_mha_fp32_counts_k_and_v_of_every_head_layer_and_position():
    # layers · (K and V) · batch · heads · positions · head_dim · 4 bytes
    assert kv_cache_bytes(SMALL, 3, 10, "fp32") == 2 * 2 * 3 * 4 * 10 * HEAD_DIM * 4


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_gqa_mqa_and_mla_shrink_the_cache_by_the_expected_factor(kv_dtype):
    mha = kv_cache_bytes(SMALL, 2, 32, kv_dtype)
    # GQA with 2 of 4 kv heads halves everything stored per head (values and scales alike); MQA quarters it
    assert kv_cache_bytes({**SMALL, "kv_heads": 2}, 2, 32, kv_dtype) * 2 == mha
    assert kv_cache_bytes({**SMALL, "attention": "mqa"}, 2, 32, kv_dtype) * 4 == mha
    # MLA caches one latent of kv_latent values instead of K and V (2 · heads · head_dim = 128 values)
    for latent, factor in ((32, 4), (16, 8)):
        mla = kv_cache_bytes({**SMALL, "attention": "mla", "kv_latent": latent}, 2, 32, kv_dtype)
        if kv_dtype in ("fp32", "bf16", "fp16"):
            assert mla * factor == mha
        else:  # int8 values, plus one scale per position (per token) or per sequence (per head) of the latent
            scales = 2 * 2 * (32 if kv_dtype == "int8" else 1) * 4
            assert mla == 2 * 2 * 32 * latent + scales


def test_int8_adds_fp32_scales_per_token_or_per_head():
    values = 2 * 2 * 1 * 4 * 20 * HEAD_DIM  # layers · K,V · batch · heads · positions · head_dim, 1 byte each
    assert kv_cache_bytes(SMALL, 1, 20, "int8") == values + (2 * 2 * 4 * 20) * 4
    assert kv_cache_bytes(SMALL, 1, 20, "int8-per-head") == values + (2 * 2 * 4) * 4
    assert kv_cache_bytes(SMALL, 1, 20, "bf16") == kv_cache_bytes(SMALL, 1, 20, "fp32") // 2


def test_formula_fills_missing_keys_from_the_model_defaults():
    # default tiny-gpt: 2 layers, 8 heads of 32 dims
    assert kv_cache_bytes({}, 1, 128, "fp32") == 2 * 2 * 8 * 128 * 32 * 4
    assert kv_cache_bytes({"attention": "mla"}, 1, 128, "fp32") == 2 * 128 * (4 * 32) * 4


@pytest.mark.parametrize(("args", "message"), [
    ((SMALL, 1, 8, "int4"), "unknown KV-cache dtype 'int4'; valid: fp32"),
    ((SMALL, -1, 8, "fp32"), "batch must be an integer >= 0"),
    ((SMALL, 1, 2.5, "fp32"), "context must be an integer >= 0"),
])
def test_formula_rejects_bad_input(args, message):
    with pytest.raises(WorkbenchError, match=message):
        kv_cache_bytes(*args)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
def test_measured_bytes_of_the_allocated_tensors_equal_the_formula(attention, kv_dtype):
    loaded = load_model("tiny-gpt", **SMALL, **ATTENTIONS[attention])
    cache = KVCache.for_model(loaded.module, 3, 40, kv_dtype)
    assert cache.nbytes() == sum(t.numel() * t.element_size() for t in cache.tensors())
    assert cache.nbytes() == kv_cache_bytes(loaded.config, 3, 40, kv_dtype)


def test_cache_layout_of_each_attention():
    assert cache_layout({**SMALL, "kv_heads": None}) == CacheLayout(tensors=2, groups=4, width=16)
    assert cache_layout({**SMALL, "kv_heads": 2}) == CacheLayout(tensors=2, groups=2, width=16)
    assert cache_layout({**SMALL, "kv_heads": None, "attention": "gqa"}) == CacheLayout(2, 2, 16)
    assert cache_layout({**SMALL, "kv_heads": None, "attention": "mla"}) == CacheLayout(1, 1, 64)  # 4 · head_dim
    assert cache_layout({**SMALL, "kv_heads": None, "attention": "mla", "kv_latent": 24}).values_per_token == 24


def _layer_cache(kv_dtype: str, groups: int = 2, width: int = 8, capacity: int = 16) -> KVCache:
    return KVCache([CacheLayout(2, groups, width)], batch=2, capacity=capacity, kv_dtype=kv_dtype)


def _reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Attention of the last q.shape[2] positions (from `start`) over k, v [B, G, start + t, D], via SDPA."""
    t, total = q.shape[2], k.shape[2]
    repeats = q.shape[1] // k.shape[1]
    mask = torch.ones(t, total, dtype=torch.bool).tril(start)
    return F.scaled_dot_product_attention(q, expand_kv(k, repeats), expand_kv(v, repeats), attn_mask=mask)


def test_fp32_cache_attention_is_grouped_causal_attention_over_everything_cached():
    gen = torch.Generator().manual_seed(0)
    cache = _layer_cache("fp32")
    k, v = torch.randn(2, 2, 7, 8, generator=gen), torch.randn(2, 2, 7, 8, generator=gen)
    cache.layer(0).append(k[:, :, :4], v[:, :, :4])
    cache.advance(4)
    # a chunk of 3 new positions (as a speculative verify feeds): causal within the chunk, all history visible
    q = torch.randn(2, 4, 3, 8, generator=gen)
    cache.layer(0).append(k[:, :, 4:], v[:, :, 4:])
    out = cache.layer(0).attend(q, 1 / math.sqrt(8))
    torch.testing.assert_close(out, _reference_attention(q, k, v, 4), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kv_dtype", ["int8", "int8-per-head", "bf16"])
def test_dequantization_inside_attention_equals_attention_over_dequantized_values(kv_dtype):
    gen = torch.Generator().manual_seed(1)
    cache = _layer_cache(kv_dtype)
    k, v = torch.randn(2, 2, 6, 8, generator=gen), torch.randn(2, 2, 6, 8, generator=gen)
    cache.layer(0).append(k, v)
    q = torch.randn(2, 4, 6, 8, generator=gen)
    out = cache.layer(0).attend(q, 1 / math.sqrt(8))  # six new positions after none: causal among themselves
    store_k, store_v = cache.layer(0).keys, cache.layer(0).values

    def dequantized(store) -> torch.Tensor:
        data = store.data[:, :, :6].float()
        if store.scale is None:
            return data
        scale = store.scale[:, :, :6, None] if store.scale.dim() == 3 else store.scale[:, :, None, None]
        return data * scale

    expected = _reference_attention(q, dequantized(store_k), dequantized(store_v), 0)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    # and the stored values are within half a quantization step (int8) or bf16 rounding of the originals
    dims = -1 if kv_dtype == "int8" else (-1, -2)  # a scale per token, or per sequence and head
    step = k.abs().amax(dim=dims, keepdim=True) / 127
    tolerance = step / 2 + 1e-7 if kv_dtype.startswith("int8") else k.abs() * 2**-8
    assert ((dequantized(store_k) - k).abs() <= tolerance).all()


def test_per_head_scales_come_from_the_prompt_and_later_outliers_saturate():
    cache = _layer_cache("int8-per-head", groups=1, width=4)
    prompt = torch.full((2, 1, 3, 4), 0.5)
    cache.layer(0).append(prompt, prompt)
    cache.advance(3)
    assert cache.saturated() == 0
    outlier = torch.full((2, 1, 1, 4), 2.0)  # 4× the calibrated range: clipped at ±127
    cache.layer(0).append(outlier, outlier)
    cache.advance(1)
    assert cache.saturated() == 2 * (2 * 4)  # K and V, 2 sequences × 4 values
    assert int(cache.layer(0).keys.data[:, :, 3].max()) == 127
    per_token = _layer_cache("int8", groups=1, width=4)
    per_token.layer(0).append(prompt, prompt)
    per_token.advance(3)
    per_token.layer(0).append(outlier, outlier)
    assert per_token.saturated() == 0  # per-token scales follow each token's own range


def test_truncate_and_capacity():
    cache = _layer_cache("fp32", capacity=4)
    x = torch.ones(2, 2, 3, 8)
    cache.layer(0).append(x, x)
    cache.advance(3)
    with pytest.raises(WorkbenchError, match="capacity 4"):
        cache.layer(0).append(x, x)
    cache.truncate(1)
    assert cache.length == 1
    with pytest.raises(WorkbenchError, match="cannot truncate to 2"):
        cache.truncate(2)
    with pytest.raises(WorkbenchError, match="stores K and V, but attention gave K only"):
        cache.layer(0).append(x, None)


def test_cache_for_model_checks_capacity_against_max_seq():
    module = load_model("tiny-gpt", **SMALL).module
    with pytest.raises(WorkbenchError, match="exceeds the model's max_seq 64"):
        KVCache.for_model(module, 1, 65)
    with pytest.raises(WorkbenchError, match="capacity must be an integer >= 1"):
        KVCache.for_model(module, 1, 0)
