"""`DeviceSpec`: what the roofline and cost analyses need to know about a chip, whatever its origin.

One type for the built-in table (`devices.yaml`), the measured local CPU (`cpu_probe`) and
user-defined accelerators (`accelerator`): peak dense FLOP/s per dtype, memory bandwidth and size,
optional on-chip SRAM, matrix-unit shape and clock, an hourly price, and where each figure comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")
"""Dtype names a spec may give a peak for (matrix-unit peaks; fp32 is the plain, non-TF32 rate)."""

KINDS = ("gpu", "tpu", "cpu", "custom")

PEAK_FALLBACK = ("fp32", "bf16")
"""Peaks tried, in order, for a dtype the spec has no figure for (int32 adds, fp64, unknown dtypes)."""


@dataclass(frozen=True)
class DeviceSpec:
    """Figures of one device, in base units (FLOP/s, bytes/s, bytes, Hz, price per hour).

    `sources` maps a field ("peak_flops.bf16", "memory_bw_bytes_per_s", ...) to the URL or measurement
    it came from; `uncertain` names the fields whose figure is not confirmed by a primary source;
    `measured` is True for figures measured on this machine (the CPU probe).
    """

    name: str
    kind: str
    peak_flops: Mapping[str, float]
    memory_bw_bytes_per_s: float
    memory_bytes: float | None = None
    sram_bytes: float | None = None
    matrix_unit: tuple[int, int] | None = None
    clock_hz: float | None = None
    price_per_hour: float | None = None
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)
    uncertain: frozenset[str] = frozenset()
    measured: bool = False

    def peak(self, dtype: str | None) -> tuple[str, float]:
        """(dtype whose peak applies, its FLOP/s) for work in `dtype`: its own peak when the spec has
        one, else the first of `PEAK_FALLBACK` it has."""
        if dtype in self.peak_flops:
            return dtype, float(self.peak_flops[dtype])
        for fallback in PEAK_FALLBACK:
            if fallback in self.peak_flops:
                return fallback, float(self.peak_flops[fallback])
        first = next(iter(self.peak_flops))
        return first, float(self.peak_flops[first])

    def ridge_point(self, dtype: str | None) -> float:
        """Arithmetic intensity (FLOP per byte) above which work in `dtype` is compute-bound here."""
        return self.peak(dtype)[1] / self.memory_bw_bytes_per_s

    def with_price(self, price_per_hour: float | None) -> DeviceSpec:
        """A copy with another hourly price (None keeps this one)."""
        if price_per_hour is None:
            return self
        return replace(self, price_per_hour=float(price_per_hour),
                       sources={**self.sources, "price_per_hour": "user override"},
                       uncertain=self.uncertain - {"price_per_hour"})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceSpec:
        """The spec `to_dict` wrote (e.g. a run's `device_properties`)."""
        known = {f: data[f] for f in cls.__dataclass_fields__ if f in data}
        known["uncertain"] = frozenset(known.get("uncertain") or ())
        known["matrix_unit"] = tuple(known["matrix_unit"]) if known.get("matrix_unit") else None
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready figures (for run metadata): the Trace contract's device properties plus sources."""
        data = asdict(self)
        data["peak_flops"] = dict(self.peak_flops)
        data["sources"] = dict(self.sources)
        data["uncertain"] = sorted(self.uncertain)
        data["matrix_unit"] = list(self.matrix_unit) if self.matrix_unit else None
        return data
