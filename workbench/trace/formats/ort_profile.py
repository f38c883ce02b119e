"""ONNX Runtime's own profile (`SessionOptions.enable_profiling`) as a Trace, and its merge into a run's trace.

ORT writes a Chrome-trace JSON array of complete (`"ph": "X"`) events, times in microseconds from the moment
profiling started (`InferenceSession.get_profiling_start_time_ns()`, UTC epoch nanoseconds; the file itself
does not hold it):

- `"cat": "Session"`: `model_loading_uri` and `session_initialization` (setup, kind `annotation`), `model_run`
  (one `InferenceSession.run`, kind `op`) and the executor span inside it (`SequentialExecutor::Execute`,
  kind `op`), on the host thread's track `cpu/onnxruntime thread <tid>`;
- `"cat": "Node"`: `<node name>_kernel_time`, one graph node's kernel (kind `kernel`, named after the node),
  on its execution provider's device track `<device>/onnxruntime <provider>`, its `args` carrying `op_name`
  (the op type), `provider`, `node_index`, `thread` (the host thread that ran it, with its pool in
  `thread_pool`) and everything else ORT wrote (memory figures, per-thread scheduling stats); the input
  shapes and types go to `shapes` / `dtypes` as JSON arrays. Its `launcher` is the innermost `Session` span
  of the same thread enclosing it (the executor), so analyses place it in the step its run belongs to.
  ORT's `_fence_before` / `_fence_after` node events are kept as kind `other` on the same track;
- any other category (`Api` of GPU providers, ...) is kept as kind `other` on its thread's track.

Records that are no complete event object (not a dict, no numeric `ts`/`dur`) are left out and counted in
`metadata["reader"]["skipped"]`. A workbench run merges its profile into its torch.profiler trace
(`workbench.backends.onnxruntime.profile.merge_ort_profile`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from workbench.errors import TraceFormatError
from workbench.trace import schema
from workbench.trace.columns import dict_array, encode_strings
from workbench.trace.kineto.jsonerrors import syntax_problem
from workbench.trace.kineto.reader import open_trace_file
from workbench.trace.model import Trace
from workbench.trace.nesting import innermost_enclosing, nest_spans

FORMAT = "ort_profile"
"""The format name in the trace registry and in `metadata["source"]["format"]`."""

KERNEL_SUFFIX = "_kernel_time"
FENCE_SUFFIXES = ("_fence_before", "_fence_after")
SETUP_EVENTS = frozenset({"model_loading_uri", "model_loading_array", "session_initialization"})
"""Session events that prepare the session rather than run it (kind `annotation`)."""

PROVIDER_DEVICES = {"CPUExecutionProvider": "cpu"}
"""Execution provider → the device its kernels run on; any other provider runs on the GPU given to the
reader (`gpu`, default cuda:0)."""

_SNIFF = re.compile(rb'^\s*\[\s*\{\s*"cat"\s*:\s*"(?:Session|Node|Api)"')
_DECODER = msgspec.json.Decoder()


def looks_like_ort_profile(head: bytes) -> bool:
    """Whether a file's first bytes are ORT's profile: a JSON array whose first event has ORT's categories."""
    return _SNIFF.match(head.lstrip(b"\xef\xbb\xbf")) is not None


def _load(path: Path) -> list[Any]:
    """The decoded JSON array; TraceFormatError naming the problem."""
    with open_trace_file(path) as stream:
        try:
            text = stream.read()
        except (OSError, EOFError) as exc:
            raise TraceFormatError(path, f"cannot read: {exc}") from exc
    try:
        document = _DECODER.decode(text)
    except msgspec.DecodeError as exc:
        problem = syntax_problem(str(exc), text)
        where = "" if problem.offset is None else f" at byte {problem.offset:,}"
        raise TraceFormatError(path, f"not valid JSON: {problem.cause}{where}") from exc
    if not isinstance(document, list):
        raise TraceFormatError(path, "an ONNX Runtime profile is a JSON array of events, this is "
                                     f"{type(document).__name__}")
    return document


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def _shapes(args: dict[str, Any]) -> tuple[str | None, str | None]:
    """(shapes, dtypes) JSON arrays from ORT's `input_type_shape` ([{"float": [2, 8]}, ...])."""
    items = args.get("input_type_shape")
    if not isinstance(items, list) or not all(isinstance(i, dict) and len(i) == 1 for i in items):
        return None, None
    dtypes = [next(iter(i)) for i in items]
    shapes = [next(iter(i.values())) for i in items]
    return json.dumps(shapes, separators=(",", ":")), json.dumps(dtypes, separators=(",", ":"))


def _thread(args: dict[str, Any], tid: int) -> dict[str, Any]:
    """The thread fields a kernel's args gain: the host thread and, when ORT says, its pool."""
    stats = args.get("thread_scheduling_stats")
    main = stats.get("main_thread") if isinstance(stats, dict) else None
    pool = main.get("thread_pool_name") if isinstance(main, dict) else None
    return {"thread": tid, **({"thread_pool": pool} if pool else {})}


def ort_profile_trace(records: list[Any], *, gpu: str = "cuda:0", file: str | None = None,
                      origin_ns: int = 0) -> Trace:
    """The Trace of ORT profile `records` (the decoded JSON array; see the module docstring). Times count
    from the profile's start; `origin_ns` (its UTC epoch time, when known) goes to the metadata."""
    skipped: dict[str, int] = {}
    rows: list[tuple[int, int, str, str, str, str, int, int, str | None, str | None, str]] = []
    for record in records:
        if not isinstance(record, dict):
            skipped["records that are not objects"] = skipped.get("records that are not objects", 0) + 1
            continue
        ts, dur = record.get("ts"), record.get("dur")
        if not (_number(ts) and _number(dur)) or dur < 0:
            skipped["records without numeric ts and dur >= 0"] = skipped.get("records without numeric ts "
                                                                             "and dur >= 0", 0) + 1
            continue
        name, cat = str(record.get("name", "")), str(record.get("cat", ""))
        pid, tid = int(record.get("pid") or 0), int(record.get("tid") or 0)
        args = record.get("args") if isinstance(record.get("args"), dict) else {}
        extra = {k: v for k, v in record.items() if k not in ("name", "cat", "pid", "tid", "ts", "dur", "ph", "args")}
        shapes = dtypes = None
        host_track = f"cpu/onnxruntime thread {tid}"
        if cat == "Node" and name.endswith((KERNEL_SUFFIX, *FENCE_SUFFIXES)):
            provider = str(args.get("provider", "CPUExecutionProvider"))
            device = PROVIDER_DEVICES.get(provider, gpu)
            track = f"{device}/onnxruntime {provider}"
            if name.endswith(KERNEL_SUFFIX):
                kind, name = "kernel", name.removesuffix(KERNEL_SUFFIX)
                shapes, dtypes = _shapes(args)
                args = {"op_name": args.get("op_name"), "provider": provider, "node_index": args.get("node_index"),
                        **_thread(args, tid), **args}
            else:
                kind = "other"
        elif cat == "Session":
            kind, device, track = ("annotation" if name in SETUP_EVENTS else "op"), "cpu", host_track
        else:
            kind, device, track = "other", "cpu", host_track
        text = json.dumps({"cat": cat, **extra, **args}, separators=(",", ":"), default=str)
        rows.append((round(ts * 1000), round(dur * 1000), name, kind, device, track, pid, tid, shapes, dtypes, text))
    return _trace(rows, file, origin_ns, skipped)


def _trace(rows: list[tuple], file: str | None, origin_ns: int, skipped: dict[str, int]) -> Trace:
    n = len(rows)
    start, dur, names, kinds, devices, tracks, pids, tids, shapes, dtypes, args = (
        list(column) for column in zip(*rows, strict=True)) if rows else ([[] for _ in range(11)])
    start_ns, dur_ns = np.asarray(start, dtype=np.int64), np.asarray(dur, dtype=np.int64)
    track_codes, track_labels = encode_strings(tracks)
    parent, depth = nest_spans(track_codes, start_ns, dur_ns)
    kind_codes = np.asarray([schema.KIND_CODES[k] for k in kinds], dtype=np.int32)
    launcher = np.full(n, -1, dtype=np.int64)
    is_kernel = kind_codes == schema.KIND_CODES["kernel"]
    if is_kernel.any():
        code_of = {label: code for code, label in enumerate(track_labels)}
        host_codes = np.asarray([code_of.get(f"cpu/onnxruntime thread {t}", -1) for t in tids], dtype=np.int32)
        host_spans = kind_codes == schema.KIND_CODES["op"]
        found = innermost_enclosing(host_codes[is_kernel], start_ns[is_kernel], track_codes, start_ns, dur_ns,
                                    parent, host_spans)
        launcher[is_kernel] = found
    name_codes, name_labels = encode_strings(names)
    device_codes, device_labels = encode_strings(devices)
    events = pa.table({
        "start_ns": start_ns, "dur_ns": dur_ns, "name": dict_array(name_codes, name_labels),
        "kind": dict_array(kind_codes, list(schema.KINDS)), "device": dict_array(device_codes, device_labels),
        "track": dict_array(track_codes, track_labels), "pid": np.asarray(pids, dtype=np.int64),
        "tid": np.asarray(tids, dtype=np.int64), "corr": np.full(n, -1, dtype=np.int64), "parent": parent,
        "depth": depth, "launcher": launcher, "flops": np.full(n, np.nan), "bytes": np.full(n, np.nan),
        "shapes": pa.array(shapes, pa.string()), "dtypes": pa.array(dtypes, pa.string()),
        "args": pa.array(args, pa.string()),
    }, schema=schema.EVENTS)
    metadata = {"source": {"format": FORMAT, "file": file}, "origin_ns": origin_ns,
                "reader": {"events": n, "memory": 0, "counters": 0, "skipped": skipped}}
    return Trace(events=events, metadata=metadata)


def read_ort_profile(path: str | os.PathLike[str], *, gpu: str = "cuda:0", origin_ns: int = 0) -> Trace:
    """Read an ORT profile JSON file (gzip or not); TraceFormatError for one that is not."""
    path = Path(path)
    return ort_profile_trace(_load(path), gpu=gpu, file=str(path), origin_ns=origin_ns)
