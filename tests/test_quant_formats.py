"""The low-bit formats (`workbench.quant.formats`) against their specifications and, bit for bit, against torchao's
own implementations (`prototype.mx_formats.to_mx`, `nvfp4_quantize`, the affine integer primitives, torch's float8
casts)."""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from workbench.quant.formats import ELEMENTS, FORMATS, FormatError, fake_quantize, parse_spec, round_element  # noqa: E402


def representable(ebits: int, mbits: int, largest: float) -> list[float]:
    """Every non-negative finite value of a minifloat, from its definition: subnormals m·2^(1-bias-mbits), normals
    (1 + m/2^mbits)·2^(e-bias), up to `largest` (E4M3FN drops only its NaN code, so its top is 448)."""
    bias = (1 << (ebits - 1)) - 1
    values = {m * 2.0 ** (1 - bias - mbits) for m in range(1 << mbits)}
    for e, m in itertools.product(range(1, 1 << ebits), range(1 << mbits)):
        values.add((1 + m / (1 << mbits)) * 2.0 ** (e - bias))
    return sorted(v for v in values if v <= largest)


@pytest.fixture
def wide() -> torch.Tensor:
    """Values across twelve decades, as weights with outliers and activations have."""
    torch.manual_seed(0)
    return torch.randn(64, 256) * torch.logspace(-6, 6, 256)


def test_the_fp4_element_holds_exactly_the_values_of_the_spec():
    assert representable(2, 1, 6.0) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    grid = torch.tensor(representable(2, 1, 6.0))
    assert torch.equal(round_element(grid, ELEMENTS["e2m1"]), grid)
    # midpoints round to the neighbour with an even mantissa; beyond the largest value saturates
    assert round_element(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -100.0]),
                         ELEMENTS["e2m1"]).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -6.0]


@pytest.mark.parametrize("name, ebits, mbits", [("e4m3", 4, 3), ("e5m2", 5, 2), ("e2m3", 2, 3), ("e3m2", 3, 2)])
def test_every_representable_value_is_kept_and_midpoints_go_to_even(name, ebits, mbits):
    element = ELEMENTS[name]
    values = representable(ebits, mbits, element.max)
    assert max(values) == element.max
    grid = torch.tensor(values, dtype=torch.float64).float()
    assert torch.equal(round_element(grid, element), grid) and torch.equal(round_element(-grid, element), -grid)
    low, high = grid[:-1], grid[1:]
    middle = round_element((low + high) / 2, element)
    even = [lo if _mantissa_even(lo, ebits, mbits) else hi for lo, hi in zip(low.tolist(), high.tolist(), strict=True)]
    assert middle.tolist() == even


def _mantissa_even(value: float, ebits: int, mbits: int) -> bool:
    bias = (1 << (ebits - 1)) - 1
    if value < 2.0 ** (1 - bias):
        return round(value / 2.0 ** (1 - bias - mbits)) % 2 == 0
    exponent = math.floor(math.log2(value))
    return round((value / 2.0 ** exponent - 1) * (1 << mbits)) % 2 == 0


@pytest.mark.parametrize("name, dtype", [("e4m3", "float8_e4m3fn"), ("e5m2", "float8_e5m2"), ("bf16", "bfloat16"),
                                         ("fp16", "float16")])
def test_fp8_elements_equal_torchs_saturating_cast(name, dtype):
    torch.manual_seed(1)
    x = torch.randn(200_000) * torch.logspace(-10, 6, 200_000)
    x[:4] = torch.tensor([1e30, -1e30, 0.0, -0.0])
    element = ELEMENTS[name]
    assert torch.equal(round_element(x, element), x.clamp(-element.max, element.max).to(getattr(torch, dtype)).float())


@pytest.mark.parametrize("name", ["mxfp8", "mxfp8-e5m2", "mxfp6", "mxfp6-e3m2", "mxfp4"])
def test_mx_formats_equal_torchao_bit_for_bit(name, wide):
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    constants = pytest.importorskip("torchao.prototype.mx_formats.constants")
    dtype = {"mxfp8": torch.float8_e4m3fn, "mxfp8-e5m2": torch.float8_e5m2, "mxfp6": constants.DTYPE_FP6_E2M3,
             "mxfp6-e3m2": constants.DTYPE_FP6_E3M2, "mxfp4": torch.float4_e2m1fn_x2}[name]
    scale, data = mx.to_mx(wide, dtype, 32)
    assert torch.equal(fake_quantize(wide, name), mx.to_dtype(data, scale, dtype, 32, torch.float32))


def test_mx_scale_is_the_blocks_power_of_two_over_the_elements_largest():
    block = torch.zeros(32)
    block[0] = 5.9  # floor(log2 5.9) = 2; E2M1's largest power of two is 4 = 2^2: scale 2^0, 5.9 -> 6
    block[1] = 0.3
    assert fake_quantize(block, "mxfp4")[:2].tolist() == [6.0, 0.5]
    block[0] = 6.5  # 2^(2-2) still: saturates at 6
    assert fake_quantize(block, "mxfp4")[0].item() == 6.0
    assert torch.equal(fake_quantize(torch.zeros(2, 32), "mxfp8"), torch.zeros(2, 32))


def test_nvfp4_equals_torchaos_two_level_quantization(wide):
    nvfp4 = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    tensor = nvfp4.NVFP4Tensor.to_nvfp4(wide, per_tensor_scale=nvfp4.per_tensor_amax_to_scale(wide.abs().amax()))
    assert torch.equal(fake_quantize(wide, "nvfp4"), tensor.dequantize(torch.float32))


@pytest.mark.parametrize("bits, group, symmetric", list(itertools.product((8, 4), (32, 64, 128), (True, False))))
def test_integer_groups_equal_torchaos_affine_primitives(bits, group, symmetric):
    primitives = pytest.importorskip("torchao.quantization.quant_primitives")
    torch.manual_seed(2)
    x = torch.randn(32, 256) * 3 + 0.5
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    mapping = primitives.MappingType.SYMMETRIC if symmetric else primitives.MappingType.ASYMMETRIC
    scale, zero = primitives.choose_qparams_affine(x, mapping, (1, group), torch.int8, qmin, qmax,
                                                   zero_point_dtype=None if symmetric else torch.int32)
    codes = primitives.quantize_affine(x, (1, group), scale, zero, torch.int8, qmin, qmax)
    expected = primitives.dequantize_affine(codes, (1, group), scale, zero, torch.int8, qmin, qmax,
                                            output_dtype=torch.float32)
    spec = f"int{bits}/group{group}" + ("" if symmetric else "/asym")
    assert torch.equal(fake_quantize(x, spec), expected)


def test_granularities_scale_only_their_own_elements():
    x = torch.ones(256, 256)
    x[0, 0] = 1e6  # an outlier in the first row, the first 128-column group and the first 128×128 block
    spread = {g: fake_quantize(x, f"fp8-e4m3/{g}") for g in ("tensor", "channel", "token", "group128", "block128")}
    # per tensor the outlier's scale (1e6/448) sends every 1 below E4M3's smallest subnormal: all lost
    assert spread["tensor"][1:].eq(0).all() and spread["tensor"][0, 0].item() == 1e6
    # elsewhere each scale covers its own elements only: the ones outside the outlier's row, group or block stay 1
    for g in ("channel", "token", "group128"):
        assert spread[g][1:].eq(1).all() and spread[g][0, 1].eq(0)
    assert spread["group128"][0, 128:].eq(1).all() and spread["token"][0, 128:].eq(0).all()
    assert spread["block128"][:128, 128:].eq(1).all() and spread["block128"][128:].eq(1).all()
    assert spread["block128"][1, 1].eq(0)  # inside the outlier's block
    kv = torch.ones(2, 4, 8, 16)
    kv[:, 2] *= 100
    per_head = fake_quantize(kv, "fp8-e4m3/head")
    assert torch.equal(per_head, kv)  # each head's own scale: every value exact
    assert fake_quantize(kv, "fp8-e4m3/head").shape == kv.shape


def test_specs_parse_and_say_what_is_wrong():
    spec = parse_spec("int4/group128/asym")
    assert (spec.format.name, spec.granularity, spec.size, spec.symmetric) == ("int4", "group", 128, False)
    assert str(spec) == "int4/group128/asym" and str(parse_spec("nvfp4")) == "nvfp4"
    assert str(parse_spec("FP8-E4M3/Block128")) == "fp8-e4m3/block128"
    # storage per value, scales included
    assert parse_spec("mxfp4").bits_per_value == 4.25 and parse_spec("nvfp4").bits_per_value == 4.5
    assert parse_spec("int4/group128/asym").bits_per_value == 4 + (32 + 4) / 128
    assert parse_spec("fp8-e4m3").bits_per_value == 8
    for bad, words in [("fp7", "unknown format 'fp7'"), ("mxfp4/channel", "takes no granularity"),
                       ("int8/group", "needs a positive size"), ("int8/rows", "unknown granularity 'rows'"),
                       ("fp8-e4m3/asym", "integer formats only"), ("int8/token4", "takes no size")]:
        with pytest.raises(FormatError, match=words):
            parse_spec(bad)
    # a last dim that is no multiple of the block is padded with zeros: the same as quantizing the padded tensor
    ragged = torch.randn(3, 30)
    assert torch.equal(fake_quantize(ragged, "nvfp4"), fake_quantize(F.pad(ragged, (0, 2)), "nvfp4")[:, :30])
    assert set(FORMATS) >= {"fp8-e4m3", "fp8-e5m2", "mxfp8", "mxfp6", "mxfp4", "nvfp4", "int8", "int4"}


def test_nan_stays_nan_and_dtype_and_shape_are_kept():
    x = torch.tensor([[1.0, float("nan")] * 16], dtype=torch.bfloat16)
    out = fake_quantize(x, "fp8-e4m3/token")
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert torch.isnan(out[0, 1]) and out[0, 0].item() == 1.0


def test_storage_bytes_count_elements_scales_and_zero_points():
    from workbench.quant.formats import storage_bytes

    assert storage_bytes(parse_spec("bf16"), (4, 64)) == 512
    assert storage_bytes(parse_spec("fp8-e4m3"), (4, 64)) == 256 + 4
    assert storage_bytes(parse_spec("int8/token"), (2, 3, 5, 16)) == 480 + 30 * 4
    assert storage_bytes(parse_spec("int8/head"), (2, 3, 5, 16)) == 480 + 3 * 4
    assert storage_bytes(parse_spec("int4/group32/asym"), (8, 64)) == 256 + 16 * 4 + 8  # 16 four-bit zero points
    assert storage_bytes(parse_spec("fp8-e4m3/block128"), (256, 384)) == 256 * 384 + 6 * 4
    assert storage_bytes(parse_spec("mxfp4"), (4, 64)) == 128 + 8  # 8 blocks of 32: 16 bytes and one E8M0 scale each
    assert storage_bytes(parse_spec("mxfp6"), (3, 40)) == 3 * 2 * 24 + 6  # 40 pads to two blocks of 32 per row
    assert storage_bytes(parse_spec("nvfp4"), (4, 64)) == 128 + 16 + 4  # E4M3 per 16, a float32 tensor scale
