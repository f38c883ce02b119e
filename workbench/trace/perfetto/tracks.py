"""The tracks of a Perfetto trace (`TrackDescriptor`s) as workbench devices and track labels.

A process track whose name is an accelerator's (`cuda:0`, `rocm:1`, `tpu:0`, a host-qualified `host/cuda:0`)
is that device, and the tracks under it run on it; every other track is on `cpu`. A track's label is
`<device>/<its name>` (the workbench's own exports name tracks without the device: `stream 7` under `cuda:0`);
an unnamed thread is `thread <tid>` (`pid <pid>/thread <tid>` when several processes have threads), another
unnamed track `track <uuid>`. Two tracks never share a label: a repeated one gets ` #2`, ` #3`...
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DEVICE_NAME = re.compile(r"(?:.+/)?(?:cuda|rocm|tpu|xpu|mtia|hpu|xla|mps|gpu|npu|maia|privateuseone):\d+")
"""Names of process tracks that stand for an accelerator."""


@dataclass
class TrackInfo:
    """What the descriptors say about one track uuid."""

    name: str | None = None
    parent: int | None = None
    pid: int | None = None
    tid: int | None = None
    process: bool = False
    thread: bool = False
    counter: bool = False
    unit: str | None = None


@dataclass
class Tracks:
    """Every track uuid seen (described or only used), resolved to (device, label, pid, tid) on demand."""

    info: dict[int, TrackInfo] = field(default_factory=dict)
    _resolved: dict[int, tuple[str, str, int, int]] = field(default_factory=dict)

    def describe(self, uuid: int, described: TrackInfo) -> None:
        """Record a descriptor (a later one for the same uuid fills in what the first left out)."""
        known = self.info.get(uuid)
        if known is None:
            self.info[uuid] = described
            return
        for name in ("name", "parent", "pid", "tid", "unit"):
            if getattr(described, name) is not None:
                setattr(known, name, getattr(described, name))
        known.process |= described.process
        known.thread |= described.thread
        known.counter |= described.counter

    def _process(self, uuid: int) -> TrackInfo | None:
        """The process track `uuid` belongs to: itself, an ancestor, or the process of its thread's pid."""
        seen: set[int] = set()
        current: int | None = uuid
        pid = None
        while current is not None and current not in seen:
            seen.add(current)
            info = self.info.get(current)
            if info is None:
                break
            if info.process:
                return info
            pid = info.pid if pid is None else pid
            current = info.parent
        if pid is not None:
            return next((t for t in self.info.values() if t.process and t.pid == pid), None)
        return None

    def device(self, uuid: int) -> str:
        """The device the track `uuid` is on."""
        process = self._process(uuid)
        name = process.name if process is not None else None
        return name if name is not None and DEVICE_NAME.fullmatch(name) else "cpu"

    def resolve(self) -> dict[int, tuple[str, str, int, int]]:
        """(device, label, pid, tid) of every track, labels unique."""
        pids = {t.pid for t in self.info.values() if t.thread and t.pid is not None}
        used: dict[str, int] = {}
        out = {}
        for uuid in sorted(self.info):
            info = self.info[uuid]
            device = self.device(uuid)
            process = self._process(uuid)
            pid = info.pid if info.pid is not None else (process.pid if process and process.pid is not None else 0)
            tid = info.tid if info.tid is not None else 0
            if info.name:
                name = info.name
            elif info.thread:
                name = f"pid {pid}/thread {tid}" if len(pids) > 1 else f"thread {tid}"
            elif info.process:
                name = f"process {pid}"
            else:
                name = f"track {uuid}"
            label = name if name.startswith(f"{device}/") else f"{device}/{name}"
            if label in used:
                used[label] += 1
                label = f"{label} #{used[label]}"
            else:
                used[label] = 1
            out[uuid] = (device, label, pid, tid)
        return out
