"""Nsight Compute (`ncu`): per-kernel metrics of a variant's measured launches, from a child process.

`ncu --profile-from-start off --metrics ... [--kernel-name K] --launch-count N` profiles the first N
matching kernel launches of the measured region into a `.ncu-rep`; `ncu --import --csv --page raw`
exports the per-launch metrics that `workbench.trace.formats.ncu` reads into the `kernel_metrics` table.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from workbench.errors import WorkbenchError
from workbench.profiling.child import ChildSpec, child_command, child_env, child_result, free_cuda_cache, prepared_child
from workbench.profiling.framework import profile_in_process
from workbench.profiling.registry import DEFAULT_LAUNCH_COUNT, Addition, ProfileRequest, ProfilerSpec, register_profiler
from workbench.profiling.tools import find_tool, run_tool, tail, tool_version

COUNTER_PERMISSION_HINT = (
    "ncu needs access to the GPU performance counters (ERR_NVGPUCTRPERM): run as root, or allow all users "
    "with the driver option NVreg_RestrictProfilingToAdminUsers=0 (https://developer.nvidia.com/ERR_NVGPUCTRPERM)")


def ncu_command(ncu: str, output: str | Path, app: Sequence[str], *, kernel_name: str | None = None,
                launch_count: int = DEFAULT_LAUNCH_COUNT, metrics: Sequence[str] | None = None) -> list[str]:
    """`ncu` profiling `app` (and its child processes) from cudaProfilerStart on, into `<output>.ncu-rep`.

    `kernel_name` is ncu's filter: an exact function name, or `regex:<expression>`; `launch_count` caps
    the launches profiled; `metrics` default to what `kernel_metrics` derives its columns from.
    """
    from workbench.trace.formats.ncu import METRICS

    if isinstance(launch_count, bool) or not isinstance(launch_count, int) or launch_count < 1:
        raise WorkbenchError(f"--launch-count must be an integer >= 1, got {launch_count!r}")
    if kernel_name is not None and not kernel_name.strip():
        raise WorkbenchError("--kernel-name is empty: give a kernel name or regex:<expression>")
    command = [
        ncu,
        "--target-processes", "all",
        "--profile-from-start", "off",
        "--metrics", ",".join(metrics or METRICS),
    ]
    if kernel_name is not None:
        command += ["--kernel-name", kernel_name]
    return [*command, "--launch-count", str(launch_count), "--export", str(output), "--force-overwrite", *app]


def ncu_import_command(ncu: str, report: str | Path) -> list[str]:
    """`ncu --import` printing a report's raw page as CSV, in base units, with demangled kernel names
    (as traces name kernels)."""
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base",
            "--print-kernel-base", "demangled"]


def _with_permission_hint(message: str) -> str:
    """`message`, followed by how to get counter access when ncu was refused it."""
    return f"{message}\n{COUNTER_PERMISSION_HINT}" if "ERR_NVGPUCTRPERM" in message else message


@dataclass(frozen=True)
class KernelProfile:
    """What an ncu run leaves: the `kernel_metrics` table, its raw files (report, CSV, log) and notes
    (command, version, filter, launches profiled)."""

    metrics: pa.Table
    raw_paths: tuple[Path, ...]
    notes: dict[str, Any]


def profile_with_ncu(spec: ChildSpec, folder: str | Path, *, kernel_name: str | None = None,
                     launch_count: int = DEFAULT_LAUNCH_COUNT, ncu: str | None = None,
                     timeout_s: float | None = None) -> KernelProfile:
    """Run the spec's variant in a child process under `ncu` (the first `launch_count` launches of the
    measured region matching `kernel_name`), export the report's raw page and read it into
    `kernel_metrics`. Outputs go to `folder`."""
    from workbench.trace.formats.ncu import read_ncu_csv

    ncu = ncu or find_tool("ncu")
    folder = Path(folder)
    spec, spec_path, log = prepared_child(spec, folder, "ncu")
    output = folder / spec.variant
    command = ncu_command(ncu, output, child_command(spec_path), kernel_name=kernel_name, launch_count=launch_count)
    free_cuda_cache()
    try:
        run_tool(command, log, what="ncu", timeout_s=timeout_s, env=child_env())
    except WorkbenchError as exc:
        raise WorkbenchError(_with_permission_hint(str(exc))) from exc
    report = output.with_name(f"{output.name}.ncu-rep")
    if not report.is_file():
        wanted = f"kernels matching {kernel_name!r}" if kernel_name else "kernels"
        raise WorkbenchError(_with_permission_hint(
            f"ncu wrote no report {report}: it profiled no {wanted} in the measured iterations; {tail(log)}"))
    child_result(Path(spec.out_dir), log)
    csv_path = folder / f"{spec.variant}.ncu.csv"
    run_tool(ncu_import_command(ncu, report), log, what="ncu --import", timeout_s=timeout_s, stdout=csv_path)
    metrics = read_ncu_csv(csv_path)
    notes = {"command": shlex.join(command), "version": tool_version(ncu), "report": report.name,
             "kernel_name": kernel_name, "launch_count": launch_count, "launches": metrics.num_rows}
    return KernelProfile(metrics, (report, csv_path, log), notes)


def _kernel_metrics(request: ProfileRequest) -> Addition:
    """Nsight Compute's `kernel_metrics` of the variant's measured launches, from a child under ncu."""
    kernels = profile_with_ncu(request.child, request.folder, kernel_name=request.kernel_name,
                               launch_count=request.launch_count)
    return Addition({"kernel_metrics": kernels.metrics}, kernels.raw_paths, kernels.notes)


register_profiler(ProfilerSpec("ncu", "the framework's profiler, plus Nsight Compute metrics of the measured "
                               "kernel launches (a child process under ncu)", profile_in_process,
                               label="{framework} + ncu", child_session="cuda-range", memory_history=False,
                               adds=_kernel_metrics, tool="ncu", needs_cuda=True))
