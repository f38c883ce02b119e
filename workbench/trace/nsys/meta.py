"""Metadata of an Nsight Systems SQLite export (`workbench.trace.nsys.reader`): what the export says about
itself, the capture, the system and its GPUs, and the reader's own report.

| source table                                   | goes to                                                    |
|------------------------------------------------|------------------------------------------------------------|
| `META_DATA_EXPORT` (current), `EXPORT_META_DATA` | `source.export`; `nsys_version`, `schema_version`,       |
| (nsys 2022 and older)                          | `export_time` (UTC)                                        |
| `META_DATA_CAPTURE`                            | `capture` (capture settings)                               |
| `TARGET_INFO_SYSTEM_ENV`                       | `system`; `driver_version`, `cuda_driver_version`          |
| `TARGET_INFO_SESSION_START_TIME`,              | `session`: UTC start (`utcEpochNs`, `utcTime`), and the    |
| `ANALYSIS_DETAILS`                             | span on nsys's clock (`startTime`, `stopTime`, `duration`) |
| `TARGET_INFO_GPU`                              | `devices`: name, memory, SMs... (every device with         |
|                                                | activity is listed too)                                    |
| `PROCESSES`, `ThreadNames`                     | `processes`, `threads` (those with events only)            |

Environment variables (`DeviceEnvironment`, ...) are left out: they can hold secrets. A table or column
an export lacks leaves its entries out (or None); text that is not valid UTF-8 is decoded leniently.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from workbench.trace.columns import grouped
from workbench.trace.nsys.tables import NsysExport, global_ids

EXPORT_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")
"""The export's own name → value record, under its current name and the one nsys 2022 and older used."""
_SECRET_PRONE = re.compile(r"ENV", re.IGNORECASE)  # environment variables in capture/system records


def trace_metadata(db: NsysExport, origin: int, events: pa.Table, devices: list[int]) -> dict[str, Any]:
    """The Trace metadata of the export, all but the reader's report (see the module docstring)."""
    export = {k: v for table in EXPORT_TABLES for k, v in _pairs(db, table).items()}
    system = {k: v for k, v in _pairs(db, "TARGET_INFO_SYSTEM_ENV").items() if not _SECRET_PRONE.search(k)}
    threads = np.unique(np.stack([events["pid"].to_numpy(), events["tid"].to_numpy()], axis=1), axis=0)
    return {
        "source": {"format": "nsys", "file": str(db.path), "bytes": db.path.stat().st_size, "export": export},
        "schema_version": export.get("EXPORT_SCHEMA_VERSION"),
        "nsys_version": export.get("EXPORT_PRODUCT_VERSION"),
        "export_time": export.get("EXPORT_TIME_UTC"),
        "driver_version": system.get("NvDriverVersion"),
        "cuda_driver_version": system.get("CudaDriverVersion"),
        "origin_ns": origin,
        "session": {**_first_row(db, "TARGET_INFO_SESSION_START_TIME"), **_first_row(db, "ANALYSIS_DETAILS")},
        "capture": {k: v for k, v in _pairs(db, "META_DATA_CAPTURE").items() if not _SECRET_PRONE.search(k)},
        "system": system,
        "devices": _devices(db, devices),
        "processes": _processes(db, set(threads[:, 0].tolist())),
        "threads": _threads(db, {(p, t) for p, t in threads.tolist()}),
    }


def reader_report(db: NsysExport, events: pa.Table, memory: pa.Table, skipped: Counter[str],
                  unlinked: int) -> dict[str, Any]:
    """`metadata["reader"]`: rows read per table, tables with rows left unread, what was skipped, and a
    warning summing up the values of the wrong type read as null (`NsysExport.coerced`), if any."""
    unread = {name: db.count(name) for name in sorted(db.columns)
              if name not in db.rows_read and name != "StringIds" and not name.startswith("ENUM_")}
    return {
        "tables": dict(sorted(db.rows_read.items())),
        "unread_tables": {k: v for k, v in unread.items() if v},
        "events": events.num_rows,
        "memory": memory.num_rows,
        "counters": 0,
        "device_work_launched_outside_the_export": unlinked,
        "skipped": {k: v for k, v in skipped.items() if v},
        "warnings": _coerced_warning(db.coerced),
    }


def _coerced_warning(coerced: Counter[str]) -> list[str]:
    """One short line (a terminal's, with the run id before it) on the values of the wrong type read as null
    (or as text): how many, and in which column or how many columns (`reader.skipped` has each's count)."""
    counts: Counter[str] = Counter()
    for reason, n in coerced.items():
        counts[reason.split(":", 1)[0]] += n
    if not counts.total():
        return []
    where = f"{len(counts)} columns (see reader.skipped)" if len(counts) > 1 else next(iter(counts))
    return [f"{counts.total()} values of the wrong type read as null or text, in {where}"]


def _pairs(db: NsysExport, table: str) -> dict[str, Any]:
    """A name → value table as a dict; a name given more than once keeps all its values, as a list."""
    if not db.has(table, "name", "value"):
        return {}
    t = db.read(table, ("name", "value"))
    return grouped(zip(t["name"].to_pylist(), t["value"].to_pylist(), strict=True))


def _first_row(db: NsysExport, table: str) -> dict[str, Any]:
    rows = db.read(table).to_pylist() if db.has(table) else []
    return rows[0] if rows else {}


def _devices(db: NsysExport, seen: list[int]) -> list[dict[str, Any]]:
    """One entry per CUDA device with activity or listed in TARGET_INFO_GPU (matched on its CUDA id)."""
    gpus: dict[int, dict[str, Any]] = {}
    if db.has("TARGET_INFO_GPU"):
        for row in db.read("TARGET_INFO_GPU").to_pylist():
            cuda_id = row["cuDevice"] if row.get("cuDevice") is not None else row.get("id")
            if isinstance(cuda_id, int):
                gpus[cuda_id] = row
    devices = []
    for d in sorted(set(seen) | set(gpus)):
        row = gpus.get(d, {})
        major, minor = row.get("computeMajor"), row.get("computeMinor")
        devices.append({
            "device": f"cuda:{d}",
            "name": row.get("name"),
            "memory_bytes": row.get("totalMemory"),
            "memory_bandwidth_bytes_per_s": row.get("memoryBandwidth"),
            "sm_count": row.get("smCount"),
            "clock_hz": row.get("clockRate"),
            "compute_capability": None if major is None else f"{major}.{minor}",
            "source": row,
        })
    return devices


def _processes(db: NsysExport, pids: set[int]) -> dict[str, dict[str, Any]]:
    if not db.has("PROCESSES", "pid", "name"):
        return {}
    rows = db.read("PROCESSES", ("pid", "name")).to_pylist()
    return {str(r["pid"]): {"name": r["name"]} for r in rows if r["pid"] in pids}


def _threads(db: NsysExport, threads: set[tuple[int, int]]) -> dict[str, dict[str, Any]]:
    if not db.has("ThreadNames", "nameId", "globalTid"):
        return {}
    t = db.read("ThreadNames", ("nameId", "globalTid"))
    pid, tid = global_ids(t, "globalTid")
    codes, names = db.strings(t["nameId"])
    return {f"{p}/{i}": {"name": names[c] if c >= 0 else None}
            for p, i, c in zip(pid.tolist(), tid.tolist(), codes.tolist(), strict=True) if (p, i) in threads}
