"""KV caches of Hugging Face models: the transformers cache each `--cache` kind makes, whether it can run here,
the bytes it holds (measured from the cache object after generation) and what the performance model predicts.

Kinds (`HF_CACHES`):

- `dynamic`: `DynamicCache`, grown by concatenation; holds the positions fed so far.
- `static`: `StaticCache`, preallocated for `capacity` positions (prompt + new − 1: every position fed).
- `quantized`: `QuantizedCache` with the optimum-quanto backend (int4, KIVI-style residual window),
  `quantized-hqq` with HQQ's: each only where its package is installed (`cache_unavailable` says why not).
- `quantized-fp8`: `QuantizedCache(backend="fp8")` (transformers' own float8_e4m3 cache, one frozen fp32
  scale per layer for K and one for V; no extra package).

Measured bytes are those of the tensors the cache holds (`keys` / `values` of each layer and a quantized
layer's quantized states and scales), element count × element size. A cropped dynamic layer (assisted
generation) may keep a larger storage alive until its next update; that slack is not counted.

Predicted bytes come from `workbench.llm.perf_model.kv_bytes` of the config read by
`perf_model.hf_config` (K and V of the kv heads, or MLA's compressed latent + RoPE key, which is what
transformers' DeepSeek attention caches): for `dynamic` at the positions held, for `static` at its capacity,
for `quantized-fp8` in fp8 plus the 2 · layers fp32 scales. The int4 backends (residual window, group
scales and zero points in the backend's own layout) are not modelled: no prediction. Nor are sliding-window
layers once the context passes the window.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any

import torch

from workbench.errors import VariantUnavailable, WorkbenchError
from workbench.llm.perf_model import LLMConfig, kv_bytes
from workbench.llm.perf_model.hf_config import dtype_name, sliding_window_of

HF_CACHES = ("dynamic", "static", "quantized", "quantized-hqq", "quantized-fp8")
"""Cache kinds of HF generation runs (see the module docstring)."""

CROPPABLE = frozenset({"dynamic", "static"})
"""Kinds assisted generation can use: it crops the target's cache back to the accepted tokens."""

_BACKENDS: dict[str, tuple[str, str | None, str | None]] = {
    "quantized": ("quanto", "optimum.quanto", "optimum-quanto"),
    "quantized-hqq": ("hqq", "hqq", "hqq"),
    "quantized-fp8": ("fp8", None, None),
}
"""Quantized kinds: (transformers backend, module it needs, pip package)."""

SCALE_BYTES = 4
"""Bytes of one fp32 scale of the fp8 cache."""


def check_cache_kind(kind: str) -> None:
    """WorkbenchError listing the kinds unless `kind` is one."""
    if kind not in HF_CACHES:
        raise WorkbenchError(f"generate: unknown cache {kind!r}; valid: {', '.join(HF_CACHES)}")


def cache_unavailable(kind: str) -> str | None:
    """Why `kind` cannot run here (its backend package is missing), or None when it can."""
    check_cache_kind(kind)
    backend = _BACKENDS.get(kind)
    if backend is None or backend[1] is None:
        return None
    _, module, package = backend
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package (optimum) is missing
        found = False
    return None if found else (f"cache {kind!r} needs transformers' {backend[0]} backend: {package} is not "
                               f"installed (pip install {package})")


def make_cache(kind: str, config: Any, capacity: int) -> Any:
    """A new, empty transformers cache of `kind` for a model of `config` (static: `capacity` positions);
    VariantUnavailable when its backend package is missing."""
    from transformers import DynamicCache, QuantizedCache, StaticCache

    reason = cache_unavailable(kind)
    if reason:
        raise VariantUnavailable(reason)
    if kind == "dynamic":
        return DynamicCache(config=config)
    if kind == "static":
        return StaticCache(config=config, max_cache_len=capacity)
    return QuantizedCache(backend=_BACKENDS[kind][0], config=config)


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a cache attribute: a tensor, or tuples, lists and dicts of them (quantized states)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


CACHED_ATTRIBUTES = ("keys", "values", "_quantized_keys", "_quantized_values")
"""What a transformers cache layer holds its states in (other attributes, such as a static layer's position
counter, are bookkeeping)."""


def measured_cache_bytes(cache: Any) -> int:
    """Bytes of the tensors `cache` holds (see the module docstring), each tensor counted once."""
    seen: dict[int, torch.Tensor] = {}
    for layer in cache.layers:
        for name in CACHED_ATTRIBUTES:
            for tensor in _tensors(getattr(layer, name, None)):
                seen[id(tensor)] = tensor
    return sum(t.numel() * t.element_size() for t in seen.values())


def cache_dtype(model: torch.nn.Module) -> str:
    """The perf model's dtype name of the model's floating-point weights, which its K and V take."""
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    name = dtype_name(dtype)
    if name is None:
        raise WorkbenchError(f"generate: model weights in {dtype}, which the KV-cache prediction does not know")
    return name


def predicted_cache_bytes(llm: LLMConfig, hf_config: Any, kind: str, *, batch: int, context: int, capacity: int,
                          dtype: str) -> tuple[int | None, str]:
    """(bytes the performance model predicts for a `kind` cache holding `context` positions of `batch`
    sequences, what it counted); None bytes, with the reason, where it does not model the cache."""
    check_cache_kind(kind)
    window = sliding_window_of(hf_config)
    if window is not None and max(context, capacity if kind == "static" else 0) > window:
        return None, f"sliding-window layers (window {window}) hold less than the context: not modelled"
    what = "compressed latent + RoPE key (MLA)" if llm.attention == "mla" else f"K and V of {llm.kv_heads} kv heads"
    if kind == "dynamic":
        return int(kv_bytes(replace(llm, kv_dtype=dtype), batch, context)), f"{what}, {dtype}, {context} positions"
    if kind == "static":
        return int(kv_bytes(replace(llm, kv_dtype=dtype), batch, capacity)), \
            f"{what}, {dtype}, preallocated {capacity} positions"
    if kind == "quantized-fp8":
        scales = 2 * llm.layers * SCALE_BYTES
        return int(kv_bytes(replace(llm, kv_dtype="fp8", kv_scale="static"), batch, context)) + scales, \
            f"{what}, fp8, {context} positions + one fp32 scale per layer for K and V"
    return None, f"cache {kind!r} (int4 groups and a residual window in the backend's layout): not modelled"
