"""The built-in device table (`devices.yaml`, shipped in the package) and name resolution.

`device_spec("h100")` gives a built-in `DeviceSpec` (names and aliases are case-insensitive);
`resolve_device_spec` also accepts "cpu" (this machine's CPU, measured by `cpu_probe`) and the path of
a user accelerator YAML, so every analysis that takes a device takes all three. `match_device` maps the
names that drivers report ("NVIDIA H100 80GB HBM3", jax's "TPU v5 lite") onto the table.

Hourly prices: the table's indicative figure, replaced by a prices file named by `$WORKBENCH_PRICES`
(YAML or JSON mapping device name or alias to USD per hour, e.g. `{h100: 2.49, my-npu: 0.3}`),
replaced in turn by an explicit `price_per_hour=` argument.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from workbench.errors import WorkbenchError
from workbench.hardware.accelerator import AcceleratorSpecError, load_accelerator, parse_spec
from workbench.hardware.device import DTYPES, DeviceSpec

if TYPE_CHECKING:  # the table for display loads pandas, the specs do not
    import pandas as pd

DATA_FILE = "devices.yaml"
PRICES_ENV = "WORKBENCH_PRICES"
LOCAL_CPU = frozenset({"cpu", "local-cpu", "xla:cpu"})
"""Names that mean this machine's CPU, measured (see `cpu_probe.local_cpu_spec`)."""
SPEC_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class _Table:
    specs: dict[str, DeviceSpec]
    aliases: dict[str, str]
    patterns: tuple[tuple[re.Pattern[str], str], ...]


@functools.cache
def _table() -> _Table:
    """The parsed data file (read once per process)."""
    data_file = resources.files("workbench.hardware").joinpath(DATA_FILE)
    origin = f"workbench/hardware/{DATA_FILE}"
    data = yaml.safe_load(data_file.read_text())
    devices = data.get("devices") if isinstance(data, Mapping) else None
    if not isinstance(devices, Mapping):
        raise AcceleratorSpecError(origin, "devices", "missing: the table needs a 'devices' mapping")
    specs: dict[str, DeviceSpec] = {}
    aliases: dict[str, str] = {}
    patterns: list[tuple[re.Pattern[str], str]] = []
    for name, entry in devices.items():
        if not isinstance(entry, Mapping):
            raise AcceleratorSpecError(origin, f"devices.{name}", "expected a mapping of fields")
        specs[name] = parse_spec(entry, name=name, origin=f"{origin} (device {name})", require_sources=True,
                                 extra_keys=frozenset({"aliases", "match"}))
        for alias in (name, *entry.get("aliases", ())):
            aliases[alias.lower()] = name
        patterns += [(re.compile(p, re.IGNORECASE), name) for p in entry.get("match", ())]
    return _Table(specs, aliases, tuple(patterns))


def list_devices() -> list[str]:
    """Names of the built-in devices, in table order (NVIDIA parts, then TPUs)."""
    return list(_table().specs)


def device_spec(name: str, *, price_per_hour: float | None = None) -> DeviceSpec:
    """The built-in device called `name` (or one of its aliases), with the price overrides applied;
    a `WorkbenchError` listing the valid names otherwise."""
    table = _table()
    key = table.aliases.get(name.strip().lower())
    if key is None:
        raise WorkbenchError(f"unknown device {name!r}; built-in devices: {', '.join(list_devices())} "
                             "(or 'cpu' for this machine, or the path of an accelerator YAML)")
    return _priced(table.specs[key], price_per_hour)


def match_device(reported_name: str) -> DeviceSpec | None:
    """The built-in device whose `match` patterns fit a reported device name, or None."""
    reported = " ".join(reported_name.split())
    for pattern, name in _table().patterns:
        if pattern.fullmatch(reported):
            return _priced(_table().specs[name], None)
    return None


def resolve_device_spec(device: str | os.PathLike[str] | DeviceSpec, *,
                        price_per_hour: float | None = None) -> DeviceSpec:
    """A `DeviceSpec` from whatever names a device: a spec (returned as is, re-priced), "cpu" (this
    machine, measured and cached), an accelerator YAML path, or a built-in name or alias."""
    if isinstance(device, DeviceSpec):
        return _priced(device, price_per_hour)
    text = os.fspath(device)
    if isinstance(device, os.PathLike) or text.lower().endswith(SPEC_SUFFIXES) or os.sep in text:
        return _priced(load_accelerator(text), price_per_hour)
    if text.strip().lower() in LOCAL_CPU:
        from workbench.hardware.cpu_probe import local_cpu_spec

        return _priced(local_cpu_spec(), price_per_hour)
    return device_spec(text, price_per_hour=price_per_hour)


def device_table(devices: list[str] | None = None) -> pd.DataFrame:
    """The built-in table for display: one row per device, peaks in TFLOP/s, bandwidth in GB/s.

    | name | kind | description | fp32 … fp4 (TFLOP/s) | memory_gb_per_s | memory_gb | price_per_hour | uncertain |
    """
    import pandas as pd

    rows = []
    for name in devices or list_devices():
        spec = device_spec(name)
        rows.append({
            "name": spec.name, "kind": spec.kind, "description": spec.description,
            **{dtype: spec.peak_flops[dtype] / 1e12 if dtype in spec.peak_flops else None for dtype in DTYPES},
            "memory_gb_per_s": spec.memory_bw_bytes_per_s / 1e9,
            "memory_gb": spec.memory_bytes / 1e9 if spec.memory_bytes else None,
            "price_per_hour": spec.price_per_hour,
            "uncertain": ", ".join(sorted(spec.uncertain)),
        })
    table = pd.DataFrame(rows)
    return table.dropna(axis="columns", how="all")


def price_overrides() -> dict[str, float]:
    """Prices from the file named by `$WORKBENCH_PRICES` (device name or alias, lower-cased -> USD/h);
    empty when the variable is unset."""
    path = os.environ.get(PRICES_ENV)
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise WorkbenchError(f"{path} (${PRICES_ENV}): cannot read the prices file: {exc}") from exc
    if not isinstance(data, Mapping):
        raise WorkbenchError(f"{path} (${PRICES_ENV}): expected a mapping of device name to price per hour")
    prices: dict[str, float] = {}
    for name, price in data.items():
        if isinstance(price, bool) or not isinstance(price, int | float) or price < 0:
            raise WorkbenchError(f"{path} (${PRICES_ENV}): price of {name!r} must be a non-negative number, "
                                 f"got {price!r}")
        prices[str(name).lower()] = float(price)
    return prices


def _priced(spec: DeviceSpec, price_per_hour: float | None) -> DeviceSpec:
    """`spec` with the explicit price, else the prices file's entry for its name or an alias."""
    if price_per_hour is not None:
        return spec.with_price(price_per_hour)
    overrides = price_overrides()
    if not overrides:
        return spec
    names = {spec.name.lower()} | {alias for alias, target in _table().aliases.items() if target == spec.name}
    for name in sorted(names):
        if name in overrides:
            return spec.with_price(overrides[name])
    return spec
