"""Hidden scratch entries of a traces root, named after the process that owns them.

Writers assemble bundles, experiment records and profiler output in hidden entries of the traces root
and rename them into place once complete. A process killed with SIGKILL cannot remove its own, so every
such name says who owns it:

    .<kind>-<label>-<owner>-<8 hex>[.json]      owner = <host>.<boot>.<pid>.<start>

`host` and `boot` are short hashes of the host name and of the kernel's boot id, `start` is the
process's start time in clock ticks since boot (it tells a reused pid from the owner); a part the
platform cannot tell is 0. `owner_gone(name)` is true only when the owner certainly no longer runs: it ran
on this host, in an earlier boot or under a pid that has exited (or now belongs to a process started at
another time). Entries of a live process, of another host (a shared file system) and of older workbench
versions (names without an owner) are never touched.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import socket
from functools import cache
from pathlib import Path

KINDS = ("tmp", "profile", "staging", "deleting")
"""What a scratch entry is: a bundle or record being written, a profiler's output, a group of bundles
waiting for their experiment record (`workbench.trace.store.staging`), a bundle being deleted."""

_UNKNOWN = "0"
_NAME_RE = re.compile(rf"\.(?P<kind>{'|'.join(KINDS)})-(?P<label>.+)-(?P<host>[0-9a-f]+)\.(?P<boot>[0-9a-f]+)"
                      r"\.(?P<pid>\d{1,10})\.(?P<start>\d{1,20})-[0-9a-f]{8}(?:\.json)?")
_PROC = Path("/proc")


def scratch_name(kind: str, label: str, suffix: str = "") -> str:
    """A fresh hidden name of `kind` (one of KINDS) for `label` (a run or experiment id), owned by this
    process, e.g. `.tmp-20261203-tiny-gpt-eager-3f9a-4be1c0.9a01f2.4242.1876543-0c1d2e3f`."""
    if kind not in KINDS:
        raise ValueError(f"unknown scratch kind {kind!r}")
    return f".{kind}-{label}-{_owner(os.getpid())}-{secrets.token_hex(4)}{suffix}"


def make_scratch_dir(parent: Path, kind: str, label: str) -> Path:
    """Create and return a fresh scratch folder of `kind` in `parent` (which must exist)."""
    path = parent / scratch_name(kind, label)
    path.mkdir()
    return path


def scratch_kind(name: str) -> str | None:
    """The kind of the scratch entry called `name`, or None when it is no owned scratch entry."""
    match = _NAME_RE.fullmatch(name)
    return match["kind"] if match else None


def owner_gone(name: str) -> bool:
    """Whether `name` is a scratch entry whose owner process certainly no longer runs (module docstring)."""
    match = _NAME_RE.fullmatch(name)
    if match is None or match["host"] != _host():
        return False
    if match["boot"] != _boot() and _UNKNOWN not in (match["boot"], _boot()):
        return True
    return not _running(int(match["pid"]), int(match["start"]))


def remove_entry(path: Path) -> None:
    """Remove a scratch file or folder, ignoring what is already gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _owner(pid: int) -> str:
    return f"{_host()}.{_boot()}.{pid}.{_start_time(pid) or _UNKNOWN}"


@cache
def _host() -> str:
    return _short_hash(socket.gethostname())


@cache
def _boot() -> str:
    try:
        return _short_hash((_PROC / "sys/kernel/random/boot_id").read_text().strip())
    except OSError:
        return _UNKNOWN


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def _running(pid: int, start: int) -> bool:
    """Whether process `pid`, started at `start` (0: unknown), still runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        pass  # another user's process
    stat = _proc_stat(pid)
    if stat is not None:
        state, started = stat
        return state not in ("Z", "X") and (start == 0 or started == start)
    return start == 0 or _start_time(pid) in (None, start)


def _start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, or centiseconds since the epoch where there is no
    /proc but psutil is installed); None where that cannot be told."""
    stat = _proc_stat(pid)
    if stat is not None:
        return stat[1]
    try:
        import psutil
    except ImportError:
        return None
    try:
        return int(psutil.Process(pid).create_time() * 100)
    except (psutil.Error, OSError):
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """The state letter and start time of `pid` from /proc/<pid>/stat; None where unreadable."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the command name in parentheses may hold spaces
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None
