"""Native profilers' log lines kept off the user's terminal and notebook.

Kineto (under torch.profiler) prints `USDT:... profiler_start` / `STAGE:...` lines, and XLA and TensorFlow print
glog-style lines (`I1203 14:00:48.123456 1234 file.cc:12] ...`, `2026-12-03 14:00:48.123456: W file.cc:12] ...`)
from C++ straight to file descriptors 1 and 2; no environment variable silences Kineto's. So while a profiler
session runs, `NativeChatter` points both descriptors at pipes and a thread copies what arrives to where they
pointed before, leaving out those lines. Everything else (the CLI's progress bars and JSON progress lines, the
user's own prints) passes through as it comes; a partial line that starts like a log line waits for its end.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

CHATTER = re.compile(
    rb"(?:USDT|STAGE|INFO|WARNING|ERROR):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\] "  # Kineto
    rb"|[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] "  # glog / absl (XLA, jaxlib)
    rb"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] \S+:\d+\] "  # TensorFlow's own logger
    rb"|[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] "  # absl before InitializeLog: `E0000 00:00:1796422448.5 ...]`
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    rb"|ERROR: External init callback must run in same thread as registerClient \("  # Kineto off the main thread
)
"""The start of a native log line that is chatter. Fatal lines (`F...`) are never left out."""
_MAY_BE_CHATTER = re.compile(rb"[A-Z0-9]")
"""How a partial line that might become chatter starts (escape codes, `\\r` and `{` pass at once)."""
_DRAIN_S = 5.0
"""Seconds to wait for the copying thread at the end (a child process may still hold the pipe)."""


class NativeChatter:
    """Filter native log lines out of fds 1 and 2 from construction until `close()` (idempotent); a descriptor
    that cannot be duplicated is left alone."""

    def __init__(self, fds: tuple[int, ...] = (1, 2)) -> None:
        self._pumps: list[_Pump] = []
        for fd in fds:
            try:
                self._pumps.append(_Pump(fd))
            except OSError:
                continue

    @classmethod
    def off(cls) -> NativeChatter:
        """One that filters nothing (for a session not started yet)."""
        return cls(fds=())

    def close(self) -> None:
        """Point the descriptors back where they were, after copying what is still in the pipes."""
        pumps, self._pumps = self._pumps, []
        _flush_python_streams()
        for pump in pumps:
            pump.close()

    def __enter__(self) -> NativeChatter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Pump:
    """One descriptor pointed at a pipe whose lines a thread copies, chatter left out, to its old target."""

    def __init__(self, fd: int) -> None:
        _flush_python_streams()
        self.fd = fd
        self.target = os.dup(fd)
        read, write = os.pipe()
        try:
            os.dup2(write, fd)
        except OSError:
            for end in (read, write, self.target):
                os.close(end)
            raise
        os.close(write)
        self.read = read
        self.thread = threading.Thread(target=self._copy, name=f"native-chatter-{fd}", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        pending = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(self.read, 1 << 16):
                *lines, pending = (pending + chunk).split(b"\n")
                kept = b"".join(line + b"\n" for line in lines if not CHATTER.match(line))
                if pending and not _MAY_BE_CHATTER.match(pending):
                    kept, pending = kept + pending, b""
                self._write(kept)
        if pending and not CHATTER.match(pending):
            self._write(pending)

    def _write(self, data: bytes) -> None:
        while data:
            data = data[os.write(self.target, data):]

    def close(self) -> None:
        os.dup2(self.target, self.fd)  # closes the pipe's write end: the thread reads to its end and stops
        self.thread.join(_DRAIN_S)
        os.close(self.read)
        if not self.thread.is_alive():
            os.close(self.target)


def _flush_python_streams() -> None:
    """Flush Python's buffered writes to the descriptors, so they land before the switch."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
