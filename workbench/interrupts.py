"""Ctrl-C in the command line: exit code 130 and no traceback, from the first moment of a command.

Inside a command, KeyboardInterrupt unwinds through the writers (which keep nothing half-written) up to
the command group (`workbench.cli.render.CommandGroup`), which exits 130. Before that, while Python loads
the command line itself, a KeyboardInterrupt would end in a traceback and a death by signal;
`QuietWhileLoading()` covers that window: nothing has been written yet, so it exits at once. This
module is the first the command line imports, so it imports next to nothing itself.
"""

from __future__ import annotations

import os
import signal

from workbench.errors import EXIT_INTERRUPTED

INTERRUPTED = "interrupted: nothing half-written was kept"
"""What an interrupted command prints on stderr."""


class QuietWhileLoading:
    """Within the block, SIGINT ends the process at once with exit code 130 and INTERRUPTED on stderr.

    Only where SIGINT has Python's default handler and in the main thread: a process that ignores SIGINT
    (started in the background) or handles it itself keeps its own behaviour.
    """

    def __enter__(self) -> None:
        self._previous = None
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            try:  # noqa: SIM105 - contextlib.suppress would load a module more before the handler is in place
                self._previous = signal.signal(signal.SIGINT, _exit_now)
            except ValueError:  # not the main thread: signals are not ours to handle
                pass

    def __exit__(self, *exc_info: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _exit_now(signum: int, frame: object) -> None:
    os.write(2, f"\n{INTERRUPTED}\n".encode())
    os._exit(EXIT_INTERRUPTED)
