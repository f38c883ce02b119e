"""Known chatter of the libraries under the workbench kept out of a notebook's outputs: `quiet()`, the first line
of a notebook (before torch or jax load), as every notebook in notebooks/ does:

    from workbench.quiet import quiet
    quiet()

It turns off, by name, only what is known to be noise, so the user's own warnings, log records and errors, and a
library's real ones, still show:

- environment variables the native libraries read when they load (`ENVIRONMENT`: XLA's INFO and WARNING lines),
  set only where unset;
- `warnings` filters for known deprecations, matched by message and the module that warns (`WARNINGS`);
- filters on the loggers that log known noise, matched by message (`LOG_RECORDS`), and the `absl` logger's level;
- in a Jupyter kernel, the native log lines that C++ writes straight to file descriptors 1 and 2 (Kineto's
  `USDT:`/`ERROR:... gpuGetDeviceCount failed`, absl's `E0000 00:00:...` lines of XProf's converters), left out
  as `workbench.profiling.quiet.NativeChatter` (whose pump this reuses) leaves them out of the CLI's profiled
  runs, for the life of the process (`NATIVE`: the CLI's `CHATTER` and a few more). In a kernel Python's own
  `sys.stderr` does not pass through the descriptors, so a Python warning or log line is never taken for
  native chatter.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import warnings

from workbench.profiling.quiet import _MAY_BE_CHATTER, CHATTER, _flush_python_streams, _Pump

ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "2"}
"""Read by XLA (jaxlib) and TensorFlow when they load: leave out their INFO and WARNING lines."""

WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (Warning, r".*register_constant\(\).*deprecated", r"torch\."),  # torchao on torch's _pytree
    (Warning, r".*_register_pytree_node is deprecated", r"torch\.|torchao\."),
    (UserWarning, r".*does not implement _stable_hash_for_caching", r"torch\."),  # torchao's int8 tensors, compiled
)
"""(category, message regex, regex of the warning module) of the known deprecation warnings."""

LOG_RECORDS: tuple[tuple[str, str], ...] = (
    ("torch.utils._pytree", r".*register_constant\(\) on Enum subclasses is deprecated"),  # torchao's enums
    ("torch.utils.cpp_extension", r"No CUDA runtime is found"),  # inductor on a CPU-only machine
)
"""(logger, message regex) of the known noisy log records (torch logs them glog-style: `W1204 12:00:00 ...]`)."""

NATIVE = re.compile(
    CHATTER.pattern
    + rb"|[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] "  # absl before InitializeLog: `E0000 00:00:1796422448.5 ...]`
    + rb"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    + rb"|ERROR: External init callback must run in same thread as registerClient \("  # Kineto off the main thread
)
"""The start of a native log line that is chatter; fatal lines (`F...`) are never left out."""

_pumps: list[_Pump] | None = None
"""The kernel-wide filters of fds 1 and 2, once installed (they last as long as the process)."""


def quiet(*, native: bool | None = None) -> None:
    """Keep the known chatter out of this process's outputs from now on (idempotent). `native` filters the
    native log lines on file descriptors 1 and 2 too; by default only in a Jupyter kernel, where Python's own
    streams do not pass through them."""
    global _pumps
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    for category, message, module in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, message in LOG_RECORDS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.pattern.pattern == message for f in logger.filters):
            logger.addFilter(_DropMessage(message))
    absl = logging.getLogger("absl")
    if absl.level == logging.NOTSET:
        absl.setLevel(logging.WARNING)
    if native is None:
        native = "ipykernel" in sys.modules
    if native and _pumps is None:
        _pumps = []
        for fd in (1, 2):
            try:
                _pumps.append(_NativePump(fd))
            except OSError:  # a descriptor that cannot be duplicated is left alone
                continue
        atexit.register(_restore, _pumps)


def _restore(pumps: list[_Pump]) -> None:
    """At exit: point the descriptors back, after copying what is still in the pipes."""
    _flush_python_streams()
    for pump in pumps:
        pump.close()


class _DropMessage(logging.Filter):
    """Drops the records whose message matches `pattern` from its start."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot be formatted is not ours to judge
            return True
        return not self.pattern.match(message)


class _NativePump(_Pump):
    """The CLI's pump (a descriptor pointed at a pipe, copied to its old target by a thread) leaving out `NATIVE`."""

    def _copy(self) -> None:
        pending = b""
        try:
            while chunk := os.read(self.read, 1 << 16):
                *lines, pending = (pending + chunk).split(b"\n")
                kept = b"".join(line + b"\n" for line in lines if not NATIVE.match(line))
                if pending and not _MAY_BE_CHATTER.match(pending):
                    kept, pending = kept + pending, b""
                self._write(kept)
        except OSError:
            pass
        if pending and not NATIVE.match(pending):
            self._write(pending)
