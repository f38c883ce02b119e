"""The Nsight tools as external programs: finding them, running them with a log, their versions.

A tool is found on PATH, or at the path in `WORKBENCH_NSYS` / `WORKBENCH_NCU`; without it, `find_tool`
raises `ToolMissing` saying how to install it. `run_tool` runs one command with its output appended to a
log and turns a failure, a time-out or an interrupt into a WorkbenchError naming what failed.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

from workbench.errors import WorkbenchError

TOOL_TIMEOUT_S = 60.0
"""Limit of the short tool calls (`--version`, exports)."""

TOOL_ENV = {"nsys": "WORKBENCH_NSYS", "ncu": "WORKBENCH_NCU"}
INSTALL_HINTS = {
    "nsys": "install NVIDIA Nsight Systems (https://developer.nvidia.com/nsight-systems, or the CUDA toolkit's "
            "nsight-systems package: apt install nsight-systems-<version> from NVIDIA's CUDA repository) and put "
            "its bin folder (e.g. /opt/nvidia/nsight-systems/<version>/bin) on PATH",
    "ncu": "install NVIDIA Nsight Compute (it ships with the CUDA toolkit: /usr/local/cuda/bin/ncu; or "
           "https://developer.nvidia.com/nsight-compute, apt install nsight-compute-<version>) and put it on PATH",
}


class ToolMissing(WorkbenchError):
    """An Nsight tool that is not installed (or not on PATH); the message says how to install it."""

    def __init__(self, tool: str) -> None:
        env = TOOL_ENV.get(tool)
        where = f"not on PATH and {env} is not set" if env else "not on PATH"
        super().__init__(f"{tool} is {where}: {INSTALL_HINTS.get(tool, 'install it')}"
                         + (f"; or set {env} to the executable" if env else ""))
        self.tool = tool


def find_tool(name: str) -> str:
    """The executable of an Nsight tool (`nsys`, `ncu`): `$WORKBENCH_NSYS` / `$WORKBENCH_NCU` when set,
    else the one on PATH; raises ToolMissing when there is none."""
    import shutil

    override = os.environ.get(TOOL_ENV.get(name, ""), "")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise WorkbenchError(f"{TOOL_ENV[name]}={override} is not an executable file")
        return override
    found = shutil.which(name)
    if found is None:
        raise ToolMissing(name)
    return found


def run_tool(command: Sequence[str], log: Path, *, what: str, timeout_s: float | None = None,
             stdout: Path | None = None, env: Mapping[str, str] | None = None) -> None:
    """Run `command`, appending its output (stdout too unless `stdout` names a file for it) to `log`.

    A failure raises WorkbenchError naming `what`, the exit code and the end of the log. On a timeout or
    an interrupt the process is terminated (then killed) before the exception goes on.
    """
    with open(log, "ab") as out, ExitStack() as stack:
        out.write(f"$ {shlex.join(command)}\n".encode())
        out.flush()
        target = stack.enter_context(open(stdout, "wb")) if stdout is not None else out
        try:
            proc = subprocess.Popen(list(command), stdout=target, stderr=out, env=None if env is None else dict(env))
        except OSError as exc:
            raise WorkbenchError(f"{what}: cannot start {command[0]}: {exc.strerror}") from exc
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise WorkbenchError(f"{what} did not finish within {timeout_s:g} s; {tail(log)}") from None
        except BaseException:
            _stop(proc)
            raise
    if code != 0:
        raise WorkbenchError(f"{what} failed (exit code {code}); {tail(log)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a process, killing it if it has not ended 10 s later."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tail(log: Path, lines: int = 25) -> str:
    """`<log> ends: <its last lines>`, for error messages."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return f"no log at {log}"
    return f"{log} ends:\n" + "\n".join(text)


def tool_version(tool: str) -> str | None:
    """The last line of `<tool> --version` (None when it cannot be run)."""
    try:
        done = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[-1] if done.returncode == 0 and lines else None
