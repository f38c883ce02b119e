"""`tiny-gpt`: a small decoder-only transformer whose kv-heads setting makes it MHA, GQA or MQA.

The module tree is kept plain (named Linear / Embedding / LayerNorm leaves, no fused weights) so
torchao can quantize every projection and other backends can read the weights by state_dict name:
`tok_emb`, `pos_emb`, `blocks.<i>.{ln1,attn.{q,k,v,o}_proj,ln2,mlp.{fc_in,fc_out}}`, `ln_f`,
`lm_head`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.errors import WorkbenchError
from workbench.models.seeding import input_generator, materialize
from workbench.models.spec import BuiltinSpec, Config, require_int

DEFAULT_SEQ = 128


def expand_kv(x: torch.Tensor, repeats: int) -> torch.Tensor:
    """[B, kv_heads, T, D] → [B, kv_heads*repeats, T, D]; query head h reads kv head h // repeats."""
    if repeats == 1:
        return x
    b, kv_heads, t, d = x.shape
    return x[:, :, None].expand(b, kv_heads, repeats, t, d).reshape(b, kv_heads * repeats, t, d)


class CausalSelfAttention(nn.Module):
    """Causal self-attention with `kv_heads` key/value heads shared by groups of query heads."""

    def __init__(self, d_model: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = d_model // heads
        self.q_proj = nn.Linear(d_model, heads * self.head_dim)
        self.k_proj = nn.Linear(d_model, kv_heads * self.head_dim)
        self.v_proj = nn.Linear(d_model, kv_heads * self.head_dim)
        self.o_proj = nn.Linear(heads * self.head_dim, d_model)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        repeats = self.heads // self.kv_heads
        q = self._split(self.q_proj(x), self.heads)
        k = expand_kv(self._split(self.k_proj(x), self.kv_heads), repeats)
        v = expand_kv(self._split(self.v_proj(x), self.kv_heads), repeats)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


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

    def __init__(self, d_model: int, heads: int, kv_heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, kv_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, mlp_ratio * d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token ids [B, T] (int64) → logits [B, T, vocab]."""

    def __init__(
        self, vocab: int, layers: int, d_model: int, heads: int, kv_heads: int, max_seq: int, mlp_ratio: int
    ) -> None:
        super().__init__()
        self.max_seq = max_seq
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, kv_heads, mlp_ratio) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _kv_heads(config: Config) -> int:
    return config["heads"] if config["kv_heads"] is None else config["kv_heads"]


def _validate(config: Config) -> None:
    for key in ("vocab", "layers", "d_model", "heads", "max_seq", "mlp_ratio"):
        require_int("tiny-gpt", config, key)
    if config["kv_heads"] is not None:
        require_int("tiny-gpt", config, "kv_heads")
    kv_heads = _kv_heads(config)
    if config["d_model"] % config["heads"]:
        raise WorkbenchError(
            f"tiny-gpt: d_model {config['d_model']} is not divisible by heads {config['heads']}"
        )
    if config["heads"] % kv_heads:
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
            kv_heads=_kv_heads(config),
            max_seq=config["max_seq"],
            mlp_ratio=config["mlp_ratio"],
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
    summary="decoder-only transformer (MHA / GQA / MQA via kv_heads), tokens [B, T] → logits [B, T, vocab]",
    defaults={
        "vocab": 1024,
        "layers": 2,
        "d_model": 256,
        "heads": 8,
        "kv_heads": None,
        "max_seq": 512,
        "mlp_ratio": 4,
        "seed": 0,
    },
    build=build,
    make_inputs=make_inputs,
    default_seq=lambda config: min(DEFAULT_SEQ, config["max_seq"]),
)
