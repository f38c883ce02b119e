"""Quantization recipes: which tensors of which layers take which format, and a model emulating them.

A recipe is text, one `TARGET=SPEC` per comma (`linear.weight=nvfp4,kv=fp8-e4m3/head`); SPEC is a
`workbench.quant.formats` spec. TARGET names a tensor kind:

- `PATTERN.weight` / `PATTERN.input`: the weight, or the input activation, of every Linear or convolution whose
  qualified name matches PATTERN (`fnmatch`: `blocks.*.mlp.*`, `lm_head`; `linear` matches every Linear, `conv`
  every convolution; `workbench.quant.layers` says how a convolution's tensors meet a format);
- `kv`, `k`, `v`: the keys and values attention reads (the KV cache: what it stores is what attention reads back);
- `q`: the queries (with `k`, the Q·Kᵀ operands); `p`: the softmax output before P·V.

`quantized(model, recipe)` returns a copy of the model whose weights are stored in their formats and whose
activations and attention operands are rounded on the way, as the hardware would: weights once, activations
by forward pre-hooks on the layers, attention operands inside `F.scaled_dot_product_attention`, which the copy
runs as explicit Q·Kᵀ, softmax and P·V when `q`, `k`, `v` or `p` is in the recipe (any model that calls SDPA:
the built-ins, Hugging Face's SDPA attention). Attention computed another way is not reached: `Quantized.reached`
says which targets matched something, so a recipe that quantizes nothing is an error, not a silent no-op.
"""

from __future__ import annotations

import copy
import fnmatch
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from workbench.quant.formats import FormatError, QuantSpec, fake_quantize, parse_spec
from workbench.quant.layers import LAYER_KINDS, quantize_input, quantize_weight, weight_layers

ATTENTION_TARGETS = ("q", "k", "v", "p")
"""Attention operands a recipe may name (`kv` is `k` and `v`)."""


@dataclass(frozen=True)
class Rule:
    """One `TARGET=SPEC` of a recipe: a layer name pattern with `weight`/`input`, or an attention operand."""

    target: str
    spec: QuantSpec
    pattern: str | None = None
    tensor: str | None = None

    def __str__(self) -> str:
        return f"{self.target}={self.spec}"

    def names_operand(self, operand: str) -> bool:
        """Whether this rule rounds attention operand `operand` (q, k, v, p; `kv` names both k and v)."""
        return self.target == operand or (self.target == "kv" and operand in ("k", "v"))

    def matches(self, name: str, module: nn.Module) -> bool:
        """Whether the layer `module` called `name` is one this rule's pattern names."""
        if self.pattern in LAYER_KINDS:
            return isinstance(module, LAYER_KINDS[self.pattern])
        return fnmatch.fnmatchcase(name, self.pattern or "")


@dataclass(frozen=True)
class Recipe:
    """The rules of a recipe, in order: for a tensor the last rule naming it wins (a general rule first, its
    exceptions after)."""

    rules: tuple[Rule, ...]

    def __str__(self) -> str:
        return ",".join(str(rule) for rule in self.rules)

    def layer_rule(self, name: str, module: nn.Module, tensor: str) -> Rule | None:
        """The rule deciding layer `name`'s `tensor` ("weight" or "input"), None when it stays as it is."""
        chosen = [r for r in self.rules if r.tensor == tensor and r.matches(name, module)]
        return chosen[-1] if chosen else None

    def attention_rule(self, operand: str) -> Rule | None:
        """The rule deciding attention operand `operand` (q, k, v, p), None when it stays as it is."""
        chosen = [r for r in self.rules if r.names_operand(operand)]
        return chosen[-1] if chosen else None

    def layer(self, name: str, module: nn.Module, tensor: str) -> QuantSpec | None:
        """The spec of layer `name`'s `tensor`, None when it stays as it is."""
        rule = self.layer_rule(name, module, tensor)
        return rule.spec if rule else None

    def attention(self, operand: str) -> QuantSpec | None:
        """The spec of attention operand `operand`, None when it stays as it is."""
        rule = self.attention_rule(operand)
        return rule.spec if rule else None


def rounded(x: torch.Tensor, rule: Rule, where: str, store=fake_quantize) -> torch.Tensor:
    """`x` in `rule`'s format (through `store(x, spec)`); a tensor the format cannot store (groups that do not
    divide it) is an error naming the recipe entry and `where` it applied."""
    try:
        return store(x, rule.spec)
    except FormatError as cannot:
        raise FormatError(f"recipe entry '{rule}' at {where}: {cannot}") from None


def parse_recipe(text: str) -> Recipe:
    """`TARGET=SPEC[,TARGET=SPEC...]` as a `Recipe` (see the module docstring); a clear error for a bad part."""
    rules = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        target, sep, spec_text = part.partition("=")
        target = target.strip()
        if not sep or not target or not spec_text.strip():
            raise FormatError(f"recipe part '{part}' is not TARGET=FORMAT (e.g. linear.weight=nvfp4, kv=fp8-e4m3/head)")
        spec = parse_spec(spec_text)
        if target in (*ATTENTION_TARGETS, "kv"):
            rules.append(Rule(target, spec))
            continue
        pattern, dot, tensor = target.rpartition(".")
        if not dot or tensor not in ("weight", "input") or not pattern:
            raise FormatError(f"recipe target '{target}' names no tensor: use PATTERN.weight or PATTERN.input "
                              "(PATTERN a layer's name with * wildcards, linear or conv for all of a kind), or one of "
                              "kv, k, v, q, p")
        rules.append(Rule(target, spec, pattern, tensor))
    if not rules:
        raise FormatError("empty recipe: give TARGET=FORMAT, e.g. linear.weight=int8")
    return Recipe(tuple(rules))


class Quantized(nn.Module):
    """A quantized copy of a model, itself a module (call it like the model, evaluate it like one); `reached`
    counts what each rule quantized (Linears for weight/input rules, attention calls for operand rules, the
    latter counted as the model runs)."""

    def __init__(self, model: nn.Module, recipe: Recipe) -> None:
        super().__init__()
        self.model = model
        self.recipe = recipe
        self.reached: dict[str, int] = {}

    def forward(self, *args, **kwargs):
        with self.attention():
            return self.model(*args, **kwargs)

    @contextmanager
    def attention(self) -> Iterator[None]:
        """Inside: SDPA calls of the model run with the recipe's attention operands quantized."""
        if not any(self.recipe.attention(op) for op in ATTENTION_TARGETS):
            yield
            return
        with _QuantizedAttention(self):
            yield

    def unreached(self) -> list[str]:
        """The recipe's targets that quantized nothing so far."""
        return [str(rule) for rule in self.recipe.rules if not self.reached.get(str(rule))]


def quantized(model: nn.Module, recipe: Recipe | str) -> Quantized:
    """A copy of `model` with `recipe`'s weights stored in their formats and its activation rules hooked; the
    original is left as it is. A weight or input rule that matches no layer raises `FormatError`."""
    recipe = parse_recipe(recipe) if isinstance(recipe, str) else recipe
    copied = copy.deepcopy(model).eval()
    result = Quantized(copied, recipe).eval()
    for name, module in weight_layers(copied):
        for rule in recipe.rules:
            if rule.tensor and rule.matches(name, module):
                result.reached[str(rule)] = result.reached.get(str(rule), 0) + 1
        weight = recipe.layer_rule(name, module, "weight")
        if weight is not None:
            with torch.no_grad():
                module.weight.copy_(rounded(module.weight, weight, f"{name}.weight", quantize_weight))
        activation = recipe.layer_rule(name, module, "input")
        if activation is not None:
            module.register_forward_pre_hook(lambda m, args, rule=activation, at=f"{name}.input": (
                rounded(args[0], rule, at, lambda x, spec: quantize_input(x, spec, m)), *args[1:]))
    missing = [str(rule) for rule in recipe.rules if rule.tensor and not result.reached.get(str(rule))]
    if missing:
        raise FormatError(f"recipe rule(s) {', '.join(missing)} match no layer of the model; its layers: "
                          + ", ".join(_layer_names(copied, 8)))
    return result


def _layer_names(model: nn.Module, most: int) -> list[str]:
    names = [name for name, _ in weight_layers(model)]
    return names[:most] + ([f"… {len(names) - most} more"] if len(names) > most else [])


class _QuantizedAttention(TorchFunctionMode):
    """Runs `F.scaled_dot_product_attention` as Q·Kᵀ → softmax → P·V with the recipe's operands rounded."""

    def __init__(self, quantized_model: Quantized) -> None:
        super().__init__()
        self.q = quantized_model

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        return self._attention(*args, **kwargs)

    def _attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        recipe = self.q.recipe
        operands = {"q": query, "k": key, "v": value}
        for name in operands:
            rule = recipe.attention_rule(name)
            if rule is not None:
                operands[name] = rounded(operands[name], rule, f"attention {name}")
                self._count(name)
        q, k, v = operands["q"], operands["k"], operands["v"]
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
        if is_causal:
            t, s = scores.shape[-2], scores.shape[-1]
            scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool, device=q.device).triu(s - t + 1),
                                        float("-inf"))
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
                else scores + attn_mask
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        rule = recipe.attention_rule("p")
        if rule is not None:
            probs = rounded(probs, rule, "attention p")
            self._count("p")
        if dropout_p:
            probs = F.dropout(probs, dropout_p)
        return probs @ v

    def _count(self, operand: str) -> None:
        for rule in self.q.recipe.rules:
            if rule.names_operand(operand):
                self.q.reached[str(rule)] = self.q.reached.get(str(rule), 0) + 1
