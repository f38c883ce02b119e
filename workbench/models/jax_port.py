"""JAX ports of the built-in models, loading the same seeded weights as the PyTorch modules.

`jax_model(loaded)` turns a built-in `LoadedModel` (tiny-gpt with MHA / GQA / MQA, mlp, convnet)
into a `JaxModel`: a pure `apply(params, *inputs)` for `jax.jit` whose config (layers, heads,
strides) is closed over, and `params`, a flat dict keyed by the torch `state_dict()` names holding
float32 arrays. The same model can then be run and profiled in both frameworks from the same
weights and inputs (`jax_inputs`). The semantics follow the torch modules op for op: causal
attention where query head h reads kv head h // (heads // kv_heads) (`tiny_gpt.expand_kv`), exact
(erf) GELU, LayerNorm/BatchNorm eps 1e-5, BatchNorm from running statistics (eval mode).

Precision: float32 params compute at full float32 matmul precision (not TF32 on GPU nor
single-pass bf16 on TPU, the platforms' defaults), so an fp32 JAX run is comparable with fp32
torch eager. With bf16/fp16 params (`with_dtype`) matmuls run in that dtype, while normalization
statistics and the attention softmax are computed in float32, as torch does.

Importing this module imports jax; `workbench.models` does not import it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workbench.errors import MissingDependency, VariantUnavailable, WorkbenchError
from workbench.models.loaded import LoadedModel
from workbench.models.tiny_gpt import resolved_kv_heads

try:
    import jax
    import jax.numpy as jnp
    from jax import lax
except ImportError as exc:  # pragma: no cover - jax is an optional extra
    raise MissingDependency("jax", "jax") from exc

Params = dict[str, jax.Array]
Apply = Callable[..., jax.Array]

NORM_EPS = 1e-5
"""eps of torch's nn.LayerNorm and nn.BatchNorm2d defaults, which the built-in models use."""


@dataclass(frozen=True)
class JaxModel:
    """A built-in model in JAX: `apply(params, *inputs)` is pure and jit-able; `params` its weights.

    Float inputs are cast to the params' dtype inside `apply`; integer inputs (token ids) are used
    as they are. The output has the params' dtype.
    """

    name: str
    apply: Apply = dataclasses.field(repr=False)
    params: Params = dataclasses.field(repr=False)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the params (all float params share one)."""
        return _params_dtype(self.params)

    def with_dtype(self, dtype: Any) -> JaxModel:
        """The same model with every param cast to the float dtype `dtype` (e.g. jnp.bfloat16, "float16")."""
        try:
            target = jnp.dtype(dtype)
        except TypeError as exc:
            raise WorkbenchError(f"JAX model '{self.name}': unknown dtype {dtype!r}") from exc
        if not jnp.issubdtype(target, jnp.floating):
            raise WorkbenchError(f"JAX model '{self.name}': params can only be cast to a float dtype, got {target}")
        return dataclasses.replace(self, params={key: value.astype(target) for key, value in self.params.items()})


def _params_dtype(params: Mapping[str, jax.Array]) -> np.dtype:
    return next(iter(params.values())).dtype


def _matmul_precision(dtype: np.dtype) -> contextlib.AbstractContextManager[Any]:
    """Full float32 matmuls for float32 params; the dtype's own precision otherwise."""
    return jax.default_matmul_precision("float32") if dtype == jnp.float32 else contextlib.nullcontext()


# --- layers (names and semantics of torch.nn) ---------------------------------------------------


def _linear(params: Params, prefix: str, x: jax.Array) -> jax.Array:
    """nn.Linear: y = x W^T + b (no bias when the state_dict has none)."""
    y = x @ params[f"{prefix}.weight"].T
    bias = params.get(f"{prefix}.bias")
    return y if bias is None else y + bias


def _layer_norm(params: Params, prefix: str, x: jax.Array) -> jax.Array:
    """nn.LayerNorm over the last dim; statistics and affine in float32, result in x's dtype."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(axis=-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(axis=-1, keepdims=True)
    y = (x32 - mean) * lax.rsqrt(var + NORM_EPS)
    weight, bias = params[f"{prefix}.weight"], params[f"{prefix}.bias"]
    return (y * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def _gelu(x: jax.Array) -> jax.Array:
    """Exact (erf) GELU, torch's default."""
    return jax.nn.gelu(x, approximate=False)


_BN_KEYS = ("running_mean", "running_var", "weight", "bias")


def _conv_bn(params: Params, prefix: str, x: jax.Array, stride: int) -> jax.Array:
    """`convnet.conv_bn`: Conv2d (padding kernel // 2, no bias) then eval-mode BatchNorm2d, NCHW."""
    weight = params[f"{prefix}.0.weight"]
    pad = weight.shape[-1] // 2
    y = lax.conv_general_dilated(
        x, weight, (stride, stride), ((pad, pad), (pad, pad)), dimension_numbers=("NCHW", "OIHW", "NCHW")
    )
    mean, var, gamma, beta = (params[f"{prefix}.1.{key}"].astype(jnp.float32) for key in _BN_KEYS)
    scale = lax.rsqrt(var + NORM_EPS) * gamma
    shift = beta - mean * scale
    return (y.astype(jnp.float32) * scale[:, None, None] + shift[:, None, None]).astype(y.dtype)


# --- tiny-gpt -----------------------------------------------------------------------------------


def _attention(params: Params, prefix: str, x: jax.Array, heads: int, kv_heads: int) -> jax.Array:
    """`tiny_gpt.CausalSelfAttention`: causal SDPA, query head h reads kv head h // (heads // kv_heads).

    Query heads are grouped as [kv_heads, heads // kv_heads] (head h = k·G + g reads kv head k), the
    same rule as `expand_kv`, without materializing repeated kv heads. Scores and softmax are in
    float32. (Not jax.nn.dot_product_attention: under jit on CPU it fails for float16.)
    """
    b, t, d_model = x.shape
    head_dim = d_model // heads
    groups = heads // kv_heads
    q = _linear(params, f"{prefix}.q_proj", x).reshape(b, t, kv_heads, groups, head_dim)
    k = _linear(params, f"{prefix}.k_proj", x).reshape(b, t, kv_heads, head_dim)
    v = _linear(params, f"{prefix}.v_proj", x).reshape(b, t, kv_heads, head_dim)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) / math.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1).astype(v.dtype)
    y = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return _linear(params, f"{prefix}.o_proj", y.reshape(b, t, heads * head_dim))


def _tiny_gpt(config: Mapping[str, Any]) -> Apply:
    if config.get("attention") == "mla":
        raise VariantUnavailable("tiny-gpt with attention 'mla' has no JAX port (MHA, GQA and MQA have one)")
    layers, heads, max_seq = config["layers"], config["heads"], config["max_seq"]
    kv_heads = resolved_kv_heads(config)

    def apply(params: Params, tokens: jax.Array) -> jax.Array:
        """Token ids [B, T] (integers) → logits [B, T, vocab]."""
        t = tokens.shape[1]
        if t > max_seq:
            raise WorkbenchError(f"tiny-gpt (JAX): sequence length {t} exceeds max_seq {max_seq}")
        x = jnp.take(params["tok_emb.weight"], tokens, axis=0) + params["pos_emb.weight"][:t]
        for i in range(layers):
            block = f"blocks.{i}"
            x = x + _attention(params, f"{block}.attn", _layer_norm(params, f"{block}.ln1", x), heads, kv_heads)
            hidden = _gelu(_linear(params, f"{block}.mlp.fc_in", _layer_norm(params, f"{block}.ln2", x)))
            x = x + _linear(params, f"{block}.mlp.fc_out", hidden)
        return _linear(params, "lm_head", _layer_norm(params, "ln_f", x))

    return apply


# --- mlp ----------------------------------------------------------------------------------------


def _mlp(config: Mapping[str, Any]) -> Apply:
    # `mlp._layers`: hidden_layers + 2 (Linear, GELU) pairs, then a Linear; Sequential indices 0, 2, 4, ...
    linears = [f"{2 * i}" for i in range(config["hidden_layers"] + 3)]

    def apply(params: Params, features: jax.Array) -> jax.Array:
        """Features [B, in_features] (float) → logits [B, num_classes]."""
        x = features.astype(_params_dtype(params))
        for name in linears[:-1]:
            x = _gelu(_linear(params, name, x))
        return _linear(params, linears[-1], x)

    return apply


# --- convnet ------------------------------------------------------------------------------------


def _convnet(config: Mapping[str, Any]) -> Apply:
    # (stride, has_shortcut) per BasicBlock, in the order `convnet.ConvNet.__init__` builds them.
    blocks: list[tuple[int, bool]] = []
    cin = width = config["width"]
    for stage in range(config["stages"]):
        cout = width * 2**stage
        for index in range(config["blocks_per_stage"]):
            stride = 2 if stage > 0 and index == 0 else 1
            blocks.append((stride, stride != 1 or cin != cout))
            cin = cout

    def apply(params: Params, images: jax.Array) -> jax.Array:
        """Images [B, 3, S, S] (float, NCHW) → logits [B, num_classes]."""
        x = jax.nn.relu(_conv_bn(params, "stem", images.astype(_params_dtype(params)), 2))
        for i, (stride, has_shortcut) in enumerate(blocks):
            block = f"blocks.{i}"
            y = _conv_bn(params, f"{block}.conv2", jax.nn.relu(_conv_bn(params, f"{block}.conv1", x, stride)), 1)
            x = jax.nn.relu(y + (_conv_bn(params, f"{block}.shortcut", x, stride) if has_shortcut else x))
        return _linear(params, "fc", x.mean(axis=(2, 3)))

    return apply


PORTS: dict[str, Callable[[Mapping[str, Any]], Apply]] = {
    "tiny-gpt": _tiny_gpt,
    "mlp": _mlp,
    "convnet": _convnet,
}
"""Built-in model name → builder of its `apply` from the model's full config."""


def _with_precision(body: Apply) -> Apply:
    def apply(params: Params, *inputs: jax.Array) -> jax.Array:
        with _matmul_precision(_params_dtype(params)):
            return body(params, *inputs)

    return apply


def jax_params(module: torch.nn.Module) -> Params:
    """The module's float state_dict entries as float32 jax arrays, keyed by state_dict name.

    Integer buffers (BatchNorm's num_batches_tracked) are left out: no forward pass reads them.
    """
    return {
        name: jnp.asarray(tensor.detach().to("cpu", torch.float32).numpy())
        for name, tensor in module.state_dict().items()
        if tensor.is_floating_point()
    }


def jax_model(loaded: LoadedModel) -> JaxModel:
    """The JAX port of a built-in model with the loaded module's weights (float32).

    Raises VariantUnavailable for models without a port (user factories, exported programs).
    """
    builder = PORTS.get(loaded.name) if loaded.source == "builtin" else None
    if builder is None:
        what = "a built-in model without a port" if loaded.source == "builtin" else f"a {loaded.source} model"
        raise VariantUnavailable(
            f"model '{loaded.name}' is {what}: JAX variants support only the built-in models "
            f"{', '.join(sorted(PORTS))}"
        )
    return JaxModel(name=loaded.name, apply=_with_precision(builder(loaded.config)), params=jax_params(loaded.module))


def jax_inputs(inputs: tuple[torch.Tensor, ...]) -> tuple[np.ndarray, ...]:
    """Torch example inputs as numpy arrays for JAX: int64 → int32 (JAX's default), floats → float32.

    Numpy rather than jax arrays, so the caller chooses the device to put them on.
    """
    converted: list[np.ndarray] = []
    for index, tensor in enumerate(inputs):
        if not isinstance(tensor, torch.Tensor):
            raise WorkbenchError(f"JAX inputs: input {index} is a {type(tensor).__name__}, not a torch.Tensor")
        t = tensor.detach().to("cpu")
        if t.is_floating_point():
            converted.append(t.to(torch.float32).numpy())
        elif t.dtype == torch.int64:
            info = np.iinfo(np.int32)
            if t.numel() and (int(t.min()) < info.min or int(t.max()) > info.max):
                raise WorkbenchError(f"JAX inputs: input {index} (int64) has values outside the int32 range")
            converted.append(t.to(torch.int32).numpy())
        else:
            converted.append(t.numpy())
    return tuple(converted)
