"""Quantities with units as people write them in spec sheets: "989.5 TFLOP/s", "3.35 TB/s", "80 GiB".

A quantity is a plain number (already in base units: FLOP/s, bytes/s, bytes, Hz) or a string of a
number, an optional prefix and a unit of the expected family. Decimal prefixes (k, M, G, T, P, E) are
powers of 1000, binary ones (Ki, Mi, Gi, Ti, Pi) powers of 1024 (only for bytes).
"""

from __future__ import annotations

import math
import re

FAMILIES: dict[str, tuple[str, ...]] = {
    "flops": ("FLOP/s", "FLOPS", "FLOP/S", "OP/s", "OPS", "OP/S"),
    "bandwidth": ("B/s", "B/S", "Bps"),
    "bytes": ("B",),
    "hertz": ("Hz",),
}
"""Units accepted for each kind of quantity (case as written; "TOPS" counts as FLOP/s for integers)."""

EXAMPLES = {"flops": "989.5 TFLOP/s", "bandwidth": "3.35 TB/s", "bytes": "80 GiB", "hertz": "1.98 GHz"}

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_QUANTITY = re.compile(r"\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*(Ki|Mi|Gi|Ti|Pi|[kKMGTPE]?)(\S*)\s*")


class UnitError(ValueError):
    """A value that is not a quantity of the expected family; the message says what was expected."""


def parse_quantity(value: object, family: str) -> float:
    """`value` in base units of `family` ("flops", "bandwidth", "bytes", "hertz"); finite and >= 0.

    Numbers pass through; strings are split into number, prefix and unit. Raises `UnitError`.
    """
    units = FAMILIES[family]
    if isinstance(value, bool):
        raise UnitError(f"expected a number or a quantity such as {EXAMPLES[family]!r}, got {value!r}")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        match = _QUANTITY.fullmatch(value)
        if match is None or match.group(3) not in units or (match.group(2) in _BINARY and family == "flops"):
            raise UnitError(f"cannot read {value!r} as {family} (expected e.g. {EXAMPLES[family]!r}; "
                            f"units: {', '.join(units)})")
        prefix = match.group(2)
        number = float(match.group(1)) * (_BINARY[prefix] if prefix in _BINARY else _DECIMAL[prefix])
    else:
        raise UnitError(f"expected a number or a quantity such as {EXAMPLES[family]!r}, got {value!r}")
    if not math.isfinite(number) or number < 0:
        raise UnitError(f"{value!r} must be a finite, non-negative {family} value")
    return number


_BYTE_UNITS = {True: (1024, ("B", "KiB", "MiB", "GiB", "TiB")), False: (1000, ("B", "kB", "MB", "GB", "TB"))}


def format_bytes(n: float, *, binary: bool = True) -> str:
    """A byte count as people read it: binary units to one decimal ("1.5 MiB", "512 B"), or with
    `binary=False` decimal units to three significant digits ("8.03 GB", the hardware table's convention)."""
    base, units = _BYTE_UNITS[binary]
    power = 0
    while power < len(units) - 1 and abs(n) >= base ** (power + 1):
        power += 1
    if binary:
        return f"{n} B" if power == 0 else f"{n / base ** power:.1f} {units[power]}"
    return f"{n / base ** power:.3g} {units[power]}"
