"""TensorRT capture on CPU: IProfiler layer timings taken after the measured steps and merged into the trace,
the compile files in the bundle, and the TensorRT row of the fusion table.

TensorRT cannot be installed here, so a fake prepared variant with `PreparedTrtVariant`'s surface stands in:
it runs the torch model on the CPU, leaves compile files like a real build, reports the inspector JSON of a
real engine (`test_tensorrt.RESNET_FP16`, plus one layer of a single ONNX node) and canned layer times.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from bokeh.models import DataTable
from conftest import write_trace
from test_tensorrt import RESNET_FP16

import workbench.profiling.lifecycle as lifecycle
from workbench.analysis.fusion import FusionInputs, fusion_detail, fusion_inputs, fusion_table
from workbench.analysis.steps import step_windows
from workbench.analysis.trt_fusion import ENGINE_JSON, ONNX_NODES, layer_executions, trt_fusions, trt_summary
from workbench.backends import get_variant
from workbench.backends.benchmark import WallClockTimer
from workbench.backends.prepared import time_first_call
from workbench.backends.tensorrt.prepared import ARTIFACTS, TIMING_CACHE, keep_compile_files
from workbench.errors import WorkbenchError
from workbench.experiment import ExperimentSettings, run_experiment
from workbench.models import load_model
from workbench.profiling import ProfileSettings
from workbench.profiling.lifecycle import profile_variant
from workbench.trace import read_trace
from workbench.trace.formats.trt_layers import TRACK, LayerTimes, layer_trace, merge_layer_times
from workbench.trace.store.bundle import open_bundle, write_bundle
from workbench.views.experiments import experiments_view as compare

GEMM = {"Name": "Gemm_48", "LayerType": "CaskGemmMatrixMultiply",
        "Inputs": [{"Name": "x", "Dimensions": [32, 512], "Format/Datatype": "Row major linear FP16 format"}],
        "Outputs": [{"Name": "y", "Dimensions": [32, 1000], "Format/Datatype": "Row major linear FP16 format"}],
        "TacticName": "sm80_xmma_gemm_f16f16_f16f32", "TacticValue": "0x00000000000000aa"}
ENGINE = json.loads(RESNET_FP16)
ENGINE["Layers"].append(GEMM)
ENGINE_TEXT = json.dumps(ENGINE)
NODE_OPS = {"Conv_3": "Conv", "Relu_4": "Relu", "Conv_5": "Conv", "Add_6": "Add", "Relu_7": "Relu", "Gemm_48": "Gemm"}
LAYER_MS = [0.01, 0.25, 0.0, 0.5, 0.02, 0.125]
"""Per execution, the time of each engine layer in `ENGINE` order (ms); execution n adds n * 0.001 to each."""
COMPILE_FILES = {"model.onnx", "model.fp16.onnx", "model.fp16.onnx.data", TIMING_CACHE}
MLP = {"hidden": 16}
FAST = {"batch": 2, "warmup": 1, "iterations": 3, "threads": 1,
        "profile_settings": ProfileSettings(warmup_steps=1, active_steps=3)}


def _layer_names() -> list[str]:
    return [layer["Name"] for layer in ENGINE["Layers"]]


class FakeTrtVariant:
    """`PreparedTrtVariant`'s surface on the CPU: the first call "builds" (writes compile files and the
    artifacts), `profile_layers` returns canned IProfiler timings; `log` records the calls in order."""

    def __init__(self, variant: Any, loaded: Any, work: Path) -> None:
        self.variant = variant
        self.device = torch.device("cpu")
        self.notes: dict[str, Any] = {"device": "cuda:0", "compile": "tensorrt", "precision": variant.precision}
        self.artifacts: dict[str, str] = {}
        self.compile_dir = work / "compile"
        self.log: list[str] = []
        self._module = loaded.module
        self._profiling = False

    def place(self, inputs: Any) -> tuple[torch.Tensor, ...]:
        return tuple(inputs)

    def run(self, inputs: Any) -> torch.Tensor:
        if not self.artifacts:
            self.compile_dir.mkdir(parents=True)
            for name in (*COMPILE_FILES, "autocast_calibration.npz"):
                (self.compile_dir / name).write_bytes(name.encode())
            self.artifacts = {ARTIFACTS["engine"]: ENGINE_TEXT, ARTIFACTS["nodes"]: json.dumps(NODE_OPS),
                              ARTIFACTS["precision"]: json.dumps({"precision": "fp16"})}
        self.log.append("profiled run" if self._profiling else "run")
        with torch.inference_mode():
            return self._module(*inputs).float()

    def sync(self) -> None:
        """Nothing queued on the CPU."""

    def timer(self) -> WallClockTimer:
        return WallClockTimer(sync=self.sync)

    def first_call(self, inputs: Any) -> float:
        return time_first_call(self, inputs)

    def profile_layers(self, inputs: Any, iterations: int = 10) -> LayerTimes:
        times = LayerTimes(epoch_offset_ns=time.time_ns() - time.perf_counter_ns())
        self._profiling = True
        for execution in range(iterations):
            times.begin(time.perf_counter_ns())
            self.run(inputs)
            for name, ms in zip(_layer_names(), LAYER_MS, strict=True):
                times.record(name, ms + execution * 0.001)
            times.end(time.perf_counter_ns())
        self._profiling = False
        return times


@pytest.fixture(scope="module")
def mlp():
    return load_model("mlp", **MLP)


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    """Make `prepare` hand back a FakeTrtVariant for TensorRT variants (the real one for the others); the
    fakes made are listed."""
    made: list[FakeTrtVariant] = []
    real = lifecycle.prepare

    def prepare(variant, loaded, **kwargs):
        if variant.backend != "tensorrt":
            return real(variant, loaded, **kwargs)
        made.append(FakeTrtVariant(variant, loaded, tmp_path / f"work-{len(made)}"))
        return made[-1]

    monkeypatch.setattr(lifecycle, "prepare", prepare)
    return made


def _expected_kernel_ns(executions: int) -> float:
    sums = [sum(round((ms + n * 0.001) * 1e6) for ms in LAYER_MS) for n in range(executions)]
    return float(pd.Series(sums).median())


def test_profile_variant_times_layers_after_the_measured_steps_and_keeps_compile_files(mlp, fakes, tmp_path):
    settings = ProfileSettings(warmup_steps=1, active_steps=3)
    out = tmp_path / "out"
    out.mkdir()
    run = profile_variant(get_variant("trt-fp16", batch=2, device="cuda:0"), mlp, mlp.make_inputs(2, None), out,
                          settings)
    (fake,) = fakes
    # first call, warm-up, 3 measured steps, then the IProfiler runs
    assert fake.log == ["run"] * 5 + ["profiled run"] * 3
    assert "layers" in run.phases_ms
    annotations = set(read_trace(run.trace_path).df().query("kind == 'annotation'")["name"].astype(str))
    assert {"step 0", "step 2"} <= annotations and "layers" not in annotations  # profiler already closed
    times = run.layer_times
    assert len(times.executions) == 3 and len(times.layers) == len(LAYER_MS) * 3
    (saved,) = [p for p in run.raw_paths if p.name == "trt-fp16.trt_layers.json"]
    assert LayerTimes.from_dict(json.loads(saved.read_text())) == times
    assert {p.name for p in run.compile_dir.iterdir()} == COMPILE_FILES  # calibration inputs left behind
    assert sorted(p.name for p in fake.compile_dir.iterdir()) == ["autocast_calibration.npz"]
    assert run.artifacts[ENGINE_JSON] == ENGINE_TEXT


def test_experiment_bundle_has_layer_events_compile_files_and_a_tensorrt_fusion_row(mlp, fakes, tmp_path):
    root = tmp_path / "traces"
    settings = ExperimentSettings(model="mlp", variants=("trt-fp16",), device="cuda:0", model_overrides=MLP, **FAST)
    (result,) = run_experiment(settings, root).runs
    assert result.status == "ok", result.error
    bundle = open_bundle(result.run_id, root)
    trace = bundle.trace()
    counts = trace.kind_counts()
    assert counts["layer"] == len(LAYER_MS) * 3 and counts["module"] == 3
    events = trace.df()
    layers = events[events["kind"] == "layer"]
    assert set(layers["track"].astype(str)) == {f"cuda:0/{TRACK}"}
    assert (events.loc[layers["parent"].to_numpy(), "kind"] == "module").all()  # parents shifted with the rows
    fused = [json.loads(a) for a in layers.loc[layers["name"] == "Conv_5 + Add_6 + Relu_7", "args"]]
    assert len(fused) == 3 and all(a["precision"] == "fp16" and a["fused_ops"] == "Conv, Add, Relu" for a in fused)
    assert all(a["tactic"].startswith("sm80_xmma_fprop_implicit_gemm") for a in fused)
    last_step = step_windows(trace)["end_ns"].max()
    assert len(step_windows(trace)) == 3 and layers["start_ns"].min() >= last_step  # outside the measured steps
    assert trace.metadata["tensorrt_layers"]["placement"] == "clock"

    compiled = {p.name for p in (bundle.path / "compile").iterdir()}
    assert compiled == COMPILE_FILES | {ENGINE_JSON, ONNX_NODES, "precision.json"}
    assert (bundle.path / "compile" / ENGINE_JSON).read_text() == ENGINE_TEXT
    assert [p.name for p in bundle.raw_files()] == ["trt-fp16.pt.trace.json", "trt-fp16.trt_layers.json"]

    inputs = fusion_inputs(bundle)
    assert inputs.framework == "tensorrt" and inputs.node_ops == NODE_OPS
    row = fusion_table([inputs]).iloc[0]
    summary = trt_summary(trt_fusions(ENGINE_TEXT, NODE_OPS))
    # the inspector: two conv layers fusing 2 and 3 ONNX nodes, one lone Gemm, three reformat / no-op layers
    assert (row["kernels"], row["fusions"], row["fused_ops"], row["unfused_ops"]) == (3, 2, 5, 1)
    assert row["fusions"] == summary["fusions"] and row["framework"] == "tensorrt"
    assert row["kernel_ns"] == _expected_kernel_ns(3)
    windows = step_windows(trace)
    assert row["steps"] == 3 and row["step_ns"] == float((windows["end_ns"] - windows["start_ns"]).median())

    detail = fusion_detail(inputs).set_index("name")
    assert (detail["executions"] == 3).all()
    assert detail.loc["Gemm_48", "median_ns"] == 126_000 and detail.loc["Gemm_48", "fused_ops"] == "Gemm"
    assert detail["share"].sum() == pytest.approx(1.0)

    tables = list(compare([bundle]).select({"type": DataTable}))
    assert any(list(t.source.data.get("framework", [])) == ["tensorrt"] for t in tables)


def _layer_only_bundle(root: Path, texts: dict[str, str]) -> Any:
    times = LayerTimes()
    for execution, begin in enumerate((0, 10_000_000, 20_000_000)):
        times.begin(begin)
        for name, ms in zip(_layer_names(), LAYER_MS, strict=True):
            times.record(name, ms + execution * 0.001)
        times.end(begin + 2_000_000 + execution * 1_000_000)
    trace = layer_trace(times, "cuda:0", engine="trt-fp16", layers=trt_fusions(ENGINE_TEXT, NODE_OPS))
    write_bundle(root, "trt", {"variant": {"name": "trt-fp16", "backend": "tensorrt"}}, trace,
                 texts={f"compile/{name}": text for name, text in texts.items()})
    return open_bundle("trt", root)


def test_a_tensorrt_bundle_without_steps_takes_its_step_time_from_the_executions(tmp_path):
    bundle = _layer_only_bundle(tmp_path, {ENGINE_JSON: ENGINE_TEXT, ONNX_NODES: json.dumps(NODE_OPS)})
    jit = FusionInputs("jax-jit", "jax", hlo_text="HloModule m\n\nENTRY %e (p: f32[2]) -> f32[2] {\n"
                                                   "  %p = f32[2]{0} parameter(0)\n  ROOT %t = f32[2]{0} tanh(%p)\n}\n")
    table = fusion_table([fusion_inputs(bundle), jit]).set_index("variant")
    row = table.loc["trt-fp16"]
    assert row["steps"] == 3 and row["step_ns"] == 3_000_000  # median execution wall time
    assert row["kernel_ns"] == _expected_kernel_ns(3) and row["fusions"] == 2
    assert table.loc["jax-jit", "framework"] == "jax" and table.loc["jax-jit", "kernels"] == 1
    assert list(layer_executions(bundle.trace())["wall_ns"]) == [2_000_000, 3_000_000, 4_000_000]


def test_a_tensorrt_bundle_without_a_node_map_or_with_a_bad_one(tmp_path):
    plain = fusion_inputs(_layer_only_bundle(tmp_path / "a", {ENGINE_JSON: ENGINE_TEXT}))
    assert plain.node_ops is None and fusion_table([plain]).iloc[0]["fusions"] == 2  # names alone suffice here
    with pytest.raises(WorkbenchError, match=r"onnx_nodes.json: expected a JSON object"):
        fusion_inputs(_layer_only_bundle(tmp_path / "b", {ENGINE_JSON: ENGINE_TEXT, ONNX_NODES: "[1, 2]"}))
    no_engine = fusion_inputs(_layer_only_bundle(tmp_path / "c", {}))
    assert no_engine.engine_json is None and no_engine.framework == "tensorrt"
    with pytest.raises(WorkbenchError, match="trt-fp16: no fusion record"):
        fusion_detail(no_engine)


def test_merged_layer_events_sit_on_the_traces_clock_or_after_it(tmp_path):

    base = 1_700_000_000_000_000_000
    events = [{"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 100, "dur": 200},
              {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 150, "dur": 50}]
    host = read_trace(write_trace(tmp_path / "host.json", events, baseTimeNanoseconds=base))
    times = LayerTimes(epoch_offset_ns=base + 100_000 + 2_000_000 - 5_000_000)  # perf 5 ms = 2 ms on the axis
    times.begin(5_000_000)
    times.record("Conv_3 + Relu_4", 0.25)
    times.end(5_400_000)
    merged = merge_layer_times(host, times, "cuda:0", engine="trt-fp16").df()
    assert list(merged["name"].astype(str)) == ["outer", "inner", "trt-fp16", "Conv_3 + Relu_4"]
    assert list(merged["start_ns"])[2:] == [2_000_000, 2_000_000]
    assert list(merged["parent"]) == [-1, 0, -1, 2]
    times.epoch_offset_ns = None
    after = merge_layer_times(host, times, "cuda:0")
    assert after.df()["start_ns"].iloc[2] == 200_000 + 1_000_000  # host trace ends at 200 µs, then the gap
    assert after.metadata["tensorrt_layers"]["placement"] == "after trace"
    assert after.metadata["source"] == host.metadata["source"]


def test_layer_times_keep_their_clock_offset_and_read_older_records():
    times = LayerTimes(epoch_offset_ns=42)
    times.begin(1)
    times.record("a", 0.5)
    times.end(2)
    assert LayerTimes.from_dict(json.loads(json.dumps(times.to_dict()))) == times
    older = {"executions": [[1, 2]], "layers": [{"execution": 0, "name": "a", "ms": 0.5}]}
    assert LayerTimes.from_dict(older).epoch_offset_ns is None


def test_keep_compile_files_names_a_missing_build(tmp_path):
    with pytest.raises(WorkbenchError, match="never built"):
        keep_compile_files(tmp_path / "nothing", tmp_path / "dest")
    assert ARTIFACTS["engine"] == ENGINE_JSON and ARTIFACTS["nodes"] == ONNX_NODES  # bundle names agree
