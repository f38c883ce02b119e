"""Low-bit number formats emulated exactly on CPU: what a tensor becomes when stored in FP8, MX, NVFP4 or INT.

A format is an element encoding (`Element`: a minifloat with `ebits`/`mbits`, or an integer range) and a way of
scaling groups of elements (`Scaling`: a float32 scale per tensor, channel, token, head, group or 2-D block; a
power-of-two E8M0 scale per 32 elements for the OCP microscaling formats; an E4M3 scale per 16 elements under a
float32 tensor scale for NVFP4; a last dim that is no multiple of the block is zero-padded, as kernels pad).
`fake_quantize(x, spec)` returns `x` rounded onto the format and back
(dequantized), bit for bit what the hardware's conversion gives:

- minifloats round to nearest, ties to even, saturating at the format's largest finite value (the OCP 8-bit
  floating point and microscaling specifications; `e4m3` is E4M3FN: no infinities, 448 at most);
- MX scales are 2^(floor(log2(amax)) - emax_elem) (OCP MX v1.0, section 6.3), NVFP4 block scales are
  amax / 6 rounded to E4M3 under the tensor scale amax / (448 · 6), as torchao's `to_mx` and `nvfp4_quantize`;
- integers are affine, as torchao's `choose_qparams_affine` (and GPTQ): symmetric scale amax / ((qmax - qmin) / 2)
  with zero point 0, asymmetric scale (max - min) / (qmax - qmin) with an integer zero point.

Specs are text, as a recipe writes them: `FORMAT[/GRANULARITY][/sym|asym]`, e.g. `nvfp4`, `mxfp6`,
`fp8-e4m3/channel`, `fp8-e4m3/block128`, `int4/group128/asym`, `fp8-e5m2/head` (see `parse_spec`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from workbench.errors import WorkbenchError


class FormatError(WorkbenchError):
    """A quantization spec that names no format, granularity or mapping this module knows."""


@dataclass(frozen=True)
class Element:
    """How one value is stored: a minifloat (`ebits`, `mbits`, saturating at `max`) or a signed integer."""

    name: str
    bits: int
    ebits: int = 0
    mbits: int = 0
    max: float = 0.0

    @property
    def is_int(self) -> bool:
        return self.ebits == 0

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1))

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    @property
    def emax(self) -> int:
        """Exponent of the largest power of two the element holds (`floor(log2(max))`)."""
        return math.floor(math.log2(self.max))

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal value: below it values are subnormal, spaced 2^(emin - mbits)."""
        return 2 - (1 << (self.ebits - 1))


ELEMENTS = {e.name: e for e in (
    Element("e4m3", 8, 4, 3, 448.0), Element("e5m2", 8, 5, 2, 57344.0), Element("e2m3", 6, 2, 3, 7.5),
    Element("e3m2", 6, 3, 2, 28.0), Element("e2m1", 4, 2, 1, 6.0), Element("int8", 8), Element("int4", 4),
    Element("bf16", 16, 8, 7, float(torch.finfo(torch.bfloat16).max)),
    Element("fp16", 16, 5, 10, float(torch.finfo(torch.float16).max)),
    Element("fp32", 32, 8, 23, float(torch.finfo(torch.float32).max)))}
"""The element encodings: OCP FP8 (E4M3FN, E5M2), the MX FP6 and FP4 elements, signed integers, and the 16-bit
floats a layer kept out of a low-bit format stays in (and fp32, the reference's own)."""

ScaleCode = Literal["fp32", "e8m0", "e4m3", "none"]


@dataclass(frozen=True)
class Format:
    """A named format: its element, how a block's scale is stored, a fixed block size (MX, NVFP4) and whether a
    float32 tensor scale sits above the block scales (NVFP4)."""

    name: str
    element: Element
    scale: ScaleCode = "fp32"
    block: int | None = None
    tensor_scale: bool = False


FORMATS = {f.name: f for f in (
    Format("fp8-e4m3", ELEMENTS["e4m3"]), Format("fp8-e5m2", ELEMENTS["e5m2"]),
    Format("mxfp8", ELEMENTS["e4m3"], "e8m0", 32), Format("mxfp8-e5m2", ELEMENTS["e5m2"], "e8m0", 32),
    Format("mxfp6", ELEMENTS["e2m3"], "e8m0", 32), Format("mxfp6-e3m2", ELEMENTS["e3m2"], "e8m0", 32),
    Format("mxfp4", ELEMENTS["e2m1"], "e8m0", 32), Format("nvfp4", ELEMENTS["e2m1"], "e4m3", 16, True),
    Format("int8", ELEMENTS["int8"]), Format("int4", ELEMENTS["int4"]),
    Format("bf16", ELEMENTS["bf16"], "none"), Format("fp16", ELEMENTS["fp16"], "none"),
    Format("fp32", ELEMENTS["fp32"], "none"))}
"""Every format a spec may name."""

GRANULARITIES = ("tensor", "channel", "token", "head", "group", "block")
"""Which elements share a scale: the whole tensor; an output channel (dim 0 of a weight); a token (the last dim's
vector); an attention head (dim 1 of a [batch, heads, tokens, head_dim] tensor); a group of N along the last dim;
an N×N block over the last two dims."""

_GRANULARITY = re.compile(r"(?P<kind>tensor|channel|token|head|group|block)(?P<size>\d+)?")


@dataclass(frozen=True)
class QuantSpec:
    """A format with its granularity (`group`/`block` carry `size`) and mapping (integers: symmetric or not)."""

    format: Format
    granularity: str = "tensor"
    size: int | None = None
    symmetric: bool = True

    def __str__(self) -> str:
        text = self.format.name
        if self.format.block is None and self.format.scale != "none":
            text += f"/{self.granularity}{self.size or ''}"
        if self.format.element.is_int and not self.symmetric:
            text += "/asym"
        return text

    @property
    def bits_per_value(self) -> float:
        """Storage per element, scales included (a tensor-wide scale counted as free): what memory a weight or
        KV cache in this format takes per value."""
        fmt, element = self.format, self.format.element
        if fmt.scale == "none":
            return float(element.bits)
        scale_bits = {"fp32": 32, "e8m0": 8, "e4m3": 8}[fmt.scale]
        zero_bits = 0 if not element.is_int or self.symmetric else element.bits
        group = fmt.block or (self.size if self.granularity == "group" else
                              self.size * self.size if self.granularity == "block" else None)
        return element.bits + ((scale_bits + zero_bits) / group if group else 0.0)


def storage_bytes(spec: QuantSpec, shape: Sequence[int]) -> int:
    """Exact bytes of a tensor of `shape` stored in `spec`: packed elements (MX/NVFP4 padded to whole blocks),
    one scale per scaled group (float32, or one byte for E8M0/E4M3 block scales, plus NVFP4's float32 tensor
    scale) and, for asymmetric integers, one zero point per group in the element's width."""
    fmt, element = spec.format, spec.format.element
    numel = math.prod(shape)
    if fmt.scale == "none":
        return numel * element.bits // 8
    if fmt.block is not None:
        rows, width = (math.prod(shape[:-1]), shape[-1]) if shape else (1, 1)
        blocks = rows * -(-width // fmt.block)
        return -(-blocks * fmt.block * element.bits // 8) + blocks + (4 if fmt.tensor_scale else 0)
    groups = {"tensor": 1, "channel": shape[0] if shape else 1, "token": numel // shape[-1] if shape else 1,
              "head": shape[1] if len(shape) > 1 else 1, "group": numel // (spec.size or 1),
              "block": numel // (spec.size or 1) ** 2}[spec.granularity]
    zero_bits = element.bits if element.is_int and not spec.symmetric else 0
    return -(-numel * element.bits // 8) + groups * 4 + -(-groups * zero_bits // 8)


def parse_spec(text: str) -> QuantSpec:
    """`FORMAT[/GRANULARITY][/sym|asym]` as a `QuantSpec`: `nvfp4`, `int4/group128/asym`, `fp8-e4m3/block128`.

    MX and NVFP4 fix their own blocks (32, 16 along the last dim) and take no granularity; integers default to
    symmetric; `group` and `block` need a size (`group32`..`group128`, `block128`).
    """
    parts = [p.strip().lower() for p in text.strip().split("/")]
    fmt = FORMATS.get(parts[0])
    if fmt is None:
        raise FormatError(f"unknown format '{parts[0]}' in '{text}'; formats: {', '.join(FORMATS)}")
    granularity, size, symmetric = "tensor", None, True
    for part in parts[1:]:
        if part in ("sym", "asym"):
            if not fmt.element.is_int:
                raise FormatError(f"'{text}': sym/asym applies to integer formats only")
            symmetric = part == "sym"
            continue
        match = _GRANULARITY.fullmatch(part)
        if match is None:
            raise FormatError(f"unknown granularity '{part}' in '{text}'; one of {', '.join(GRANULARITIES)} "
                              "(group and block with a size: group128, block128), or sym/asym")
        if fmt.scale == "none":
            raise FormatError(f"'{text}': {fmt.name} is a plain 16-bit float and takes no granularity")
        if fmt.block is not None:
            raise FormatError(f"'{text}': {fmt.name} scales fixed blocks of {fmt.block} along the last dim and "
                              "takes no granularity")
        granularity, size = match["kind"], int(match["size"]) if match["size"] else None
        if (granularity in ("group", "block")) != (size is not None) or size == 0:
            raise FormatError(f"'{text}': {granularity} " + ("needs a positive size, e.g. "
                              f"{granularity}128" if granularity in ("group", "block") else "takes no size"))
    return QuantSpec(fmt, granularity, size, symmetric)


def round_element(x: torch.Tensor, element: Element) -> torch.Tensor:
    """`x` (float32, already scaled) rounded to the nearest value of the minifloat `element`, ties to even,
    saturating at ±max; NaN stays NaN. Exact: every step scales by a power of two."""
    magnitude = x.abs().clamp(max=element.max)
    _, exponent = torch.frexp(magnitude)  # magnitude = m · 2^exponent, m in [0.5, 1)
    exponent = torch.clamp(exponent - 1, min=element.emin)
    quantum = torch.ldexp(torch.ones_like(magnitude), exponent - element.mbits)
    rounded = torch.round(magnitude / quantum) * quantum
    return torch.where(torch.isnan(x), x, torch.copysign(rounded.clamp(max=element.max), x))


def fake_quantize(x: torch.Tensor, spec: QuantSpec | str) -> torch.Tensor:
    """`x` stored in `spec`'s format and read back, in `x`'s dtype and shape (see the module docstring)."""
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    fmt = spec.format
    data = x.detach().to(torch.float32)
    if fmt.scale == "none":  # a plain 16-bit float: the cast itself
        out = round_element(data, fmt.element)
    elif fmt.scale == "e8m0":
        out = _mx(data, fmt)
    elif fmt.scale == "e4m3":
        out = _nvfp4(data, fmt)
    else:
        groups, restore = _grouped(data, spec.granularity, spec.size)
        out = restore(_int(groups, fmt.element, spec.symmetric) if fmt.element.is_int
                      else _float_scaled(groups, fmt.element))
    return out.to(x.dtype)


def _float_scaled(groups: torch.Tensor, element: Element) -> torch.Tensor:
    """FP8 with one float32 scale per group (row of `groups`): amax maps onto the element's max."""
    amax = groups.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / element.max, torch.ones_like(amax))
    return round_element(groups / scale, element) * scale


def _int(groups: torch.Tensor, element: Element, symmetric: bool) -> torch.Tensor:
    """Affine integers per group (row of `groups`), as torchao's choose_qparams_affine and quantize_affine."""
    eps = torch.finfo(torch.float32).smallest_normal
    low = groups.amin(dim=-1, keepdim=True).clamp(max=0)
    high = groups.amax(dim=-1, keepdim=True).clamp(min=0)
    span = float(element.qmax - element.qmin)
    if symmetric:
        scale = (torch.maximum(-low, high) / (span / 2)).clamp(min=eps)
        zero = torch.zeros_like(scale)
    else:
        scale = ((high - low) / span).clamp(min=eps)
        zero = (element.qmin - torch.round(low / scale)).clamp(element.qmin, element.qmax)
    codes = torch.clamp(torch.round(groups * (1.0 / scale)) + zero, element.qmin, element.qmax)
    return (codes - zero) * scale


def _mx(data: torch.Tensor, fmt: Format) -> torch.Tensor:
    """OCP microscaling: per `fmt.block` elements along the last dim, a power-of-two scale 2^(floor(log2 amax) -
    emax_elem), clamped to E8M0's range; elements saturate. An all-zero block keeps the smallest normal scale."""
    blocks, restore = _last_dim_blocks(data, fmt)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    _, exponent = torch.frexp(amax)
    unbiased = torch.where(amax > 0, exponent - 1 - fmt.element.emax, torch.full_like(exponent, -127))
    scale = torch.ldexp(torch.ones_like(amax), unbiased.clamp(-127, 127))
    scale = scale.clamp(min=torch.finfo(torch.float32).smallest_normal)
    out = round_element(blocks / scale, fmt.element) * scale
    return restore(torch.where(torch.isnan(amax), torch.full_like(out, math.nan), out))


def _nvfp4(data: torch.Tensor, fmt: Format) -> torch.Tensor:
    """NVFP4: a float32 tensor scale amax / (448 · 6), then per 16 elements an E4M3 scale of the block's amax / 6
    under it; E2M1 elements, as torchao's two-level `nvfp4_quantize`."""
    e4m3 = ELEMENTS["e4m3"]
    blocks, restore = _last_dim_blocks(data, fmt)
    tensor_amax = data.abs().amax()
    tensor_scale = (tensor_amax / (e4m3.max * fmt.element.max)).clamp(min=torch.finfo(torch.float32).tiny)
    block_scale = blocks.abs().amax(dim=-1, keepdim=True) / fmt.element.max
    tiny = torch.finfo(torch.float8_e4m3fn).tiny
    stored = round_element((block_scale / tensor_scale).clamp(min=tiny, max=e4m3.max), e4m3)
    elements = round_element((blocks * ((1.0 / tensor_scale) / stored)).clamp(-fmt.element.max, fmt.element.max),
                             fmt.element)
    return restore(elements * (stored * tensor_scale))


def _last_dim_blocks(data: torch.Tensor, fmt: Format) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """`data` as rows of `fmt.block` consecutive elements of its last dim, zero-padded to whole blocks as kernels
    pad (zeros change no block's amax), and the function turning such rows back into `data`'s shape."""
    if data.ndim == 0:
        data = data.reshape(1)
    width = data.shape[-1]
    padded = F.pad(data, (0, -width % fmt.block))
    return padded.reshape(-1, fmt.block), lambda rows: rows.reshape(padded.shape)[..., :width].reshape(data.shape)


def _grouped(data: torch.Tensor, granularity: str, size: int | None):
    """`data` as a 2-D tensor whose rows share a scale, and the function turning such rows back into `data`'s
    shape."""
    shape = data.shape
    if granularity == "tensor" or data.ndim == 0:
        return data.reshape(1, -1), lambda rows: rows.reshape(shape)
    if granularity == "channel":
        return data.reshape(shape[0], -1), lambda rows: rows.reshape(shape)
    if granularity == "token":
        return data.reshape(-1, shape[-1]), lambda rows: rows.reshape(shape)
    if granularity == "head":
        if data.ndim < 3:
            raise FormatError("per-head scales need a [batch, heads, tokens, head_dim] tensor, not shape "
                              f"{tuple(shape)}")
        moved = data.movedim(1, 0)
        return moved.reshape(shape[1], -1), lambda rows: rows.reshape(moved.shape).movedim(0, 1)
    if granularity == "group":
        if shape[-1] % size:
            raise FormatError(f"groups of {size} do not divide the last dim of shape {tuple(shape)}")
        return data.reshape(-1, size), lambda rows: rows.reshape(shape)
    if data.ndim < 2 or shape[-1] % size or shape[-2] % size:  # block
        raise FormatError(f"{size}×{size} blocks do not tile the last two dims of shape {tuple(shape)}")
    lead, rows_, cols = shape[:-2], shape[-2], shape[-1]
    tiled = data.reshape(*lead, rows_ // size, size, cols // size, size).transpose(-3, -2)
    return tiled.reshape(-1, size * size), lambda rows: rows.reshape(tiled.shape).transpose(-3, -2).reshape(shape)
