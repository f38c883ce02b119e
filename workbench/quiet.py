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
  by the filter that leaves them out of the CLI's profiled runs (`workbench.profiling.quiet.NativeChatter`,
  its `CHATTER`), for the life of the process. In a kernel Python's own
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

from workbench.profiling.quiet import NativeChatter

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

_native: NativeChatter | None = None
"""The kernel-wide filter of fds 1 and 2, once installed (it lasts as long as the process)."""


def quiet(*, native: bool | None = None) -> None:
    """Keep the known chatter out of this process's outputs from now on (idempotent). `native` filters the
    native log lines on file descriptors 1 and 2 too; by default only in a Jupyter kernel, where Python's own
    streams do not pass through them."""
    global _native
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
    if native and _native is None:
        _native = NativeChatter()  # the CLI's filter of native log lines (`CHATTER`), for the process's life
        atexit.register(_native.close)


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
