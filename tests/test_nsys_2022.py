"""The Nsight Systems reader on an nsys 2022.2 export (MPI + CUDA saxpy on an A100): counts and times
against SQL over its raw tables, CUDA backtrace records, old and new metadata tables, text that is not
UTF-8, out-of-range times, old or partial schemas, and files that are no (intact) export."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from click.testing import CliRunner
from conftest import fixture_path

from workbench.cli import main
from workbench.errors import TraceFormatError
from workbench.trace import read_trace
from workbench.trace.nsys.reader import read_nsys
from workbench.trace.registry import sniff_format

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
BACKTRACE = 67  # ENUM_NSYS_EVENT_CLASS: TRACE_PROCESS_EVENT_CUDABACKTRACE (nsys docs)
TWIN = (f"EXISTS (SELECT 1 FROM {RUNTIME} c WHERE c.eventClass != {BACKTRACE} AND c.globalTid = r.globalTid "
        "AND c.correlationId = r.correlationId)")
"""SQL: a backtrace record `r` repeats an API call recorded on its own."""
BACKTRACES_SKIPPED = "CUDA backtrace records repeating an API call (callchainId kept in its args)"


def _out_of_range(table):
    return f"{table} rows whose start or end is not an integer within ±2**62 ns (left out)"


@pytest.fixture(scope="module")
def export():
    return fixture_path("nsys", "saxpy_mpi_cuda_nsys2022.sqlite")


@pytest.fixture(scope="module")
def trace(export):
    return read_nsys(export)


@pytest.fixture(scope="module")
def events(trace):
    return trace.df()


def _query(path):
    """SQL over a database's raw tables; text comes back as bytes (this export holds invalid UTF-8)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.text_factory = bytes
    return con, lambda query, *params: con.execute(query, params).fetchall()


@pytest.fixture(scope="module")
def sql(export):
    con, query = _query(export)
    yield query
    con.close()


def _copy(export, tmp_path, *statements):
    """A copy of the export with `statements` applied."""
    path = tmp_path / "changed.sqlite"
    shutil.copyfile(export, path)
    path.chmod(0o644)
    with sqlite3.connect(path) as con:
        for statement in statements:
            con.execute(statement)
    con.close()
    return path


def _kind(events, kind):
    return events[events["kind"] == kind]


# -- what the export holds ------------------------------------------------------------------------------


def test_counts_per_kind_match_sql(trace, sql):
    ((kernels,),) = sql(f"SELECT count(*) FROM {KERNEL}")
    ((copies,),) = sql(f"SELECT count(*) FROM {MEMCPY}")
    ((ranges,),) = sql("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59 AND end IS NOT NULL")
    ((rows,),) = sql(f"SELECT count(*) FROM {RUNTIME}")
    ((calls,),) = sql(f"SELECT count(*) FROM {RUNTIME} WHERE eventClass != {BACKTRACE}")
    ((repeats,),) = sql(f"SELECT count(*) FROM {RUNTIME} r WHERE eventClass = {BACKTRACE} AND {TWIN}")
    assert (kernels, copies, ranges, rows) == (5, 15, 22, 95)
    assert (calls, repeats) == (57, 38) and calls + repeats == rows
    assert trace.kind_counts() == {"kernel": kernels, "memcpy": copies, "runtime": calls, "annotation": ranges}
    assert trace.metadata["reader"]["skipped"] == {
        BACKTRACES_SKIPPED: repeats,
        "NVTX domain definitions (names in args domain)": 1,
        "NVTX NvtxThread records": 1,
    }


def test_device_time_bytes_and_lanes_match_sql(events, sql):
    kernels, copies = _kind(events, "kernel"), _kind(events, "memcpy")
    ((kernel_ns,),) = sql(f"SELECT sum(end - start) FROM {KERNEL}")
    ((copy_ns, copy_bytes),) = sql(f"SELECT sum(end - start), sum(bytes) FROM {MEMCPY}")
    assert int(kernels["dur_ns"].sum()) == kernel_ns == 88_573_480
    assert (int(copies["dur_ns"].sum()), int(copies["bytes"].sum())) == (copy_ns, copy_bytes)
    lanes = {f"cuda:{d}/stream {s}" for t in (KERNEL, MEMCPY) for d, s in sql(f"SELECT deviceId, streamId FROM {t}")}
    assert set(kernels["track"]) | set(copies["track"]) == lanes == {"cuda:0/stream 7"}
    assert set(kernels["name"]) == {v.decode() for (v,) in sql(f"SELECT s.value FROM {KERNEL} k JOIN StringIds s "
                                                                 "ON s.id = k.demangledName")}


def test_memcpy_named_by_copy_kind_without_enum_tables(events, sql):
    """nsys 2022 writes no ENUM_* tables: copy kinds take current nsys's labels (from the 2026 export)."""
    assert not sql("SELECT name FROM sqlite_master WHERE name LIKE 'ENUM_%'")
    current = sqlite3.connect(f"file:{fixture_path('nsys', 'h100_2gpu_1s.sqlite')}?mode=ro", uri=True)
    labels = dict(current.execute("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER").fetchall())
    current.close()
    expected = {f"[CUDA memcpy {labels[k]}]": n for k, n in sql(f"SELECT copyKind, count(*) FROM {MEMCPY} GROUP BY 1")}
    assert _kind(events, "memcpy")["name"].astype(str).value_counts().to_dict() == expected
    assert set(expected) == {"[CUDA memcpy Host-to-Device]", "[CUDA memcpy Device-to-Host]"}


def test_backtrace_records_fold_into_their_call(trace, events, sql):
    origin = trace.metadata["origin_ns"]
    runtime = _kind(events, "runtime").set_index("corr")
    assert runtime.index.is_unique
    repeats = sql(f"SELECT r.correlationId, r.callchainId, c.start, c.end, s.value FROM {RUNTIME} r "
                  f"JOIN {RUNTIME} c ON c.globalTid = r.globalTid AND c.correlationId = r.correlationId "
                  f"AND c.eventClass != {BACKTRACE} JOIN StringIds s ON s.id = c.nameId "
                  f"WHERE r.eventClass = {BACKTRACE}")
    assert len(repeats) == 38
    for corr, callchain, start, end, symbol in repeats:
        call = runtime.loc[corr]
        args = json.loads(call["args"])
        assert (call["start_ns"] + origin, call["dur_ns"]) == (start, end - start)
        assert (args["callchainId"], args["symbol"], args["eventClass"]) == (callchain, symbol.decode(), "CUDA runtime")
    assert {json.loads(a)["eventClass"] for a in runtime["args"]} == {"CUDA runtime", "CUDA driver"}
    assert "cudaLaunchKernel" in set(runtime["name"])


def test_kernels_are_launched_inside_the_saxpy_ranges(trace, events, sql):
    origin = trace.metadata["origin_ns"]
    launches = sql(f"SELECT k.correlationId, n.start, n.text FROM {KERNEL} k JOIN {RUNTIME} r "
                   f"ON r.correlationId = k.correlationId AND r.eventClass = 0 JOIN NVTX_EVENTS n "
                   "ON n.globalTid = r.globalTid AND n.eventType = 59 AND n.start <= r.start AND n.end >= r.end")
    assert len(launches) == 5
    kernels = _kind(events, "kernel").set_index("corr")
    for corr, start, text in launches:
        launcher = events.iloc[kernels.loc[corr, "launcher"]]
        assert (launcher["name"], launcher["start_ns"] + origin, launcher["kind"]) == (text.decode(), start,
                                                                                       "annotation")
    assert trace.metadata["reader"]["device_work_launched_outside_the_export"] == 0


# -- metadata ---------------------------------------------------------------------------------------------


def test_metadata_from_the_2022_tables(trace, sql):
    meta = trace.metadata
    export = {k.decode(): v.decode() for k, v in sql("SELECT name, value FROM EXPORT_META_DATA")}
    assert meta["source"]["export"] == export
    assert (meta["nsys_version"], meta["schema_version"], meta["export_time"]) == (
        export["EXPORT_PRODUCT_VERSION"], export["EXPORT_SCHEMA_VERSION"], export["EXPORT_TIME_UTC"])
    assert meta["nsys_version"] == "2022.2.1.31"
    system = {k.decode(): v for k, v in sql("SELECT name, value FROM TARGET_INFO_SYSTEM_ENV")}
    assert (meta["driver_version"], meta["cuda_driver_version"]) == (system["NvDriverVersion"].decode(),
                                                                     system["CudaDriverVersion"].decode())
    assert meta["system"]["GpuInfo"] == system["GpuInfo"].decode("utf-8", errors="replace")
    assert "\ufffd" in meta["system"]["GpuInfo"] and "DeviceEnvironment" not in meta["system"]
    ((epoch, utc),) = sql("SELECT utcEpochNs, utcTime FROM TARGET_INFO_SESSION_START_TIME")
    ((duration,),) = sql("SELECT duration FROM ANALYSIS_DETAILS")
    assert (meta["session"]["utcEpochNs"], meta["session"]["utcTime"], meta["session"]["duration"]) == (
        epoch, utc.decode(), duration)
    ((name, memory, sms, major, minor),) = sql("SELECT name, totalMemory, smCount, computeMajor, computeMinor "
                                               "FROM TARGET_INFO_GPU")
    (device,) = meta["devices"]
    assert (device["device"], device["name"], device["memory_bytes"], device["sm_count"]) == (
        "cuda:0", name.decode(), memory, sms)
    assert device["compute_capability"] == f"{major}.{minor}" == "8.0"
    ((pid, process),) = sql("SELECT pid, name FROM PROCESSES WHERE globalPid = (SELECT globalPid FROM "
                            f"{KERNEL} LIMIT 1)")
    assert meta["processes"] == {str(pid): {"name": process.decode()}}
    json.dumps(meta)  # serializable as it is, for run.json


def test_reader_report_lists_tables_read_and_unread(trace, sql):
    reader = trace.metadata["reader"]
    for table, rows in reader["tables"].items():
        assert sql(f'SELECT count(*) FROM "{table}"') == [(rows,)], table
    assert reader["tables"]["EXPORT_META_DATA"] == 23
    for table, rows in reader["unread_tables"].items():
        assert sql(f'SELECT count(*) FROM "{table}"') == [(rows,)], table
    assert {"PROFILER_OVERHEAD", "CUDA_CALLCHAINS", "SCHED_EVENTS"} <= set(reader["unread_tables"])


def test_metadata_from_the_current_tables():
    """The 2026 export names its tables META_DATA_EXPORT and META_DATA_CAPTURE."""
    path = fixture_path("nsys", "h100_2gpu_1s.sqlite")
    meta = read_nsys(path).metadata
    con, query = _query(path)
    export = {k.decode(): v.decode() for k, v in query("SELECT name, value FROM META_DATA_EXPORT")}
    capture = {k.decode(): v.decode() for k, v in query("SELECT name, value FROM META_DATA_CAPTURE")}
    ((epoch,),) = query("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    con.close()
    assert (meta["nsys_version"], meta["export_time"]) == (export["EXPORT_PRODUCT_VERSION"], export["EXPORT_TIME_UTC"])
    assert meta["source"]["export"] == export
    assert meta["capture"]["CUDA_TRACE_SCOPE"] == capture["CUDA_TRACE_SCOPE"] == "ProcessTree"
    assert meta["capture"]["CAPTURE_EVENT_TYPE"] == ["NvtxEvents", "Cuda"]
    assert meta["session"]["utcEpochNs"] == epoch


# -- lenient reading ----------------------------------------------------------------------------------------


def test_blob_and_invalid_utf8_text_reads_as_text(export, tmp_path, sql):
    ((kernel_name, short_name),) = sql(f"SELECT DISTINCT demangledName, shortName FROM {KERNEL}")
    ((launch_name,),) = sql(f"SELECT DISTINCT r.nameId FROM {RUNTIME} r JOIN StringIds s ON s.id = r.nameId "
                            "WHERE s.value = 'cudaLaunchKernel_v7000'")
    path = _copy(export, tmp_path,
                 f"UPDATE StringIds SET value = CAST(value AS BLOB) WHERE id = {kernel_name}",
                 f"UPDATE StringIds SET value = X'7361787079FF' WHERE id = {short_name}",  # 'saxpy' + 0xFF, BLOB
                 f"UPDATE StringIds SET value = CAST(X'6C61756E6368C3' AS TEXT) WHERE id = {launch_name}",
                 "UPDATE NVTX_EVENTS SET text = CAST(X'4D504900FE' AS TEXT) WHERE text = 'MPI'",  # a domain name
                 "UPDATE NVTX_EVENTS SET text = CAST(X'736178707980' AS TEXT) WHERE text = 'saxpy'",
                 "UPDATE EXPORT_META_DATA SET value = X'FFFE' WHERE name = 'EXPORT_HOST'")
    trace = read_nsys(path)
    events = trace.df()
    ((original,),) = sql("SELECT value FROM StringIds WHERE id = ?", kernel_name)
    assert set(_kind(events, "kernel")["name"]) == {original.decode()}
    assert {json.loads(a)["shortName"] for a in _kind(events, "kernel")["args"]} == {"saxpy\ufffd"}
    assert (_kind(events, "runtime")["name"] == "launch\ufffd").sum() == 5
    annotations = _kind(events, "annotation")
    assert (annotations["name"] == "saxpy\ufffd").sum() == 5
    assert {json.loads(a).get("domain") for a in annotations["args"]} == {"MPI\x00\ufffd", None}
    assert trace.metadata["source"]["export"]["EXPORT_HOST"] == "\ufffd\ufffd"
    names = events["name"].astype(str)
    assert not names.str.startswith("b'").any() and not events["args"].str.contains("b'").any()
    assert trace.kind_counts() == read_nsys(export).kind_counts()


def test_out_of_range_times_are_counted_never_changed(export, tmp_path, trace):
    not_repeated = f"eventClass = 0 AND NOT EXISTS (SELECT 1 FROM {RUNTIME} b WHERE b.eventClass = {BACKTRACE} " \
                   "AND b.correlationId = r.correlationId)"
    path = _copy(export, tmp_path,
                 f"UPDATE {KERNEL} SET end = start - 5 WHERE gridId = 2",
                 f"UPDATE {RUNTIME} SET start = 9.3e18 WHERE rowid = (SELECT min(rowid) FROM {RUNTIME} r "
                 f"WHERE {not_repeated})",
                 f"UPDATE {RUNTIME} SET end = 'later' WHERE rowid = (SELECT max(rowid) FROM {RUNTIME} r "
                 f"WHERE {not_repeated})",
                 f"UPDATE {MEMCPY} SET end = 9223372036854775807 WHERE rowid = 4",
                 "UPDATE NVTX_EVENTS SET end = -9223372036854775808 WHERE rowid = (SELECT max(rowid) FROM NVTX_EVENTS "
                 "WHERE eventType = 59)")
    con, query = _query(path)
    ((kernel_start, kernel_end),) = query(f"SELECT start, end FROM {KERNEL} WHERE gridId = 2")
    con.close()
    changed = read_nsys(path)
    before = trace.kind_counts()
    assert changed.kind_counts() == {"kernel": before["kernel"], "memcpy": before["memcpy"] - 1,
                                     "runtime": before["runtime"] - 2, "annotation": before["annotation"] - 1}
    skipped = changed.metadata["reader"]["skipped"]
    assert skipped["spans ending before they start (duration set to 0)"] == 1
    assert (skipped[_out_of_range(RUNTIME)], skipped[_out_of_range(MEMCPY)], skipped[_out_of_range("NVTX_EVENTS")]) \
        == (2, 1, 1)
    assert kernel_end < kernel_start
    kernel = _kind(changed.df(), "kernel").sort_values("start_ns").iloc[1]
    assert (kernel["start_ns"] + changed.metadata["origin_ns"], kernel["dur_ns"]) == (kernel_start, 0)
    assert changed.metadata["origin_ns"] == trace.metadata["origin_ns"]
    assert (changed.events["dur_ns"].to_numpy() >= 0).all()


def test_old_and_partial_schemas_are_tolerated(export, tmp_path, sql):
    """No NVTX, memset, GPU, process or metadata tables; device work owned through a globalTid column."""
    path = _copy(export, tmp_path, *(f"DROP TABLE {t}" for t in (
        "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_MEMSET", "TARGET_INFO_GPU", "EXPORT_META_DATA", "PROCESSES", "ThreadNames",
        "TARGET_INFO_SYSTEM_ENV", "TARGET_INFO_SESSION_START_TIME", "ANALYSIS_DETAILS")),
        f"ALTER TABLE {KERNEL} RENAME COLUMN globalPid TO globalTid",
        f"ALTER TABLE {MEMCPY} RENAME COLUMN globalPid TO globalTid")
    trace = read_nsys(path)
    events = trace.df()
    assert trace.kind_counts() == {"kernel": 5, "memcpy": 15, "runtime": 57}
    ((pid,),) = sql(f"SELECT DISTINCT (globalPid >> 24) & 16777215 FROM {KERNEL}")
    assert set(events["pid"]) == {pid}
    assert (events["launcher"] == -1).all()
    meta = trace.metadata
    assert (meta["nsys_version"], meta["export_time"], meta["session"], meta["system"]) == (None, None, {}, {})
    assert [(d["device"], d["name"]) for d in meta["devices"]] == [("cuda:0", None)]
    assert meta["processes"] == {} and meta["threads"] == {}


# -- files that are no (intact) export -------------------------------------------------------------------------


def _sqlite(path, script):
    with sqlite3.connect(path) as con:
        con.executescript(script)
    con.close()
    return path


@pytest.mark.parametrize(("make", "problem"), [
    (lambda p: p.write_bytes(b"") or p, "empty file, not an Nsight Systems SQLite export"),
    (lambda p: _sqlite(p, "CREATE TABLE results (x INTEGER); INSERT INTO results VALUES (1);"),
     "not an Nsight Systems SQLite export"),
    (lambda p: _sqlite(p, f"CREATE TABLE StringIds (id INTEGER, text TEXT); CREATE TABLE {KERNEL} (start INTEGER);"),
     "not an Nsight Systems SQLite export"),
])
def test_sqlite_that_is_no_export_gets_one_line(tmp_path, make, problem):
    path = make(tmp_path / "capture.sqlite")
    with pytest.raises(TraceFormatError) as info:
        read_nsys(path)
    assert str(info.value).startswith(str(path)) and problem in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("keep", [8192, 1 / 3, 1 / 2, 0.95])
def test_truncated_2022_export_is_reported(export, tmp_path, keep):
    data = export.read_bytes()
    path = tmp_path / "truncated.sqlite"
    path.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    with pytest.raises(TraceFormatError, match="corrupt or truncated SQLite database") as info:
        read_nsys(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


# -- the CLI -------------------------------------------------------------------------------------------------


def test_cli_imports_and_shows_the_export(export, tmp_path, monkeypatch, trace, sql):
    monkeypatch.setenv("WORKBENCH_TRACES", str(tmp_path / "traces"))
    assert sniff_format(export) == "nsys"
    assert read_trace(export).kind_counts() == trace.kind_counts()
    runner = CliRunner()
    result = runner.invoke(main, ["import", str(export), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (run_id,) = json.loads(result.stdout)
    assert (tmp_path / "traces" / run_id / "raw" / export.name).read_bytes() == export.read_bytes()
    result = runner.invoke(main, ["show", run_id, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["events"] == trace.kind_counts()
    ((kernel_ns,),) = sql(f"SELECT sum(end - start) FROM {KERNEL}")
    assert summary["kernel_ns"] == {"cuda:0": kernel_ns}
    assert summary["device"] == "cpu,cuda:0"
    result = runner.invoke(main, ["show", run_id])
    assert result.exit_code == 0 and "saxpy" in result.stdout
