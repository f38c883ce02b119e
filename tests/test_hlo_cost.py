"""Per-kernel FLOPs and bytes from optimized HLO, checked against XLA's own cost analysis."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from workbench.analysis.hlo_cost import hlo_op_costs, shape_bytes  # noqa: E402
from workbench.backends.jax_backend import FUSION_OFF  # noqa: E402


def _mlp(x, w1, w2):
    return jnp.sum(jax.nn.gelu(x @ w1) @ w2)


@pytest.mark.parametrize("options", [None, FUSION_OFF], ids=["fused", "unfused"])
def test_kernel_costs_add_up_to_xlas_totals(options) -> None:
    x, w1, w2 = jnp.ones((8, 64)), jnp.ones((64, 128)), jnp.ones((128, 32))
    compiled = jax.jit(_mlp).lower(x, w1, w2).compile(compiler_options=options)
    costs = hlo_op_costs(compiled.as_text())
    xla = compiled.cost_analysis()
    assert costs["flops"].sum() == xla["flops"]
    assert costs["transcendentals"].sum() == xla["transcendentals"]
    assert costs["bytes"].sum() == xla["bytes accessed"]
    dots = costs[costs["flops"] >= 2 * 8 * 32 * 128]
    assert sorted(dots["flops"]) == [2 * 8 * 32 * 128, 2 * 8 * 128 * 64]  # the two GEMMs, by hand


def test_convolution_counts_every_tap() -> None:
    def conv(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))

    x, k = jnp.ones((2, 3, 16, 16)), jnp.ones((8, 3, 3, 3))
    compiled = jax.jit(conv).lower(x, k).compile()
    costs = hlo_op_costs(compiled.as_text())
    by_hand = 2 * (2 * 8 * 14 * 14) * (3 * 3 * 3)  # output elements × multiply-adds per output
    assert costs["flops"].sum() == by_hand == compiled.cost_analysis()["flops"]


def test_shape_bytes() -> None:
    assert shape_bytes("f32[8,128]{1,0}") == 4096
    assert shape_bytes("(bf16[4,4]{1,0}, s8[10]{0}, f32[])") == 32 + 10 + 4
    assert shape_bytes("pred[]") == 1
