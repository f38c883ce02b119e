"""Nsight Systems (`nsys`) and Nsight Compute (`ncu`) around a variant's profiled run.

CUPTI serves one profiler per process: torch.profiler (Kineto) and jax.profiler (XProf) cannot trace
while Nsight does. So an Nsight run happens in a child process the tool launches:
`python -m workbench _profile-variant SPEC.json` loads the model by reference, runs the variant's
labelled lifecycle (`profile_variant`) with a `CudaRangeSession`, which only brackets the measured
iterations with cudaProfilerStart/Stop (the phases keep their NVTX ranges), and writes `result.json`
(phase timings, preparation notes, the CUDA memory snapshot's path) into its output folder.

- nsys: `nsys profile -t cuda,nvtx,osrt,cublas,cudnn --capture-range=cudaProfilerApi ...` records the
  measured region; `nsys export --type=sqlite` turns the `.nsys-rep` into the SQLite that
  `workbench.trace.nsys` reads as the run's trace. Report, SQLite and log go to the bundle's raw/.
- ncu: `ncu --profile-from-start off --metrics ... [--kernel-name K] --launch-count N` profiles the
  first N matching kernel launches of the measured region into a `.ncu-rep`; `ncu --import --csv
  --page raw` exports the per-launch metrics that `workbench.trace.ncu` reads into `kernel_metrics`.

The commands are built by pure functions (`nsys_command`, `ncu_command`...), so they are tested
without the tools. A tool is found on PATH, or at the path in `WORKBENCH_NSYS` / `WORKBENCH_NCU`;
without it, `find_tool` raises `ToolMissing` saying how to install it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from workbench.capture.torch_profiler import ProfileSettings
from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from workbench.capture.lifecycle import ProfiledRun

FRAMEWORK = "framework"
"""The default profiler: the framework's own (torch.profiler, or jax.profiler for JAX variants)."""
PROFILERS = (FRAMEWORK, "nsys", "ncu")
CHILD_COMMAND = "_profile-variant"
"""The hidden CLI command a tool launches: one variant's profiled lifecycle (see `run_child`)."""
RESULT_JSON = "result.json"
NSYS_TRACE = ("cuda", "nvtx", "osrt", "cublas", "cudnn")
"""What nsys traces: CUDA API and kernels, NVTX ranges, OS runtime calls, cuBLAS and cuDNN calls."""
DEFAULT_LAUNCH_COUNT = 50
"""Kernel launches ncu profiles by default: each one is replayed once per counter pass."""
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


COUNTER_PERMISSION_HINT = (
    "ncu needs access to the GPU performance counters (ERR_NVGPUCTRPERM): run as root, or allow all users "
    "with the driver option NVreg_RestrictProfilingToAdminUsers=0 (https://developer.nvidia.com/ERR_NVGPUCTRPERM)")


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


def check_profiler(profiler: str, device: str, profile: bool = True) -> None:
    """Check, before anything runs, that `profiler` can profile variants on `device`: the tool exists
    (first, so a machine without it says how to install it), profiling is on, and the device is CUDA."""
    if profiler not in PROFILERS:
        raise WorkbenchError(f"unknown profiler {profiler!r}; choose one of {', '.join(PROFILERS)}")
    if profiler == FRAMEWORK:
        return
    find_tool(profiler)
    if not profile:
        raise WorkbenchError(f"--profiler {profiler} profiles the variants: it cannot be combined with --no-profile")
    from workbench.backends.devices import parse_device

    if parse_device(device).type != "cuda":
        raise WorkbenchError(f"--profiler {profiler} profiles CUDA work: run with --device cuda (got {device!r})")


# -- commands -------------------------------------------------------------------------------------


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
    """`nsys export` of a report into an SQLite database (the format `workbench.trace.nsys` reads)."""
    return [nsys, "export", "--type=sqlite", f"--output={sqlite}", "--force-overwrite=true", str(report)]


def ncu_command(ncu: str, output: str | Path, app: Sequence[str], *, kernel_name: str | None = None,
                launch_count: int = DEFAULT_LAUNCH_COUNT, metrics: Sequence[str] | None = None) -> list[str]:
    """`ncu` profiling `app` (and its child processes) from cudaProfilerStart on, into `<output>.ncu-rep`.

    `kernel_name` is ncu's filter: an exact function name, or `regex:<expression>`; `launch_count` caps
    the launches profiled; `metrics` default to what `kernel_metrics` derives its columns from.
    """
    from workbench.trace.ncu import METRICS

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


def child_command(spec_path: str | Path, python: str | None = None) -> list[str]:
    """The command of the child process that runs one variant for a tool (see `run_child`)."""
    return [python or sys.executable, "-m", "workbench", CHILD_COMMAND, str(spec_path)]


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: this one, with this interpreter's import path on PYTHONPATH (so user
    models found here are found there) and JAX's GPU memory preallocation off (the parent may hold GPU
    memory already)."""
    env = dict(os.environ if base is None else base)
    paths = [p for p in sys.path if p] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


# -- running ---------------------------------------------------------------------------------------


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
            raise WorkbenchError(f"{what} did not finish within {timeout_s:g} s; {_tail(log)}") from None
        except BaseException:
            _stop(proc)
            raise
    if code != 0:
        raise WorkbenchError(f"{what} failed (exit code {code}); {_tail(log)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a process, killing it if it has not ended 10 s later."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(log: Path, lines: int = 25) -> str:
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


# -- the child ---------------------------------------------------------------------------------------


class CudaRangeSession:
    """The profiler session of a run under Nsight: cudaProfilerStart once the warm-up iterations are
    done, cudaProfilerStop at close (after the `measure` phase), so `--capture-range=cudaProfilerApi`
    (nsys) and `--profile-from-start off` (ncu) record exactly the measured iterations.

    It mirrors the other sessions (`start`/`step`/`step_scope`/`close`, `trace_path`, `raw_paths`,
    `op_flops`): the trace itself is the tool's, written by the tool. With `emit_nvtx` torch's ops get
    NVTX ranges too (`torch.autograd.profiler.emit_nvtx`), so nsys ties kernels to ops. On a device
    other than CUDA there is no CUDA profiler range to open and only the bookkeeping runs. With no
    warm-up iterations the range opens at the first measured iteration.
    """

    def __init__(self, out_dir: str | Path, name: str, settings: ProfileSettings | None = None, *,
                 device_type: str = "cuda", emit_nvtx: bool = False) -> None:
        self.settings = settings or ProfileSettings()
        self.name = name
        self.device_type = device_type
        self.emit_nvtx = emit_nvtx
        self.trace_path: Path | None = None
        self.op_flops: dict[str, float] = {}  # no torch.profiler here: FLOPs are not counted
        self.captured = False
        self._out = Path(out_dir)
        self._steps = 0
        self._started = self._closed = False
        self._stack: ExitStack | None = None

    @property
    def raw_paths(self) -> tuple[Path, ...]:
        """Nothing: the tool writes the raw output."""
        return ()

    def start(self) -> None:
        """Start the session (once); the range opens after `warmup_steps` calls to `step()`."""
        if self._started or self._closed:
            raise WorkbenchError("a profiler session can be started only once")
        self._started = True

    def step(self) -> None:
        """Mark the end of an iteration; the range opens after the last warm-up iteration."""
        if not self._started or self._closed:
            raise WorkbenchError("the profiler session is not running")
        self._steps += 1
        if self._steps == self.settings.warmup_steps:
            self._begin()

    def step_scope(self, n: int) -> contextlib.AbstractContextManager[Any]:
        """Nothing to add (the phase labels are NVTX ranges already); opens the range if it is not yet open."""
        if self._started and self._stack is None and not self._closed:
            self._begin()
        return contextlib.nullcontext()

    def _begin(self) -> None:
        if self._stack is not None:
            return
        self._stack = ExitStack()
        self.captured = True
        if self.device_type != "cuda":
            return
        import torch

        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        self._stack.callback(torch.cuda.profiler.stop)
        self._stack.callback(torch.cuda.synchronize)
        if self.emit_nvtx:
            self._stack.enter_context(torch.autograd.profiler.emit_nvtx(record_shapes=self.settings.record_shapes))

    def close(self, *, export: bool = True) -> Path | None:
        """Close the range (synchronizing first); with `export`, `trace_path` becomes the output folder.
        Later calls only return the same path."""
        if self._closed:
            return self.trace_path
        self._closed = True
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()
        if export and self._started:
            self.trace_path = self._out
        return self.trace_path

    def __enter__(self) -> CudaRangeSession:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(export=exc_type is None)


@dataclass(frozen=True)
class ChildSpec:
    """What the child process runs: a model reference and overrides, one variant on a device, batch and
    sequence length, torch threads, the profile settings (ProfileSettings fields), the tool it runs
    under (`nsys`, `ncu`), and the folder for its `result.json` and memory snapshot."""

    model: str
    variant: str
    batch: int
    device: str
    out_dir: str
    profiler: str = "nsys"
    seq: int | None = None
    threads: int | None = None
    model_overrides: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def write(self, path: Path) -> Path:
        """Write the spec as JSON to `path` and return it."""
        path.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: Path) -> ChildSpec:
        """The spec in the JSON file `path`."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(**data)
        except (OSError, json.JSONDecodeError, TypeError) as exc:
            raise WorkbenchError(f"{path}: not a profile-variant spec: {exc}") from exc


def run_child(spec_path: str | Path) -> Path:
    """In the child process: run the spec's variant through its profiled lifecycle and write
    `result.json` (phase timings, notes, the CUDA memory snapshot's path); returns that file."""
    import torch

    from workbench.backends import get_variant
    from workbench.capture.lifecycle import profile_variant
    from workbench.models import load_model
    from workbench.trace.bundle import json_safe

    spec = ChildSpec.read(Path(spec_path))
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    loaded = load_model(spec.model, **spec.model_overrides)
    inputs = loaded.make_inputs(spec.batch, spec.seq)
    variant = get_variant(spec.variant, spec.batch, spec.device)
    profiled = profile_variant(variant, loaded, inputs, out, ProfileSettings(**spec.settings), profiler=spec.profiler)
    snapshot = profiled.memory_snapshot
    result = {"variant": variant.name, "phases_ms": profiled.phases_ms, "notes": profiled.notes,
              "memory_snapshot": str(snapshot) if snapshot else None}
    path = out / RESULT_JSON
    path.write_text(json.dumps(json_safe(result), indent=2), encoding="utf-8")
    return path


def _child_result(out: Path, log: Path) -> dict[str, Any]:
    """The child's result.json (the tool ran it), or an error saying the child never finished."""
    try:
        return json.loads((out / RESULT_JSON).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise WorkbenchError(f"the profiled child process left no result ({out / RESULT_JSON}: {exc}); "
                             f"{_tail(log)}") from exc


def _free_cuda_cache() -> None:
    """Give this process's cached GPU memory back before a child needs the GPU."""
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _prepared_child(spec: ChildSpec, folder: Path, profiler: str) -> tuple[ChildSpec, Path, Path]:
    """(the spec for `profiler`, its JSON file, the log file), in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = replace(spec, profiler=profiler, out_dir=str(folder / f"{profiler}-child"))
    path = spec.write(folder / f"{spec.variant}.{profiler}-spec.json")
    return spec, path, folder / f"{spec.variant}.{profiler}.log"


def profile_with_nsys(spec: ChildSpec, folder: str | Path, *, nsys: str | None = None,
                      timeout_s: float | None = None) -> ProfiledRun:
    """Run the spec's variant in a child process under `nsys profile`, export the report to SQLite, and
    return the run with the SQLite as its trace; report, SQLite, log (and the CUDA memory snapshot)
    are its raw files. Outputs go to `folder`."""
    from workbench.capture.lifecycle import ProfiledRun

    nsys = nsys or find_tool("nsys")
    folder = Path(folder)
    spec, spec_path, log = _prepared_child(spec, folder, "nsys")
    output = folder / spec.variant
    memory_usage = bool(spec.settings.get("profile_memory", True))
    command = nsys_command(nsys, output, child_command(spec_path), memory_usage=memory_usage)
    _free_cuda_cache()
    run_tool(command, log, what="nsys profile", timeout_s=timeout_s, env=child_env())
    report = output.with_name(f"{output.name}.nsys-rep")
    if not report.is_file():
        raise WorkbenchError(f"nsys wrote no report {report}: the measured region (cudaProfilerStart/Stop) "
                             f"was not captured; {_tail(log)}")
    result = _child_result(Path(spec.out_dir), log)
    sqlite = folder / f"{spec.variant}.sqlite"
    run_tool(nsys_export_command(nsys, report, sqlite), log, what="nsys export", timeout_s=timeout_s)
    if not sqlite.is_file():
        raise WorkbenchError(f"nsys export wrote no {sqlite}; {_tail(log)}")
    snapshot = Path(result["memory_snapshot"]) if result.get("memory_snapshot") else None
    raw = (report, sqlite, log, *((snapshot,) if snapshot else ()))
    notes = {**(result.get("notes") or {}),
             "nsys": {"command": shlex.join(command), "version": tool_version(nsys), "report": report.name}}
    return ProfiledRun(sqlite, {}, result.get("phases_ms") or {}, notes, raw, {}, snapshot)


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
    from workbench.trace.ncu import read_ncu_csv

    ncu = ncu or find_tool("ncu")
    folder = Path(folder)
    spec, spec_path, log = _prepared_child(spec, folder, "ncu")
    output = folder / spec.variant
    command = ncu_command(ncu, output, child_command(spec_path), kernel_name=kernel_name, launch_count=launch_count)
    _free_cuda_cache()
    try:
        run_tool(command, log, what="ncu", timeout_s=timeout_s, env=child_env())
    except WorkbenchError as exc:
        raise WorkbenchError(_with_permission_hint(str(exc))) from exc
    report = output.with_name(f"{output.name}.ncu-rep")
    if not report.is_file():
        wanted = f"kernels matching {kernel_name!r}" if kernel_name else "kernels"
        raise WorkbenchError(_with_permission_hint(
            f"ncu wrote no report {report}: it profiled no {wanted} in the measured iterations; {_tail(log)}"))
    _child_result(Path(spec.out_dir), log)
    csv_path = folder / f"{spec.variant}.ncu.csv"
    run_tool(ncu_import_command(ncu, report), log, what="ncu --import", timeout_s=timeout_s, stdout=csv_path)
    metrics = read_ncu_csv(csv_path)
    notes = {"command": shlex.join(command), "version": tool_version(ncu), "report": report.name,
             "kernel_name": kernel_name, "launch_count": launch_count, "launches": metrics.num_rows}
    return KernelProfile(metrics, (report, csv_path, log), notes)
