"""Device specs written as YAML: user-defined accelerators and the entries of the built-in table.

A spec file describes one chip so that an NPU team can project their models onto it, and is accepted
wherever a built-in device name is (`resolve_device_spec`). Fields (see
examples/accelerators/npu-example.yaml):

    name: my-npu                      # required
    kind: custom                      # gpu | tpu | cpu | custom (default custom)
    description: free text
    peak_flops: {int8: 64 TOPS, bf16: 16 TFLOP/s}   # dense peaks, at least one dtype
    memory_bandwidth: 68 GB/s         # required
    memory_size: 8 GiB
    sram: 8 MiB                       # on-chip SRAM / scratchpad
    matrix_unit: 64x64                # rows x columns of the systolic array (or [64, 64])
    clock: 1 GHz
    price_per_hour: 0.25

Every figure is a number in base units, a quantity string ("16 TFLOP/s"), or a mapping
`{value: ..., source: <url>, uncertain: true, note: ...}`. Unknown fields and dtypes are errors, so a
typo cannot silently drop a figure; every error names the file and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from workbench.errors import WorkbenchError
from workbench.hardware.device import DTYPES, KINDS, DeviceSpec
from workbench.hardware.units import UnitError, parse_quantity

FIELDS = {
    # spec key: (DeviceSpec field, unit family)
    "memory_bandwidth": ("memory_bw_bytes_per_s", "bandwidth"),
    "memory_size": ("memory_bytes", "bytes"),
    "sram": ("sram_bytes", "bytes"),
    "clock": ("clock_hz", "hertz"),
}
TOP_KEYS = frozenset({"name", "kind", "description", "peak_flops", "matrix_unit", "price_per_hour", *FIELDS})
FIGURE_KEYS = frozenset({"value", "source", "uncertain", "note"})
_MATRIX = re.compile(r"\s*(\d+)\s*[x×*]\s*(\d+)\s*")


class AcceleratorSpecError(WorkbenchError):
    """A device spec that cannot be used: names the file, the field and the problem."""

    def __init__(self, path: object, field: str | None, problem: str) -> None:
        where = f"{path}: field '{field}'" if field else f"{path}"
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.field = field
        self.problem = problem


def load_accelerator(path: str | Path) -> DeviceSpec:
    """The `DeviceSpec` described by the YAML (or JSON) file at `path`; `AcceleratorSpecError` if it
    is missing, unreadable or invalid."""
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise AcceleratorSpecError(path, None, f"cannot read the accelerator spec ({exc.strerror or exc})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise AcceleratorSpecError(path, None, f"not valid YAML{where}: {problem}") from exc
    if not isinstance(data, Mapping):
        raise AcceleratorSpecError(path, None, "expected a mapping of fields (name, peak_flops, memory_bandwidth, ...)")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise AcceleratorSpecError(path, "name", "required: a non-empty string")
    return parse_spec(data, name=name.strip(), origin=path, default_kind="custom")


def parse_spec(data: Mapping[str, Any], *, name: str, origin: object, default_kind: str | None = None,
               require_sources: bool = False, extra_keys: frozenset[str] = frozenset()) -> DeviceSpec:
    """A `DeviceSpec` from one spec mapping (the module docstring's fields).

    `origin` names the file in errors; `require_sources` demands a source URL for every figure (the
    built-in table); `extra_keys` are further top-level keys the caller handles itself.
    """
    unknown = sorted(set(data) - TOP_KEYS - extra_keys)
    if unknown:
        raise AcceleratorSpecError(origin, unknown[0], f"unknown field (valid: {', '.join(sorted(TOP_KEYS))})")
    reader = _FigureReader(origin, require_sources)
    kind = data.get("kind", default_kind)
    if kind not in KINDS:
        raise AcceleratorSpecError(origin, "kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise AcceleratorSpecError(origin, "description", "must be a string")
    peaks = data.get("peak_flops")
    if not isinstance(peaks, Mapping) or not peaks:
        raise AcceleratorSpecError(origin, "peak_flops", f"required: a mapping of dtype to FLOP/s (dtypes: "
                                   f"{', '.join(DTYPES)}), e.g. {{bf16: 16 TFLOP/s}}")
    peak_flops: dict[str, float] = {}
    for dtype, figure in peaks.items():
        if dtype not in DTYPES:
            raise AcceleratorSpecError(origin, f"peak_flops.{dtype}", f"unknown dtype (valid: {', '.join(DTYPES)})")
        value = reader.read(f"peak_flops.{dtype}", figure, "flops")
        if value <= 0:
            raise AcceleratorSpecError(origin, f"peak_flops.{dtype}", "must be positive")
        peak_flops[dtype] = value
    if data.get("memory_bandwidth") is None:
        raise AcceleratorSpecError(origin, "memory_bandwidth", "required, e.g. '3.35 TB/s'")
    figures = {attr: reader.read(key, data[key], family) if data.get(key) is not None else None
               for key, (attr, family) in FIELDS.items()}
    if not figures["memory_bw_bytes_per_s"]:
        raise AcceleratorSpecError(origin, "memory_bandwidth", "must be positive")
    price = reader.read("price_per_hour", data["price_per_hour"], None) if data.get("price_per_hour") is not None \
        else None
    return DeviceSpec(
        name=name, kind=kind, description=description, peak_flops=peak_flops,
        matrix_unit=_matrix_unit(origin, data.get("matrix_unit"), reader), price_per_hour=price,
        sources={_attribute(k): url for k, url in reader.sources.items()},
        uncertain=frozenset(_attribute(k) for k in reader.uncertain), **figures,
    )


def _attribute(key: str) -> str:
    """The DeviceSpec field a spec key fills ("memory_bandwidth" -> "memory_bw_bytes_per_s"), so that
    `sources` and `uncertain` use the same names for every origin."""
    return FIELDS[key][0] if key in FIELDS else key


class _FigureReader:
    """Reads figures (plain or `{value, source, ...}`), collecting their sources and uncertain flags."""

    def __init__(self, origin: object, require_sources: bool) -> None:
        self.origin = origin
        self.require_sources = require_sources
        self.sources: dict[str, str] = {}
        self.uncertain: set[str] = set()

    def unwrap(self, key: str, figure: Any) -> Any:
        """The bare value of a figure, after recording its source and uncertainty."""
        if isinstance(figure, Mapping):
            extra = sorted(set(figure) - FIGURE_KEYS)
            if extra:
                raise AcceleratorSpecError(self.origin, f"{key}.{extra[0]}",
                                           f"unknown key (a figure has {', '.join(sorted(FIGURE_KEYS))})")
            if "value" not in figure:
                raise AcceleratorSpecError(self.origin, key, "a figure written as a mapping needs a 'value'")
            source = figure.get("source")
            if source is not None:
                if not isinstance(source, str) or not source.startswith(("http://", "https://")):
                    raise AcceleratorSpecError(self.origin, f"{key}.source", f"must be a URL, got {source!r}")
                self.sources[key] = source
            if figure.get("uncertain"):
                self.uncertain.add(key)
            figure = figure["value"]
        if self.require_sources and key not in self.sources:
            raise AcceleratorSpecError(self.origin, key, "needs a source URL ({value: ..., source: https://...})")
        return figure

    def read(self, key: str, figure: Any, family: str | None) -> float:
        """A figure as a float in base units of `family` (None: a plain non-negative number)."""
        value = self.unwrap(key, figure)
        try:
            if family is not None:
                return parse_quantity(value, family)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise UnitError(f"expected a non-negative number, got {value!r}")
            return float(value)
        except UnitError as exc:
            raise AcceleratorSpecError(self.origin, key, str(exc)) from exc


def _matrix_unit(origin: object, figure: Any, reader: _FigureReader) -> tuple[int, int] | None:
    """`matrix_unit` as (rows, columns): "128x128", [128, 128] or {rows: 128, cols: 128}."""
    if figure is None:
        return None
    is_dims = isinstance(figure, Mapping) and set(figure) == {"rows", "cols"}
    value = figure if is_dims else reader.unwrap("matrix_unit", figure)
    if isinstance(value, str) and (match := _MATRIX.fullmatch(value)):
        dims: Any = (int(match.group(1)), int(match.group(2)))
    elif isinstance(value, Mapping) and set(value) == {"rows", "cols"}:
        dims = (value["rows"], value["cols"])
    elif isinstance(value, list | tuple) and len(value) == 2:
        dims = tuple(value)
    else:
        dims = None
    if dims is None or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise AcceleratorSpecError(origin, "matrix_unit",
                                   f"expected rows x columns such as '128x128' or [128, 128], got {value!r}")
    return dims
