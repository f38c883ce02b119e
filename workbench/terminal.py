"""How the command line writes to the terminal and how its commands end.

Text is printed as it is: the consoles read no rich markup or emoji codes from strings, so a path, run
id, model name or error holding `[red]`, `[/x]` or `:smile:` shows literally (and cannot break the
output); styles are given with `rich.text.Text` (`styled`, `labelled`). Every failure ends in one line
on stderr and a meaningful exit code: the workbench's own errors and the operating system's (`errors()`)
and click's usage errors (`CommandGroup`) exit 2, Ctrl-C at any point exits 130.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.text import Text

from workbench.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, WorkbenchError, is_disk_full
from workbench.interrupts import INTERRUPTED

_PIPE_WIDTH = 160
"""Width of tables in a pipe: rich would squeeze them into 80 columns."""

out = Console(width=None if sys.stdout.isatty() else _PIPE_WIDTH, markup=False, emoji=False, highlight=False)
err = Console(stderr=True, width=None if sys.stderr.isatty() else _PIPE_WIDTH, markup=False, emoji=False,
              highlight=False)


def styled(text: object, style: str) -> Text:
    """`text` in `style` (e.g. "red", "bold"), printed as it is."""
    return Text(str(text), style=style)


def labelled(label: str, style: str, message: object) -> Text:
    """`label` in `style`, then `message` as it is: `error: ...`, `warning: ...`."""
    return Text.assemble((label, style), " ", str(message))


def status_text(status: str) -> Text:
    """A run's status for a table cell: ok in green, anything else in red."""
    return styled(status, "green" if status == "ok" else "red")


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print `error: <message>` as one line on stderr and exit with `code`."""
    err.print(labelled("error:", "bold red", message), soft_wrap=True)
    sys.exit(code)


@contextmanager
def errors() -> Iterator[None]:
    """Turn the workbench's own errors, and the operating system's (a full disk, a path through a file, a
    name too long), into one line on stderr and exit code 2."""
    try:
        yield
    except WorkbenchError as exc:
        fail(str(exc))
    except OSError as exc:
        if is_disk_full(exc):
            fail(f"no space left on device writing {exc.filename or 'a file'}")
        fail(f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc))


class CommandGroup(click.Group):
    """A click group whose every outcome is one line and an exit code that means something: a usage error
    is `error: ...` and exit 2 (click's own takes four lines), Ctrl-C at any point exits 130 with no
    traceback (click's would say "Aborted!" and exit 1)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """Run the command line (see `click.Group.main`); in standalone mode, exit with its code."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            try:
                code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            except click.exceptions.NoArgsIsHelpError as exc:  # `workbench` alone: the help, as click gives it
                exc.show()
                sys.exit(exc.exit_code)
            except click.UsageError as exc:
                hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
                lines = (line.strip() for line in exc.format_message().splitlines())
                fail(" ".join(line for line in lines if line) + hint, exc.exit_code)
            except click.Abort as exc:
                if not isinstance(exc.__cause__, KeyboardInterrupt):
                    fail("aborted", 1)
                _interrupted()
            except click.ClickException as exc:
                fail(exc.format_message(), exc.exit_code)
            except KeyboardInterrupt:
                _interrupted()
        except KeyboardInterrupt:  # a second Ctrl-C while reporting the first
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(code if isinstance(code, int) else 0)


def _interrupted() -> NoReturn:
    err.print(labelled("interrupted:", "yellow", INTERRUPTED.partition(": ")[2]), soft_wrap=True)
    sys.exit(EXIT_INTERRUPTED)
