"""Nsight Compute: the raw-page CSV reader, the join of its metrics to a trace's kernels, and the
`kernel_metrics` table in a bundle.

The CSV below follows the layout of `ncu --csv --page raw` (and `ncu --import REPORT --csv --page
raw`) as documented in the Nsight Compute CLI guide and seen in its output: a header of identity
columns (`ID` … `CC`) then the metric names in alphabetical order, a units row that is empty under
the identity columns, one row per profiled launch, quoted fields, thousands separators, `n/a` for
counters not collected; without `--print-units base` ncu scales units (`usecond`, `Kbyte`). When ncu
prints to stdout (no `--import`) its `==PROF==` lines surround the table.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from workbench.analysis.kernel_metrics import join_kernel_metrics, trace_kernels
from workbench.errors import BundleError, TraceFormatError
from workbench.trace import Trace, schema
from workbench.trace.formats.ncu import CORE, METRICS, parse_ncu_csv, read_ncu_csv, table_metadata
from workbench.trace.store.bundle import OPTIONAL_TABLES, open_bundle, write_bundle

GEMM = "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(T1::Params)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"  # noqa: E501

SASS = [f"sm__sass_thread_inst_executed_op_{p}{op}_pred_on.sum" for p in "dfh" for op in ("add", "fma", "mul")]
HEADER = ['"ID"', '"Process ID"', '"Process Name"', '"Host Name"', '"Kernel Name"', '"Context"', '"Stream"',
          '"Block Size"', '"Grid Size"', '"Device"', '"CC"', '"dram__bytes_read.sum"', '"dram__bytes_write.sum"',
          '"dram__throughput.avg.pct_of_peak_sustained_elapsed"',
          '"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"', '"gpu__time_duration.sum"',
          '"launch__func_cache_config"', *(f'"{m}"' for m in SASS),
          '"sm__throughput.avg.pct_of_peak_sustained_elapsed"', '"sm__warps_active.avg.pct_of_peak_sustained_active"']
UNITS = ['""'] * 11 + ['"Mbyte"', '"Kbyte"', '"%"', '"%"', '"usecond"', '""'] + ['"inst"'] * 9 + ['"%"', '"%"']
#                 d: add fma mul | f: add fma mul | h: add fma mul
ROWS = [
    ['"0"', '"4242"', '"python3.11"', '"gpu-host"', f'"{GEMM}"', '"1"', '"7"', '"(256, 1, 1)"', '"(16, 4, 1)"',
     '"0"', '"8.0"', '"1.05"', '"2.05"', '"35.20"', '"41.00"', '"12.58"', '"CachePreferNone"',
     '"0"', '"0"', '"0"', '"1,000"', '"4,194,304"', '"500"', '"n/a"', '"n/a"', '"n/a"', '"61.30"', '"48.75"'],
    ['"1"', '"4242"', '"python3.11"', '"gpu-host"', f'"{ADD}"', '"1"', '"7"', '"(128, 1, 1)"', '"(64, 1, 1)"',
     '"0"', '"8.0"', '"0.26"', '"0.13"', '"80.10"', '"80.10"', '"3.20"', '"CachePreferNone"',
     '"0"', '"0"', '"0"', '"32,768"', '"0"', '"0"', '"n/a"', '"n/a"', '"n/a"', '"9.50"', '"77.00"'],
    ['"2"', '"4242"', '"python3.11"', '"gpu-host"', f'"{GEMM}"', '"1"', '"7"', '"(256, 1, 1)"', '"(16, 4, 1)"',
     '"0"', '"8.0"', '"1.04"', '"2.10"', '"35.00"', '"40.50"', '"12.61"', '"CachePreferNone"',
     '"0"', '"0"', '"0"', '"1,000"', '"4,194,304"', '"500"', '"n/a"', '"n/a"', '"n/a"', '"61.10"', '"48.50"'],
]
CSV = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3.11)",
    '==PROF== Profiling "Kernel2": 0%....50%....100% - 3 passes',
    ",".join(HEADER), ",".join(UNITS), *(",".join(row) for row in ROWS),
    "==PROF== Disconnected from process 4242",
]) + "\n"


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return parse_ncu_csv(CSV, source="gemm.ncu.csv")


def test_one_row_per_launch_with_identity_and_launch_index_per_kernel(table):
    assert table.schema.names[:len(CORE)] == CORE.names
    rows = table.to_pylist()
    assert [r["id"] for r in rows] == [0, 1, 2]
    assert [r["kernel"] for r in rows] == [GEMM, ADD, GEMM]
    assert [r["launch"] for r in rows] == [0, 0, 1]
    assert rows[0]["pid"] == 4242 and rows[0]["stream"] == 7 and rows[0]["device"] == 0
    assert rows[1]["block_size"] == "(128, 1, 1)" and rows[1]["cc"] == "8.0" and rows[1]["host"] == "gpu-host"


def test_derived_columns_in_base_units_and_flops_from_the_sass_counters(table):
    gemm, add, _ = table.to_pylist()
    assert gemm["duration_ns"] == pytest.approx(12_580.0)  # 12.58 usecond
    assert gemm["dram_bytes_read"] == pytest.approx(1_050_000.0) and gemm["dram_bytes_write"] == pytest.approx(2_050.0)
    assert gemm["sm_throughput_pct"] == 61.3 and gemm["achieved_occupancy_pct"] == 48.75
    assert gemm["dram_throughput_pct"] == 35.2 and gemm["memory_throughput_pct"] == 41.0
    assert gemm["flops_fp32"] == 1_000 + 500 + 2 * 4_194_304
    assert gemm["flops_fp64"] == 0.0
    assert math.isnan(gemm["flops_fp16"])  # n/a: not collected
    assert gemm["flops"] == gemm["flops_fp32"]
    assert add["flops"] == 32_768.0


def test_every_metric_is_kept_with_its_unit(table):
    assert table["gpu__time_duration.sum"].to_pylist()[1] == pytest.approx(3_200.0)
    assert table.schema.field("gpu__time_duration.sum").metadata == {b"unit": b"nsecond"}
    assert table.schema.field("dram__bytes_write.sum").metadata == {b"unit": b"byte"}
    assert table["launch__func_cache_config"].type == pa.string()
    assert table["launch__func_cache_config"].to_pylist() == ["CachePreferNone"] * 3
    assert table[SASS[3]].to_pylist() == [1_000.0, 32_768.0, 1_000.0]
    meta = table_metadata(table)
    assert meta["units"]["sm__warps_active.avg.pct_of_peak_sustained_active"] == "%"
    assert meta["source"] == {"format": "ncu-csv", "file": "gemm.ncu.csv"}
    assert meta["reader"]["skipped"] == {"ncu messages (==PROF==, ==WARNING==...)": 3}


def test_a_table_without_a_metric_has_nan_derived_columns(tmp_path):
    header = ",".join([*HEADER[:11], '"gpu__time_duration.sum"'])
    units = ",".join([*UNITS[:11], '"nsecond"'])
    row = ",".join([*ROWS[0][:11], '"12,580"'])
    path = tmp_path / "only-duration.csv"
    path.write_text("\n".join([header, units, row]))
    (only,) = read_ncu_csv(path).to_pylist()
    assert only["duration_ns"] == 12_580.0
    assert all(math.isnan(only[c]) for c in ("sm_throughput_pct", "flops", "flops_fp32", "dram_bytes_read"))


@pytest.mark.parametrize(("text", "problem"), [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters",
     "no ncu CSV header"),
    ('"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
     '"0","1","k(float*)","GPU Speed Of Light Throughput","Duration","nsecond","1,000"\n', "raw page"),
    ("", "no ncu CSV header"),
])
def test_what_is_not_a_raw_page_is_refused(text, problem):
    with pytest.raises(TraceFormatError, match=problem):
        parse_ncu_csv(text, source="bad.csv")


def test_default_metrics_cover_every_derived_column():
    for name in ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                 "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                 "sm__warps_active.avg.pct_of_peak_sustained_active", "dram__bytes_read.sum", "dram__bytes_write.sum",
                 *SASS):
        assert name in METRICS


def _trace(kernels: list[tuple[str, int]], measure: tuple[int, int] = (100, 1_000)) -> Trace:
    """A trace with a `measure` annotation and kernels (name, start) of 10 ns each."""
    names = ["measure", *(name for name, _ in kernels)]
    n = len(names)
    events = pa.table({
        "start_ns": [measure[0], *(start for _, start in kernels)],
        "dur_ns": [measure[1] - measure[0], *([10] * len(kernels))],
        "name": pa.array(names).dictionary_encode(),
        "kind": pa.array(["annotation", *(["kernel"] * len(kernels))]).dictionary_encode(),
        "device": pa.array(["cpu", *(["cuda:0"] * len(kernels))]).dictionary_encode(),
        "track": pa.array(["cpu/thread 1", *(["cuda:0/stream 7"] * len(kernels))]).dictionary_encode(),
        "pid": [1] * n, "tid": [1] * n, "corr": [-1] * n, "parent": [-1] * n, "depth": [0] * n,
        "launcher": [-1] * n, "flops": [np.nan] * n, "bytes": [np.nan] * n,
        "shapes": [None] * n, "dtypes": [None] * n, "args": [None] * n,
    })
    return Trace(events=events.cast(schema.EVENTS))


def test_metrics_join_the_measured_kernels_by_name_and_order(table):
    # a warm-up GEMM before `measure`, then GEMM, ADD (printed without the space of "> >"), GEMM, GEMM
    trace = _trace([(GEMM, 50), (GEMM, 200), (ADD.replace("> >", ">>"), 300), (GEMM, 400), (GEMM, 500)])
    kernels = trace_kernels(trace)
    assert kernels["row"].tolist() == [2, 3, 4, 5] and kernels["launch"].tolist() == [0, 0, 1, 2]
    joined = join_kernel_metrics(trace, table)
    assert joined["row"].tolist() == [2, 3, 4, 5]
    assert joined["id"].tolist()[:3] == [0, 1, 2] and math.isnan(joined["id"].tolist()[3])
    assert joined["duration_ns"].tolist()[:3] == pytest.approx([12_580.0, 3_200.0, 12_610.0])
    assert math.isnan(joined["duration_ns"].iloc[3])  # the third GEMM was not profiled
    assert joined.attrs["unmatched"] == 0


# One kernel as Kineto and as Nsight Compute spelled it on an H200 (torch 2.11, ncu 2025.3): namespaces, template
# arguments and the parameter list differ, and ncu counts `launch` per its own spelling.
H200_SPELLINGS = {
    "add": ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
            "void at::vectorized_elementwise_kernel<4, at::CUDAFunctor_add<float>, std::array<char *, 3>>(int, T2, T3)"),  # noqa: E501
    "gelu": ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "  # noqa: E501
             "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::"
             "{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
             "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::"
             "{lambda(float)#1}, std::array<char*, 2ul>)",
             "void at::vectorized_elementwise_kernel<4, at::GeluCUDAKernelImpl(at::TensorIteratorBase &, at::GeluType)::"  # noqa: E501
             "[lambda() (instance 2)]::operator ()() const::[lambda() (instance 2)]::operator ()() const::"
             "[lambda(float) (instance 1)], std::array<char *, 2>>(int, T2, T3)"),
    "norm": ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float, "
             "float const*, float const*, float const*, float*, float*, float*)",
             "void at::<unnamed>::vectorized_layer_norm_kernel<float, float, 0>(int, T2, const T1 *, const T1 *, "
             "const T1 *, T2 *, T2 *, T1 *)"),
    "attention": ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
                  "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
                  "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
                  "cutlass::Sm80, 1, 64, 64, 64, 1, 1>::Params)"),
}


def test_kineto_and_ncu_spellings_of_one_kernel_pair_in_launch_order():
    order = ["norm", "add", "attention", "gelu", "add", "norm"]
    trace = _trace([(H200_SPELLINGS[k][0], 200 + 100 * i) for i, k in enumerate(order)])
    per_name: dict[str, int] = {}
    launches = []
    for k in order:
        launches.append(per_name.get(k, 0))
        per_name[k] = launches[-1] + 1
    metrics = pd.DataFrame({"id": range(len(order)), "kernel": [H200_SPELLINGS[k][1] for k in order],
                            "launch": launches, "duration_ns": [1_000.0 * (i + 1) for i in range(len(order))]})
    joined = join_kernel_metrics(trace, metrics)
    assert joined["duration_ns"].tolist() == metrics["duration_ns"].tolist()  # each launch with its own metrics
    assert [name.split("<")[0] for name in joined["kernel"]] == [name.split("<")[0] for name in metrics["kernel"]]
    assert joined.attrs["unmatched"] == 0


def test_profiled_launches_without_a_trace_kernel_are_counted(table):
    joined = join_kernel_metrics(_trace([(GEMM, 200)]), table)
    assert len(joined) == 1 and joined["duration_ns"].iloc[0] == 12_580.0
    assert joined.attrs["unmatched"] == 2
    everything = join_kernel_metrics(_trace([(GEMM, 50), (GEMM, 200)]), table, phase=None)
    assert everything["id"].tolist() == [0, 2]


def test_kernel_metrics_travel_in_the_bundle(tmp_path, table):
    trace = _trace([(GEMM, 200)])
    path = write_bundle(tmp_path, "run-ncu", {"variant": "eager"}, trace, tables={"kernel_metrics": table})
    bundle = open_bundle("run-ncu", tmp_path)
    read = bundle.table("kernel_metrics")
    assert read.schema.equals(table.schema, check_metadata=True) and read.to_pandas().equals(table.to_pandas())
    assert table_metadata(bundle.table("kernel_metrics"))["units"]["gpu__time_duration.sum"] == "nsecond"
    assert bundle.table("cuda_segments") is None and "kernel_metrics" in OPTIONAL_TABLES
    assert (path / "kernel_metrics.parquet").is_file()
    with pytest.raises(BundleError, match="not an optional bundle table"):
        bundle.table("events")


@pytest.mark.parametrize(("tables", "with_trace", "match"), [
    ({"ncu": pa.table({"a": [1]})}, True, "unknown tables ncu"),
    ({"kernel_metrics": pa.table({"a": [1]})}, False, "optional tables need a trace"),
])
def test_bad_optional_tables_are_refused_and_nothing_is_written(tmp_path, tables, with_trace, match):
    trace = _trace([]) if with_trace else None
    with pytest.raises(BundleError, match=match):
        write_bundle(tmp_path, "run-bad", {}, trace, tables=tables)
    assert list(tmp_path.iterdir()) == []
