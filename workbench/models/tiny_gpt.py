"""`tiny-gpt`: a small decoder-only transformer whose attention is MHA, GQA, MQA (by kv-heads) or MLA.

The module tree is kept plain (named Linear / Embedding / LayerNorm leaves, no fused weights) so
torchao can quantize every projection and other backends can read the weights by state_dict name:
`tok_emb`, `pos_emb`, `blocks.<i>.{ln1,attn.{q,k,v,o}_proj,ln2,mlp.{fc_in,fc_out}}`, `ln_f`,
`lm_head`. With `attention="mla"` each block's attention is
`blocks.<i>.attn.{q_proj,kv_down,kv_norm,k_up,v_up,o_proj}` instead (see `LatentAttention`).

`forward(tokens)` maps token ids to logits. For autoregressive generation it also takes a KV cache
(`forward(tokens, cache=...)`, any object with the `KVCache` protocol below; `workbench.llm.kv_cache`
implements it): the tokens are then the next positions after those cached, their keys and values (or
MLA latents) are appended to the cache, and attention reads the whole cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from workbench.errors import WorkbenchError
from workbench.models.seeding import input_generator, materialize
from workbench.models.spec import BuiltinSpec, Config, require_int

DEFAULT_SEQ = 128

ATTENTION_KINDS = ("mha", "gqa", "mqa", "mla")
"""Values of the `attention` config key (None: mha, gqa or mqa as kv_heads says)."""

MLA_LATENT_PER_HEAD_DIM = 4
"""Default MLA latent width in head dims (DeepSeek-V2: d_c = 4·d_h, 512 for 128-dim heads)."""


@dataclass(frozen=True)
class CacheLayout:
    """What one layer caches per token: `tensors` tensors (2: K and V; 1: MLA's latent, which serves as
    both) of `groups` heads × `width` values each."""

    tensors: int
    groups: int
    width: int

    @property
    def values_per_token(self) -> int:
        """Cached values per token and layer."""
        return self.tensors * self.groups * self.width


class KVLayer(Protocol):
    """One layer's part of a KV cache, as attention uses it."""

    def append(self, keys: torch.Tensor, values: torch.Tensor | None) -> None:
        """Store the new positions' keys and values, [B, groups, t, width] each (values None: the keys are
        MLA latents that serve as both)."""
        ...

    def attend(self, queries: torch.Tensor, scale: float) -> torch.Tensor:
        """Causal attention of the new positions' queries [B, heads, t, width] over every cached position:
        [B, heads, t, width]; query head h reads cache group h // (heads // groups)."""
        ...


class KVCache(Protocol):
    """A KV cache as the model uses it: `length` positions are cached; `layer(i)` is block i's part;
    `advance(t)` is called once all blocks have appended `t` new positions."""

    length: int

    def layer(self, index: int) -> KVLayer: ...

    def advance(self, t: int) -> None: ...


def expand_kv(x: torch.Tensor, repeats: int) -> torch.Tensor:
    """[B, kv_heads, T, D] → [B, kv_heads*repeats, T, D]; query head h reads kv head h // repeats."""
    if repeats == 1:
        return x
    b, kv_heads, t, d = x.shape
    return x[:, :, None].expand(b, kv_heads, repeats, t, d).reshape(b, kv_heads * repeats, t, d)


def _split(x: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """[B, T, heads·head_dim] → [B, heads, T, head_dim]."""
    b, t, _ = x.shape
    return x.view(b, t, heads, head_dim).transpose(1, 2)


def _merge(y: torch.Tensor) -> torch.Tensor:
    """[B, heads, T, head_dim] → [B, T, heads·head_dim]."""
    b, heads, t, head_dim = y.shape
    return y.transpose(1, 2).reshape(b, t, heads * head_dim)


class CausalSelfAttention(nn.Module):
    """Causal self-attention with `kv_heads` key/value heads shared by groups of query heads."""

    def __init__(self, d_model: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = d_model // heads
        self.cache_layout = CacheLayout(tensors=2, groups=kv_heads, width=self.head_dim)
        self.q_proj = nn.Linear(d_model, heads * self.head_dim)
        self.k_proj = nn.Linear(d_model, kv_heads * self.head_dim)
        self.v_proj = nn.Linear(d_model, kv_heads * self.head_dim)
        self.o_proj = nn.Linear(heads * self.head_dim, d_model)

    def forward(self, x: torch.Tensor, cache: KVLayer | None = None, cached: int = 0) -> torch.Tensor:
        """x [B, T, d_model] → [B, T, d_model]. With `cache` (holding `cached` earlier positions), the new
        keys and values are appended to it; attention then reads the cache unless it was empty."""
        repeats = self.heads // self.kv_heads
        q = _split(self.q_proj(x), self.heads, self.head_dim)
        k = _split(self.k_proj(x), self.kv_heads, self.head_dim)
        v = _split(self.v_proj(x), self.kv_heads, self.head_dim)
        if cache is None or cached == 0:  # no history: plain causal attention over x (a prefill)
            y = F.scaled_dot_product_attention(q, expand_kv(k, repeats), expand_kv(v, repeats), is_causal=True)
            if cache is not None:
                cache.append(k, v)
        else:
            cache.append(k, v)
            y = cache.attend(q, 1.0 / math.sqrt(self.head_dim))
        return self.o_proj(_merge(y))


class LatentAttention(nn.Module):
    """Multi-head latent attention (MLA, DeepSeek-V2): keys and values are up-projected from one shared
    per-token latent `c = kv_norm(kv_down(x))` of `latent` values, and the cache holds `c` (latent values
    per token and layer) instead of K and V (2·heads·head_dim).

    Without a cache (and for a prefill) K = k_up(c) and V = v_up(c) are materialized and attention is
    the usual causal SDPA. With a cache, attention runs in latent space (the "absorbed" form): k_up is
    folded into the queries (q·k_h = (W_uk,hᵀ q)·c) and v_up applied to the attention-weighted latents,
    so the cached latents are never expanded. The up-projections have no bias, as in DeepSeek-V2, which
    keeps the two forms equal. tiny-gpt's positions are learned embeddings added at the input, so
    DeepSeek-V2's decoupled RoPE key is not needed.
    """

    def __init__(self, d_model: int, heads: int, latent: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.latent = latent
        self.cache_layout = CacheLayout(tensors=1, groups=1, width=latent)
        self.q_proj = nn.Linear(d_model, heads * self.head_dim)
        self.kv_down = nn.Linear(d_model, latent)
        self.kv_norm = nn.LayerNorm(latent)
        self.k_up = nn.Linear(latent, heads * self.head_dim, bias=False)
        self.v_up = nn.Linear(latent, heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, d_model)

    def forward(self, x: torch.Tensor, cache: KVLayer | None = None, cached: int = 0) -> torch.Tensor:
        """x [B, T, d_model] → [B, T, d_model]; the cache, as in `CausalSelfAttention.forward`, holds latents."""
        q = _split(self.q_proj(x), self.heads, self.head_dim)
        c = self.kv_norm(self.kv_down(x))  # [B, T, latent]
        if cache is None or cached == 0:
            k = _split(self.k_up(c), self.heads, self.head_dim)
            v = _split(self.v_up(c), self.heads, self.head_dim)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if cache is not None:
                cache.append(c[:, None], None)
        else:
            cache.append(c[:, None], None)
            w_uk = self.k_up.weight.view(self.heads, self.head_dim, self.latent)
            w_uv = self.v_up.weight.view(self.heads, self.head_dim, self.latent)
            q_latent = torch.einsum("bhtd,hdl->bhtl", q, w_uk)
            context = cache.attend(q_latent, 1.0 / math.sqrt(self.head_dim))  # [B, heads, T, latent]
            y = torch.einsum("bhtl,hdl->bhtd", context, w_uv)
        return self.o_proj(_merge(y))


class MLP(nn.Module):
    """Position-wise feed-forward: Linear → GELU (exact) → Linear."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, hidden)
        self.fc_out = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, d_model: int, heads: int, kv_heads: int, mlp_ratio: int, kv_latent: int | None = None) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn: CausalSelfAttention | LatentAttention = (
            CausalSelfAttention(d_model, heads, kv_heads) if kv_latent is None
            else LatentAttention(d_model, heads, kv_latent))
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, mlp_ratio * d_model)

    def forward(self, x: torch.Tensor, cache: KVLayer | None = None, cached: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache, cached)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token ids [B, T] (int64) → logits [B, T, vocab]; MLA attention when `kv_latent` is given."""

    def __init__(
        self, vocab: int, layers: int, d_model: int, heads: int, kv_heads: int, max_seq: int, mlp_ratio: int,
        kv_latent: int | None = None,
    ) -> None:
        super().__init__()
        self.max_seq = max_seq
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, kv_heads, mlp_ratio, kv_latent) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits of `tokens`. With `cache`, `tokens` continue the cached sequence: they sit at positions
        cache.length.., attend to everything cached, and are appended to the cache."""
        if cache is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.tok_emb(tokens) + self.pos_emb(positions)
            for block in self.blocks:
                x = block(x)
            return self.lm_head(self.ln_f(x))
        start, t = cache.length, tokens.shape[1]
        if start + t > self.max_seq:
            raise WorkbenchError(f"tiny-gpt: positions {start}..{start + t - 1} exceed max_seq {self.max_seq}")
        positions = torch.arange(start, start + t, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for index, block in enumerate(self.blocks):
            x = block(x, cache.layer(index), start)
        cache.advance(t)
        return self.lm_head(self.ln_f(x))


def _kv_heads(config: Config) -> int:
    return config["heads"] if config["kv_heads"] is None else config["kv_heads"]


def _default_gqa_kv_heads(heads: int) -> int:
    """kv heads of a GQA config that gives none: the smallest divisor of `heads` in 2..heads-1."""
    divisor = next((d for d in range(2, heads) if heads % d == 0), None)
    if divisor is None:
        raise WorkbenchError(f"tiny-gpt: attention 'gqa' needs heads with a divisor in 2..heads-1; "
                             f"heads {heads} has none (set kv_heads, or use mha/mqa)")
    return divisor


def resolved_kv_heads(config: Config) -> int:
    """Key/value heads of a config: kv_heads when given, else what its `attention` implies (mha: heads,
    gqa: the smallest divisor of heads above 1, mqa: 1); MLA configs have none (0)."""
    attention = config.get("attention")
    if attention == "mla":
        return 0
    if config["kv_heads"] is not None:
        return config["kv_heads"]
    if attention == "gqa":
        return _default_gqa_kv_heads(config["heads"])
    return 1 if attention == "mqa" else config["heads"]


def attention_kind(config: Config) -> str:
    """The attention of a config, one of ATTENTION_KINDS: `attention` when set, else what kv_heads makes
    it (all heads: mha; one: mqa; otherwise gqa)."""
    if config.get("attention") is not None:
        return config["attention"]
    kv_heads = _kv_heads(config)
    if kv_heads == config["heads"]:
        return "mha"
    return "mqa" if kv_heads == 1 else "gqa"


def resolved_kv_latent(config: Config) -> int | None:
    """The MLA latent width of a config (kv_latent, default 4·head_dim); None unless attention is mla."""
    if config.get("attention") != "mla":
        return None
    latent = config.get("kv_latent")
    return MLA_LATENT_PER_HEAD_DIM * (config["d_model"] // config["heads"]) if latent is None else latent


def cache_layout(config: Config) -> CacheLayout:
    """What each layer of a (valid) config caches per token: K and V of the kv heads, or MLA's latent."""
    latent = resolved_kv_latent(config)
    if latent is not None:
        return CacheLayout(tensors=1, groups=1, width=latent)
    return CacheLayout(tensors=2, groups=resolved_kv_heads(config), width=config["d_model"] // config["heads"])


def _validate_attention(config: Config) -> None:
    """Check `attention`, `kv_heads` and `kv_latent` against each other."""
    attention, kv_heads, heads = config.get("attention"), config["kv_heads"], config["heads"]
    if attention is not None and attention not in ATTENTION_KINDS:
        raise WorkbenchError(f"tiny-gpt: attention must be one of {', '.join(ATTENTION_KINDS)} (or null), "
                             f"got {attention!r}")
    if config.get("kv_latent") is not None:
        if attention != "mla":
            raise WorkbenchError("tiny-gpt: kv_latent applies only to attention 'mla'")
        require_int("tiny-gpt", config, "kv_latent")
    if attention == "mla":
        if kv_heads is not None:
            raise WorkbenchError("tiny-gpt: attention 'mla' caches a latent, not kv heads; leave kv_heads unset")
        return
    expected = {"mha": lambda n: n == heads, "mqa": lambda n: n == 1, "gqa": lambda n: 1 < n < heads}
    if attention is not None and kv_heads is not None and not expected[attention](kv_heads):
        raise WorkbenchError(f"tiny-gpt: attention {attention!r} does not match kv_heads {kv_heads} "
                             f"(heads {heads}; mha: kv_heads = heads, gqa: 1 < kv_heads < heads, mqa: 1)")


def _validate(config: Config) -> None:
    for key in ("vocab", "layers", "d_model", "heads", "max_seq", "mlp_ratio"):
        require_int("tiny-gpt", config, key)
    if config["kv_heads"] is not None:
        require_int("tiny-gpt", config, "kv_heads")
    if config["d_model"] % config["heads"]:
        raise WorkbenchError(
            f"tiny-gpt: d_model {config['d_model']} is not divisible by heads {config['heads']}"
        )
    _validate_attention(config)
    kv_heads = resolved_kv_heads(config)
    if kv_heads and config["heads"] % kv_heads:
        raise WorkbenchError(f"tiny-gpt: heads {config['heads']} is not divisible by kv_heads {kv_heads}")


def build(config: Config) -> TinyGPT:
    """A TinyGPT with seeded weights for a full config."""
    _validate(config)
    return materialize(
        lambda: TinyGPT(
            vocab=config["vocab"],
            layers=config["layers"],
            d_model=config["d_model"],
            heads=config["heads"],
            kv_heads=resolved_kv_heads(config) or 1,
            max_seq=config["max_seq"],
            mlp_ratio=config["mlp_ratio"],
            kv_latent=resolved_kv_latent(config),
        ),
        config["seed"],
    )


def make_inputs(config: Config, batch: int, seq: int | None) -> tuple[torch.Tensor, ...]:
    """Seeded token ids, int64 [batch, seq], uniform over the vocabulary."""
    assert seq is not None  # LoadedModel resolves the default before calling
    if not 1 <= seq <= config["max_seq"]:
        raise WorkbenchError(f"tiny-gpt: seq must be in 1..{config['max_seq']} (max_seq), got {seq}")
    gen = input_generator(config["seed"])
    return (torch.randint(0, config["vocab"], (batch, seq), generator=gen, dtype=torch.int64),)


SPEC = BuiltinSpec(
    name="tiny-gpt",
    summary="decoder-only transformer (MHA / GQA / MQA via kv_heads, or MLA), tokens [B, T] → logits [B, T, vocab]",
    defaults={
        "vocab": 1024,
        "layers": 2,
        "d_model": 256,
        "heads": 8,
        "kv_heads": None,
        "max_seq": 512,
        "mlp_ratio": 4,
        "seed": 0,
        "attention": None,
        "kv_latent": None,
    },
    build=build,
    make_inputs=make_inputs,
    default_seq=lambda config: min(DEFAULT_SEQ, config["max_seq"]),
)
