"""Multi-rank jobs: reading a folder of per-rank traces, clock alignment, per-rank analysis, import, view."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import fixture_path, write_trace

from workbench.analysis.ranks import collective_overlap, rank_table
from workbench.cli import main
from workbench.errors import TraceFormatError
from workbench.imports import import_ranks
from workbench.trace import read_trace
from workbench.trace.ranks.multirank import read_ranks
from workbench.trace.store.bundle import list_bundles, open_bundle
from workbench.trace.store.experiment import list_experiments

BASE_NS = 1_700_000_000_000_000_000
"""Job epoch (ns) of the synthetic traces; their `baseTimeNanoseconds` are this plus `DELTA_NS`."""

DELTA_NS = {0: 0, 1: 5_000_123, 2: 2_500_007, 3: 7_000_001}
"""Per-rank `baseTimeNanoseconds` offsets: not whole µs, so alignment is checked to the ns."""

STEP0_NS = 100_000_000
"""Absolute time (ns after BASE_NS) at which step 0 starts on every rank: the simultaneous event."""

SLOW_RANK = 2
STEP_US = {0: 1000, 1: 1000, 2: 1300, 3: 1000}
SKEW_NS = 3_000
"""Clock skew given to rank 1 in the skew test: its clock runs 3 µs ahead of the others."""

NAMES = {0: "host-b_proc3.pt.trace.json", 1: "host-a_proc0.pt.trace.json", 2: "host-c_proc1.pt.trace.json",
         3: "host-a_proc2.pt.trace.json.gz"}
"""File names whose order is not the rank order (the rank comes from distributedInfo)."""


def _rank_events(rank: int, skew_ns: int = 0) -> list[dict]:
    """One rank's events: a setup op (each rank's at another time, so origins differ), 3 steps, each
    with compute kernels [100, 500) µs on stream 7 and [650, 800) on stream 8 and an NCCL all-reduce
    kernel [400, 700) on stream 20 (overlap 100 + 50 µs), a host `nccl:all_reduce` of 20 µs; the slow
    rank adds a compute kernel [900, 1200). Times given as absolute ns are converted to the rank's µs."""
    def us(abs_ns: int) -> float:
        return (abs_ns + skew_ns - DELTA_NS[rank]) / 1000

    def kernel(name: str, start_ns: int, dur_us: int, stream: int) -> dict:
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": us(start_ns), "dur": dur_us,
                "args": {"device": 0, "stream": stream, "correlation": -1}}

    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::setup", "pid": 10 + rank, "tid": 1,
               "ts": us(STEP0_NS - 10_000 * (rank + 1)), "dur": 5}]
    for step in range(3):
        s = STEP0_NS + step * STEP_US[rank] * 1000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 10 + rank,
                       "tid": 1, "ts": us(s), "dur": STEP_US[rank]})
        events.append({"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 10 + rank,
                       "tid": 1, "ts": us(s + 390_000), "dur": 20})
        events.append(kernel("sm80_xmma_gemm_f16", s + 100_000, 400, 7))
        events.append(kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                             s + 400_000, 300, 20))
        events.append(kernel("elementwise_kernel", s + 650_000, 150, 8))
        if rank == SLOW_RANK:
            events.append(kernel("sm80_xmma_gemm_f16", s + 900_000, 300, 7))
    return events


def _write_job(folder: Path, skew: dict[int, int] | None = None) -> Path:
    folder.mkdir()
    for rank, name in NAMES.items():
        path = write_trace(folder / name.removesuffix(".gz"), _rank_events(rank, (skew or {}).get(rank, 0)),
                           distributedInfo={"backend": "nccl", "rank": rank, "world_size": 4},
                           baseTimeNanoseconds=BASE_NS + DELTA_NS[rank])
        if name.endswith(".gz"):
            import gzip

            (folder / name).write_bytes(gzip.compress(path.read_bytes()))
            path.unlink()
    (folder / "README.txt").write_text("not a trace: left alone")
    return folder


@pytest.fixture
def job(tmp_path: Path) -> Path:
    return _write_job(tmp_path / "job")


def _step0(rank_trace) -> int:
    events = rank_trace.trace.df()
    return int(events.loc[events["name"] == "ProfilerStep#0", "start_ns"].iloc[0])


def _first_nccl_end(trace) -> int:
    events = trace.df()
    nccl = events[events["name"].astype(str).str.startswith("nccl") & (events["kind"] == "kernel")]
    first = nccl.sort_values("start_ns").iloc[0]
    return int(first["start_ns"] + first["dur_ns"])


def test_ranks_numbered_from_distributed_info(job: Path) -> None:
    ranks = read_ranks(job, workers=1)
    assert [r.rank for r in ranks] == [0, 1, 2, 3]
    assert [r.path.name for r in ranks] == list(NAMES.values())
    assert {r.world_size for r in ranks} == {4} and {r.backend for r in ranks} == {"nccl"}
    assert {r.rank_source for r in ranks} == {"distributedInfo"}


def test_clock_alignment_lines_up_simultaneous_events_to_the_ns(job: Path) -> None:
    ranks = read_ranks(job, workers=1)
    # the job's first event is rank 3's setup op, 40 µs before step 0 (absolute times)
    earliest = STEP0_NS - 40_000
    for r in ranks:
        assert _step0(r) == STEP0_NS - earliest, f"rank {r.rank}"
        assert r.offset_ns == STEP0_NS - 10_000 * (r.rank + 1) - earliest
        assert r.trace.metadata["origin_ns"] == BASE_NS + earliest
        assert r.trace.metadata["rank"]["offset_ns"] == r.offset_ns
    assert min(int(r.trace.events["start_ns"].to_numpy().min()) for r in ranks) == 0


def test_clock_skew_kept_by_clock_and_corrected_by_collective_alignment(tmp_path: Path) -> None:
    folder = _write_job(tmp_path / "skewed", skew={1: SKEW_NS})
    by_clock = {r.rank: r for r in read_ranks(folder, workers=1)}
    assert _step0(by_clock[1]) - _step0(by_clock[0]) == SKEW_NS
    by_collective = {r.rank: r for r in read_ranks(folder, workers=1, align="collective")}
    assert {_first_nccl_end(r.trace) for r in by_collective.values()} == {_first_nccl_end(by_collective[0].trace)}
    assert by_collective[1].clock_correction_ns == -SKEW_NS
    assert {_step0(r) for r in by_collective.values()} == {_step0(by_collective[0])}


def test_collective_alignment_needs_a_collective_on_every_rank(tmp_path: Path) -> None:
    folder = tmp_path / "nocoll"
    folder.mkdir()
    write_trace(folder / "rank0.json", _rank_events(0), distributedInfo={"rank": 0, "world_size": 2})
    write_trace(folder / "rank1.json", [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 5,
                                         "dur": 1, "args": {"device": 0, "stream": 7}}])
    with pytest.raises(TraceFormatError, match=r"rank1\.json.*no collective"):
        read_ranks(folder, workers=1, align="collective")


def test_per_rank_times_equal_hand_computed_values(job: Path) -> None:
    table = rank_table(read_ranks(job, workers=1)).set_index("rank")
    us = 1000
    for rank in range(4):
        row = table.loc[rank]
        slow = rank == SLOW_RANK
        compute = (550 + (300 if slow else 0)) * 3 * us
        assert row["compute_ns"] == compute
        assert row["collective_ns"] == 900 * us
        assert row["overlap_ns"] == 450 * us
        assert row["exposed_collective_ns"] == 450 * us
        assert row["overlap_frac"] == pytest.approx(0.5)
        assert row["kernel_ns"] == compute + 900 * us - 450 * us
        assert row["busy_ns"] == row["kernel_ns"]
        last_end = 2 * STEP_US[rank] + (1200 if slow else 800)
        assert row["idle_ns"] == (last_end - 100) * us - row["busy_ns"]
        assert row["host_collective_ns"] == 60 * us
        assert row["steps"] == 3 and row["median_step_ns"] == STEP_US[rank] * us
        assert row["devices"] == "cuda:0"


def test_straggler_is_the_slow_rank(job: Path) -> None:
    table = rank_table(read_ranks(job, workers=1))
    assert table.loc[table["straggler"], "rank"].tolist() == [SLOW_RANK]
    assert table.set_index("rank").loc[SLOW_RANK, "step_excess"] == pytest.approx(0.3)
    assert rank_table(read_ranks(job, workers=1), threshold=0.5)["straggler"].sum() == 0


def test_overlap_counts_each_instant_once_across_streams(tmp_path: Path) -> None:
    def kernel(name: str, ts: int, dur: int, device: int, stream: int) -> dict:
        return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
                "args": {"device": device, "stream": stream}}

    path = write_trace(tmp_path / "two_gpus.json", [
        kernel("gemm_a", 0, 100, 0, 7), kernel("gemm_b", 50, 100, 0, 8),  # two streams, both under the NCCL kernel
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 40, 80, 0, 20),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 0, 10, 1, 20),
    ])
    assert collective_overlap(read_trace(path)) == {
        "cuda:0": {"kernel_ns": 150_000, "compute_ns": 150_000, "collective_ns": 80_000, "overlap_ns": 80_000},
        "cuda:1": {"kernel_ns": 10_000, "compute_ns": 0, "collective_ns": 10_000, "overlap_ns": 0},
    }


def test_nsys_export_ranked_by_file_name_on_the_session_clock(tmp_path: Path) -> None:
    folder = tmp_path / "nsys"
    folder.mkdir()
    shutil.copy(fixture_path("nsys", "h100_2gpu_1s.sqlite"), folder / "job.rank1.sqlite")
    (rank,) = read_ranks(folder)
    assert (rank.rank, rank.rank_source, rank.world_size) == (1, "file name", None)
    with sqlite3.connect(folder / "job.rank1.sqlite") as db:  # the first kernel's UTC time, from the export itself
        (session,) = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        (first_kernel,) = db.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    events = rank.trace.df()
    kernels = events[events["kind"] == "kernel"]
    assert rank.trace.metadata["origin_ns"] + int(kernels["start_ns"].min()) == session + first_kernel
    assert rank.offset_ns == 0
    assert rank_table([rank]).loc[0, "kernel_ns"] > 0


def test_parallel_and_sequential_reads_are_identical(job: Path) -> None:
    sequential = read_ranks(job, workers=1)
    parallel = read_ranks(job, workers=2)
    assert [r.rank for r in parallel] == [r.rank for r in sequential]
    for a, b in zip(sequential, parallel, strict=True):
        pd.testing.assert_frame_equal(a.trace.df(), b.trace.df())  # (NaN flops: Table.equals says NaN != NaN)
        assert a.offset_ns == b.offset_ns
    pd.testing.assert_frame_equal(rank_table(sequential), rank_table(parallel))


def test_rank_from_file_name_then_order(tmp_path: Path) -> None:
    folder = tmp_path / "named"
    folder.mkdir()
    span = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5}]
    write_trace(folder / "trace_rank_5.json", span)
    write_trace(folder / "worker.json", span)
    ranks = read_ranks(folder, workers=1)
    assert [(r.rank, r.rank_source, r.path.name) for r in ranks] == [(1, "order", "worker.json"),
                                                                     (5, "file name", "trace_rank_5.json")]


def test_duplicate_rank_is_an_error_naming_both_files(tmp_path: Path) -> None:
    folder = tmp_path / "dup"
    folder.mkdir()
    for name in ("a.json", "b.json"):
        write_trace(folder / name, _rank_events(0), distributedInfo={"rank": 0, "world_size": 2})
    with pytest.raises(TraceFormatError, match=r"b\.json.*rank 0.*a\.json"):
        read_ranks(folder, workers=1)


def test_empty_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="holds no trace file"):
        read_ranks(tmp_path)


def test_cli_imports_one_bundle_per_rank_and_an_experiment(job: Path, tmp_path: Path) -> None:
    root = tmp_path / "traces"
    result = CliRunner().invoke(main, ["import", "--ranks", str(job), "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert len(out["runs"]) == 4 and all(f"rank{r}" in run for r, run in enumerate(out["runs"]))
    (experiment,) = list_experiments(root)
    assert experiment.experiment_id == out["experiment"]
    assert experiment.run_ids == out["runs"]
    assert experiment.info["world_size"] == 4
    assert [r["rank"] for r in experiment.info["ranks"]] == [0, 1, 2, 3]
    assert [r["file"] for r in experiment.info["ranks"]] == list(NAMES.values())
    for rank, run_id in enumerate(out["runs"]):
        bundle = open_bundle(run_id, root)
        assert bundle.info["rank"] == rank and bundle.info["variant"] == f"rank{rank}"
        stored = bundle.trace()
        assert stored.metadata["rank"]["rank"] == rank
        events = stored.df()
        step0 = int(events.loc[events["name"] == "ProfilerStep#0", "start_ns"].iloc[0])
        assert step0 == 40_000  # the shared axis survives the bundle
    table = rank_table({r["rank"]: open_bundle(r["run"], root).trace() for r in experiment.info["ranks"]})
    assert table.loc[table["straggler"], "rank"].tolist() == [SLOW_RANK]


def test_cli_bad_rank_is_named_and_the_others_kept(job: Path, tmp_path: Path) -> None:
    (job / "rank9.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "name": ')
    root = tmp_path / "traces"
    result = CliRunner().invoke(main, ["import", "--ranks", str(job), "--out", str(root), "--json"])
    assert result.exit_code == 1, result.output
    assert "rank9.pt.trace.json" in result.stderr
    out = json.loads(result.stdout)
    assert list(out["failed"]) == ["rank9.pt.trace.json"]
    (experiment,) = list_experiments(root)
    assert experiment.info["failed"] == ["rank9.pt.trace.json"]
    assert sorted(b.run_id for b in list_bundles(root)) == sorted(out["runs"])
    assert len(out["runs"]) == len(NAMES)


def test_cli_strict_bad_file_names_it_and_writes_nothing(job: Path, tmp_path: Path) -> None:
    (job / "rank9.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "name": ')
    root = tmp_path / "traces"
    result = CliRunner().invoke(main, ["import", "--ranks", str(job), "--strict", "--out", str(root)])
    assert result.exit_code == 2, result.output
    assert "rank9.pt.trace.json" in result.stderr
    assert not root.exists() or (list_bundles(root) == [] and list_experiments(root) == [])
    with pytest.raises(TraceFormatError, match=r"rank9\.pt\.trace\.json"):
        import_ranks(job, root, workers=2)
    assert not root.exists() or (list_bundles(root) == [] and list_experiments(root) == [])


def test_cli_collective_alignment_corrects_skew(tmp_path: Path) -> None:
    folder = _write_job(tmp_path / "skewed", skew={1: SKEW_NS})
    root = tmp_path / "traces"
    result = CliRunner().invoke(main, ["import", "--ranks", str(folder), "--align", "collective", "--out", str(root),
                                       "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    (experiment,) = list_experiments(root)
    assert experiment.info["align"] == "collective"
    ends = {_first_nccl_end(open_bundle(run_id, root).trace()) for run_id in out["runs"]}
    assert len(ends) == 1


@pytest.mark.parametrize("option", [["--align", "collective"], ["--strict"]])
def test_cli_rank_options_need_ranks(tmp_path: Path, option: list[str]) -> None:
    result = CliRunner().invoke(main, ["import", "x.json", *option, "--out", str(tmp_path)])
    assert result.exit_code == 2 and f"{option[0]} applies to --ranks" in result.output


def test_cli_rejects_files_with_ranks(job: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["import", "x.json", "--ranks", str(job), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "not both" in result.output


def test_view_builds(job: Path) -> None:
    from bokeh.embed import json_item

    from workbench.views.ranks import ranks_view

    layout = ranks_view(read_ranks(job, workers=1), width=600)
    text = json.dumps(json_item(layout))
    assert "rank 3" in text and "no straggler" not in text and "rank 2" in text


def test_report_of_a_rank_import_has_the_ranks_view(job: Path, tmp_path: Path) -> None:
    root = tmp_path / "traces"
    imported = json.loads(CliRunner().invoke(main, ["import", "--ranks", str(job), "--out", str(root),
                                                    "--json"]).stdout)
    report = tmp_path / "ranks.html"
    result = CliRunner().invoke(main, ["report", imported["experiment"], "--out", str(root), "-o", str(report)])
    assert result.exit_code == 0, result.output
    html = report.read_text(encoding="utf-8")
    assert "4 ranks on one time axis; stragglers: rank 2" in html  # the slow rank, flagged in the ranks tab
    assert "step time per rank (ms)" in html and "compare" in html  # beside the comparison of the runs
    one = CliRunner().invoke(main, ["report", imported["runs"][0], "--out", str(root), "-o", str(tmp_path / "1.html")])
    assert one.exit_code == 0 and "ranks on one time axis" not in (tmp_path / "1.html").read_text(encoding="utf-8")


def test_real_fixtures_with_distributed_info(tmp_path: Path) -> None:
    folder = tmp_path / "real"
    folder.mkdir()
    names = ("ns_resolution_rank0.pt.trace.json.gz", "cpu_only_rank34.pt.trace.json.gz", "diff_test.json.gz")
    for name in names:
        shutil.copy(fixture_path("kineto", name), folder / name)
    ranks = read_ranks(folder)
    assert [(r.rank, r.world_size, r.rank_source) for r in ranks] == [(0, 1, "distributedInfo"),
                                                                      (1, 2, "distributedInfo"),
                                                                      (34, 300, "distributedInfo")]
    assert min(r.offset_ns for r in ranks) == 0
    for r in ranks:  # the shift is each origin minus the earliest, times unchanged relative to each other
        assert r.offset_ns == r.origin_ns - min(x.origin_ns for x in ranks)
    table = rank_table(ranks).set_index("rank")
    assert table.loc[1, "collective_ns"] > 0  # diff_test has ncclKernel_AllReduce kernels
    assert 0 <= table.loc[1, "overlap_ns"] <= table.loc[1, "collective_ns"]
    assert table.loc[34, "kernel_ns"] == 0 and table.loc[34, "busy_ns"] == 0  # CPU only
    assert table.loc[0, "host_collective_ns"] > 0  # nccl:all_reduce record_function ranges
    assert np.isfinite(table["median_step_ns"]).all()
