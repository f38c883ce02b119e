"""Seeds of the fuzz cases (`fuzzing.py`): small valid traces of every format `workbench import` reads.

- Kineto/Chrome JSON: a hand-made trace touching every record kind the reader knows (spans, instants,
  B/E and async pairs, flows, counters, metadata, memory, device properties), the small real traces of
  the shared fixtures (whole, or their first events), and the Chrome trace jax writes beside an XSpace.
- XSpace: hand-made text-format messages with host, GPU and TPU planes (serialized by jax), and the
  `.xplane.pb` of a jitted function captured here with `jax.profiler.trace` (used for byte mutations).
- nsys: the shared fixtures' SQLite exports with every table cut to its first rows.

Everything but the hand-made JSON needs jax or the shared fixtures; without them those seeds are left
out (and a format with no seed has no cases).
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
"""The shared real-trace fixtures, beside the repository."""

KINETO_FIXTURES = ("amd_mi250_train.json.gz", "cpu_only_rank34.pt.trace.json.gz", "triton_example.json.gz",
                   "cupti_range_profiler.json.gz", "mtia_inference_rank0.json.gz")
NSYS_FIXTURES = ("saxpy_mpi_cuda_nsys2022.sqlite", "h100_2gpu_1s.sqlite")
FIRST_EVENTS = 300
"""Events (and nsys rows per table) kept of a larger fixture."""

NSYS_TABLES = frozenset({
    "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_OVERHEAD",
    "NVTX_EVENTS", "CUDA_GPU_MEMORY_USAGE_EVENTS", "OSRT_API", "CUBLAS_EVENTS", "CUDNN_EVENTS", "StringIds",
    "ThreadNames", "PROCESSES", "META_DATA_EXPORT", "EXPORT_META_DATA", "META_DATA_CAPTURE", "TARGET_INFO_GPU",
    "TARGET_INFO_SYSTEM_ENV", "TARGET_INFO_SESSION_START_TIME", "ANALYSIS_DETAILS", "CUDA_CALLCHAINS",
    "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "ENUM_NSYS_EVENT_TYPE", "ENUM_NSYS_EVENT_CLASS",
})
"""The export's tables the nsys reader reads (mutations go there)."""


@dataclass
class Seeds:
    """Seeds by format: Kineto documents as JSON text, XSpace text-format messages and files, nsys exports."""

    kineto: list[tuple[str, str]] = field(default_factory=list)
    xspace_text: list[tuple[str, str]] = field(default_factory=list)
    xspace_bytes: list[tuple[str, bytes]] = field(default_factory=list)
    nsys: list[tuple[str, bytes]] = field(default_factory=list)
    serialize_xspace: Callable[[str], bytes] | None = None

    def has(self, fmt: str) -> bool:
        """Whether there is a seed for the case format `fmt` (see `fuzzing.FORMATS`)."""
        if fmt == "xspace":
            return bool(self.xspace_text) and self.serialize_xspace is not None
        return bool(self.nsys if fmt == "nsys" else self.kineto)


def build_seeds(fixtures: Path | None = FIXTURES, with_jax: bool = True) -> Seeds:
    """Every seed this machine can make: jax's only `with_jax` and where it imports, the fixtures' where
    `fixtures` exists."""
    seeds = Seeds(kineto=[("handmade", json.dumps(HANDMADE_KINETO))])
    if fixtures is not None and fixtures.is_dir():
        for name in KINETO_FIXTURES:
            if (fixtures / "kineto" / name).exists():
                seeds.kineto.append((name, _first_events(fixtures / "kineto" / name)))
        for name in NSYS_FIXTURES:
            if (fixtures / "nsys" / name).exists():
                seeds.nsys.append((name, _first_rows(fixtures / "nsys" / name)))
    if with_jax:
        try:
            from jax.profiler import ProfileData
        except ImportError:
            return seeds
        seeds.serialize_xspace = ProfileData.text_proto_to_serialized_xspace
        seeds.xspace_text = [("host and devices", HANDMADE_XSPACE)]
        xplane, chrome = _capture_jax()
        seeds.xspace_bytes.append(("jax capture", xplane))
        seeds.kineto.append(("jax trace.json.gz", chrome))
    return seeds


def _first_events(path: Path) -> str:
    """The trace's JSON with at most `FIRST_EVENTS` events."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    doc["traceEvents"] = doc["traceEvents"][:FIRST_EVENTS]
    return json.dumps(doc)


def _first_rows(path: Path) -> bytes:
    """A copy of the SQLite export with every table cut to its first `FIRST_EVENTS` rows, vacuumed."""
    with tempfile.TemporaryDirectory(prefix="fuzz-seed-") as folder:
        copy = Path(folder) / path.name
        shutil.copyfile(path, copy)
        con = sqlite3.connect(copy, isolation_level=None)
        try:
            for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                con.execute(f'DELETE FROM "{table}" WHERE rowid NOT IN '
                            f'(SELECT rowid FROM "{table}" ORDER BY rowid LIMIT {FIRST_EVENTS})')
            con.execute("VACUUM")
        finally:
            con.close()
        return copy.read_bytes()


def _capture_jax() -> tuple[bytes, str]:
    """The `.xplane.pb` bytes and the Chrome trace JSON of two annotated steps of a tiny jitted function."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def layer(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w) + 1

    x, w = jnp.ones((8, 16)), jnp.full((16, 4), 0.1)
    layer(x, w).block_until_ready()
    with tempfile.TemporaryDirectory(prefix="fuzz-jax-") as folder:
        with jax.profiler.trace(folder), jax.profiler.TraceAnnotation("measure"):
            for step in range(2):
                with jax.profiler.StepTraceAnnotation("train", step_num=step):
                    layer(x, w).block_until_ready()
        (xplane,) = Path(folder).rglob("*.xplane.pb")
        (chrome,) = Path(folder).rglob("*.trace.json.gz")
        return xplane.read_bytes(), gzip.decompress(chrome.read_bytes()).decode("utf-8")


HANDMADE_KINETO = {
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 85_000_000_000, "computeMajor": 9,
                          "computeMinor": 0, "maxThreadsPerBlock": 1024, "numSms": 132, "sharedMemPerBlock": 49152}],
    "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
    "displayTimeUnit": "ms",
    "baseTimeNanoseconds": 1_700_000_000_000_000_000,
    "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "MainThread"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 100, "dur": 400},
        {"ph": "X", "cat": "python_function", "name": "model.py(10): forward", "pid": 1, "tid": 1, "ts": 105,
         "dur": 300},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 110, "dur": 80,
         "args": {"External id": 1, "Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"],
                  "Sequence number": 5, "Fwd thread id": 0, "Record function id": 3}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 120, "dur": 10,
         "args": {"correlation": 9, "External id": 1, "cbid": 211}},
        {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": 140, "dur": 30,
         "args": {"correlation": 9, "External id": 1, "device": 0, "stream": 7, "grid": [1, 1, 1],
                  "block": [128, 1, 1], "registers per thread": 32, "shared memory": 0,
                  "est. achieved occupancy %": 12}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1, "ts": 200, "dur": 8,
         "args": {"correlation": 10}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
         "ts": 210, "dur": 5, "args": {"correlation": 10, "device": 0, "stream": 7, "bytes": 4096,
                                       "memory bandwidth (GB/s)": 0.8}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 220, "dur": 2,
         "args": {"device": 0, "stream": 7, "bytes": 512}},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "layer", "pid": 0, "tid": 7, "ts": 135, "dur": 40},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 112,
         "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": 256, "Total Allocated": 256,
                  "Total Reserved": 2048}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 300,
         "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": -256, "Total Allocated": 0,
                  "Total Reserved": 2048}},
        {"ph": "s", "id": 9, "pid": 1, "tid": 1, "ts": 120, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 9, "pid": 0, "tid": 7, "ts": 140, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "B", "name": "begin end", "pid": 1, "tid": 2, "ts": 200},
        {"ph": "E", "pid": 1, "tid": 2, "ts": 260},
        {"ph": "b", "cat": "async", "name": "request", "id": "0x1", "pid": 1, "tid": 1, "ts": 150},
        {"ph": "e", "cat": "async", "name": "request", "id": "0x1", "pid": 1, "tid": 1, "ts": 300},
        {"ph": "C", "name": "utilization", "pid": 0, "ts": 150, "args": {"value": 0.5, "other": 2}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 8, "ts": 400, "dur": 50,
         "args": {"device": 0, "stream": 8, "correlation": 11}},
    ],
}
"""A small Kineto trace with one record of each kind the reader handles."""

HANDMADE_XSPACE = """
planes {
  id: 1 name: "/host:CPU"
  lines { id: 11 name: "python" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 900000 }
    events { metadata_id: 2 offset_ps: 100000 duration_ps: 400000 stats { metadata_id: 1 int64_value: 0 } }
    events { metadata_id: 3 offset_ps: 150000 duration_ps: 300000 }
    events { metadata_id: 6 offset_ps: 160000 duration_ps: 100000 }
    events { metadata_id: 7 offset_ps: 200000 duration_ps: 10000 stats { metadata_id: 4 uint64_value: 9 } }
  }
  lines { id: 12 name: "tf_XLAPjRtCpuClient" timestamp_ns: 1100
    events { metadata_id: 4 offset_ps: 0 duration_ps: 200000 }
    events { metadata_id: 5 offset_ps: 10000 duration_ps: 50000
             stats { metadata_id: 2 str_value: "dot.1" } stats { metadata_id: 3 str_value: "jit_layer" }
             stats { metadata_id: 5 uint64_value: 4096 } stats { metadata_id: 6 uint64_value: 512 } }
  }
  event_metadata { key: 1 value { id: 1 name: "measure" } }
  event_metadata { key: 2 value { id: 2 name: "train" } }
  event_metadata { key: 3 value { id: 3 name: "PjitFunction(layer)" } }
  event_metadata { key: 4 value { id: 4 name: "ThunkExecutor::Execute" } }
  event_metadata { key: 5 value { id: 5 name: "dot.1" } }
  event_metadata { key: 6 value { id: 6 name: "$model.py:10 forward" } }
  event_metadata { key: 7 value { id: 7 name: "cuLaunchKernel" } }
  stat_metadata { key: 1 value { id: 1 name: "step_num" } }
  stat_metadata { key: 2 value { id: 2 name: "hlo_op" } }
  stat_metadata { key: 3 value { id: 3 name: "hlo_module" } }
  stat_metadata { key: 4 value { id: 4 name: "correlation_id" } }
  stat_metadata { key: 5 value { id: 5 name: "flops" } }
  stat_metadata { key: 6 value { id: 6 name: "bytes_accessed" } }
}
planes {
  id: 2 name: "/device:GPU:0"
  lines { id: 7 name: "Stream #7(Compute)" timestamp_ns: 1200
    events { metadata_id: 1 offset_ps: 0 duration_ps: 30000
             stats { metadata_id: 1 str_value: "regs:38 shm:0 grid:160,1,1 block:1024,1,1" }
             stats { metadata_id: 2 uint64_value: 9 } }
  }
  lines { id: 8 name: "Stream #8(MemcpyH2D)" timestamp_ns: 1250
    events { metadata_id: 2 offset_ps: 0 duration_ps: 5000 stats { metadata_id: 3 str_value: "num_bytes:4096" } }
  }
  lines { id: 9 name: "XLA Ops" timestamp_ns: 1200
    events { metadata_id: 3 offset_ps: 0 duration_ps: 30000 stats { metadata_id: 4 double_value: 1.5 } }
  }
  lines { id: 10 name: "Steps" timestamp_ns: 1200 events { metadata_id: 3 offset_ps: 0 duration_ps: 40000 } }
  event_metadata { key: 1 value { id: 1 name: "gemm_kernel" } }
  event_metadata { key: 2 value { id: 2 name: "MemcpyH2D" } }
  event_metadata { key: 3 value { id: 3 name: "dot.1" } }
  stat_metadata { key: 1 value { id: 1 name: "kernel_details" } }
  stat_metadata { key: 2 value { id: 2 name: "correlation_id" } }
  stat_metadata { key: 3 value { id: 3 name: "memcpy_details" } }
  stat_metadata { key: 4 value { id: 4 name: "flops" } }
  stat_metadata { key: 5 value { id: 5 name: "device_vendor" } }
  stats { metadata_id: 5 str_value: "Nvidia" }
}
planes {
  id: 3 name: "/device:TPU:0"
  lines { id: 1 name: "XLA Modules" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 10000000 stats { metadata_id: 1 str_value: "jit_f" } } }
  lines { id: 2 name: "XLA Ops" timestamp_ns: 1000
    events { metadata_id: 2 offset_ps: 1000000 duration_ps: 2000000 stats { metadata_id: 2 uint64_value: 4096 } } }
  event_metadata { key: 1 value { id: 1 name: "jit_f(1)" } }
  event_metadata { key: 2 value { id: 2 name: "fusion.1" } }
  stat_metadata { key: 1 value { id: 1 name: "hlo_module" } }
  stat_metadata { key: 2 value { id: 2 name: "flops" } }
}
"""
"""An XSpace with an XLA:CPU host plane, a GPU plane (streams, XLA ops, steps) and a TPU plane."""
