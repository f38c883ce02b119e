"""Nsight Systems (`nsys`): a variant's profiled run in a child process under `nsys profile`.

`nsys profile -t cuda,nvtx,osrt,cublas,cudnn --capture-range=cudaProfilerApi ...` records the measured
region; `nsys export --type=sqlite` turns the `.nsys-rep` into the SQLite that `workbench.trace.nsys.reader`
reads as the run's trace. Report, SQLite and log go to the bundle's raw/. The commands are built by pure
functions, so they are tested without the tool.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.profiling.child import ChildSpec, child_command, child_env, child_result, free_cuda_cache, prepared_child
from workbench.profiling.registry import ProfileRequest, ProfilerSpec, register_profiler
from workbench.profiling.result import ProfiledRun
from workbench.profiling.settings import progress_units
from workbench.profiling.tools import find_tool, run_tool, tail, tool_version

NSYS_TRACE = ("cuda", "nvtx", "osrt", "cublas", "cudnn")
"""What nsys traces: CUDA API and kernels, NVTX ranges, OS runtime calls, cuBLAS and cuDNN calls."""


def nsys_command(nsys: str, output: str | Path, app: Sequence[str], *, trace: Sequence[str] = NSYS_TRACE,
                 memory_usage: bool = False) -> list[str]:
    """`nsys profile` recording only the CUDA profiler range of `app` into `<output>.nsys-rep`.

    `--capture-range-end=stop` lets the application run on after cudaProfilerStop (so it can write its
    results); CUDA graphs are traced node by node (compile-reduce-overhead replays graphs); CPU sampling
    and context switches are off; `memory_usage` adds nsys's GPU memory usage events.
    """
    return [
        nsys, "profile",
        f"--trace={','.join(trace)}",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--cuda-graph-trace=node",
        f"--cuda-memory-usage={'true' if memory_usage else 'false'}",
        "--sample=none",
        "--cpuctxsw=none",
        f"--output={output}",
        "--force-overwrite=true",
        *app,
    ]


def nsys_export_command(nsys: str, report: str | Path, sqlite: str | Path) -> list[str]:
    """`nsys export` of a report into an SQLite database (the format `workbench.trace.nsys.reader` reads)."""
    return [nsys, "export", "--type=sqlite", f"--output={sqlite}", "--force-overwrite=true", str(report)]


def profile_with_nsys(spec: ChildSpec, folder: str | Path, *, nsys: str | None = None,
                      timeout_s: float | None = None) -> ProfiledRun:
    """Run the spec's variant in a child process under `nsys profile`, export the report to SQLite, and
    return the run with the SQLite as its trace; report, SQLite, log (and the CUDA memory snapshot)
    are its raw files. Outputs go to `folder`."""
    nsys = nsys or find_tool("nsys")
    folder = Path(folder)
    spec, spec_path, log = prepared_child(spec, folder, "nsys")
    output = folder / spec.variant
    memory_usage = bool(spec.settings.get("profile_memory", True))
    command = nsys_command(nsys, output, child_command(spec_path), memory_usage=memory_usage)
    free_cuda_cache()
    run_tool(command, log, what="nsys profile", timeout_s=timeout_s, env=child_env())
    report = output.with_name(f"{output.name}.nsys-rep")
    if not report.is_file():
        raise WorkbenchError(f"nsys wrote no report {report}: the measured region (cudaProfilerStart/Stop) "
                             f"was not captured; {tail(log)}")
    result = child_result(Path(spec.out_dir), log)
    sqlite = folder / f"{spec.variant}.sqlite"
    run_tool(nsys_export_command(nsys, report, sqlite), log, what="nsys export", timeout_s=timeout_s)
    if not sqlite.is_file():
        raise WorkbenchError(f"nsys export wrote no {sqlite}; {tail(log)}")
    snapshot = Path(result["memory_snapshot"]) if result.get("memory_snapshot") else None
    raw = (report, sqlite, log, *((snapshot,) if snapshot else ()))
    notes = {**(result.get("notes") or {}),
             "nsys": {"command": shlex.join(command), "version": tool_version(nsys), "report": report.name}}
    return ProfiledRun(sqlite, {}, result.get("phases_ms") or {}, notes, raw, {}, snapshot)


def _profile(request: ProfileRequest) -> ProfiledRun:
    """The variant's run in a child under nsys; its SQLite export is the trace."""
    run = profile_with_nsys(request.child, request.folder)
    request.on_progress(progress_units(request.settings))
    return run


register_profiler(ProfilerSpec("nsys", "Nsight Systems: the run in a child process under nsys profile (SQLite trace)",
                               _profile, label="nsys", child_session="cuda-range", records_nvtx=True,
                               tool="nsys", needs_cuda=True))
