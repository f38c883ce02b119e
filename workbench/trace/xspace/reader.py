"""Reader for XSpace profiles (`<host>.xplane.pb`, written by `jax.profiler.trace` / XProf) into a `Trace`.

Parsed with `jax.profiler.ProfileData` (jax is imported on first use), plane by plane:

| source                                        | goes to                                                   |
|-----------------------------------------------|-----------------------------------------------------------|
| `/device:TPU:N`, `/device:GPU:N` planes       | device `tpu:N` / `cuda:N` (`rocm:N` for AMD), track       |
|                                               | `<device>/<line name>`; kind by line (`xspace_device`):   |
|                                               | GPU `Stream #N(...)` lines → `kernel` / `memcpy` /        |
|                                               | `memset`, `XLA Modules` → `module`, `XLA Ops` → `hlo`,    |
|                                               | `TensorFlow Ops` → `op`, `Steps` and name scopes →        |
|                                               | `annotation`, other lines → `other`                       |
| host planes (`/host:CPU`): one track per line | device `cpu`, track `cpu/<line name>` (`python`,          |
| (thread), kind per event:                     | `tf_XLAPjRtCpuClient/...`):                               |
|   stat `correlation_id` (a CUDA launch/copy)  |   `runtime`                                               |
|   stat `hlo_op` / only `hlo_module`           |   `hlo` / `module` (XLA:CPU runs ops on host threads)     |
|   `ThunkExecutor::Execute` around hlo events  |   `module`, named after the ops' `hlo_module` (XLA:CPU)   |
|   name `$file:line function`                  |   `python` on `<track>/python tracer` (Python frames do   |
|                                               |   not nest with the thread's TraceMe ranges)              |
|   stat `step_num` or `_r` (step root)         |   `annotation` (`StepTraceAnnotation`)                    |
|   a range enclosing an annotation or a        |   `annotation` (`TraceAnnotation`, see below)             |
|   `PjitFunction(...)` call                    |                                                           |
|   any other range                             |   `op` (JAX / PjRt / XLA runtime TraceMe)                 |
| other planes' lines (`/host:CUPTI` driver     | device `cpu`, track `cpu/<plane name>/<line name>`,       |
| API calls...)                                 | `runtime` with stat `correlation_id`, else `other`        |
| plane stats (`/host:metadata` versions,       | `metadata["planes"][<plane name>]`; a device plane's      |
| `Task Environment` profile start/stop...)     | capabilities also in `metadata["devices"]`                |
| event stats `flops`, `bytes_accessed`,        | `flops`, `bytes`, `corr`                                  |
| `correlation_id`                              |                                                           |
| every other event stat (`hlo_op`,             | `args` JSON (a stat given twice keeps both, as a list)    |
| `hlo_module`, `program_id`, `long_name`...)   |                                                           |

A plain `TraceAnnotation` carries no stat that tells it from the runtime's own TraceMe ranges, so a
range whose name has no `::` or `(` counts as an annotation when it encloses another annotation or
a jitted call; one enclosing neither reads as `op`.

Times are integer ns from the earliest event (`metadata["origin_ns"]` is that event's time on the
profile's clock). Nothing is changed silently: `metadata["reader"]["skipped"]` counts the events left out
because their start or end is not within ±2**62 ns, negative durations (kept as 0), and stats left out
because jax cannot decode their value (bytes that are not UTF-8 where it expects text); a correlation id
that is no int64 stays in args. What jaxlib's C++ logs to stderr while reading (protobuf's complaints
about a damaged file) is kept out of the terminal: it ends the error of a file that cannot be read, and is
in `metadata["reader"]["warnings"]` for one that can.

A folder is read as a TensorBoard log: the run folder itself (`plugins/profile/<run>/`) or a `logdir` /
`plugins/profile` above it, whose newest run (by name: runs are named by timestamp) is read. A run with
several hosts' files reads them all, host tracks then naming the host (`cpu/<host>/python`) and devices
too (`<host>/cuda:4`, track `<host>/cuda:4/Stream #134(Compute)`), so two hosts' GPU 4 stay apart; the
device column stays `cuda:N` / `tpu:N` for a single host. `pid` is the file's index among the run's hosts
(0 for one file), `tid` the line's index in its plane. `corr` is the CUPTI correlation id (counted per
process, so it links rows with the same `pid` only); a GPU kernel's or copy's `launcher` is the host op
(else annotation) around the runtime call with its correlation id on that host
(`workbench.trace.launches`). TPU work has no correlation ids (XSpace links it by run ids, kept in args).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from workbench.errors import MissingDependency, TraceFormatError
from workbench.trace import schema
from workbench.trace.columns import dict_array, encode_strings, grouped
from workbench.trace.launches import launchers, per_process
from workbench.trace.model import Trace
from workbench.trace.nesting import DEPTH_LIMIT, nest_spans
from workbench.trace.progress import advance
from workbench.trace.schema import KIND_CODES, TIME_LIMIT_NS
from workbench.trace.xspace.device import (
    device_properties,
    line_kind,
    plane_device,
    stream_event_details,
    stream_event_kind,
    stream_types,
    sub_plane,
)
from workbench.trace.xspace.xla_host import (
    CORRELATION,
    HOST_PLANE,
    PYTHON_LANE,
    host_kind,
    mark_annotations,
    xla_cpu_modules,
)

SUFFIX = ".xplane.pb"
FAR_TIMES = "events whose start or end is not within ±2**62 ns (left out)"
NEGATIVE_DURATION = "events with a negative duration (kept, duration 0)"
NOT_UTF8_STATS = "stats whose value is bytes that are not UTF-8 text (left out)"
_LOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] ")
"""The prefix of a line jaxlib's C++ logs (`E1203 10:34:37.354020  12095 wire_format_lite.cc:578] `)."""


def read_xspace(path: str | os.PathLike[str]) -> Trace:
    """Read an `.xplane.pb` file, or the newest run of a TensorBoard-style folder, into a `Trace`."""
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(path, "no such file or folder")
    files = run_files(path) if path.is_dir() else [path]
    if not files:
        raise TraceFormatError(path, f"a folder with no {SUFFIX} file (in it, a run folder or plugins/profile/*)")
    reader = _Reader(path, files)
    for index, file in enumerate(files):
        logged: list[str] = []
        try:
            with native_stderr(logged):
                reader.add(index, file, _load(file))
        except TraceFormatError as exc:
            if not logged:
                raise
            raise TraceFormatError(file, f"{exc.problem}; jax logged: {logged[-1]}") from exc
        reader.warnings += [f"{file.name}: jax logged: {line}" + (f" ({n} times)" if n > 1 else "")
                            for line, n in Counter(logged).items()]
    return reader.trace()


@contextmanager
def native_stderr(lines: list[str]) -> Iterator[None]:
    """Collect into `lines` what native code (jaxlib's protobuf parser and profiler, in C++) writes to the
    process's stderr while the block runs, its log prefixes cut, rather than letting it print around the
    command's own one-line error or output (Python's own writes to `sys.stderr` are not affected)."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to guard
        yield
        return
    with tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", "replace")
            lines += [_LOG_PREFIX.sub("", line).strip() for line in text.splitlines() if line.strip()]


def run_files(folder: Path) -> list[Path]:
    """The `.xplane.pb` files of the folder's run: its own, or those of the newest run below it."""
    candidates = [folder, *sorted(folder.glob("*")), *sorted(folder.glob("plugins/profile/*"))]
    runs = [d for d in candidates if d.is_dir() and any(d.glob(f"*{SUFFIX}"))]
    if not runs:
        return []
    run = runs[0] if runs[0] == folder else max(runs, key=lambda d: d.name)
    return sorted(p for p in run.glob(f"*{SUFFIX}") if p.is_file())


def accepts_dir(folder: Path) -> bool:
    """Whether the folder holds an XSpace run (for the registry's folder dispatch)."""
    return bool(run_files(folder))


def looks_like_xspace(head: bytes) -> bool:
    """An XSpace message starts with its first plane (field 1), whose first field is `id` or `name`."""
    if head[:1] != b"\x0a":
        return False
    at = 1
    while at < len(head) and head[at] & 0x80:  # the plane's length, a varint
        at += 1
    return head[at + 1:at + 2] in (b"\x08", b"\x12")


def _load(file: Path) -> Any:
    """The `ProfileData` of one file; a file that jax cannot parse or that holds no plane is an error."""
    try:
        from jax.profiler import ProfileData
    except ImportError as exc:
        raise MissingDependency("jax", "jax") from exc
    try:
        data = ProfileData.from_file(str(file))
    except Exception as exc:  # jaxlib raises RuntimeError or JaxRuntimeError, nothing narrower
        raise TraceFormatError(file, f"not a readable XSpace ({' '.join(str(exc).split())})") from exc
    if not any(True for _ in data.planes):
        raise TraceFormatError(file, "an XSpace with no planes (empty or not an XSpace)")
    return data


class _Reader:
    """Collects the events of one or more XSpaces (one per host) into the Trace tables."""

    def __init__(self, path: Path, files: list[Path]) -> None:
        self.path = path
        self.files = files
        self.multi_host = len(files) > 1
        self.start: list[float] = []
        self.dur: list[float] = []
        self.name: list[str] = []
        self.kind: list[int] = []
        self.device: list[str] = []
        self.track: list[str] = []
        self.pid: list[int] = []
        self.tid: list[int] = []
        self.corr: list[int] = []
        self.flops: list[float] = []
        self.bytes: list[float] = []
        self.args: list[str | None] = []
        self.classify: list[bool] = []  # host ranges whose kind waits for nesting (op or annotation)
        self.planes: dict[str, dict[str, Any]] = {}
        self.devices: dict[str, dict[str, Any]] = {}
        self.lines: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.warnings: list[str] = []
        self.repeats: Counter[tuple[str, float, float]] = Counter()  # runs of identical spans per track
        self.file = path

    def add(self, index: int, file: Path, data: Any) -> None:
        """Append the events of one host's XSpace."""
        host = file.name.removesuffix(SUFFIX)
        self.file = file
        try:
            self._add_planes(index, host, data)
        except UnicodeDecodeError as exc:  # a name that is not UTF-8 (jax decodes every string it hands out)
            raise TraceFormatError(file, f"not a readable XSpace (a name that is not UTF-8 text: {exc})") from exc

    def _add_planes(self, index: int, host: str, data: Any) -> None:
        planes = list(data.planes)
        for done, plane in enumerate(planes):
            advance(self.file, done, len(planes), "planes")
            stats = self._stats(plane.stats)
            if stats:
                self.planes[f"{host}{plane.name}" if self.multi_host else plane.name] = stats
            device = plane_device(plane.name, stats, host if self.multi_host else None)
            if device is not None and stats:
                self.devices.setdefault(device, device_properties(device, stats))
            for tid, line in enumerate(plane.lines):
                if device is not None:
                    kind = line_kind(line.name)
                    lane = "/".join([device, *sub_plane(plane.name), line.name])
                    self._line(line, kind, device, lane, index, tid,
                               stream=stream_types(line.name) if kind is None else None)
                    continue
                where = [host] if self.multi_host else []
                if plane.name != HOST_PLANE:
                    where.append(plane.name.strip("/"))
                self._line(line, None if plane.name == HOST_PLANE else "other", "cpu",
                           "/".join(["cpu", *where, line.name]), index, tid)

    def _line(self, line: Any, kind: str | None, device: str, track: str, pid: int, tid: int,
              stream: frozenset[str] | None = None) -> None:
        """Append one line's events. `kind` None picks it per event: by the line's event types on a device's
        stream line (`stream` given), else as on a host thread; a host event with a correlation id is `runtime`."""
        n = run = 0
        last: tuple[str, float, float] = (track, np.nan, np.nan)
        for event in line.events:
            start, dur = event.start_ns, event.duration_ns
            if not (abs(start) < TIME_LIMIT_NS and abs(start + max(dur, 0)) < TIME_LIMIT_NS):  # NaN too
                self.skipped[FAR_TIMES] += 1
                continue
            if dur < 0:
                self.skipped[NEGATIVE_DURATION] += 1
            n += 1
            stats = self._stats(event.stats)
            corr = stats.pop(CORRELATION) if _is_id(stats.get(CORRELATION)) else -1
            size = np.nan
            if stream is not None:
                event_kind: str | None = stream_event_kind(event.name, stats, stream)
                stats, size = stream_event_details(event_kind, stats)
            elif device == "cpu" and corr >= 0:
                event_kind = "runtime"
            else:
                event_kind = kind or host_kind(event.name, stats)
            self.start.append(start)
            self.dur.append(dur)
            self.name.append(event.name)
            self.classify.append(event_kind is None)
            self.kind.append(KIND_CODES[event_kind or "op"])
            lane = f"{track}{PYTHON_LANE}" if event_kind == "python" and kind is None else track
            self.track.append(lane)
            if start == last[1] and dur == last[2] and lane == last[0]:
                run += 1
            else:
                self._repeated(line.name, last, run)
                last, run = (lane, start, dur), 1
            self.corr.append(corr)
            self.flops.append(_number(stats, "flops"))
            moved = _number(stats, "bytes_accessed")
            self.bytes.append(size if np.isnan(moved) else moved)
            self.args.append(json.dumps(stats, ensure_ascii=False) if stats else None)
        self._repeated(line.name, last, run)
        self.device.extend([device] * n)
        self.pid.extend([pid] * n)
        self.tid.extend([tid] * n)
        self.lines[track] += n

    def _repeated(self, line: str, span: tuple[str, float, float], run: int) -> None:
        """Count a run of `run` identical spans (track, start, duration), adding those of earlier lines with
        the same name: identical spans nest as a chain, so once there are too many for the depth column the
        file is refused here, without reading the rest of it (`_check_depth` catches any other deep nesting)."""
        track, start, dur = span
        if run < 2 or round(dur) <= 0:  # spans of length 0 (once rounded to ns) do not nest
            return
        self.repeats[span] += run
        if self.repeats[span] > DEPTH_LIMIT:  # the last of them would be DEPTH_LIMIT deep
            raise TraceFormatError(self.file, (
                f"line {line!r} (track {track}) repeats one event (start {start:.0f} ns, {dur:.0f} ns long) "
                f"{self.repeats[span]:,} times or more: identical events nest, each inside the one before, "
                f"deeper than the {DEPTH_LIMIT:,} levels a trace holds"))

    def trace(self) -> Trace:
        raw_start = np.asarray(self.start, dtype=np.float64)
        origin = float(raw_start.min()) if len(raw_start) else 0.0
        start = np.rint(raw_start - origin).astype(np.int64)
        dur = np.maximum(np.rint(np.asarray(self.dur, dtype=np.float64)), 0).astype(np.int64)
        track, track_labels = encode_strings(self.track)
        device, device_labels = encode_strings(self.device)
        parent, depth = nest_spans(track, start, dur)
        self._check_depth(depth, track, track_labels, start)
        kind = mark_annotations(np.asarray(self.kind, dtype=np.int8), np.asarray(self.classify, dtype=bool),
                            np.asarray(self.name, dtype=object), parent, depth)
        xla_cpu_modules(kind, self.name, self.args, parent)
        name, name_labels = encode_strings(self.name)
        n = len(start)
        pid = np.asarray(self.pid, dtype=np.int64)
        corr = np.asarray(self.corr, dtype=np.int64)
        events = pa.table(
            {
                "start_ns": start,
                "dur_ns": dur,
                "name": dict_array(name, name_labels),
                "kind": dict_array(kind, list(schema.KINDS)),
                "device": dict_array(device, device_labels),
                "track": dict_array(track, track_labels),
                "pid": pid,
                "tid": np.asarray(self.tid, dtype=np.int64),
                "corr": corr,
                "parent": parent,
                "depth": depth,
                "launcher": launchers(kind, per_process(pid, corr), parent),
                "flops": np.asarray(self.flops, dtype=np.float64),
                "bytes": np.asarray(self.bytes, dtype=np.float64),
                "shapes": pa.nulls(n, pa.string()),
                "dtypes": pa.nulls(n, pa.string()),
                "args": pa.array(self.args, pa.string()),
            },
            schema=schema.EVENTS,
        )
        return Trace(events=events, metadata=self._metadata(round(origin), n))

    def _check_depth(self, depth: np.ndarray, track: np.ndarray, labels: list[str], start: np.ndarray) -> None:
        """Refuse a trace whose spans nest deeper than the depth column holds (`nest_spans` caps them)."""
        if not len(depth) or int(depth.max()) < DEPTH_LIMIT:
            return
        row = int(np.argmax(depth))
        raise TraceFormatError(self.path, (
            f"events on track {labels[track[row]]} nest {DEPTH_LIMIT:,} or more levels deep (at {start[row]} ns "
            f"from the start), deeper than a trace holds"))

    def _metadata(self, origin_ns: int, n_events: int) -> dict[str, Any]:
        return {
            "source": {"format": "xspace", "file": str(self.path),
                       "files": [str(f) for f in self.files],
                       "bytes": sum(f.stat().st_size for f in self.files)},
            "origin_ns": origin_ns,
            "hosts": [f.name.removesuffix(SUFFIX) for f in self.files],
            "planes": self.planes,
            "devices": list(self.devices.values()),
            "reader": {"events": n_events, "memory": 0, "counters": 0, "lines": dict(self.lines),
                       "skipped": {k: v for k, v in self.skipped.items() if v}, "warnings": self.warnings},
        }

    def _stats(self, stats: Any) -> dict[str, Any]:
        """Stats as a dict (bytes as hex); a name given more than once keeps all its values, as a list. A stat
        whose value jax cannot decode (bytes that are not UTF-8 where it expects text) is left out, counted."""
        pairs = []
        values = iter(stats)
        while True:
            try:
                key, value = next(values)
            except StopIteration:
                return grouped(pairs)
            except UnicodeDecodeError:  # jax has moved past the stat already
                self.skipped[NOT_UTF8_STATS] += 1
                continue
            pairs.append((key, value.hex() if isinstance(value, bytes) else value))


def _is_id(value: Any) -> bool:
    """Whether a stat is usable as a correlation id (an int64 integer; others stay in args)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _number(stats: dict[str, Any], key: str) -> float:
    """Pop a numeric stat for a column (NaN if absent); a value that is no number stays in args."""
    value = stats.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(stats.pop(key))
    return np.nan
