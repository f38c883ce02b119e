"""The small chip the co-design tests describe and work their figures out on by hand: one 128 x 128 array at
1 GHz (1 bf16 MAC per PE per cycle, 2 int8), 1 MiB of SRAM at 1 TB/s, 100 GB/s off chip, a 10 GB/s host link."""

from __future__ import annotations


def npu_yaml(native_ops: str = "matmul, elementwise, norm, copy", extra: str = "") -> str:
    """The chip's description as YAML, running `native_ops` natively; `extra` adds lines (e.g. chip_links)."""
    return f"""
name: test-npu
clock: 1 GHz
matrix_units: {{count: 1, array: 128x128, rates: {{bf16: 32.768 TFLOP/s, int8: 65.536 TOPS}}}}
vector_units: {{rates: {{bf16: 256 GFLOP/s, fp32: 128 GFLOP/s}}, transcendental_cycles: 8}}
memory_levels: [{{name: sram, size: 1 MiB, bandwidth: 1 TB/s}}]
off_chip: {{size: 4 GiB, bandwidth: 100 GB/s}}
host_link: {{bandwidth: 10 GB/s, latency: 1 us}}
{extra}native_ops: [{native_ops}]
host_fallback_cost: {{latency: 10 us}}
"""
