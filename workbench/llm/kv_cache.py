"""KV caches for tiny-gpt generation, and the formula of their size.

A `KVCache` preallocates, per layer, what the model's attention caches (`tiny_gpt.cache_layout`):
K and V of the kv heads (MHA / GQA / MQA), or MLA's latent, which serves as both. Storage formats
(`CACHE_FORMATS`):

- `fp32`, `bf16`, `fp16`: the values in that dtype, cast to the queries' dtype when attention reads them.
- `int8`: symmetric int8 with one fp32 scale per token and head (absmax / 127 of that vector, set as
  the token is written): dynamic, never saturates.
- `int8-per-head`: symmetric int8 with one fp32 scale per sequence and head, set from the absmax of the
  first write (the prompt, at prefill) and kept: later tokens beyond that range saturate at ±127
  (counted in `saturated()`), as with statically calibrated KV scales.

Dequantization happens inside attention (`LayerCache.attend`), folded into its two matmuls rather than
materializing a dequantized copy of the cache: a per-token key scale multiplies the score column of
that token, a per-head one the whole score block; a per-token value scale multiplies the attention
probability of that token before the probability × V product, a per-head one the product. The int8
values take part in the matmuls cast to the queries' dtype (CPUs and GPUs lack an int8 × float matmul).

`kv_cache_bytes(config, batch, context, kv_dtype)` is the size these tensors have: `KVCache.nbytes()`
measures it from the allocated tensors, and the two agree exactly (tested).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from workbench.errors import WorkbenchError
from workbench.models.tiny_gpt import SPEC as TINY_GPT_SPEC
from workbench.models.tiny_gpt import CacheLayout, TinyGPT, cache_layout

CACHE_FORMATS = ("fp32", "bf16", "fp16", "int8", "int8-per-head")
"""Storage formats a `KVCache` holds its keys and values in (see the module docstring)."""

SCALE_BYTES = 4
"""Bytes of one int8 scale (fp32)."""

_INT8_MAX = 127.0
_TINY = 1e-12  # floor of a scale, so an all-zero vector quantizes to zeros rather than NaN


@dataclass(frozen=True)
class KVFormat:
    """A storage format: the tensor dtype and, for int8, the scale granularity ("token" or "head")."""

    name: str
    dtype: torch.dtype
    scales: str | None = None

    @property
    def itemsize(self) -> int:
        """Bytes per stored value."""
        return torch.empty((), dtype=self.dtype).element_size()


_FORMATS = {
    "fp32": KVFormat("fp32", torch.float32),
    "bf16": KVFormat("bf16", torch.bfloat16),
    "fp16": KVFormat("fp16", torch.float16),
    "int8": KVFormat("int8", torch.int8, "token"),
    "int8-per-head": KVFormat("int8-per-head", torch.int8, "head"),
}


def kv_format(kv_dtype: str) -> KVFormat:
    """The storage format named `kv_dtype`; WorkbenchError listing the valid names otherwise."""
    try:
        return _FORMATS[kv_dtype]
    except (KeyError, TypeError):
        raise WorkbenchError(f"unknown KV-cache dtype {kv_dtype!r}; valid: {', '.join(CACHE_FORMATS)}") from None


def _full_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A tiny-gpt config with the defaults filled in (so callers may pass only what they changed)."""
    return {**TINY_GPT_SPEC.defaults, **config}


def kv_cache_bytes(config: Mapping[str, Any], batch: int, context: int, kv_dtype: str) -> int:
    """Bytes of the KV cache of a tiny-gpt `config` (missing keys take the defaults) holding `context`
    positions of `batch` sequences in format `kv_dtype`:

        layers · tensors · batch · groups · context · width · itemsize       (the values)
      + layers · tensors · batch · groups · context · 4                      (int8: per-token scales)
      + layers · tensors · batch · groups · 4                                (int8-per-head: scales)

    where tensors · groups · width is 2 · kv_heads · head_dim (K and V) or MLA's kv_latent.
    """
    for name, value in (("batch", batch), ("context", context)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise WorkbenchError(f"kv_cache_bytes: {name} must be an integer >= 0, got {value!r}")
    full = _full_config(config)
    fmt = kv_format(kv_dtype)
    layout = cache_layout(full)
    vectors = full["layers"] * layout.tensors * batch * layout.groups
    total = vectors * context * layout.width * fmt.itemsize
    if fmt.scales == "token":
        total += vectors * context * SCALE_BYTES
    elif fmt.scales == "head":
        total += vectors * SCALE_BYTES
    return total


class _Store:
    """One cached tensor of one layer, [batch, groups, capacity, width] in a format, with its scales."""

    def __init__(self, batch: int, layout: CacheLayout, capacity: int, fmt: KVFormat, device: torch.device) -> None:
        self.fmt = fmt
        self.data = torch.zeros(batch, layout.groups, capacity, layout.width, dtype=fmt.dtype, device=device)
        self.scale: torch.Tensor | None = None
        if fmt.scales == "token":
            self.scale = torch.zeros(batch, layout.groups, capacity, dtype=torch.float32, device=device)
        elif fmt.scales == "head":
            self.scale = torch.zeros(batch, layout.groups, dtype=torch.float32, device=device)
        # values clipped by static per-head scales; a tensor, so counting never syncs the device
        self.saturated = torch.zeros((), dtype=torch.int64, device=device)

    def tensors(self) -> list[torch.Tensor]:
        return [self.data] if self.scale is None else [self.data, self.scale]

    def write(self, x: torch.Tensor, start: int) -> None:
        """Store x [batch, groups, t, width] at positions start..start+t-1."""
        end = start + x.shape[2]
        if self.fmt.scales is None:
            self.data[:, :, start:end] = x.to(self.fmt.dtype)
            return
        x32 = x.float()
        if self.fmt.scales == "token":
            scale = (x32.abs().amax(dim=-1) / _INT8_MAX).clamp_min(_TINY)  # [B, G, t]
            self.scale[:, :, start:end] = scale
            q = torch.round(x32 / scale[..., None])
        else:
            if start == 0:  # the first write (the prompt) calibrates the per-head scales
                self.scale.copy_((x32.abs().amax(dim=(-1, -2)) / _INT8_MAX).clamp_min(_TINY))
            q = torch.round(x32 / self.scale[:, :, None, None])
            self.saturated += (q.abs() > _INT8_MAX).sum()
        self.data[:, :, start:end] = q.clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)

    def scores(self, queries: torch.Tensor, end: int) -> torch.Tensor:
        """queries [B, G, n, width] @ stored[:end]ᵀ, dequantized: [B, G, n, end]."""
        raw = queries @ self.data[:, :, :end].to(queries.dtype).transpose(-1, -2)
        if self.fmt.scales == "token":
            return raw * self.scale[:, :, None, :end].to(queries.dtype)
        if self.fmt.scales == "head":
            return raw * self.scale[:, :, None, None].to(queries.dtype)
        return raw

    def mix(self, probs: torch.Tensor, end: int) -> torch.Tensor:
        """probs [B, G, n, end] @ stored[:end], dequantized: [B, G, n, width]."""
        values = self.data[:, :, :end].to(probs.dtype)
        if self.fmt.scales == "token":
            return (probs * self.scale[:, :, None, :end].to(probs.dtype)) @ values
        if self.fmt.scales == "head":
            return (probs @ values) * self.scale[:, :, None, None].to(probs.dtype)
        return probs @ values


class LayerCache:
    """One layer's part of a `KVCache` (the model's `KVLayer`): its key store and value store, or one
    latent store serving as both (MLA)."""

    def __init__(self, owner: KVCache, keys: _Store, values: _Store | None) -> None:
        self._owner = owner
        self.keys = keys
        self.values = values

    def append(self, keys: torch.Tensor, values: torch.Tensor | None) -> None:
        """Write the new positions (after the owner's `length`); values None when the keys are latents."""
        if (values is None) != (self.values is None):
            stored = "K and V" if self.values is not None else "a latent (MLA)"
            given = "K only" if values is None else "K and V"
            raise WorkbenchError(f"KV cache: this layer stores {stored}, but attention gave {given}")
        start = self._owner.length
        if start + keys.shape[2] > self._owner.capacity:
            raise WorkbenchError(f"KV cache full: {start} + {keys.shape[2]} positions exceed its capacity "
                                 f"{self._owner.capacity}")
        self.keys.write(keys, start)
        if values is not None and self.values is not None:
            self.values.write(values, start)

    def attend(self, queries: torch.Tensor, scale: float) -> torch.Tensor:
        """Causal attention of the t newest positions' queries [B, heads, t, width] over the cache (those
        positions included): [B, heads, t, value width]. Query head h reads group h // (heads // groups);
        scores and softmax are in float32, or in the queries' dtype if wider."""
        b, heads, t, width = queries.shape
        groups = self.keys.data.shape[1]
        end = self._owner.length + t
        dtype = torch.promote_types(queries.dtype, torch.float32)
        # [B, heads, t, w] → [B, groups, repeats·t, w]: each group's query heads as rows of one matmul
        grouped = queries.to(dtype).reshape(b, groups, (heads // groups) * t, width)
        scores = self.keys.scores(grouped, end) * scale
        if t > 1:  # query i (at position length + i) sees positions 0..length + i
            visible = torch.ones(t, end, dtype=torch.bool, device=queries.device).tril(end - t)
            scores = scores.masked_fill(~visible.repeat(heads // groups, 1), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = (self.keys if self.values is None else self.values).mix(probs, end)
        return out.reshape(b, heads, t, out.shape[-1]).to(queries.dtype)


class KVCache:
    """A preallocated KV cache for `batch` sequences of up to `capacity` positions (the model's
    `KVCache`): `length` positions are filled. `truncate` drops the newest positions (speculative
    decoding's rollback); `nbytes` measures the allocated tensors."""

    def __init__(self, layouts: list[CacheLayout], batch: int, capacity: int, kv_dtype: str,
                 device: torch.device | str = "cpu") -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise WorkbenchError(f"KV cache: capacity must be an integer >= 1, got {capacity!r}")
        self.kv_dtype = kv_dtype
        self.format = kv_format(kv_dtype)
        self.batch = batch
        self.capacity = capacity
        self.length = 0
        device = torch.device(device)
        self._layers = []
        for layout in layouts:
            keys = _Store(batch, layout, capacity, self.format, device)
            values = _Store(batch, layout, capacity, self.format, device) if layout.tensors == 2 else None
            self._layers.append(LayerCache(self, keys, values))

    @classmethod
    def for_model(cls, model: TinyGPT, batch: int, capacity: int, kv_dtype: str = "fp32") -> KVCache:
        """An empty cache shaped for `model`'s attention layers, on the model's device."""
        if capacity > model.max_seq:
            raise WorkbenchError(f"KV cache: capacity {capacity} exceeds the model's max_seq {model.max_seq}")
        layouts = [block.attn.cache_layout for block in model.blocks]
        return cls(layouts, batch, capacity, kv_dtype, model.tok_emb.weight.device)

    def layer(self, index: int) -> LayerCache:
        """Block `index`'s part."""
        return self._layers[index]

    def advance(self, t: int) -> None:
        """Count `t` more positions as filled (after every layer has appended them)."""
        self.length += t

    def truncate(self, length: int) -> None:
        """Keep only the first `length` positions (later writes overwrite the rest)."""
        if not 0 <= length <= self.length:
            raise WorkbenchError(f"KV cache: cannot truncate to {length} positions (it holds {self.length})")
        self.length = length

    @property
    def layers(self) -> int:
        """Number of layers."""
        return len(self._layers)

    def tensors(self) -> list[torch.Tensor]:
        """Every allocated tensor of the cache: values and scales of each store of each layer."""
        stores = [s for layer in self._layers for s in (layer.keys, layer.values) if s is not None]
        return [t for store in stores for t in store.tensors()]

    def nbytes(self) -> int:
        """Bytes allocated for the cache, measured from its tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def saturated(self) -> int:
        """Values clipped at ±127 so far (int8-per-head only; 0 otherwise). Synchronizes the device."""
        stores = [s for layer in self._layers for s in (layer.keys, layer.values) if s is not None]
        return int(sum(int(s.saturated) for s in stores))
