"""Reader for Nsight Compute's raw CSV page (`ncu --import REPORT --csv --page raw`) into a
`kernel_metrics` Arrow table: one row per profiled kernel launch.

The raw page is wide: a header row (`"ID","Process ID","Process Name","Host Name","Kernel Name",
"Context","Stream","Block Size","Grid Size","Device","CC", <metric>...`), a row of units (empty under
the identity columns, `nsecond`, `byte`, `%`... under the metrics), then one row per launch. ncu's
own `==PROF==` / `==WARNING==` lines may surround it. Numbers carry thousands separators
(`"2,048"`); `n/a` means not collected.

| column                   | from                                                                 |
|--------------------------|----------------------------------------------------------------------|
| `id`                     | `ID`: ncu's launch number across all profiled kernels                |
| `kernel`                 | `Kernel Name` (demangled with `--print-kernel-base demangled`)      |
| `launch`                 | the launch's index among the profiled launches of the same kernel   |
| `pid`, `context`, `stream`, `device` | their columns (int64)                                    |
| `process`, `host`, `block_size`, `grid_size`, `cc` | their columns (text)                       |
| `duration_ns`            | `gpu__time_duration.sum`                                             |
| `sm_throughput_pct`      | `sm__throughput.avg.pct_of_peak_sustained_elapsed`                   |
| `memory_throughput_pct`  | `gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed`   |
| `dram_throughput_pct`    | `dram__throughput.avg.pct_of_peak_sustained_elapsed`                 |
| `achieved_occupancy_pct` | `sm__warps_active.avg.pct_of_peak_sustained_active`                  |
| `flops_fp32/fp64/fp16`   | SASS thread instructions: `fadd + fmul + 2 * ffma` (`d…`, `h…` alike)|
| `flops`                  | their sum (CUDA-core FLOPs: tensor-core MMA work is not in these counters) |
| `dram_bytes_read/write`  | `dram__bytes_read.sum`, `dram__bytes_write.sum`                      |
| every metric column      | kept under its metric name (float64, or text when not numeric)       |

Derived columns are NaN where their metrics were not collected. Times are converted to ns and byte
counts to bytes whatever prefix ncu printed (`usecond`, `Kbyte`: decimal prefixes); the unit of each
metric column is in its field metadata (`unit`) and in the table metadata (`units`), beside the
source file and the count of rows skipped (lines that were not rows of the table).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from workbench.errors import TraceFormatError

IDENTITY = {
    "ID": "id", "Process ID": "pid", "Process Name": "process", "Host Name": "host", "Kernel Name": "kernel",
    "Context": "context", "Stream": "stream", "Block Size": "block_size", "Grid Size": "grid_size",
    "Device": "device", "CC": "cc",
}
"""ncu's identity columns and their names in the table."""

_INT_IDENTITY = ("id", "pid", "context", "stream", "device")

DURATION = "gpu__time_duration.sum"
DERIVED = {
    "duration_ns": DURATION,
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "dram_bytes_read": "dram__bytes_read.sum",
    "dram_bytes_write": "dram__bytes_write.sum",
}
"""Table column → the ncu metric it is read from."""

PRECISIONS = {"fp32": "f", "fp64": "d", "fp16": "h"}
"""FLOP column suffix → the letter of ncu's SASS op counters (`ffma`, `dfma`, `hfma`)."""


def sass_counter(letter: str, op: str, prefix: str = "sm") -> str:
    """The SASS thread-instruction counter of one op, e.g. `sm__sass_thread_inst_executed_op_ffma_pred_on.sum`."""
    return f"{prefix}__sass_thread_inst_executed_op_{letter}{op}_pred_on.sum"


METRICS: tuple[str, ...] = (
    *dict.fromkeys(DERIVED.values()),
    *(sass_counter(letter, op) for letter in PRECISIONS.values() for op in ("add", "mul", "fma")),
)
"""The metrics `ncu --metrics` collects by default: everything the derived columns need."""

CORE = pa.schema([
    ("id", pa.int64()), ("kernel", pa.string()), ("launch", pa.int64()), ("pid", pa.int64()),
    ("process", pa.string()), ("host", pa.string()), ("context", pa.int64()), ("stream", pa.int64()),
    ("device", pa.int64()), ("block_size", pa.string()), ("grid_size", pa.string()), ("cc", pa.string()),
    *((name, pa.float64()) for name in DERIVED),
    *((f"flops_{p}", pa.float64()) for p in PRECISIONS), ("flops", pa.float64()),
])
"""The columns every `kernel_metrics` table starts with; the metric columns follow."""

_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
          "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_TIME_TO_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
               "second": 1e9, "s": 1e9}
_BYTES = re.compile(r"(K|M|G|T|P|Ki|Mi|Gi|Ti)?byte")
_MISSING = {"", "n/a", "N/A", "nan", "-"}


def read_ncu_csv(path: str | os.PathLike[str]) -> pa.Table:
    """The `kernel_metrics` table of an ncu raw-page CSV file (see the module docstring)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read: {exc.strerror}") from exc
    return parse_ncu_csv(text, source=str(path))


def parse_ncu_csv(text: str, source: str = "<ncu csv>") -> pa.Table:
    """The `kernel_metrics` table of the text of an ncu raw-page CSV; `source` names it in errors."""
    skipped: Counter[str] = Counter()
    header, units, rows = _split(text, source, skipped)
    columns: dict[str, list[str]] = {name: [row[i] for row in rows] for i, name in enumerate(header)}
    n = len(rows)
    core: dict[str, Any] = {}
    for raw, name in IDENTITY.items():
        values = columns.get(raw, [""] * n)
        core[name] = [_int(v) for v in values] if name in _INT_IDENTITY else [v or None for v in values]
    extra_identity = [h for h in header if h not in IDENTITY and "__" not in h]
    metric_names = [h for h in header if "__" in h]
    metrics: dict[str, np.ndarray | list[str | None]] = {}
    metric_units: dict[str, str] = {}
    for name in metric_names:
        unit = units[header.index(name)]
        values, unit = _metric(columns[name], unit)
        metrics[name], metric_units[name] = values, unit
    core["launch"] = _launch_index(core["kernel"], core["id"])
    for column, metric in DERIVED.items():
        core[column] = _numeric(metrics.get(metric), n)
    flops = []
    for precision, letter in PRECISIONS.items():
        parts = [_counter(metrics, letter, op, n) for op in ("add", "mul", "fma")]
        value = parts[0] + parts[1] + 2.0 * parts[2]  # NaN unless all three were collected
        core[f"flops_{precision}"] = value
        flops.append(value)
    stacked = np.vstack(flops)
    core["flops"] = np.where(np.isnan(stacked).all(axis=0), np.nan, np.nansum(stacked, axis=0))
    fields = list(CORE)
    arrays = [pa.array(core[f.name], f.type) for f in CORE]
    for name in extra_identity:
        fields.append(pa.field(_snake(name), pa.string()))
        arrays.append(pa.array([v or None for v in columns[name]], pa.string()))
    for name in metric_names:
        values = metrics[name]
        kind = pa.float64() if isinstance(values, np.ndarray) else pa.string()
        fields.append(pa.field(name, kind, metadata={"unit": metric_units[name]}))
        arrays.append(pa.array(values, kind))
    metadata = {"source": {"format": "ncu-csv", "file": source}, "units": metric_units,
                "reader": {"launches": n, "skipped": dict(skipped)}}
    schema = pa.schema(fields, metadata={"workbench": json.dumps(metadata)})
    return pa.Table.from_arrays(arrays, schema=schema)


def table_metadata(table: pa.Table) -> dict[str, Any]:
    """The reader's metadata of a `kernel_metrics` table (source, units, skipped lines)."""
    raw = (table.schema.metadata or {}).get(b"workbench")
    return json.loads(raw) if raw else {}


def _split(text: str, source: str, skipped: Counter[str]) -> tuple[list[str], list[str], list[list[str]]]:
    """(header, units, rows) of the CSV, leaving out ncu's `==…==` lines and anything not a row."""
    lines = [line for line in text.splitlines() if line.strip()]
    parsed = []
    for line in lines:
        if line.startswith("=="):
            skipped["ncu messages (==PROF==, ==WARNING==...)"] += 1
            continue
        try:
            parsed.append(next(csv.reader([line])))
        except (csv.Error, StopIteration):
            skipped["lines that are not CSV"] += 1
    start = next((i for i, row in enumerate(parsed) if "Kernel Name" in row and "ID" in row), None)
    if start is None:
        raise TraceFormatError(source, "no ncu CSV header (a row naming \"ID\" and \"Kernel Name\"): "
                                       "not the output of `ncu --csv --page raw`")
    header = parsed[start]
    if start:
        skipped["lines before the header"] += start
    body = parsed[start + 1:]
    if not body or not _is_units_row(body[0], header):
        raise TraceFormatError(source, "the ncu CSV header is not followed by a row of units: export it with "
                                       "`ncu --import REPORT --csv --page raw` (the raw page)")
    units, rows = body[0], []
    for row in body[1:]:
        if len(row) == len(header):
            rows.append(row)
        else:
            skipped["rows whose field count differs from the header's"] += 1
    return header, units, rows


def _is_units_row(row: list[str], header: list[str]) -> bool:
    """Whether `row` is the units row: as long as the header, empty under every identity column."""
    return len(row) == len(header) and all(not value for name, value in zip(header, row, strict=True)
                                           if name in IDENTITY)


def _metric(values: list[str], unit: str) -> tuple[np.ndarray | list[str | None], str]:
    """A metric column as floats in base units (ns, bytes) with its unit, or as text if not numeric."""
    numbers = np.full(len(values), np.nan)
    for i, value in enumerate(values):
        text = value.strip()
        if text in _MISSING:
            continue
        try:
            numbers[i] = float(text.replace(",", ""))
        except ValueError:
            return [v.strip() or None for v in values], unit
    if unit in _TIME_TO_NS:
        return numbers * _TIME_TO_NS[unit], "nsecond"
    match = _BYTES.fullmatch(unit)
    if match:
        return numbers * _SCALE[match.group(1) or ""], "byte"
    return numbers, unit


def _numeric(values: np.ndarray | list[str | None] | None, n: int) -> np.ndarray:
    """A metric's floats, or NaN everywhere when it was not collected (or is text)."""
    return values if isinstance(values, np.ndarray) else np.full(n, np.nan)


def _counter(metrics: dict[str, Any], letter: str, op: str, n: int) -> np.ndarray:
    """A SASS op counter, summed over SMs (`sm__…`) or, when only that was collected, over SM sub-partitions."""
    for prefix in ("sm", "smsp"):
        name = sass_counter(letter, op, prefix)
        if name in metrics:
            return _numeric(metrics[name], n)
    return np.full(n, np.nan)


def _launch_index(kernels: list[str | None], ids: list[int | None]) -> list[int]:
    """Each row's index among the launches of its kernel, in ID order (file order where IDs are missing)."""
    order = sorted(range(len(kernels)), key=lambda i: (ids[i] is None, ids[i] if ids[i] is not None else 0, i))
    seen: Counter[str | None] = Counter()
    launch = [0] * len(kernels)
    for i in order:
        launch[i] = seen[kernels[i]]
        seen[kernels[i]] += 1
    return launch


def _int(text: str) -> int | None:
    """An integer identity value (`"1,024"` → 1024); None when empty or not a number."""
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return int(value) if math.isfinite(value) else None


def _snake(name: str) -> str:
    """A column name for an identity column ncu added that this reader does not know."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "column"
