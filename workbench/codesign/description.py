"""An accelerator described for projection: its units, memory levels, links and the operators it runs natively.

The detailed form (docs/accelerators.md has a worked example):

    name: my-npu                                   # required
    kind: custom                                   # gpu | tpu | cpu | custom
    description: free text
    clock: 1 GHz                                   # required with an array
    matrix_units:                                  # required
      count: 2                                     # systolic arrays working in parallel (default 1)
      array: 128x128                               # rows x columns of each array (none: FLOPs / rate, no tiles)
      rates: {bf16: 65.5 TFLOP/s, int8: 131 TOPS}  # chip peak (all arrays) per input dtype
    vector_units:                                  # required
      rates: {fp32: 1 TFLOP/s, bf16: 2 TFLOP/s}    # chip peak per dtype
      transcendental_cycles: 8                     # vector-op cost of one exp/tanh/erf/... element (default 1)
    memory_levels: [{name: sram, size: 8 MiB, bandwidth: 2 TB/s}]   # on-chip, innermost first
    off_chip: {size: 16 GiB, bandwidth: 200 GB/s}  # bandwidth required
    host_link: {bandwidth: 32 GB/s, latency: 2 us} # needed when an operator falls back to the host
    chip_links: {bandwidth: 100 GB/s, latency: 1 us, topology: ring, chips: 8}   # needed on several chips
    native_ops: [matmul, conv, attention, elementwise, softmax, norm, copy]   # default: all of OP_KINDS
    host_fallback_cost: {latency: 20 us}           # per fallen-back operator, besides the link transfer
    op_overhead: 1 us                              # launch cost of each operator (each fused group) on the chip
    op_floor: 2 us                                 # shortest an operator (a fused group) runs once started: a GPU
                                                   # kernel's ramp-up and drain; its time is at least this
    fusion: true                                   # elementwise chains fuse into the matmul before them

A matrix rate is a FLOP/s figure like the device table's peaks; with the array, the count and the clock it gives
the MACs each processing element does per cycle in that dtype (`MatrixUnits.macs_per_cycle`). The older, shorter
form (`workbench.hardware.accelerator`: peak_flops, memory_bandwidth, sram, matrix_unit, clock) and every entry of
the built-in table are read too (`from_device_spec`): their peaks serve as matrix and vector rates, all operators
are native, and without an array shape and clock the compute time is FLOPs over the peak (no padding).

`chip_links` are the links between chips that a tensor-parallel projection (`workbench.codesign.sharding`) sends
its all-reduces over: `bandwidth` each chip sends at in one direction (all its links together), `latency` per hop,
`topology` `ring` (default: each chip sends to one neighbour) or `all-to-all` (also written `switch`: every chip
reaches every other in one hop, through a switch or direct links), and `chips`, the largest number of chips the part
scales to (none: no limit).

Figures take units ("200 GB/s", "8 MiB", "2 us") or `{value: ..., source: https://...}`, as in the short form.
Every error is one line naming the file and the field (`AcceleratorSpecError`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workbench.hardware.accelerator import FIGURE_KEYS, AcceleratorSpecError, load_accelerator
from workbench.hardware.device import DTYPES, KINDS, DeviceSpec
from workbench.hardware.units import UnitError, parse_quantity

OP_KINDS = ("matmul", "conv", "attention", "elementwise", "softmax", "norm", "copy", "other")
"""Operator kinds of a projected graph (`workbench.codesign.graph`); `native_ops` names some of them."""

TARGET_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
"""Dtypes a graph may be projected at (`graph.at_dtype`; int8: weights and activations quantized)."""

DETAILED_KEYS = frozenset({"matrix_units", "vector_units", "memory_levels", "off_chip", "host_link", "native_ops",
                           "host_fallback_cost", "op_overhead", "op_floor", "fusion", "chip_links"})
"""Keys that mark the detailed form (a file with none of them is read as the short form)."""
TOP_KEYS = frozenset({"name", "kind", "description", "clock", "price_per_hour", *DETAILED_KEYS})
SHORT_ONLY = {"peak_flops": "matrix_units.rates", "memory_bandwidth": "off_chip.bandwidth",
              "memory_size": "off_chip.size", "sram": "memory_levels", "matrix_unit": "matrix_units.array"}
"""Short-form keys and where the detailed form says the same."""

_ARRAY = re.compile(r"\s*(\d+)\s*[x×*]\s*(\d+)\s*")
_TIME = re.compile(r"\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(s|ms|us|µs|ns)\s*")
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
TOPOLOGIES = ("ring", "all-to-all", "switch")
"""How chips are linked (`chip_links.topology`); `switch` is another name for `all-to-all`."""


@dataclass(frozen=True)
class MatrixUnits:
    """`count` systolic arrays of `rows` x `cols` (None: no shape known) with chip peaks per dtype (FLOP/s)."""

    count: int
    rows: int | None
    cols: int | None
    rates: Mapping[str, float]

    def macs_per_cycle(self, dtype: str, clock_hz: float) -> float:
        """MACs one processing element does per cycle in `dtype`: rate / (2 · count · rows · cols · clock)."""
        assert self.rows is not None and self.cols is not None
        return self.rates[dtype] / (2.0 * self.count * self.rows * self.cols * clock_hz)


@dataclass(frozen=True)
class MemoryLevel:
    """One on-chip memory (or off-chip memory, named "off-chip"): capacity in bytes and bandwidth in bytes/s
    (None: unknown; an on-chip level of unknown bandwidth adds no time of its own)."""

    name: str
    size: float | None
    bandwidth: float | None


@dataclass(frozen=True)
class ChipLinks:
    """The links between chips: bandwidth per chip per direction (bytes/s), latency per hop (seconds), the
    topology (`TOPOLOGIES`) and the largest chip count the part scales to (None: no limit)."""

    bandwidth: float
    latency_s: float = 0.0
    topology: str = "ring"
    chips: int | None = None


@dataclass(frozen=True)
class Description:
    """An accelerator as projection sees it (base units: Hz, FLOP/s, bytes, bytes/s, seconds)."""

    name: str
    kind: str
    clock_hz: float | None
    matrix: MatrixUnits
    vector_rates: Mapping[str, float]
    transcendental_cycles: float
    memory_levels: tuple[MemoryLevel, ...]
    off_chip: MemoryLevel
    native_ops: frozenset[str]
    host_link_bandwidth: float | None = None
    host_link_latency_s: float = 0.0
    host_fallback_latency_s: float = 0.0
    op_overhead_s: float = 0.0
    op_floor_s: float = 0.0
    fusion: bool = True
    chip_links: ChipLinks | None = None
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def tiled(self) -> bool:
        """Whether compute time follows the array's tiles (an array shape and a clock are known)."""
        return self.matrix.rows is not None and self.clock_hz is not None

    @property
    def on_chip(self) -> MemoryLevel | None:
        """The largest on-chip level: the one the tiling model keeps operands in."""
        sized = [level for level in self.memory_levels if level.size]
        return max(sized, key=lambda level: level.size or 0) if sized else None

    def matrix_dtype(self, dtype: str | None) -> str:
        """The dtype a matmul in `dtype` runs in on the matrix units: its own when they have a rate for it, else
        the widest they have (fp32 work cast to bf16 on a bf16/int8 array)."""
        if dtype in self.matrix.rates:
            return dtype
        return _widest(self.matrix.rates)

    def vector_dtype(self, dtype: str | None) -> str:
        """The dtype vector work in `dtype` runs in: its own rate when listed, else the widest listed."""
        if dtype in self.vector_rates:
            return dtype
        return _widest(self.vector_rates)

    def scaled(self, **factors: float) -> Description:
        """A copy with figures multiplied, for sensitivity sweeps: `bandwidth` (off-chip), `on_chip` (every
        level's size), `rate` (every matrix and vector rate), `rate.<dtype>` (that dtype's matrix and vector
        rates), `link` (host link bandwidth), `chip_link` (chip-to-chip link bandwidth). Pass `rate.<dtype>` as
        `**{"rate.bf16": 2.0}`."""
        from dataclasses import replace

        unknown = sorted(name for name in factors if name not in FACTOR_SWEEPS and not is_dtype_rate(name))
        if unknown:
            raise AcceleratorSpecError(self.name, unknown[0], f"unknown sweep (valid: {', '.join(SWEEPS)})")
        bw, size, rate = factors.get("bandwidth", 1.0), factors.get("on_chip", 1.0), factors.get("rate", 1.0)

        def rates(table: Mapping[str, float]) -> dict[str, float]:
            return {d: r * rate * factors.get(f"rate.{d}", 1.0) for d, r in table.items()}

        return replace(
            self,
            off_chip=replace(self.off_chip, bandwidth=(self.off_chip.bandwidth or 0.0) * bw),
            memory_levels=tuple(replace(level, size=level.size * size if level.size else level.size)
                                for level in self.memory_levels),
            matrix=replace(self.matrix, rates=rates(self.matrix.rates)),
            vector_rates=rates(self.vector_rates),
            host_link_bandwidth=(self.host_link_bandwidth * factors.get("link", 1.0)
                                 if self.host_link_bandwidth else self.host_link_bandwidth),
            chip_links=(replace(self.chip_links, bandwidth=self.chip_links.bandwidth * factors.get("chip_link", 1.0))
                        if self.chip_links is not None else None),
        )

    def with_array(self, rows: int, cols: int) -> Description:
        """A copy whose arrays are `rows` x `cols`, each processing element as it was (the same MACs per cycle
        in every dtype at the same clock), so the matrix rates scale with the array's area: 64x64 on a
        128x128 chip has a quarter of its peak and pads less."""
        from dataclasses import replace

        if not self.tiled:
            raise AcceleratorSpecError(self.name, "matrix_units.array", "an array sweep needs a description with "
                                       "an array shape and a clock (matrix_units.array, clock)")
        if rows < 1 or cols < 1:
            raise AcceleratorSpecError(self.name, "matrix_units.array", f"each dimension must be >= 1, got "
                                       f"{rows}x{cols}")
        assert self.matrix.rows is not None and self.matrix.cols is not None
        area = rows * cols / (self.matrix.rows * self.matrix.cols)
        return replace(self, matrix=replace(self.matrix, rows=rows, cols=cols,
                                            rates={d: r * area for d, r in self.matrix.rates.items()}))


FACTOR_SWEEPS = ("bandwidth", "on_chip", "rate", "link", "chip_link")
"""Figures a sensitivity sweep scales by a factor (`Description.scaled`); besides them, `rate.<dtype>`."""
SWEEPS = (*FACTOR_SWEEPS, "rate.<dtype>", "array", "chips")
"""Every sweep knob: the factors, one dtype's rate (`rate.bf16`), the array shape (`Description.with_array`) and the
number of chips a tensor-parallel projection shards over (`projection.project(..., chips=)`)."""


def is_dtype_rate(name: str) -> bool:
    """Whether `name` is a sweep of one dtype's rate ("rate.bf16")."""
    return name.startswith("rate.") and name.removeprefix("rate.") in DTYPES


_WIDTH_ORDER = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "fp4")


def _widest(rates: Mapping[str, float]) -> str:
    return next(d for d in _WIDTH_ORDER if d in rates)


def load_description(path: str | Path) -> Description:
    """The description in the YAML (or JSON) file at `path`, detailed or short form; `AcceleratorSpecError`
    (one line naming the file and the field) when it is unreadable or invalid."""
    path = Path(path).expanduser()
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise AcceleratorSpecError(path, None, f"cannot read the accelerator description ({exc.strerror or exc})") \
            from exc
    except yaml.YAMLError as exc:
        raise AcceleratorSpecError(path, None, f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    if isinstance(data, Mapping) and not DETAILED_KEYS & set(data):
        return from_device_spec(load_accelerator(path))
    return parse_description(data, origin=path)


def resolve_description(device: str | Path | DeviceSpec | Description) -> Description:
    """A description from a description, a `DeviceSpec`, a YAML path, a built-in device name or "cpu"."""
    import os

    if isinstance(device, Description):
        return device
    if isinstance(device, DeviceSpec):
        return from_device_spec(device)
    text = os.fspath(device)
    if isinstance(device, Path) or text.lower().endswith((".yaml", ".yml", ".json")) or os.sep in text:
        return load_description(text)
    from workbench.hardware.specs import resolve_device_spec

    return from_device_spec(resolve_device_spec(text))


def from_device_spec(spec: DeviceSpec) -> Description:
    """A short-form spec (built-in, measured CPU or user YAML) as a description: its peaks are the matrix rates
    and (fp32 and below, else all) the vector rates, one array of `matrix_unit`, every operator native."""
    rows, cols = spec.matrix_unit or (None, None)
    vector = {d: r for d, r in spec.peak_flops.items() if d in ("fp32", "fp16", "bf16")} or dict(spec.peak_flops)
    levels = (MemoryLevel("sram", spec.sram_bytes, None),) if spec.sram_bytes else ()
    return Description(
        name=spec.name, kind=spec.kind, clock_hz=spec.clock_hz if rows is not None else None,
        matrix=MatrixUnits(1, rows, cols, dict(spec.peak_flops)), vector_rates=vector, transcendental_cycles=1.0,
        memory_levels=levels, off_chip=MemoryLevel("off-chip", spec.memory_bytes, spec.memory_bw_bytes_per_s),
        native_ops=frozenset(OP_KINDS), description=spec.description, sources=dict(spec.sources))


def parse_description(data: Any, *, origin: object) -> Description:
    """A `Description` from one detailed-form mapping (the module docstring's fields); `origin` names the file."""
    if not isinstance(data, Mapping):
        raise AcceleratorSpecError(origin, None, "expected a mapping of fields (name, clock, matrix_units, ...)")
    for key in data:
        if key in SHORT_ONLY:
            raise AcceleratorSpecError(origin, key, f"a short-form field; the detailed form says it as "
                                       f"'{SHORT_ONLY[key]}'")
        if key not in TOP_KEYS:
            raise AcceleratorSpecError(origin, str(key), f"unknown field (valid: {', '.join(sorted(TOP_KEYS))})")
    read = _Reader(origin)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise AcceleratorSpecError(origin, "name", "required: a non-empty string")
    kind = data.get("kind", "custom")
    if kind not in KINDS:
        raise AcceleratorSpecError(origin, "kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    matrix = read.section(data, "matrix_units", {"count", "array", "rates"}, required=True)
    count = read.count("matrix_units.count", matrix.get("count", 1))
    rows, cols = read.array("matrix_units.array", matrix["array"]) if matrix.get("array") is not None \
        else (None, None)
    clock = read.positive("clock", read.required(data, "clock", "'1 GHz' (the array's cycles)"), "hertz") \
        if rows is not None or data.get("clock") is not None else None
    fusion = data.get("fusion", True)
    if not isinstance(fusion, bool):
        raise AcceleratorSpecError(origin, "fusion", f"must be true or false, got {fusion!r}")
    vector = read.section(data, "vector_units", {"rates", "transcendental_cycles"}, required=True)
    transcendental = vector.get("transcendental_cycles", 1)
    if isinstance(transcendental, bool) or not isinstance(transcendental, int | float) or transcendental < 1:
        raise AcceleratorSpecError(origin, "vector_units.transcendental_cycles",
                                   f"must be a number of cycles >= 1, got {transcendental!r}")
    off_chip = read.section(data, "off_chip", {"size", "bandwidth"}, required=True)
    host = read.section(data, "host_link", {"bandwidth", "latency"}, required=False)
    fallback = read.section(data, "host_fallback_cost", {"latency"}, required=False)
    chip_links = read.chip_links(read.section(data, "chip_links", {"bandwidth", "latency", "topology", "chips"},
                                              required=False))
    native = data.get("native_ops", list(OP_KINDS))
    if not isinstance(native, list) or not all(isinstance(op, str) for op in native):
        raise AcceleratorSpecError(origin, "native_ops", f"expected a list of operator kinds ({', '.join(OP_KINDS)})")
    for op in native:
        if op not in OP_KINDS:
            raise AcceleratorSpecError(origin, f"native_ops.{op}", f"unknown operator kind (valid: "
                                       f"{', '.join(OP_KINDS)})")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise AcceleratorSpecError(origin, "description", "must be a string")
    return Description(
        name=name.strip(), kind=kind, clock_hz=clock,
        matrix=MatrixUnits(count, rows, cols, read.rates("matrix_units.rates", matrix.get("rates"))),
        vector_rates=read.rates("vector_units.rates", vector.get("rates")),
        transcendental_cycles=float(transcendental),
        memory_levels=read.levels(data.get("memory_levels", [])),
        off_chip=MemoryLevel("off-chip", read.optional(off_chip, "off_chip.size", "bytes"),
                             read.positive("off_chip.bandwidth",
                                           read.required(off_chip, "off_chip.bandwidth", "'200 GB/s'"), "bandwidth")),
        native_ops=frozenset(native),
        host_link_bandwidth=(read.positive("host_link.bandwidth", host["bandwidth"], "bandwidth")
                             if "bandwidth" in host else None),
        host_link_latency_s=read.seconds("host_link.latency", host.get("latency", 0)),
        host_fallback_latency_s=read.seconds("host_fallback_cost.latency", fallback.get("latency", 0)),
        op_overhead_s=read.seconds("op_overhead", data.get("op_overhead", 0)),
        op_floor_s=read.seconds("op_floor", data.get("op_floor", 0)), fusion=fusion,
        chip_links=chip_links, description=description, sources=read.sources)


class _Reader:
    """Reads the detailed form's figures, each error naming `origin` and the field."""

    def __init__(self, origin: object) -> None:
        self.origin = origin
        self.sources: dict[str, str] = {}

    def fail(self, key: str, problem: str) -> AcceleratorSpecError:
        return AcceleratorSpecError(self.origin, key, problem)

    def required(self, data: Mapping[str, Any], key: str, example: str) -> Any:
        value = data.get(key.rsplit(".", 1)[-1])
        if value is None:
            raise self.fail(key, f"required, e.g. {example}")
        return value

    def section(self, data: Mapping[str, Any], key: str, keys: set[str], *, required: bool) -> Mapping[str, Any]:
        value = data.get(key)
        if value is None and not required:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(key, f"required: a mapping with {', '.join(sorted(keys))}" if value is None
                            else f"expected a mapping with {', '.join(sorted(keys))}, got {value!r}")
        for sub in value:
            if sub not in keys:
                raise self.fail(f"{key}.{sub}", f"unknown field (valid: {', '.join(sorted(keys))})")
        return value

    def unwrap(self, key: str, figure: Any) -> Any:
        if isinstance(figure, Mapping):
            extra = sorted(set(figure) - FIGURE_KEYS)
            if extra or "value" not in figure:
                raise self.fail(key, "a figure written as a mapping has a 'value' (and source, uncertain, note)")
            if isinstance(figure.get("source"), str):
                self.sources[key] = figure["source"]
            return figure["value"]
        return figure

    def quantity(self, key: str, figure: Any, family: str) -> float:
        try:
            return parse_quantity(self.unwrap(key, figure), family)
        except UnitError as exc:
            raise self.fail(key, str(exc)) from exc

    def positive(self, key: str, figure: Any, family: str) -> float:
        value = self.quantity(key, figure, family)
        if value <= 0:
            raise self.fail(key, "must be positive")
        return value

    def optional(self, data: Mapping[str, Any], key: str, family: str) -> float | None:
        figure = data.get(key.rsplit(".", 1)[-1])
        return None if figure is None else self.positive(key, figure, family)

    def seconds(self, key: str, figure: Any) -> float:
        """A time: a number of seconds or "20 us" (s, ms, us, µs, ns); finite and >= 0."""
        value = self.unwrap(key, figure)
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        elif isinstance(value, str) and (match := _TIME.fullmatch(value)):
            seconds = float(match.group(1)) * _SECONDS[match.group(2)]
        else:
            raise self.fail(key, f"expected a time such as '2 us' (units: s, ms, us, ns), got {value!r}")
        if not seconds >= 0 or seconds == float("inf"):
            raise self.fail(key, f"{value!r} must be a finite, non-negative time")
        return seconds

    def chip_links(self, links: Mapping[str, Any]) -> ChipLinks | None:
        """The `chip_links` section (empty: none): bandwidth required, latency, topology and chips optional."""
        if not links:
            return None
        topology = links.get("topology", "ring")
        if topology not in TOPOLOGIES:
            raise self.fail("chip_links.topology", f"must be one of {', '.join(TOPOLOGIES)}, got {topology!r}")
        chips = links.get("chips")
        return ChipLinks(
            self.positive("chip_links.bandwidth", self.required(links, "chip_links.bandwidth", "'100 GB/s'"),
                          "bandwidth"),
            self.seconds("chip_links.latency", links.get("latency", 0)), topology,
            self.count("chip_links.chips", chips) if chips is not None else None)

    def count(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(key, f"must be a whole number >= 1, got {value!r}")
        return value

    def array(self, key: str, figure: Any) -> tuple[int, int]:
        """rows x columns: "128x128" or [128, 128], each >= 1."""
        value = self.unwrap(key, figure)
        dims: Any = None
        if isinstance(value, str) and (match := _ARRAY.fullmatch(value)):
            dims = (int(match.group(1)), int(match.group(2)))
        elif isinstance(value, list | tuple) and len(value) == 2:
            dims = tuple(value)
        if dims is None or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
            raise self.fail(key, f"expected rows x columns such as '128x128' or [128, 128], got {value!r}")
        if min(dims) < 1:
            raise self.fail(key, f"each dimension must be >= 1, got {dims[0]}x{dims[1]}")
        return dims[0], dims[1]

    def rates(self, key: str, value: Any) -> dict[str, float]:
        if not isinstance(value, Mapping) or not value:
            raise self.fail(key, f"required: a mapping of dtype to FLOP/s (dtypes: {', '.join(DTYPES)})")
        rates: dict[str, float] = {}
        for dtype, figure in value.items():
            if dtype not in DTYPES:
                raise self.fail(f"{key}.{dtype}", f"unknown dtype (valid: {', '.join(DTYPES)})")
            rates[dtype] = self.positive(f"{key}.{dtype}", figure, "flops")
        return rates

    def levels(self, value: Any) -> tuple[MemoryLevel, ...]:
        if not isinstance(value, list):
            raise self.fail("memory_levels", "expected a list of {name, size, bandwidth}")
        levels = []
        for index, level in enumerate(value):
            key = f"memory_levels[{index}]"
            if not isinstance(level, Mapping) or set(level) - {"name", "size", "bandwidth"}:
                raise self.fail(key, "expected a mapping with name, size and bandwidth")
            name = level.get("name")
            if not isinstance(name, str) or not name:
                raise self.fail(f"{key}.name", "required: a non-empty string")
            levels.append(MemoryLevel(
                name, self.positive(f"{key}.size", self.required(level, f"{key}.size", "'8 MiB'"), "bytes"),
                self.positive(f"{key}.bandwidth", self.required(level, f"{key}.bandwidth", "'2 TB/s'"), "bandwidth")))
        return tuple(levels)
