"""Run one fuzz case (`fuzzing.Case`) through the real command line and classify what happened.

The contract checked (issue 13, "no crash on any input"): `workbench import FILE` either exits 0 having
written one complete bundle, which opens, whose trace reads and which `workbench show --json` (and, when
asked, `workbench report`) handles with exit 0, or exits 2 with exactly one line on stderr naming the file
and nothing written. Never a traceback, never a hang, never debris (hidden `.tmp-*` / `.profile-*` folders,
half bundles, files beside the input).

Outcomes: `ok`, `error` (the clean refusal), `crash` (a traceback, another exit code, a bundle that does
not open, an error that is not one line naming the file), `hang` (past the timeout; subprocess only),
`debris`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fuzzing import Case

OUTCOMES = ("ok", "error", "crash", "hang", "debris")
EXIT_OK, EXIT_BAD_INPUT = 0, 2


@dataclass(frozen=True)
class Outcome:
    """What one case did: one of `OUTCOMES` and what shows it (the error line, the traceback...)."""

    kind: str
    detail: str = ""


@dataclass(frozen=True)
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


Cli = Callable[[list[str], Path], CliResult]
"""Runs `workbench ARGS` with the traces root given by $WORKBENCH_TRACES."""


def in_process(args: list[str], root: Path) -> CliResult:
    """`workbench ARGS` through click's test runner in this process (fast; a Python exception propagates)."""
    from click.testing import CliRunner

    from workbench.cli import main

    result = CliRunner().invoke(main, args, env={"WORKBENCH_TRACES": str(root)}, catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


def in_subprocess(timeout_s: float) -> Cli:
    """`python -m workbench ARGS` in a fresh interpreter, killed after `timeout_s` (a hang)."""

    def run(args: list[str], root: Path) -> CliResult:
        proc = subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, timeout=timeout_s,
                              env={**os.environ, "WORKBENCH_TRACES": str(root)})
        decode = lambda data: data.decode("utf-8", "replace")  # noqa: E731
        return CliResult(proc.returncode, decode(proc.stdout), decode(proc.stderr))

    return run


def check_case(case: Case, folder: Path, cli: Cli, *, report: bool = False) -> Outcome:
    """Write the case's file into `folder`, import it with `cli` into `folder/traces`, check the result."""
    inputs, root = folder / "input", folder / "traces"
    inputs.mkdir(parents=True)
    path = inputs / case.name
    path.write_bytes(case.data)
    try:
        outcome = _check_import(path, root, folder, cli, report)
    except subprocess.TimeoutExpired as exc:
        return Outcome("hang", f"{' '.join(map(str, exc.cmd[2:]))} ran past {exc.timeout} s")
    except Exception:
        return Outcome("crash", traceback.format_exc())
    beside = sorted(p.name for p in inputs.iterdir() if p.name != case.name)
    if beside and outcome.kind in ("ok", "error"):
        return Outcome("debris", f"files beside the input: {beside}")
    return outcome


def _check_import(path: Path, root: Path, folder: Path, cli: Cli, report: bool) -> Outcome:
    result = cli(["import", str(path)], root)
    if "Traceback" in result.stdout + result.stderr:
        return Outcome("crash", f"import printed a traceback:\n{result.stderr[-4000:]}")
    if result.exit_code == EXIT_BAD_INPUT:
        lines = result.stderr.strip().splitlines()
        if len(lines) != 1 or path.name not in lines[0]:
            return Outcome("crash", f"exit 2 without one line naming the file on stderr:\n{result.stderr[-2000:]}")
        left = _debris(root, expected=[])
        return Outcome("debris", f"{left} after: {lines[0]}") if left else Outcome("error", lines[0])
    if result.exit_code != EXIT_OK:
        return Outcome("crash", f"import exited {result.exit_code}:\n{result.stderr[-2000:]}")
    run_ids = result.stdout.split()
    if len(run_ids) != 1:
        return Outcome("crash", f"import exited 0 but printed {run_ids!r}, not one run id")
    left = _debris(root, expected=run_ids)
    if left:
        return Outcome("debris", left)
    from workbench.trace.store.bundle import open_bundle

    events = open_bundle(run_ids[0], root).trace().events.num_rows
    commands = [["show", run_ids[0], "--json"]]
    if report:
        commands.append(["report", run_ids[0], "-o", str(folder / "report.html")])
    for args in commands:
        shown = cli(args, root)
        if shown.exit_code != EXIT_OK or "Traceback" in shown.stdout + shown.stderr:
            return Outcome("crash", f"{args[0]} exited {shown.exit_code}:\n{shown.stderr[-4000:]}")
        if args[0] == "show":
            json.loads(shown.stdout)
    left = _debris(root, expected=run_ids)
    return Outcome("debris", f"{left} after show/report") if left else Outcome("ok", f"{events} events")


def _debris(root: Path, expected: list[str]) -> str:
    """What in `root` should not be there: hidden entries (temporary or half-deleted bundles) and anything
    but the expected bundles; '' if nothing."""
    if not root.exists():
        return "" if not expected else f"no traces root, expected {expected}"
    names = sorted(p.name for p in root.iterdir())
    unexpected = [n for n in names if n not in expected]
    missing = [n for n in expected if n not in names]
    if unexpected or missing:
        return f"traces root holds {names}, expected {expected}"
    return ""
