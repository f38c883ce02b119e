"""The Model Context Protocol server of a traces root (`workbench mcp`): read-only tools over its runs, a resource
per run's `run.json`, a prompt that walks an agent through a slow run, and, only when started with
`allow_capture`, tools that capture and import (built-in models only, as the Jupyter server's `ModelPolicy`).

Every tool answers compact JSON of at most `paging.MAX_CHARS` characters with the figures of the matching CLI
`--json` (`workbench.agents.answers`), and a `page` pointer where it was cut; a failure is one line (the
`WorkbenchError`'s message). docs/agents.md says which tool answers which question.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError

from workbench.agents import answers
from workbench.agents.paging import MAX_CHARS, page
from workbench.errors import WorkbenchError

CAPTURE_TIMEOUT_S = 3_600.0
"""Longest a capture tool call may run before its process is stopped."""
READ_ONLY_TOOLS = ("list_runs", "run_summary", "top_ops", "findings", "critical_path", "spans", "sql", "compare",
                   "run_files")
CAPTURE_TOOLS = ("capture", "import_trace")
"""The tools that write to the traces root, present only with `allow_capture`."""
INSTRUCTIONS = (
    f"Tools over a workbench traces root (profiles of deep-learning inference). Start with list_runs, then "
    f"run_summary and findings for a run; answers are compact JSON of at most {MAX_CHARS} characters; where "
    f"`page.next` is not null, call again with offset=page.next for the rest. Times are in the unit their field "
    f"name says (_ns, _ms, _s); counts are integers.")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _answer(make: Callable[[], answers.Answer], offset: int) -> str:
    """Page `make`'s answer from `offset`; a failure the user can fix is a ToolError of one line."""
    try:
        reply, key = make()
        return page(reply, key, offset)
    except (WorkbenchError, ValueError, KeyError, OSError) as exc:
        raise ToolError(_one_line(exc)) from exc


def _file(root: Path, run: str, name: str) -> str:
    """A resource's text; a failure is one line, sent to the client (a plain exception's text is withheld)."""
    try:
        return answers.run_file(root, run, name)
    except (WorkbenchError, UnicodeDecodeError) as exc:
        raise ResourceNotFoundError(_one_line(exc)) from exc


def build_server(root: Path, *, allow_capture: bool = False) -> MCPServer:
    """The server of the traces root `root`; `allow_capture` adds the tools that capture and import."""
    server = MCPServer("workbench", instructions=INSTRUCTIONS)
    bound = f" At most {MAX_CHARS} characters; `page.next` is the offset of the rest."

    @server.tool(description="The runs of the traces root (as `workbench ls --json`) and its experiments." + bound,
                 structured_output=False)
    def list_runs(offset: int = 0) -> str:
        return _answer(lambda: answers.list_runs(root), offset)

    @server.tool(description="One run's summary (as `workbench show RUN --json`): status, latency, events per "
                             "kind, kernel time per device, memory peaks, top ops and kernels." + bound,
                 structured_output=False)
    def run_summary(run: str, top: int = 10, offset: int = 0) -> str:
        return _answer(lambda: answers.run_summary(root, run, top), offset)

    @server.tool(description="A run's top ops (kind='op') or kernels (kind='kernel') by total time: calls, "
                             "total_ns, self_ns, device_ns, share." + bound, structured_output=False)
    def top_ops(run: str, kind: str = "kernel", top: int = 10, offset: int = 0) -> str:
        return _answer(lambda: answers.top_ops(root, run, kind, top), offset)

    @server.tool(description="A run's findings (as `workbench analyze RUN --json`), critical-path share first, "
                             "each with its evidence rows and a next step." + bound, structured_output=False)
    def findings(run: str, offset: int = 0) -> str:
        return _answer(lambda: answers.findings(root, run), offset)

    @server.tool(description="The critical path of a step (default the median step): length_ns, ns per segment "
                             "kind, the top names by path share and what-if speedups." + bound,
                 structured_output=False)
    def critical_path(run: str, step: int | None = None, top: int = 10, offset: int = 0) -> str:
        return _answer(lambda: answers.critical_path(root, run, step, top), offset)

    @server.tool(description=f"The spans overlapping [start_ns, end_ns) of a run (default: all of it), at most "
                             f"max_spans (1 to {answers.MAX_SPANS}) listed, sparse lanes first; other lanes are "
                             f"counted." + bound, structured_output=False)
    def spans(run: str, start_ns: int | None = None, end_ns: int | None = None, max_spans: int = 500,
              offset: int = 0) -> str:
        return _answer(lambda: answers.spans(root, run, start_ns, end_ns, max_spans), offset)

    @server.tool(description="One read-only SQL SELECT over runs (default every run; as `workbench query "
                             "--json`): tables events, memory, counters, kernel_metrics and runs, each with a "
                             "`run` column; sandboxed (no files, settings or extensions), time- and row-limited."
                             + bound, structured_output=False)
    def sql(query: str, runs: list[str] | None = None, limit: int = 100, offset: int = 0) -> str:
        return _answer(lambda: answers.sql(root, query, runs, limit), offset)

    @server.tool(description="Runs compared against a baseline (as `workbench diff --json`): step time, device "
                             "busy/idle and overlap, op and kernel deltas, the largest `top` per kind." + bound,
                 structured_output=False)
    def compare(runs: list[str], baseline: str | None = None, top: int = 10, offset: int = 0) -> str:
        return _answer(lambda: answers.compare(root, runs, baseline, top), offset)

    @server.resource("workbench://runs/{run}/run.json", mime_type="application/json",
                     description="A run's record: model, variant, device, benchmark, trace reader facts.")
    def run_record(run: str) -> str:
        return _file(root, run, "run.json")

    @server.tool(description="A run's small text files (its record, summaries, compile-stage notes such as "
                             "optimized HLO or graph records), each with its size and the resource URI that reads "
                             "it; its tables are for the sql tool." + bound, structured_output=False)
    def run_files(run: str, offset: int = 0) -> str:
        return _answer(lambda: answers.run_files(root, run), offset)

    @server.resource("workbench://runs/{run}/files/{name}", mime_type="text/plain",
                     description=f"One of a run's small text files (at most {answers.MAX_FILE_BYTES >> 10} KiB) "
                                 f"by name, as run_files lists them.")
    def run_small_file(run: str, name: str) -> str:
        return _file(root, run, name)

    @server.resource("workbench://runs/{run}/compile/{name}", mime_type="text/plain",
                     description="One of a run's compile-stage text files (optimized HLO, inductor and ORT graph "
                                 "records), as run_files lists them.")
    def run_compile_file(run: str, name: str) -> str:
        return _file(root, run, f"compile/{name}")

    @server.prompt(description="Walk through why a run is slow, tool by tool.")
    def why_is_this_run_slow(run: str) -> str:
        return (
            f"Find out why run {run!r} is slow, using the workbench tools; quote figures with their units.\n"
            f"1. run_summary(run={run!r}): is it a capture or an import, which device, how many events; where does "
            f"kernel time go (top_kernels) and which ops lead (top_ops)?\n"
            f"2. findings(run={run!r}): the ranked findings; read each one's evidence rows and next step.\n"
            f"3. critical_path(run={run!r}): what bounds a typical step: host, launch, kernels, copies? The "
            f"what-ifs say what a faster kernel or op would save.\n"
            f"4. Check a doubt with sql (e.g. the kernels launched by the top op) or look at a step with spans.\n"
            f"5. If another run of the same model exists (list_runs), compare them.\n"
            f"Answer with the one to three causes that cost the most, each with its evidence and a next step.")

    if allow_capture:
        _add_capture_tools(server, root)
    return server


def _add_capture_tools(server: MCPServer, root: Path) -> None:
    """`capture` (built-in models only, the Jupyter server's policy and checks) and `import_trace`."""

    @server.tool(description="Capture a model into the traces root (as `workbench capture --json`): `options` "
                             "are the capture options by name, e.g. {\"model\": \"mlp\", \"variants\": "
                             "[\"eager\"], \"batch\": 2}; built-in models only." + " At most "
                             f"{MAX_CHARS} characters.", structured_output=False)
    def capture(options: dict[str, Any], offset: int = 0) -> str:
        from workbench.server.capture_request import capture_args

        def run() -> answers.Answer:
            command = [sys.executable, "-m", "workbench", "capture", *capture_args(options), "--json",
                       "--out", str(root)]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=CAPTURE_TIMEOUT_S,
                                      check=False)
            except subprocess.TimeoutExpired as exc:
                raise WorkbenchError(f"the capture ran past {CAPTURE_TIMEOUT_S:.0f} s and was stopped") from exc
            if not done.stdout.strip():
                lines = done.stderr.strip().splitlines()
                raise WorkbenchError(lines[-1] if lines else f"the capture failed (exit code {done.returncode})")
            return {"exit_code": done.returncode, "result": json.loads(done.stdout)}, None

        return _answer(run, offset)

    @server.tool(description="Import trace files captured elsewhere (Kineto/Chrome JSON, XSpace, Nsight Systems "
                             "SQLite) into the traces root, as `workbench import --json`; returns the run ids.",
                 structured_output=False)
    def import_trace(paths: list[str]) -> str:
        from workbench.imports import import_traces

        return _answer(lambda: ({"runs": import_traces([Path(p) for p in paths], root)}, "runs"), 0)


def serve(root: Path, *, allow_capture: bool = False, http_port: int | None = None) -> None:
    """Serve `root` on stdio, or with `http_port` over streamable HTTP on 127.0.0.1 only."""
    server = build_server(root, allow_capture=allow_capture)
    if http_port is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=http_port)
