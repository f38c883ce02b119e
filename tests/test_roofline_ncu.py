"""Nsight Compute counters as the roofline's first source of work: FLOPs from the SASS and tensor-pipe
counters, DRAM bytes read + written, ncu's duration for the achieved rates; kernels ncu did not profile
keep their trace / shape work. Every figure below is computed by hand from the CSV text of the test.

No real ncu export is among the shared fixtures (../shared/fixtures/README.md), so the CSVs follow the
layout of `ncu --csv --page raw` (header, units row, quoted numbers with thousands separators) as the
reader's own tests do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner

from workbench.analysis.findings.bottlenecks import analyze_run, find_bottlenecks, run_roofline
from workbench.analysis.kernel_metrics import measured_work
from workbench.analysis.roofline import ROOFLINE_COLUMNS, event_work, roofline
from workbench.cli import main
from workbench.hardware import device_spec
from workbench.trace import Trace, schema
from workbench.trace.formats.ncu import TENSOR_FLOPS_PER_INSTRUCTION, parse_ncu_csv, tensor_flops
from workbench.trace.store.bundle import open_bundle, write_bundle

H100 = device_spec("h100-sxm")
FP32_PEAK, BF16_PEAK, BANDWIDTH = 67e12, 989.5e12, 3.35e12
"""The H100 SXM figures of the hardware table: fp32 ridge 20 FLOP/byte, bf16 ridge ~295."""

SGEMM = "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(T1::Params)"
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
       "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
TC = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
ZERO = "void at::native::zero_fill_kernel<float>(float*, long)"

IDENTITY = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC"]
SASS = {op: f"sm__sass_thread_inst_executed_op_f{op}_pred_on.sum" for op in ("add", "fma", "mul")}
BF16_OPS = "sm__ops_path_tensor_src_bf16_dst_fp32.sum"
TENSOR_COLUMNS = [  # a whole counter, its two sparsity parts, another source type, and the instruction count
    BF16_OPS, "sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_off.sum",
    "sm__ops_path_tensor_src_bf16_dst_fp32_sparsity_on.sum", "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
    "sm__inst_executed_pipe_tensor.sum"]

# per kernel: DRAM read, DRAM write (bytes), ncu duration (ns), fadd, ffma, fmul, then the tensor columns
SGEMM_NCU = (98_304, 65_536, 10_000, 16_384, 2_097_152, 0)
ADD_NCU = (8_388_608, 4_194_304, 8_000, 1_048_576, 0, 0)
TC_NCU = (4_194_304, 2_097_152, 5_000, 0, 0, 0)
TC_OPS = 2 * 1024 * 1024 * 1024
TENSOR_VALUES = {SGEMM: (0, 0, 0, 0, 0), ADD: (0, 0, 0, 0, 0), TC: (TC_OPS, TC_OPS, 0, 0, 1_048_576)}

SGEMM_FLOPS = 16_384 + 2 * 2_097_152  # fadd + fmul + 2 * ffma
SGEMM_BYTES = 98_304 + 65_536
ADD_FLOPS, ADD_BYTES = 1_048_576, 8_388_608 + 4_194_304
TC_FLOPS, TC_BYTES = TC_OPS, 4_194_304 + 2_097_152  # the whole bf16 counter, its parts not added again
MM_SHAPES, MM_TYPES = "[[64, 128], [128, 256]]", '["float", "float"]'
MM_FLOPS, MM_BYTES = 2 * 64 * 128 * 256, 4 * (64 * 128 + 128 * 256 + 64 * 256)


def _quoted(values) -> str:
    return ",".join(f'"{v:,}"' if isinstance(v, int) else f'"{v}"' for v in values)


def ncu_csv(kernels: list[tuple[str, tuple]], tensor: bool = True) -> str:
    """A raw-page CSV with one row per (kernel name, figures), with or without the tensor counters."""
    metrics = ["dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum", *SASS.values()]
    units = ["byte", "byte", "nsecond", "inst", "inst", "inst"]
    if tensor:
        metrics += TENSOR_COLUMNS
        units += ["", "", "", "", "inst"]
    lines = ['==PROF== Connected to process 4242 (/usr/bin/python3.11)', _quoted(IDENTITY + metrics),
             _quoted([""] * len(IDENTITY) + units)]
    for i, (name, figures) in enumerate(kernels):
        identity = [str(i), "4242", "python3.11", "gpu-host", name, "1", "7", "(128, 1, 1)", "(64, 1, 1)", "0", "9.0"]
        lines.append(_quoted(identity + list(figures) + (list(TENSOR_VALUES[name]) if tensor else [])))
    return "\n".join(lines) + "\n"


def with_tensor_counters() -> pa.Table:
    return parse_ncu_csv(ncu_csv([(SGEMM, SGEMM_NCU), (ADD, ADD_NCU), (TC, TC_NCU)]), source="full.csv")


def toy_trace() -> Trace:
    """Two aten::mm calls (each an SGEMM and a zero-fill kernel), an add kernel and a bf16 tensor-core GEMM,
    inside `measure`. ncu profiled the first SGEMM launch only, the add and the tensor-core GEMM."""
    base = {"start_ns": 0, "dur_ns": 1, "kind": "op", "device": "cpu", "track": "cpu/thread 1", "pid": 1, "tid": 1,
            "corr": -1, "parent": -1, "depth": 0, "launcher": -1, "flops": None, "bytes": None, "shapes": None,
            "dtypes": None, "args": None}
    gpu = {"kind": "kernel", "device": "cuda:0", "track": "cuda:0/stream 7"}
    rows = [
        {"name": "measure", "kind": "annotation", "start_ns": 0, "dur_ns": 1_000_000},  # 0
        {"name": "aten::mm", "start_ns": 1_000, "dur_ns": 20_000, "shapes": MM_SHAPES, "dtypes": MM_TYPES},  # 1
        {**gpu, "name": SGEMM, "start_ns": 10_000, "dur_ns": 12_000, "launcher": 1},  # 2: profiled
        {**gpu, "name": ZERO, "start_ns": 23_000, "dur_ns": 2_000, "launcher": 1},  # 3
        {"name": "aten::mm", "start_ns": 100_000, "dur_ns": 20_000, "shapes": MM_SHAPES, "dtypes": MM_TYPES},  # 4
        {**gpu, "name": SGEMM, "start_ns": 110_000, "dur_ns": 12_000, "launcher": 4},  # 5: not profiled
        {**gpu, "name": ZERO, "start_ns": 123_000, "dur_ns": 2_000, "launcher": 4},  # 6
        {**gpu, "name": ADD.replace("> >", ">>"), "start_ns": 200_000, "dur_ns": 9_000},  # 7
        {**gpu, "name": TC, "start_ns": 300_000, "dur_ns": 6_000},  # 8
    ]
    return Trace(events=pa.Table.from_pylist([{**base, **row} for row in rows], schema=schema.EVENTS))


# -- the reader's FLOP counts ------------------------------------------------------------------------------


def test_reader_counts_cuda_core_and_tensor_flops_without_double_counting():
    sgemm, add, tc = with_tensor_counters().to_pylist()
    assert (sgemm["flops_fp32"], sgemm["flops_tensor"], sgemm["flops"]) == (SGEMM_FLOPS, 0.0, SGEMM_FLOPS)
    assert add["flops"] == ADD_FLOPS
    # the ops counter wins over 512 x instructions, and its sparsity parts are not added to it
    assert (tc["flops_tensor"], tc["flops"]) == (TC_FLOPS, TC_FLOPS)
    assert [sgemm["flops_dtype"], add["flops_dtype"], tc["flops_dtype"]] == ["fp32", "fp32", "bf16"]
    default = parse_ncu_csv(ncu_csv([(SGEMM, SGEMM_NCU)], tensor=False)).to_pylist()[0]
    assert math.isnan(default["flops_tensor"]) and default["flops"] == SGEMM_FLOPS


def _metrics(**values: float) -> dict[str, np.ndarray]:
    return {f"sm__{name}.sum": np.array([value]) for name, value in values.items()}


@pytest.mark.parametrize(("metrics", "total", "split"), [
    (_metrics(ops_path_tensor_src_fp16_dst_fp32=96, ops_path_tensor_src_fp16_dst_fp32_sparsity_off=64,
              ops_path_tensor_src_fp16_dst_fp32_sparsity_on=32), 96, {"fp16": 96}),
    (_metrics(ops_path_tensor_src_fp16_dst_fp32_sparsity_off=64, ops_path_tensor_src_fp16_dst_fp32_sparsity_on=32),
     96, {"fp16": 96}),
    (_metrics(ops_path_tensor_src_fp16=100, ops_path_tensor_src_fp16_dst_fp32=60, ops_path_tensor_src_tf32_dst_fp32=7,
              ops_path_tensor_src_fp8_sparsity_off=5), 112, {"fp16": 100, "tf32": 7, "fp8": 5}),
    (_metrics(inst_executed_pipe_tensor=3), 3 * TENSOR_FLOPS_PER_INSTRUCTION, {None: 3 * 512}),
    ({"smsp__inst_executed_pipe_tensor.sum": np.array([2.0])}, 1024, {None: 1024}),
    (_metrics(ops_path_tensor_src_bf16_dst_fp32=10, inst_executed_pipe_tensor=3), 10, {"bf16": 10}),
])
def test_tensor_flops_from_the_counters_there_are(metrics, total, split):
    flops, by_dtype = tensor_flops(metrics, 1)
    assert flops.tolist() == [total]
    assert {dtype: values.tolist() for dtype, values in by_dtype.items()} == {d: [v] for d, v in split.items()}


def test_no_tensor_counter_is_nan():
    flops, by_dtype = tensor_flops({"gpu__time_duration.sum": np.array([5.0])}, 1)
    assert np.isnan(flops).all() and by_dtype == {}


# -- the roofline's work per kernel ------------------------------------------------------------------------


def test_measured_work_per_joined_kernel():
    work = measured_work(toy_trace(), with_tensor_counters())
    assert work.index.tolist() == [2, 7, 8]  # the second SGEMM launch was not profiled
    assert work["flops"].tolist() == [SGEMM_FLOPS, ADD_FLOPS, TC_FLOPS]
    assert work["bytes"].tolist() == [SGEMM_BYTES, ADD_BYTES, TC_BYTES]
    assert work["duration_ns"].tolist() == [10_000, 8_000, 5_000]
    assert work["dtype"].tolist() == ["fp32", "fp32", "bf16"] and work["flops_complete"].all()


def test_ncu_work_wins_and_unprofiled_kernels_fall_back():
    trace = toy_trace()
    events = trace.df()
    before = event_work(events)
    work = event_work(events, measured_work(trace, with_tensor_counters()))
    assert work.loc[2, ["flops", "bytes", "source", "work_source", "measured_ns"]].tolist() == \
        [SGEMM_FLOPS, SGEMM_BYTES, "ncu", "ncu", 10_000]
    assert before.loc[2, ["flops", "bytes", "source", "work_source"]].tolist() == \
        [MM_FLOPS, MM_BYTES, "shapes", "launcher"]  # without ncu: the op's shapes
    for row in (1, 3, 4, 5, 6):  # ops and kernels without an ncu row: as before
        assert work.loc[row].drop("measured_ns").equals(before.loc[row].drop("measured_ns")), row
        assert np.isnan(work.loc[row, "measured_ns"])
    assert work.loc[5, ["flops", "bytes", "source", "work_source"]].tolist() == \
        [MM_FLOPS, MM_BYTES, "shapes", "launcher"]
    assert work.loc[8, ["flops", "bytes", "dtype", "source"]].tolist() == [TC_FLOPS, TC_BYTES, "bf16", "ncu"]
    assert np.isnan(before.loc[8, "flops"]) and before.loc[8, "dtype"] is None


def test_roofline_rows_from_ncu_counters_against_h100():
    table = roofline(toy_trace(), H100, kinds=("kernel",), kernel_metrics=with_tensor_counters())
    assert tuple(table.columns) == ROOFLINE_COLUMNS
    rows = table.set_index("name")

    add = rows.loc[ADD.replace("> >", ">>")]
    assert (add["flops"], add["bytes"], add["dtype"], add["source"]) == (ADD_FLOPS, ADD_BYTES, "fp32", "ncu")
    assert add["intensity"] == pytest.approx(ADD_FLOPS / ADD_BYTES)  # 1/12 FLOP/byte
    assert add["ridge_point"] == pytest.approx(FP32_PEAK / BANDWIDTH) and add["bound"] == "memory"
    assert add["time_ns"] == 9_000  # the timeline's duration weighs the row...
    assert add["achieved_bytes_per_s"] == pytest.approx(ADD_BYTES / 8_000e-9)  # ...ncu's gives the rates
    assert add["achieved_flops_per_s"] == pytest.approx(ADD_FLOPS / 8_000e-9)
    assert add["fraction_of_roof"] == pytest.approx(ADD_BYTES / BANDWIDTH / 8_000e-9)

    tc = rows.loc[TC]
    assert (tc["flops"], tc["bytes"], tc["dtype"], tc["peak_dtype"]) == (TC_FLOPS, TC_BYTES, "bf16", "bf16")
    assert tc["intensity"] == pytest.approx(TC_FLOPS / TC_BYTES)  # ~341 > the bf16 ridge, ~295
    assert tc["bound"] == "compute" and tc["ridge_point"] == pytest.approx(BF16_PEAK / BANDWIDTH)
    assert tc["achieved_flops_per_s"] == pytest.approx(TC_FLOPS / 5_000e-9)
    assert tc["fraction_of_roof"] == pytest.approx(TC_FLOPS / BF16_PEAK / 5_000e-9)

    sgemm = rows.loc[SGEMM]  # one launch measured by ncu, one from the op's shapes
    flops, moved = SGEMM_FLOPS + MM_FLOPS, SGEMM_BYTES + MM_BYTES
    assert (sgemm["calls"], sgemm["known_calls"], sgemm["time_ns"]) == (2, 2, 24_000)
    assert (sgemm["flops"], sgemm["bytes"], sgemm["source"]) == (flops, moved, "ncu+shapes")
    assert sgemm["intensity"] == pytest.approx(21.375) and sgemm["bound"] == "compute"  # fp32 ridge 20
    assert sgemm["achieved_flops_per_s"] == pytest.approx(flops / 22_000e-9)  # ncu's 10 µs + the timeline's 12
    assert sgemm["fraction_of_roof"] == pytest.approx(max(flops / FP32_PEAK, moved / BANDWIDTH) / 22_000e-9)

    zero = rows.loc[ZERO]  # launched with the SGEMMs, no work of its own, no ncu row
    assert zero["bound"] == "latency" and pd.isna(zero["source"]) and np.isnan(zero["flops"])


def test_without_a_tensor_counter_ncu_flops_are_a_lower_bound():
    """ncu's default metrics have no tensor counter: a GEMM on tensor cores shows few CUDA-core FLOPs, so a
    larger count from the shapes wins; DRAM bytes still come from ncu."""
    tensor_core_sgemm = (98_304, 65_536, 10_000, 16_384, 0, 0)  # only the epilogue's adds on CUDA cores
    metrics = parse_ncu_csv(ncu_csv([(SGEMM, tensor_core_sgemm), (ADD, ADD_NCU)], tensor=False))
    work = measured_work(toy_trace(), metrics)
    assert not work["flops_complete"].any()
    events = event_work(toy_trace().df(), work)
    assert events.loc[2, ["flops", "bytes", "source"]].tolist() == [MM_FLOPS, SGEMM_BYTES, "ncu+shapes"]
    assert events.loc[7, ["flops", "bytes", "source"]].tolist() == [ADD_FLOPS, ADD_BYTES, "ncu"]  # nothing larger
    row = roofline(toy_trace(), H100, kinds=("kernel",), kernel_metrics=metrics).set_index("name").loc[SGEMM]
    assert row["flops"] == 2 * MM_FLOPS and row["bytes"] == SGEMM_BYTES + MM_BYTES


def test_without_kernel_metrics_nothing_changes():
    trace = toy_trace()
    plain = roofline(trace, H100)
    assert plain.equals(roofline(trace, H100, kernel_metrics=None))
    assert "ncu" not in "".join(s for s in plain["source"] if isinstance(s, str))
    assert plain.set_index("name").loc["aten::mm", "source"] == "shapes"


# -- the run: `workbench analyze --json` and the memory-bound finding -------------------------------------


@pytest.fixture
def ncu_run(tmp_path: Path) -> tuple[Path, str]:
    write_bundle(tmp_path, "run-ncu", {"variant": "eager"}, toy_trace(), tables={"kernel_metrics":
                                                                                 with_tensor_counters()})
    write_bundle(tmp_path, "run-plain", {"variant": "eager"}, toy_trace())
    return tmp_path, "run-ncu"


def test_analyze_json_roofline_rows_carry_the_source(ncu_run):
    root, run = ncu_run
    result = CliRunner().invoke(main, ["analyze", run, "--out", str(root), "--device", "h100", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    sources = {(r["kind"], r["name"]): r["source"] for r in data["roofline"]}
    assert sources[("kernel", TC)] == "ncu" and sources[("kernel", SGEMM)] == "ncu+shapes"
    assert sources[("op", "aten::mm")] == "shapes" and sources[("kernel", ZERO)] is None
    assert data == json.loads(json.dumps(analyze_run(open_bundle(run, root), "h100")))


def test_memory_bound_finding_uses_the_measured_kernels(ncu_run):
    root, run = ncu_run
    trace = toy_trace()
    _, measured = run_roofline(open_bundle(run, root), "h100")
    (finding,) = [f for f in find_bottlenecks(trace, measured) if f.kind == "memory_bound"]
    kernels_ns = 24_000 + 4_000 + 9_000 + 6_000  # SGEMMs, zero fills, add, tensor-core GEMM
    assert finding.time_share == pytest.approx(9_000 / kernels_ns)  # only the add is memory-bound
    assert finding.evidence["ncu_measured"] and finding.evidence["ncu_time_ns"] == 9_000
    (top,) = finding.evidence["top"]
    assert (top["name"], top["source"]) == (ADD.replace("> >", ">>"), "ncu")
    assert top["achieved_bytes_per_s"] == pytest.approx(ADD_BYTES / 8_000e-9)
    assert "Nsight Compute" in finding.title and "kernels" in finding.title
    # from shapes alone, both aten::mm calls (14 µs of device time each) and their SGEMMs look memory-bound
    _, estimated = run_roofline(open_bundle("run-plain", root), "h100")
    (shapes_only,) = [f for f in find_bottlenecks(trace, estimated) if f.kind == "memory_bound"]
    assert shapes_only.time_share == pytest.approx((28_000 + 24_000) / (28_000 + kernels_ns))
    assert not shapes_only.evidence["ncu_measured"]


def test_no_memory_bound_rows_no_finding():
    """A roofline without memory-bound rows gives no memory_bound finding (an empty selection stays empty)."""
    table = roofline(toy_trace(), H100, kinds=("kernel",), kernel_metrics=with_tensor_counters())
    table = table[table["bound"] != "memory"].reset_index(drop=True)
    assert not [f for f in find_bottlenecks(toy_trace(), table) if f.kind == "memory_bound"]
