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
| `flops_tensor`           | tensor-core FLOPs: the `sm__ops_path_tensor_src_*.sum` counters, else |
|                          | 512 × `sm__inst_executed_pipe_tensor.sum` (see `tensor_flops`)       |
| `flops`                  | their sum: CUDA-core plus tensor-core FLOPs                          |
| `flops_dtype`            | the precision with the most FLOPs (`fp32`, `bf16`, `tf32`...)       |
| `dram_bytes_read/write`  | `dram__bytes_read.sum`, `dram__bytes_write.sum`                      |
| every metric column      | kept under its metric name (float64, or text when not numeric)       |

The FLOP counts follow Nsight Compute's own roofline sections (`SpeedOfLight_RooflineChart`,
`SpeedOfLight_Hierarchical{Single,Double,Half,Tensor}RooflineChart`): achieved work is
`add + mul + 2 * fma` predicated-on SASS thread instructions per precision ("an FMA instruction has
two floating point operations", hence the `_x2` derived metrics there), and tensor-core work is what
the tensor pipe executed. ncu's default `--metrics` here (`METRICS`) leave the tensor counters out
(their names differ between GPU generations, and ncu refuses a metric the GPU lacks), so `flops_tensor`
is NaN unless they were asked for: then `flops` counts CUDA-core work only, a lower bound for a kernel
that uses tensor cores.

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
from collections.abc import Mapping
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

TENSOR_OPS = re.compile(r"sm__ops_path_tensor_src_([a-z0-9]+)[a-z0-9_]*\.sum")
"""Tensor-core math ops by source type (`sm__ops_path_tensor_src_bf16_dst_fp32.sum`, `…_src_fp64.sum`,
`…_sparsity_off.sum`): FLOPs, a multiply and an add each counting one."""
TENSOR_SPLITS = ("_dst_", "_sparsity_")
"""Suffixes of the tensor op counters that split a coarser counter (`src_fp16` = `src_fp16_dst_fp16` +
`src_fp16_dst_fp32`; `x` = `x_sparsity_on` + `x_sparsity_off`): a part is left out when its whole is there."""
TENSOR_INSTRUCTIONS = ("sm__inst_executed_pipe_tensor.sum", "smsp__inst_executed_pipe_tensor.sum")
"""Warp instructions executed on the tensor pipe (summed over SMs, or over SM sub-partitions)."""
TENSOR_FLOPS_PER_INSTRUCTION = 512.0
"""FLOPs per tensor-pipe instruction in Nsight Compute's `SpeedOfLight_HierarchicalTensorRooflineChart`
section (its `derived__sm__inst_executed_pipe_tensor_x512`). A convention of that chart, not the MMA
shape of every GPU: used only when no `sm__ops_path_tensor_*` counter was collected."""
TENSOR_DTYPES = {"fp64": "fp64", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8",
                 "int4": "int4", "fp4": "fp4"}
"""Source type of a tensor op counter → the dtype whose peak applies (`workbench.hardware.device.DTYPES`)."""


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
    *((f"flops_{p}", pa.float64()) for p in PRECISIONS), ("flops_tensor", pa.float64()), ("flops", pa.float64()),
    ("flops_dtype", pa.string()),
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
    by_dtype: dict[str | None, np.ndarray] = {}
    for precision, letter in PRECISIONS.items():
        parts = [_counter(metrics, letter, op, n) for op in ("add", "mul", "fma")]
        value = parts[0] + parts[1] + 2.0 * parts[2]  # NaN unless all three were collected
        core[f"flops_{precision}"] = by_dtype[precision] = value
    core["flops_tensor"], tensor = tensor_flops(metrics, n)
    for dtype, value in tensor.items():
        by_dtype[dtype] = _nansum([by_dtype[dtype], value]) if dtype in by_dtype else value
    core["flops"] = _nansum([*(core[f"flops_{p}"] for p in PRECISIONS), core["flops_tensor"]])
    core["flops_dtype"] = _largest(by_dtype, n)
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


def tensor_flops(metrics: Mapping[str, np.ndarray | list[str | None]], n: int
                 ) -> tuple[np.ndarray, dict[str | None, np.ndarray]]:
    """Tensor-core FLOPs of each launch (NaN where no tensor counter was collected) and their split by the
    dtype whose peak applies (None: not known).

    From the `sm__ops_path_tensor_src_*.sum` counters (`TENSOR_OPS`), parts of a collected whole left out
    (`TENSOR_SPLITS`); without any, `TENSOR_FLOPS_PER_INSTRUCTION` × the tensor pipe's instructions.
    """
    ops = {name: match[1] for name in metrics if (match := TENSOR_OPS.fullmatch(name))
           and isinstance(metrics[name], np.ndarray)}
    bases = {name: name.removesuffix(".sum") for name in ops}
    wholes = [name for name in ops if not any(bases[name].startswith(bases[other] + split)
                                              for other in ops if other != name for split in TENSOR_SPLITS)]
    split: dict[str | None, list[np.ndarray]] = {}
    for name in wholes:
        split.setdefault(TENSOR_DTYPES.get(ops[name]), []).append(_numeric(metrics[name], n))
    if not split:
        name = next((m for m in TENSOR_INSTRUCTIONS if isinstance(metrics.get(m), np.ndarray)), None)
        if name is None:
            return np.full(n, np.nan), {}
        split[None] = [TENSOR_FLOPS_PER_INSTRUCTION * _numeric(metrics[name], n)]
    by_dtype = {dtype: _nansum(parts) for dtype, parts in split.items()}
    return _nansum(list(by_dtype.values())), by_dtype


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


def _nansum(parts: list[np.ndarray]) -> np.ndarray:
    """Element-wise sum of the parts that were collected; NaN where none was."""
    stacked = np.vstack(parts)
    return np.where(np.isnan(stacked).all(axis=0), np.nan, np.nansum(stacked, axis=0))


def _largest(by_dtype: Mapping[str | None, np.ndarray], n: int) -> list[str | None]:
    """Per launch, the dtype with the most FLOPs (None when no FLOPs were counted or the largest share's dtype
    is not known)."""
    if not by_dtype:
        return [None] * n
    names = list(by_dtype)
    stacked = np.nan_to_num(np.vstack([by_dtype[d] for d in names]))
    best = stacked.argmax(axis=0)
    return [names[b] if stacked[b, i] > 0 else None for i, b in enumerate(best)]


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
