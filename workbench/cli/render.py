"""How the command line writes to the terminal and how its commands end.

Tables and reports come as `TextTable`s and `Block`s (`workbench.views.text_tables`), whose content the views
decide; `print_table` and `print_blocks` only render them. Text is printed as it is: the consoles read no
rich markup or emoji codes from strings, so a path, run id, model name or error holding `[red]`, `[/x]` or
`:smile:` shows literally (and cannot break the output); styles are given with `rich.text.Text` (`styled`,
`labelled`, a cell's tone). Every failure ends in one line
on stderr and a meaningful exit code: the workbench's own errors and the operating system's (`errors()`)
and click's usage errors (`CommandGroup`) exit 2, Ctrl-C at any point exits 130.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from workbench.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, WorkbenchError, is_disk_full
from workbench.interrupts import INTERRUPTED
from workbench.views.text_tables import TONE_STYLES, Block, Cell, Paragraph, TextTable, cells

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


def print_json(value: Any) -> None:
    """`value` as indented JSON on stdout (what `--json` prints)."""
    click.echo(json.dumps(value, indent=2, default=str))


def progress(as_json: bool, progress_json: bool) -> Any:
    """Progress of a long command: JSON lines on stderr for programs (`--progress-json`), else rich bars
    on stderr, which `--json` turns off."""
    from workbench.progress import JsonProgress, RichProgress

    return JsonProgress(sys.stderr) if progress_json else RichProgress(err, enabled=not as_json)


@contextmanager
def reading_status(text: str, as_json: bool) -> Iterator[None]:
    """A spinner on stderr (none with `--json`) saying `text`, then which trace file is being read and how far
    (`workbench.trace.progress`), updated at most ten times a second."""
    if as_json:
        yield
        return
    from workbench.trace.progress import describe, listening

    shown_at = 0.0
    with err.status(text, spinner="dots") as status:
        def update(path: str, done: int, total: int, unit: str) -> None:
            nonlocal shown_at
            now = time.monotonic()
            if now - shown_at >= 0.1 or done >= total:
                shown_at = now
                status.update(describe(path, done, total, unit))

        with listening(update):
            yield


@contextmanager
def nothing() -> Iterator[None]:
    """A context that does nothing (in place of a spinner when the output is JSON)."""
    yield


def _text(cell: Cell | Paragraph) -> Text | str:
    if isinstance(cell, tuple):
        return Text.assemble(*map(_text, cell))
    return styled(cell.text, TONE_STYLES[cell.tone]) if cell.tone else cell.text


def print_table(table: TextTable, *, no_wrap: Sequence[str] = (), fold: Sequence[str] = (),
                max_widths: Mapping[str, int] | None = None) -> None:
    """`table` on stdout. Long cells wrap at words; those of the columns in `no_wrap` are cut with an ellipsis
    instead, those in `fold` broken anywhere; `max_widths` caps columns' widths."""
    shown = Table(title=table.title, title_justify="left", show_header=table.show_header)
    for column in table.columns:
        shown.add_column(column, justify="left" if column in table.left else "right", no_wrap=column in no_wrap,
                         overflow="fold" if column in fold else "ellipsis", max_width=(max_widths or {}).get(column))
    for row in table.rows:
        shown.add_row(*map(_text, row))
    out.print(shown)


def print_blocks(blocks: Sequence[Block]) -> None:
    """A text report on stdout: paragraphs as lines, tables as tables."""
    for block in blocks:
        if isinstance(block, TextTable):
            print_table(block)
        else:
            out.print(block if isinstance(block, str) else _text(block))


def print_kv(title: str, values: Mapping[str, Any]) -> None:
    """A titled table of keys and their figures, without a header."""
    print_table(TextTable(title, ("key", "value"), tuple(cells(str(k), v) for k, v in values.items()),
                          left=frozenset({"key"}), show_header=False))


def print_failures(runs: Sequence[Mapping[str, Any]], noun: str, root: Path) -> None:
    """Each failed run's error on stderr (`<noun> <variant> failed: ...`), then where the bundles are."""
    for run in runs:
        if run["status"] != "ok":
            err.print(labelled(f"{noun} {run['variant']} failed:", "red", run.get("error")))
    out.print(f"bundles in {root}; look at one with: workbench show RUN --out {root}")


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
