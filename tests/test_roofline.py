"""Roofline: FLOPs/bytes from shapes (hand-computed), bound rules, and real CPU captures vs measured peaks."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner
from conftest import TINY_CAPTURE

from workbench.analysis.op_cost import OpCost, event_costs, op_cost
from workbench.analysis.roofline import (
    PROJECTION_COLUMNS,
    ROOFLINE_COLUMNS,
    classify_bound,
    event_work,
    project,
    roofline,
)
from workbench.cli import main
from workbench.hardware import DeviceSpec, cpu_probe, device_spec
from workbench.trace import Trace, schema
from workbench.trace.store.bundle import open_bundle

F, BF = "float", "c10::BFloat16"


# --- FLOPs and bytes from shapes, computed by hand ---------------------------------------------------


@pytest.mark.parametrize(("name", "shapes", "dtypes", "concrete", "flops", "moved", "dtype"), [
    ("aten::mm", [[64, 128], [128, 256]], [F, F], None,
     2 * 64 * 128 * 256, 4 * (64 * 128 + 128 * 256 + 64 * 256), "fp32"),
    ("aten::addmm", [[256], [64, 128], [128, 256], [], []], [F, F, F, "Scalar", "Scalar"], None,
     2 * 64 * 128 * 256, 4 * (256 + 64 * 128 + 128 * 256 + 64 * 256), "fp32"),
    ("aten::linear", [[2, 8, 32], [64, 32], [64]], [BF, BF, BF], None,
     2 * 16 * 32 * 64, 2 * (2 * 8 * 32 + 64 * 32 + 64 + 2 * 8 * 64), "bf16"),
    ("aten::linear", [[2, 8, 32], [64, 32], []], [F, F, ""], None,
     2 * 16 * 32 * 64, 4 * (2 * 8 * 32 + 64 * 32 + 2 * 8 * 64), "fp32"),
    ("aten::bmm", [[4, 8, 16], [4, 16, 32]], [F, F], None, 2 * 4 * 8 * 16 * 32, 4 * 4 * (8 * 16 + 16 * 32 + 8 * 32),
     "fp32"),
    ("aten::matmul", [[2, 3, 4], [4, 5]], [F, F], None, 2 * 2 * 3 * 4 * 5, 4 * (24 + 20 + 30), "fp32"),
    ("aten::matmul", [[7], [7, 5]], [F, F], None, 2 * 7 * 5, 4 * (7 + 35 + 5), "fp32"),
    ("aten::_int_mm", [[16, 32], [32, 64]], ["unsigned char", "signed char"], None,
     2 * 16 * 32 * 64, 16 * 32 + 32 * 64 + 4 * 16 * 64, "int8"),
    # conv2d(input, weight, bias, stride, padding, dilation, groups): stride 1, padding 1 keeps 32x32
    ("aten::conv2d", [[2, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []], [F, F, F, "ScalarList", "ScalarList",
     "ScalarList", "Scalar"], ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"],
     2 * 2 * 16 * 32 * 32 * 3 * 9, 4 * (2 * 3 * 32 * 32 + 16 * 27 + 16 + 2 * 16 * 32 * 32), "fp32"),
    # stride 2, padding 1, groups 2 on 17x17: out 9x9; torch.profiler counts 186624 for batch 2
    ("aten::conv2d", [[2, 8, 17, 17], [16, 4, 3, 3], [], [], [], [], []], [F, F, "", "ScalarList", "ScalarList",
     "ScalarList", "Scalar"], ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "2"],
     186624, 4 * (2 * 8 * 17 * 17 + 16 * 36 + 2 * 16 * 81), "fp32"),
    # mkldnn_convolution(input, weight, bias, padding, stride, dilation, groups): padding comes first
    ("aten::mkldnn_convolution", [[2, 8, 17, 17], [16, 4, 3, 3], [], [], [], [], []],
     [F, F, "", "ScalarList", "ScalarList", "ScalarList", "Scalar"], ["", "", "", "[1, 1]", "[2, 2]", "[1, 1]", "2"],
     186624, 4 * (2 * 8 * 17 * 17 + 16 * 36 + 2 * 16 * 81), "fp32"),
    # 1x1 stride-2 projection of the convnet: 16x16 -> 8x8
    ("aten::convolution", [[2, 64, 16, 16], [128, 64, 1, 1], [], [], [], [], [], [], []],
     [F, F, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"],
     ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"],
     2 * 2 * 128 * 64 * 64, 4 * (2 * 64 * 256 + 128 * 64 + 2 * 128 * 64), "fp32"),
    # transposed: out = (5 - 1)·2 - 2·1 + 1·(3 - 1) + 1 + 1 = 10; FLOPs over the input positions
    ("aten::convolution", [[1, 4, 5, 5], [4, 2, 3, 3], [], [], [], [], [], [], []],
     [F, F, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"],
     ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "True", "[1, 1]", "1"],
     2 * 25 * 4 * 2 * 9, 4 * (100 + 72 + 2 * 100), "fp32"),
    # attention: 4·B·H·Tq·Tk·D, causal over the 16·17/2 unmasked pairs
    ("aten::scaled_dot_product_attention", [[2, 4, 16, 8]] * 3 + [[]] * 5, [F, F, F, "", "Scalar", "Scalar", "",
     "Scalar"], ["", "", "", "", "0.", "False", "", "False"], 4 * 2 * 4 * 16 * 16 * 8, 4 * 4 * (2 * 4 * 16 * 8),
     "fp32"),
    ("aten::scaled_dot_product_attention", [[2, 4, 16, 8]] * 3 + [[]] * 5, [F, F, F, "", "Scalar", "Scalar", "",
     "Scalar"], ["", "", "", "", "0.", "True", "", "False"], 4 * 2 * 4 * (16 * 17 // 2) * 8, 4 * 4 * (2 * 4 * 16 * 8),
     "fp32"),
    # the CPU flash kernel has is_causal at position 4; 4 queries over 16 keys see 1 + 2 + 3 + 4 keys
    ("aten::_scaled_dot_product_flash_attention_for_cpu", [[1, 2, 4, 8], [1, 2, 16, 8], [1, 2, 16, 8], [], [], [],
     []], [BF, BF, BF, "Scalar", "Scalar", "", ""], ["", "", "", "0.", "True", "", ""],
     4 * 2 * 10 * 8, 2 * (2 * 4 * 8 + 2 * 2 * 16 * 8 + 2 * 4 * 8), "bf16"),
    ("aten::add", [[2, 8, 32], [8, 32], []], [F, F, "Scalar"], None, 512, 4 * (512 + 256 + 512), "fp32"),
    ("aten::relu_", [[10, 10]], [F], None, 100, 4 * 200, "fp32"),
    ("aten::where", [[4, 4], [4, 4], []], ["bool", BF, "double"], None, 16, 16 + 2 * 16 + 8 + 2 * 16, "bf16"),
    ("aten::layer_norm", [[2, 8, 32], [], [32], [32], [], []], [F, "ScalarList", F, F, "Scalar", "Scalar"], None,
     8 * 512, 4 * (512 + 32 + 32 + 512), "fp32"),
    ("aten::_softmax", [[4, 10], [], []], [F, "Scalar", "Scalar"], None, 5 * 40, 4 * 80, "fp32"),
    ("aten::copy_", [[16, 32], [16, 32], []], [BF, F, "Scalar"], None, 0, 2 * 512 + 4 * 512, "bf16"),
    ("aten::embedding", [[512, 32], [8], [], [], []], [F, "long int", "Scalar", "Scalar", "Scalar"], None,
     0, 8 * 8 + 2 * 4 * 8 * 32, "fp32"),
])
def test_op_cost_by_hand(name, shapes, dtypes, concrete, flops, moved, dtype):
    assert op_cost(name, shapes, dtypes, concrete) == OpCost(float(flops), float(moved), dtype)


@pytest.mark.parametrize(("name", "shapes", "dtypes", "concrete"), [
    ("aten::view", [[2, 8], []], [F, "ScalarList"], None),  # not a costed op
    ("aten::mm", [[4, 5], [6, 7]], [F, F], None),  # inner dims differ
    ("aten::add", [[3, 4], [5, 4]], [F, F], None),  # does not broadcast
    ("aten::conv2d", [[2, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], []], [F, F, "", "GenericList", "GenericList",
     "GenericList", "Int"], None),  # an old trace without Concrete Inputs
    ("aten::conv2d", [[2, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], []], [F, F, "", "ScalarList", "", "ScalarList",
     "Scalar"], ["", "", "", "[1, 1]", "", "[1, 1]", "1"]),  # padding="same" is recorded as ""
    ("aten::mm", [[], []], ["Scalar", "Scalar"], None),  # no tensors
])
def test_unknown_cost_is_none(name, shapes, dtypes, concrete):
    assert op_cost(name, shapes, dtypes, concrete) is None


def test_attention_without_the_flag_counts_as_not_causal():
    q = [[1, 1, 8, 4]] * 3
    assert op_cost("aten::scaled_dot_product_attention", q, [F] * 3).flops == 4 * 8 * 8 * 4


def test_event_costs_reads_recorded_columns_and_args():
    conv_args = json.dumps({"Concrete Inputs": ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "2"]})
    events = pd.DataFrame({
        "name": ["aten::mm", "aten::mm", "aten::conv2d", "aten::view", "ProfilerStep#1"],
        "shapes": ["[[64, 128], [128, 256]]"] * 2 + ["[[2, 8, 17, 17], [16, 4, 3, 3], [], [], [], [], []]",
                                                     "[[2, 8], []]", None],
        "dtypes": ['["float", "float"]', '["c10::BFloat16", "c10::BFloat16"]',
                   '["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"]',
                   '["float", "ScalarList"]', None],
        "args": ["{}", "{}", conv_args, "{}", None],
    })
    costs = event_costs(events)
    assert costs["flops"].tolist()[:3] == [2 * 64 * 128 * 256] * 2 + [186624]
    assert costs["bytes"].tolist()[1] == 2 * (64 * 128 + 128 * 256 + 64 * 256)
    assert costs["dtype"].tolist() == ["fp32", "bf16", "fp32", "fp32", None]
    assert np.isnan(costs["flops"].tolist()[3]) and np.isnan(costs["flops"].tolist()[4])


# --- synthetic traces ---------------------------------------------------------------------------------

DEVICE = DeviceSpec(name="test-chip", kind="custom", peak_flops={"fp32": 1e12, "bf16": 4e12},
                    memory_bw_bytes_per_s=1e11)
"""Ridge points: 10 FLOP/byte in fp32, 40 in bf16."""
MM_SHAPES, MM_TYPES = "[[256, 512], [512, 1024]]", '["float", "float"]'
MM_FLOPS = 2 * 256 * 512 * 1024
MM_BYTES = 4 * (256 * 512 + 512 * 1024 + 256 * 1024)
ADD_FLOPS, ADD_BYTES = 1024 * 1024, 3 * 4 * 1024 * 1024


def _trace(rows: list[dict]) -> Trace:
    base = {"start_ns": 0, "dur_ns": 1, "kind": "op", "device": "cpu", "track": "cpu/thread 1", "pid": 1, "tid": 1,
            "corr": -1, "parent": -1, "depth": 0, "launcher": -1, "flops": None, "bytes": None, "shapes": None,
            "dtypes": None, "args": None}
    return Trace(events=pa.Table.from_pylist([{**base, **row} for row in rows], schema=schema.EVENTS))


def _ops_trace() -> Trace:
    return _trace([
        {"name": "measure", "kind": "annotation", "start_ns": 0, "dur_ns": 10_000_000},
        *({"name": "aten::mm", "start_ns": s, "dur_ns": 500_000, "shapes": MM_SHAPES, "dtypes": MM_TYPES}
          for s in (100, 1_000_000)),
        {"name": "aten::mm", "start_ns": 20_000_000, "dur_ns": 1, "shapes": MM_SHAPES, "dtypes": MM_TYPES},
        {"name": "aten::add", "start_ns": 2_000_000, "dur_ns": 251_658, "shapes": "[[1024, 1024], [1024, 1024], []]",
         "dtypes": '["float", "float", "Scalar"]'},
        {"name": "aten::relu", "start_ns": 3_000_000, "dur_ns": 3_000, "shapes": "[[16]]", "dtypes": '["float"]'},
        {"name": "aten::gelu", "start_ns": 3_100_000, "dur_ns": 20_000, "shapes": "[[16]]", "dtypes": '["float"]'},
        {"name": "aten::view", "start_ns": 4_000_000, "dur_ns": 1_000, "shapes": "[[16], []]",
         "dtypes": '["float", "ScalarList"]'},
        {"name": "my::custom_op", "start_ns": 5_000_000, "dur_ns": 50_000},
    ])


def test_roofline_rows_by_hand():
    table = roofline(_ops_trace(), DEVICE)
    assert tuple(table.columns) == ROOFLINE_COLUMNS
    table = table.set_index("name")
    mm = table.loc["aten::mm"]  # the call after the measure window is left out
    assert (mm["kind"], mm["dtype"], mm["calls"], mm["time_ns"]) == ("op", "fp32", 2, 1_000_000)
    assert (mm["flops"], mm["bytes"]) == (2 * MM_FLOPS, 2 * MM_BYTES)
    assert mm["intensity"] == pytest.approx(MM_FLOPS / MM_BYTES)
    assert mm["achieved_flops_per_s"] == pytest.approx(MM_FLOPS / 500e-6)
    assert mm["achieved_bytes_per_s"] == pytest.approx(MM_BYTES / 500e-6)
    assert (mm["peak_dtype"], mm["peak_flops_per_s"], mm["ridge_point"]) == ("fp32", 1e12, 10.0)
    assert mm["roof_ns"] == pytest.approx(2 * MM_FLOPS / 1e12 * 1e9)
    assert mm["fraction_of_roof"] == pytest.approx(MM_FLOPS / 1e12 / 500e-6)
    assert (mm["bound"], mm["work_source"], mm["known_calls"]) == ("compute", "shapes", 2)
    add = table.loc["aten::add"]
    assert add["intensity"] == pytest.approx(ADD_FLOPS / ADD_BYTES) and add["bound"] == "memory"
    assert add["fraction_of_roof"] == pytest.approx(ADD_BYTES / 1e11 / 251_658e-9)
    assert table.loc["aten::relu", "bound"] == "latency"  # a 3 µs call
    gelu = table.loc["aten::gelu"]  # 20 µs for 1.3 ns of work: not overhead but far from the roof
    assert gelu["bound"] == "memory" and gelu["fraction_of_roof"] == pytest.approx(128 / 1e11 / 20e-6)
    assert table.loc["aten::view", "bound"] == "latency"  # no work known, 1 µs calls
    custom = table.loc["my::custom_op"]
    assert custom["bound"] == "unknown" and custom["known_calls"] == 0 and np.isnan(custom["flops"])
    assert table.index[0] == "aten::mm"  # longest first


def test_roofline_whole_trace_without_phase_and_recorded_work_wins():
    trace = _ops_trace()
    everything = roofline(trace, DEVICE, phase=None).set_index("name")
    assert everything.loc["aten::mm", "calls"] == 3
    recorded = _trace([{"name": "aten::mm", "dur_ns": 10_000_000, "shapes": MM_SHAPES, "dtypes": MM_TYPES,
                        "flops": 123.0}])
    row = roofline(recorded, DEVICE).iloc[0]  # no measure annotation: the whole trace
    assert (row["flops"], row["bytes"], row["work_source"]) == (123.0, MM_BYTES, "trace+shapes")


@pytest.mark.parametrize(("known", "intensity", "ridge", "mean", "expected"), [
    (True, 50.0, 10.0, 2e6, "compute"),
    (True, 10.0, 10.0, 2e6, "compute"),  # on the ridge
    (True, 2.0, 10.0, 2e6, "memory"),
    (True, 0.0, 10.0, 2e6, "memory"),  # pure data movement
    (True, np.inf, 10.0, 2e6, "compute"),  # FLOPs known, bytes zero
    (True, 50.0, 10.0, 3_000.0, "latency"),  # short calls: the fixed overhead dominates
    (True, 0.1, 10.0, 4_999.0, "latency"),
    (False, np.nan, 10.0, 3_000.0, "latency"),
    (False, np.nan, 10.0, 8_000.0, "unknown"),
    (False, np.nan, 10.0, np.nan, "unknown"),
])
def test_classify_bound(known, intensity, ridge, mean, expected):
    got = classify_bound(np.array([known]), np.array([intensity]), np.array([ridge]), np.array([mean]), 5_000.0)
    assert got.tolist() == [expected]


def test_kernels_inherit_the_work_of_the_op_that_launched_them():
    trace = _trace([
        {"name": "aten::mm", "dur_ns": 30_000, "shapes": MM_SHAPES, "dtypes": MM_TYPES},
        {"name": "cudaLaunchKernel", "kind": "runtime", "start_ns": 10, "dur_ns": 5, "parent": 0, "depth": 1},
        {"name": "memset_kernel", "kind": "kernel", "device": "cuda:0", "track": "cuda:0/stream 7",
         "start_ns": 100, "dur_ns": 1_000, "launcher": 0},
        {"name": "sgemm_128x64", "kind": "kernel", "device": "cuda:0", "track": "cuda:0/stream 7",
         "start_ns": 2_000, "dur_ns": 300_000, "launcher": 0},
        {"name": "ncu_kernel", "kind": "kernel", "device": "cuda:0", "track": "cuda:0/stream 7",
         "start_ns": 400_000, "dur_ns": 100_000, "launcher": 0, "flops": 7e6, "bytes": 1e6},
    ])
    work = event_work(trace.df())
    assert work["work_source"].tolist() == ["shapes", None, None, "launcher", "trace"]
    assert work["dtype"].tolist()[2:] == ["fp32"] * 3
    table = roofline(trace, DEVICE).set_index("name")
    gemm = table.loc["sgemm_128x64"]
    assert (gemm["kind"], gemm["flops"], gemm["bytes"], gemm["bound"]) == ("kernel", MM_FLOPS, MM_BYTES, "compute")
    assert gemm["fraction_of_roof"] == pytest.approx(MM_FLOPS / 1e12 / 300e-6)
    assert table.loc["memset_kernel", "bound"] == "latency" and np.isnan(table.loc["memset_kernel", "flops"])
    assert table.loc["ncu_kernel", "flops"] == 7e6  # a kernel's own counters are kept
    assert table.loc["aten::mm", "time_ns"] == 401_000  # an op launching device work: its device time


def test_hlo_ops_use_xla_cost_analysis_and_a_default_dtype():
    trace = _trace([{"name": "fusion.1", "kind": "hlo", "device": "tpu:0", "track": "tpu:0/XLA Ops",
                     "dur_ns": 200_000, "flops": 4e10, "bytes": 1e8}])
    v5e = device_spec("tpu-v5e")
    row = roofline(trace, v5e).iloc[0]  # no dtype known and no fp32 figure: the bf16 peak
    assert (row["peak_dtype"], row["work_source"], row["bound"]) == ("bf16", "trace", "compute")
    assert row["fraction_of_roof"] == pytest.approx(4e10 / 197e12 / 200e-6)
    h100 = device_spec("h100")
    assert roofline(trace, h100).iloc[0]["peak_dtype"] == "fp32"
    assert roofline(trace, h100, default_dtype="bf16").iloc[0]["peak_dtype"] == "bf16"
    tf32 = roofline(_ops_trace(), h100, peak_dtypes={"fp32": "tf32"}).set_index("name")
    assert tf32.loc["aten::mm", "peak_flops_per_s"] == 494.5e12


def test_empty_selection_gives_the_columns():
    assert list(roofline(_ops_trace(), DEVICE, kinds=("kernel",)).columns) == list(ROOFLINE_COLUMNS)


def test_projection_onto_another_device():
    table = roofline(_ops_trace(), DEVICE)
    h100 = device_spec("h100")
    projected = project(table, h100)
    assert list(projected.columns) == [*table.columns, *PROJECTION_COLUMNS]
    projected = projected.set_index("name")
    mm = projected.loc["aten::mm"]
    ideal_ns = 2 * max(MM_FLOPS / 67e12, MM_BYTES / 3.35e12) * 1e9  # fp32 work, two calls
    assert (mm["projected_device"], mm["projected_peak_dtype"]) == ("h100-sxm", "fp32")
    assert mm["projected_ns"] == pytest.approx(ideal_ns)
    assert mm["projected_speedup"] == pytest.approx(1_000_000 / ideal_ns)
    assert mm["projected_bound"] == "compute" and projected.loc["aten::add", "projected_bound"] == "memory"
    assert np.isnan(projected.loc["my::custom_op", "projected_ns"])
    with_overhead = project(table, h100, overhead_ns_per_call=4_000.0).set_index("name")
    assert with_overhead.loc["aten::mm", "projected_ns"] == pytest.approx(ideal_ns + 8_000.0)
    bare = project(pd.DataFrame({"flops": [4e12], "bytes": [0.0]}), h100)  # any table with work
    assert bare["projected_ns"].tolist() == [pytest.approx(4e12 / 67e12 * 1e9)]


# --- real CPU captures against the measured CPU --------------------------------------------------------

CONVNET = ["--model", "convnet", "--set", "width=16", "--set", "image_size=32", "--batch", "2",
           "--iterations", "3", "--warmup", "1"]
GEMMS = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::conv2d", "aten::convolution",
         "aten::_convolution", "aten::mkldnn_convolution")


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    """Eager tiny-GPT and convnet captures, each with the CPU measured at the run's thread count."""
    root = tmp_path_factory.mktemp("traces")
    runs = {}
    for args in (TINY_CAPTURE, CONVNET):
        result = CliRunner().invoke(main, ["capture", *args, "--variants", "eager", "--out", str(root), "--json"])
        assert result.exit_code == 0, result.output
        (run,) = json.loads(result.stdout)["runs"]
        runs[args[1]] = open_bundle(run["run_id"], root)
    threads = {b.info["environment"]["torch_threads"] for b in runs.values()}
    cpus = {t: cpu_probe.cpu_spec(cpu_probe.measure_cpu(t), cpu_probe.fingerprint()) for t in threads}
    return {model: (bundle.trace(), cpus[bundle.info["environment"]["torch_threads"]])
            for model, bundle in runs.items()}


@pytest.mark.parametrize("model", ["tiny-gpt", "convnet"])
def test_shape_flops_match_torch_profiler_counts(captures, model):
    """Where torch.profiler counted FLOPs (mm, addmm, conv2d, add), the shape formulas agree exactly."""
    trace, _ = captures[model]
    events = trace.df()
    ops = events["kind"] == "op"
    estimate = event_costs(events)["flops"]
    names = events["name"].astype(str)
    recorded = events.loc[ops].groupby(names[ops])["flops"].sum(min_count=1).dropna()
    assert {"aten::addmm"} <= set(recorded.index)
    if model == "convnet":
        assert "aten::conv2d" in recorded.index
    for name, total in recorded.items():
        assert estimate[ops & (names == name)].sum() == pytest.approx(total, rel=1e-9), name


@pytest.mark.parametrize("model", ["tiny-gpt", "convnet"])
def test_captured_run_is_consistent_with_the_measured_cpu(captures, model):
    trace, cpu = captures[model]
    table = roofline(trace, cpu)
    assert set(table["kind"]) == {"op"} and table["calls"].sum() > 0
    work = table[table["flops"] > 0]
    assert not work.empty
    # The probe's peak and the capture are measured at different moments, so on a busy machine an op can beat
    # the probe's figure: check that the table uses the probe's peaks, not a timing relation between the two.
    for row in work.itertuples():
        peak = cpu.peak(row.dtype if isinstance(row.dtype, str) else None)[1]
        assert row.peak_flops_per_s == pytest.approx(peak), row.name
    gemms = table[table["name"].isin(GEMMS) & table["flops"].notna()]
    assert not gemms.empty and (gemms["bound"] != "unknown").all()
    ranked = gemms[gemms["bound"] != "latency"]
    assert ((ranked["bound"] == "compute") == (ranked["intensity"] >= ranked["ridge_point"])).all()
    assert (table.loc[table["bound"] == "latency", "mean_ns"] < 5_000).all()
    assert (table.loc[table["bound"] != "latency", "mean_ns"] >= 5_000).all()
    known = table[table["known_calls"] > 0]
    assert np.isfinite(known["fraction_of_roof"]).all() and (known["fraction_of_roof"] > 0).all()
    if model == "convnet":
        conv = table.set_index("name").loc["aten::conv2d"]
        assert conv["bound"] == "compute" and math.isfinite(conv["fraction_of_roof"])
