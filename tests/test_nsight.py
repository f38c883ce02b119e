"""Nsight Systems / Compute capture: command construction, tool discovery, the CUDA profiler range
around the measured iterations, the child-process runs (with stand-in tools on a CPU machine, real
ones on a GPU), the CLI options, and scripts/gpu-check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import TINY_CAPTURE, fixture_path
from test_ncu import CSV

import workbench.profiling.lifecycle as lifecycle
from workbench.backends import get_variant
from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.experiment import ExperimentSettings
from workbench.models import load_model
from workbench.profiling import ProfileSettings, session
from workbench.profiling.child import CHILD_COMMAND, ChildSpec, child_command, child_env
from workbench.profiling.cuda_range import CudaRangeSession
from workbench.profiling.ncu import ncu_command, ncu_import_command, profile_with_ncu
from workbench.profiling.nsys import NSYS_TRACE, nsys_command, nsys_export_command, profile_with_nsys
from workbench.profiling.registry import DEFAULT_LAUNCH_COUNT, check_profiler, get_profiler, profilers
from workbench.profiling.tools import ToolMissing, find_tool
from workbench.trace import read_trace
from workbench.trace.formats.ncu import METRICS

ROOT = Path(__file__).resolve().parents[1]
TINY = {"vocab": 64, "layers": 1, "d_model": 32, "heads": 2, "max_seq": 16}
APP = ["python", "-m", "workbench", CHILD_COMMAND, "/tmp/spec.json"]


# -- commands -------------------------------------------------------------------------------------


def test_nsys_command_records_the_cuda_profiler_range_of_the_app():
    assert nsys_command("/opt/nsys", "/tmp/out/eager", APP) == [
        "/opt/nsys", "profile", "--trace=cuda,nvtx,osrt,cublas,cudnn", "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop", "--cuda-graph-trace=node", "--cuda-memory-usage=false", "--sample=none",
        "--cpuctxsw=none", "--output=/tmp/out/eager", "--force-overwrite=true", *APP]
    with_memory = nsys_command("nsys", "o", ["app"], trace=("cuda", "nvtx"), memory_usage=True)
    assert "--trace=cuda,nvtx" in with_memory and "--cuda-memory-usage=true" in with_memory
    assert NSYS_TRACE == ("cuda", "nvtx", "osrt", "cublas", "cudnn")


def test_nsys_export_writes_sqlite():
    assert nsys_export_command("nsys", "/r/eager.nsys-rep", "/r/eager.sqlite") == [
        "nsys", "export", "--type=sqlite", "--output=/r/eager.sqlite", "--force-overwrite=true", "/r/eager.nsys-rep"]


def test_ncu_command_profiles_the_chosen_kernels_from_cuda_profiler_start():
    command = ncu_command("ncu", "/tmp/out/eager", APP, kernel_name="regex:gemm|sgemm", launch_count=7)
    assert command == ["ncu", "--target-processes", "all", "--profile-from-start", "off",
                       "--metrics", ",".join(METRICS), "--kernel-name", "regex:gemm|sgemm", "--launch-count", "7",
                       "--export", "/tmp/out/eager", "--force-overwrite", *APP]
    every = ncu_command("ncu", "o", ["app"], metrics=["gpu__time_duration.sum"])
    assert "--kernel-name" not in every and every[every.index("--metrics") + 1] == "gpu__time_duration.sum"
    assert every[every.index("--launch-count") + 1] == str(DEFAULT_LAUNCH_COUNT)


@pytest.mark.parametrize(("options", "match"), [({"launch_count": 0}, "launch-count must be an integer >= 1"),
                                                ({"launch_count": True}, "launch-count"),
                                                ({"kernel_name": " "}, "kernel-name is empty")])
def test_bad_ncu_options_are_refused(options, match):
    with pytest.raises(WorkbenchError, match=match):
        ncu_command("ncu", "o", ["app"], **options)


def test_ncu_import_prints_the_raw_page_in_base_units_with_demangled_names():
    assert ncu_import_command("ncu", "/r/eager.ncu-rep") == [
        "ncu", "--import", "/r/eager.ncu-rep", "--csv", "--page", "raw", "--print-units", "base",
        "--print-kernel-base", "demangled"]


def test_the_child_runs_the_hidden_cli_command_with_this_import_path():
    assert child_command("/s.json") == [sys.executable, "-m", "workbench", "_profile-variant", "/s.json"]
    env = child_env({"PATH": "/bin", "PYTHONPATH": "/extra"})
    paths = env["PYTHONPATH"].split(os.pathsep)
    assert paths[-1] == "/extra" and str(ROOT / "tests") in paths and env["PATH"] == "/bin"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_cli_options_match_the_capture_module():
    capture = main.commands["capture"]
    options = {p.name: p for p in capture.params}
    assert tuple(options["profiler"].type.choices) == tuple(profilers()) and options["profiler"].default == "framework"
    assert options["launch_count"].default == DEFAULT_LAUNCH_COUNT and options["kernel_name"].default is None
    assert main.commands[CHILD_COMMAND].hidden


# -- tools ----------------------------------------------------------------------------------------


@pytest.fixture
def no_tools(monkeypatch, tmp_path):
    """PATH without nsys or ncu."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("WORKBENCH_NSYS", raising=False)
    monkeypatch.delenv("WORKBENCH_NCU", raising=False)


@pytest.mark.parametrize(("tool", "hint"), [("nsys", "developer.nvidia.com/nsight-systems"),
                                            ("ncu", "Nsight Compute")])
def test_a_missing_tool_says_how_to_install_it(no_tools, tool, hint):
    with pytest.raises(ToolMissing, match=hint) as info:
        find_tool(tool)
    assert f"{tool} is not on PATH" in str(info.value) and info.value.tool == tool


def test_a_tool_can_be_named_by_the_environment(monkeypatch, tmp_path, no_tools):
    tool = _fake_tool(tmp_path, "nsys")
    monkeypatch.setenv("WORKBENCH_NSYS", str(tool))
    assert find_tool("nsys") == str(tool)
    monkeypatch.setenv("WORKBENCH_NSYS", str(tmp_path / "missing"))
    with pytest.raises(WorkbenchError, match=r"WORKBENCH_NSYS=.* is not an executable file"):
        find_tool("nsys")


@pytest.mark.parametrize(("profiler", "hint"), [("nsys", "Nsight Systems"), ("ncu", "Nsight Compute")])
def test_capture_without_the_tool_exits_2_with_the_install_hint(no_tools, tmp_path, profiler, hint):
    result = CliRunner().invoke(main, ["capture", *TINY_CAPTURE, "--profiler", profiler, "--device", "cuda",
                                       "--out", str(tmp_path / "traces")])
    assert result.exit_code == 2, result.output
    assert hint in result.output and "install" in result.output
    assert not (tmp_path / "traces").exists()


def test_nsight_profilers_need_cuda_and_profiling(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(_fake_tool(tmp_path, "nsys").parent))
    check_profiler("framework", "cpu", profile=False)
    check_profiler("nsys", "cuda", profile=True)
    with pytest.raises(WorkbenchError, match="run with --device cuda"):
        check_profiler("nsys", "cpu")
    with pytest.raises(WorkbenchError, match="cannot be combined with --no-profile"):
        check_profiler("nsys", "cuda", profile=False)
    with pytest.raises(WorkbenchError, match="unknown profiler 'vtune'"):
        check_profiler("vtune", "cuda")
    result = CliRunner().invoke(main, ["capture", *TINY_CAPTURE, "--profiler", "nsys", "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and "--device cuda" in result.output


@pytest.mark.parametrize(("settings", "match"), [({"profiler": "nvprof"}, "unknown profiler 'nvprof'"),
                                                 ({"launch_count": 0}, "launch_count must be an integer >= 1")])
def test_experiment_settings_check_the_profiler_options(settings, match):
    with pytest.raises(WorkbenchError, match=match):
        ExperimentSettings(**settings)


def test_the_hidden_child_command_reports_a_bad_spec(tmp_path):
    result = CliRunner().invoke(main, [CHILD_COMMAND, str(tmp_path / "missing.json")])
    assert result.exit_code == 2 and "not a profile-variant spec" in result.output
    assert CHILD_COMMAND not in CliRunner().invoke(main, ["--help"]).output


# -- the CUDA profiler range ----------------------------------------------------------------------


def test_the_range_brackets_exactly_the_measured_iterations(monkeypatch, tmp_path):
    log: list[str] = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: log.append("cudaProfilerStart"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: log.append("cudaProfilerStop"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    real_phase = lifecycle.phase

    @contextmanager
    def logged(name, timings=None):
        log.append(f"> {name}")
        with real_phase(name, timings):
            yield
        log.append(f"< {name}")

    monkeypatch.setattr(lifecycle, "phase", logged)
    asked: list[dict] = []

    def cuda_session(out_dir, name, settings, context):  # the variant runs on the CPU; the session acts as on
        asked.append({"device_type": context.device_type, "emit_nvtx": context.emit_nvtx})  # CUDA (without torch's
        return CudaRangeSession(out_dir, name, settings, device_type="cuda", emit_nvtx=False)  # NVTX op ranges)

    session.open_session("cuda-range", tmp_path, "probe", ProfileSettings(), session.SessionContext())  # registered
    monkeypatch.setitem(session._SESSIONS, "cuda-range", cuda_session)
    loaded = load_model("tiny-gpt", **TINY)
    run = lifecycle.profile_variant(get_variant("eager", 2), loaded, loaded.make_inputs(2, 8), tmp_path,
                                    ProfileSettings(warmup_steps=2, active_steps=2), tool=get_profiler("nsys"))
    assert log == ["> load", "< load", "> compile", "< compile", "> warmup", "cudaProfilerStart", "< warmup",
                   "> measure", "> step 0", "< step 0", "> step 1", "< step 1", "< measure", "cudaProfilerStop"]
    assert run.trace_path == tmp_path and run.op_flops == {} and run.raw_paths == () and run.memory_snapshot is None
    assert asked == [{"device_type": "cpu", "emit_nvtx": True}]
    assert {"warmup", "measure", "step 1"} <= set(run.phases_ms)


def test_without_warmup_the_range_opens_at_the_first_measured_iteration(monkeypatch, tmp_path):
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    session = CudaRangeSession(tmp_path, "eager", ProfileSettings(warmup_steps=0, active_steps=2))
    with pytest.raises(WorkbenchError, match="not running"):
        session.step()
    with session:
        assert calls == []
        with session.step_scope(0):
            assert calls == ["start"]
        session.step()
        session.step_scope(1)
    assert calls == ["start", "stop"] and session.captured and session.trace_path == tmp_path
    assert session.close() == tmp_path and calls == ["start", "stop"]


def test_a_range_closed_by_an_exception_exports_nothing(tmp_path):
    session = CudaRangeSession(tmp_path, "eager", ProfileSettings(warmup_steps=1), device_type="cpu")
    with pytest.raises(RuntimeError), session:
        session.step()
        raise RuntimeError("model raised")
    assert session.captured and session.trace_path is None


# -- child runs under stand-in tools (CPU) -----------------------------------------------------------

FAKE_TOOL = '''#!{python}
"""A stand-in for nsys / ncu: runs the application as the tool would and writes what the tool writes."""
import json, os, shutil, subprocess, sys
from pathlib import Path

name, args = Path(sys.argv[0]).name, sys.argv[1:]
with open(os.environ["FAKE_TOOL_LOG"], "a") as log:
    log.write(json.dumps([name, *args]) + "\\n")
if args == ["--version"]:
    print(f"fake {{name}} 1.0")
    sys.exit(0)
if name == "nsys" and args[0] == "export":
    shutil.copy(os.environ["FAKE_SQLITE"], next(a.split("=", 1)[1] for a in args if a.startswith("--output=")))
    sys.exit(0)
if name == "ncu" and "--import" in args:
    sys.stdout.write(open(os.environ["FAKE_CSV"]).read())
    sys.exit(0)
options, i = {{}}, 1 if name == "nsys" else 0
while i < len(args) and args[i].startswith("--"):
    if "=" in args[i] or args[i] == "--force-overwrite":
        key, _, value = args[i].partition("=")
        i += 1
    else:
        key, value = args[i], args[i + 1]
        i += 2
    options[key] = value
sys.stderr.write(os.environ.get("FAKE_STDERR", ""))
code = subprocess.call(args[i:]) if not os.environ.get("FAKE_SKIP_APP") else 0
if code == 0 and not os.environ.get("FAKE_NO_REPORT"):
    Path(options["--output" if name == "nsys" else "--export"] + (".nsys-rep" if name == "nsys" else ".ncu-rep")
         ).write_bytes(b"report")
sys.exit(code)
'''


def _fake_tool(folder: Path, name: str) -> Path:
    bin_dir = folder / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(FAKE_TOOL.format(python=sys.executable))
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """Stand-in nsys and ncu, the argv of each call logged as JSON lines."""
    log = tmp_path / "tool-calls.jsonl"
    csv_file = tmp_path / "kernels.csv"
    csv_file.write_text(CSV)
    monkeypatch.setenv("FAKE_TOOL_LOG", str(log))
    monkeypatch.setenv("FAKE_SQLITE", str(fixture_path("nsys", "h100_2gpu_1s.sqlite")))
    monkeypatch.setenv("FAKE_CSV", str(csv_file))
    tools = {name: str(_fake_tool(tmp_path, name)) for name in ("nsys", "ncu")}
    return tools, lambda: [json.loads(line) for line in log.read_text().splitlines()]


def _spec(variant: str = "eager") -> ChildSpec:
    return ChildSpec(model="tiny-gpt", variant=variant, batch=2, device="cpu", out_dir="", seq=8, threads=1,
                     model_overrides=TINY, settings=ProfileSettings(warmup_steps=1, active_steps=2).to_dict())


def test_nsys_runs_the_variant_in_a_child_and_its_export_is_the_trace(tmp_path, fake_tools):
    tools, calls = fake_tools
    run = profile_with_nsys(_spec(), tmp_path / "out", nsys=tools["nsys"])
    out = tmp_path / "out"
    assert run.trace_path == out / "eager.sqlite" and read_trace(run.trace_path).metadata["source"]["format"] == "nsys"
    assert [p.name for p in run.raw_paths] == ["eager.nsys-rep", "eager.sqlite", "eager.nsys.log"]
    assert {"load", "compile", "warmup", "measure", "step 0", "step 1"} <= set(run.phases_ms)
    assert run.memory_snapshot is None and run.op_flops == {}  # a CPU child records no CUDA memory
    assert run.notes["nsys"]["version"] == "fake nsys 1.0" and "--capture-range=cudaProfilerApi" in run.notes["nsys"][
        "command"]
    profile, export = [c for c in calls() if c[1] in ("profile", "export")]
    spec_file = out / "eager.nsys-spec.json"
    assert profile[-5:] == [sys.executable, "-m", "workbench", CHILD_COMMAND, str(spec_file)]
    assert f"--output={out / 'eager'}" in profile and "--cuda-memory-usage=true" in profile
    assert export[-1] == str(out / "eager.nsys-rep")
    assert ChildSpec.read(spec_file).profiler == "nsys"
    assert json.loads((out / "nsys-child" / "result.json").read_text())["variant"] == "eager"
    assert "$ " in (out / "eager.nsys.log").read_text()


def test_ncu_profiles_the_variant_in_a_child_into_kernel_metrics(tmp_path, fake_tools):
    tools, calls = fake_tools
    profile = profile_with_ncu(_spec(), tmp_path / "out", kernel_name="regex:sgemm", launch_count=5, ncu=tools["ncu"])
    assert profile.metrics.num_rows == 3 and profile.metrics["duration_ns"].to_pylist()[0] == pytest.approx(12_580.0)
    assert [p.name for p in profile.raw_paths] == ["eager.ncu-rep", "eager.ncu.csv", "eager.ncu.log"]
    assert profile.notes["kernel_name"] == "regex:sgemm" and profile.notes["launch_count"] == 5
    assert profile.notes["launches"] == 3 and profile.notes["version"] == "fake ncu 1.0"
    run, imported = [c for c in calls() if c[1] != "--version"]
    assert run[run.index("--kernel-name") + 1] == "regex:sgemm" and run[run.index("--launch-count") + 1] == "5"
    assert imported[1:3] == ["--import", str(tmp_path / "out" / "eager.ncu-rep")]


def test_a_failing_child_fails_the_capture_with_its_error(tmp_path, fake_tools):
    tools, _ = fake_tools
    with pytest.raises(WorkbenchError, match=r"(?s)nsys profile failed \(exit code 2\).*unknown variant 'nope'"):
        profile_with_nsys(_spec("nope"), tmp_path / "out", nsys=tools["nsys"])


def test_a_tool_that_writes_no_report_is_an_error(tmp_path, fake_tools, monkeypatch):
    tools, _ = fake_tools
    monkeypatch.setenv("FAKE_SKIP_APP", "1")
    monkeypatch.setenv("FAKE_NO_REPORT", "1")
    with pytest.raises(WorkbenchError, match=r"ncu wrote no report .* no kernels matching 'regex:none'"):
        profile_with_ncu(_spec(), tmp_path / "out", kernel_name="regex:none", ncu=tools["ncu"])
    with pytest.raises(WorkbenchError, match="nsys wrote no report"):
        profile_with_nsys(_spec(), tmp_path / "out2", nsys=tools["nsys"])
    monkeypatch.setenv("FAKE_STDERR", "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n")
    with pytest.raises(WorkbenchError, match=r"(?s)ERR_NVGPUCTRPERM - The user.*NVreg_RestrictProfilingToAdminUsers=0"):
        profile_with_ncu(_spec(), tmp_path / "out3", ncu=tools["ncu"])


# -- scripts/gpu-check --------------------------------------------------------------------------------

GPU_CHECK = ROOT / "scripts" / "gpu-check"


def test_gpu_check_dry_run_lists_the_steps(tmp_path):
    done = subprocess.run([str(GPU_CHECK), "--dry-run", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    for step in ("nvidia-smi", "pytest -m gpu", "--profiler nsys", "--profiler ncu",
                 "eager,fp16,bf16,compile,compile-reduce-overhead,int8-weight-only,fp8,jax-jit"):
        assert step in done.stdout
    assert not (tmp_path / "out").exists()


def test_gpu_check_without_a_gpu_fails_clearly(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    done = subprocess.run([str(GPU_CHECK), str(tmp_path / "out")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 2
    assert "nvidia-smi not found" in (tmp_path / "out" / "summary.txt").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpu_check_stops_when_torch_sees_no_gpu(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (fake)'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": sys.executable}
    done = subprocess.run([str(GPU_CHECK), str(tmp_path / "out")], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 2 and "torch sees no CUDA device" in done.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert [line.split()[:2] for line in summary.splitlines()] == [["nvidia-smi", "ok"], ["cuda", "failed"]]


# -- on a GPU with the real tools -----------------------------------------------------------------------


def _needs(tool: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not torch.cuda.is_available() or shutil.which(tool) is None,
                              reason=f"needs CUDA and {tool} on PATH")


@pytest.mark.gpu
@_needs("nsys")
def test_capture_under_nsys_on_a_gpu(tmp_path):
    from workbench.trace.store.bundle import open_bundle

    root = tmp_path / "traces"
    result = CliRunner().invoke(main, ["capture", *TINY_CAPTURE, "--variants", "eager,compile", "--device", "cuda",
                                       "--profiler", "nsys", "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    for run in json.loads(result.stdout)["runs"]:
        bundle = open_bundle(run["run_id"], root)
        trace = bundle.trace()
        assert trace.metadata["source"]["format"] == "nsys" and bundle.info["capture"]["profiler"] == "nsys"
        kinds = trace.kind_counts()
        assert kinds.get("kernel", 0) > 0
        names = set(trace.events["name"].to_pylist())
        assert {"measure", "step 0"} <= names and "load" not in names  # only the measured region
        assert {p.suffix for p in bundle.raw_files()} >= {".nsys-rep", ".sqlite"}


@pytest.mark.gpu
@_needs("ncu")
def test_capture_under_ncu_on_a_gpu(tmp_path):
    from workbench.analysis.kernel_metrics import join_kernel_metrics
    from workbench.experiment import run_experiment
    from workbench.trace.store.bundle import open_bundle

    settings = ExperimentSettings(model="tiny-gpt", variants=("eager",), batch=2, seq=8, device="cuda", warmup=1,
                                  iterations=3, model_overrides=TINY, profiler="ncu", launch_count=10,
                                  profile_settings=ProfileSettings(warmup_steps=1, active_steps=1))
    (run,) = run_experiment(settings, tmp_path).runs
    assert run.status == "ok", run.error
    bundle = open_bundle(run.run_id, tmp_path)
    metrics = bundle.table("kernel_metrics")
    assert 0 < metrics.num_rows <= 10 and min(metrics["duration_ns"].to_pylist()) > 0
    joined = join_kernel_metrics(bundle.trace(), metrics)
    assert joined["duration_ns"].notna().sum() > 0
