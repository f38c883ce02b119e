"""The Nsight Systems SQLite reader: exact counts on a real 2-GPU export against SQL over its raw tables,
launch attribution, lanes and metadata; hand-made exports for the tables the fixture lacks; bad input."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import fixture_path

from workbench.cli import main
from workbench.errors import TraceFormatError
from workbench.trace import read_trace
from workbench.trace.nsys.reader import read_nsys
from workbench.trace.registry import sniff_format

PID = "(globalPid >> 24) & 16777215"
TID_PID = "(globalTid >> 24) & 16777215"


@pytest.fixture(scope="module")
def export():
    return fixture_path("nsys", "h100_2gpu_1s.sqlite")


@pytest.fixture(scope="module")
def trace(export):
    return read_nsys(export)


@pytest.fixture(scope="module")
def sql(export):
    con = sqlite3.connect(f"file:{export}?mode=ro", uri=True)
    yield lambda query, *params: con.execute(query, params).fetchall()
    con.close()


@pytest.fixture(scope="module")
def events(trace):
    return trace.df()


def _kind(events, kind):
    return events[events["kind"] == kind]


# -- the real export ---------------------------------------------------------------------------------


def test_kernel_count_and_time_per_gpu_match_sql(events, sql):
    expected = {f"cuda:{d}": (n, ns) for d, n, ns in
                sql("SELECT deviceId, count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY deviceId")}
    kernels = _kind(events, "kernel")
    got = {d: (len(g), int(g["dur_ns"].sum())) for d, g in kernels.groupby("device", observed=True)}
    assert got == expected
    assert sum(n for n, _ in got.values()) == 3442
    assert set(got) == {"cuda:0", "cuda:1"}


def test_memcpy_and_memset_counts_and_bytes_match_sql(events, sql):
    for kind, table in (("memcpy", "CUPTI_ACTIVITY_KIND_MEMCPY"), ("memset", "CUPTI_ACTIVITY_KIND_MEMSET")):
        ((n, size),) = sql(f"SELECT count(*), sum(bytes) FROM {table}")
        rows = _kind(events, kind)
        assert (len(rows), int(rows["bytes"].sum())) == (n, size), kind
    copies = _kind(events, "memcpy")
    expected = dict(sql("SELECT '[CUDA memcpy ' || e.label || ']', count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m "
                        "JOIN ENUM_CUDA_MEMCPY_OPER e ON e.id = m.copyKind GROUP BY 1"))
    assert copies["name"].astype(str).value_counts().to_dict() == expected
    kinds = {json.loads(a)["copyKind"] for a in copies["args"]}
    assert kinds == {"Host-to-Device", "Device-to-Host", "Device-to-Device"}


def test_runtime_nvtx_and_other_counts_match_sql(events, sql):
    ((runtime,),) = sql("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    ((ranges,),) = sql("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL")
    ((others,),) = sql("SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION)"
                       " + (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_OVERHEAD)")
    counts = events["kind"].value_counts().to_dict()
    assert counts["runtime"] == runtime == 5796
    assert counts["annotation"] == ranges == 16782
    assert counts["other"] == others
    assert len(events) == 3442 + 904 + 22 + runtime + ranges + others


def test_every_kernel_has_a_cuda_device_and_stream_lane(events, sql):
    device_work = events[events["kind"].isin(["kernel", "memcpy", "memset"])]
    assert device_work["device"].astype(str).str.fullmatch(r"cuda:\d+").all()
    lanes = device_work["track"].astype(str).str.extract(r"^cuda:(\d+)/stream (\d+)$").astype(int)
    assert (lanes[0] == device_work["device"].astype(str).str[5:].astype(int)).all()
    kernels = device_work[device_work["kind"] == "kernel"]
    expected = {f"cuda:{d}/stream {s}": n for d, s, n in
                sql("SELECT deviceId, streamId, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1, 2")}
    assert kernels["track"].value_counts().loc[lambda c: c > 0].to_dict() == expected


def test_host_rows_sit_on_their_thread(events, sql):
    host = events[events["device"] == "cpu"]
    assert host["track"].astype(str).str.fullmatch(r"cpu/pid \d+/thread \d+").all()
    expected = {f"cpu/pid {p}/thread {t}": n for p, t, n in
                sql(f"SELECT {TID_PID}, globalTid & 16777215, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1, 2")}
    assert _kind(events, "runtime")["track"].value_counts().loc[lambda c: c > 0].to_dict() == expected


def test_launchers_are_the_aten_ranges_enclosing_the_launch(trace, events, sql):
    origin = trace.metadata["origin_ns"]
    device_work = events[events["kind"].isin(["kernel", "memcpy", "memset"])]
    linked = device_work[device_work["launcher"] >= 0]
    launchers = events.iloc[linked["launcher"]]
    assert (launchers["kind"] == "annotation").all()
    assert launchers["name"].astype(str).str.startswith("aten::").all()
    ((expected,),) = sql(
        "SELECT count(*) FROM (SELECT k.correlationId, k.globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "UNION ALL SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMCPY "
        "UNION ALL SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMSET) d "
        f"JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = d.correlationId AND {TID_PID} = (d.globalPid >> 24) "
        "& 16777215 WHERE EXISTS (SELECT 1 FROM NVTX_EVENTS n WHERE n.globalTid = r.globalTid "
        "AND n.start <= r.start AND n.end >= r.start)")
    assert len(linked) == expected == 1632 + 438 + 22
    kernels = linked[linked["kind"] == "kernel"]
    for row in kernels.iloc[:: max(1, len(kernels) // 60)].itertuples():
        ((call_start, gtid),) = sql(
            f"SELECT start, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId = ? AND {TID_PID} = ?",
            row.corr, row.pid)
        ((text, start),) = sql("SELECT text, start FROM NVTX_EVENTS WHERE globalTid = ? AND start <= ? AND end >= ? "
                               "ORDER BY start DESC, end ASC LIMIT 1", gtid, call_start, call_start)
        launcher = events.iloc[row.launcher]
        assert launcher["start_ns"] + origin == start
        assert text.startswith(f"{launcher['name']}, ")


def test_unlinked_device_work_is_counted(trace, events):
    device_work = events[events["kind"].isin(["kernel", "memcpy", "memset"])]
    assert trace.metadata["reader"]["device_work_launched_outside_the_export"] == (device_work["launcher"] < 0).sum()


def test_nesting_is_consistent(trace):
    e = trace.events
    start, dur, parent = (e[c].to_numpy() for c in ("start_ns", "dur_ns", "parent"))
    track = e["track"].combine_chunks().indices.to_numpy()
    kids = np.flatnonzero(parent >= 0)
    up = parent[kids]
    assert len(kids) > 10_000
    assert (track[up] == track[kids]).all()
    assert (start[up] <= start[kids]).all()
    assert (start[up] + dur[up] >= start[kids] + dur[kids]).all()
    depth = e["depth"].to_numpy()
    assert (depth[kids] == depth[up] + 1).all()


def test_times_are_ns_from_the_earliest_start(trace, events, sql):
    tables = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
              "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_OVERHEAD",
              "NVTX_EVENTS")
    ((origin,),) = sql("SELECT min(s) FROM (" + " UNION ALL ".join(f"SELECT min(start) s FROM {t}" for t in tables)
                       + ")")
    assert trace.metadata["origin_ns"] == origin
    assert events["start_ns"].min() == 0
    ((first_kernel,),) = sql("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    assert _kind(events, "kernel")["start_ns"].min() == first_kernel - origin


def test_kernel_args_keep_launch_configuration_and_names(events, sql):
    kernels = _kind(events, "kernel")
    row = kernels.iloc[100]
    ((grid, block, regs, static, dynamic, short, mangled, demangled),) = sql(
        "SELECT json_array(gridX, gridY, gridZ), json_array(blockX, blockY, blockZ), registersPerThread, "
        "staticSharedMemory, dynamicSharedMemory, s.value, m.value, d.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName JOIN StringIds m ON m.id = k.mangledName "
        f"JOIN StringIds d ON d.id = k.demangledName WHERE correlationId = ? AND {PID} = ?", int(row["corr"]),
        int(row["pid"]))
    args = json.loads(row["args"])
    assert row["name"] == demangled
    assert args["grid"] == json.loads(grid) and args["block"] == json.loads(block)
    assert args["registers per thread"] == regs
    assert args["shared memory"] == static + dynamic
    assert (args["staticSharedMemory"], args["dynamicSharedMemory"]) == (static, dynamic)
    assert (args["shortName"], args["mangledName"]) == (short, mangled)
    assert args["launchType"] == "Regular"
    assert "gridId" in args
    for text in events["args"]:
        assert isinstance(json.loads(text), dict)


def test_runtime_names_without_api_version(events):
    runtime = _kind(events, "runtime")
    assert "cudaLaunchKernel" in set(runtime["name"])
    assert not runtime["name"].astype(str).str.contains(r"_v\d+$").any()
    symbols = {json.loads(a)["symbol"] for a in runtime["args"]}
    assert "cudaLaunchKernel_v7000" in symbols


def test_emit_nvtx_texts_split_into_name_and_op_id(trace, events, sql):
    nvtx = _kind(events, "annotation")
    assert not nvtx["name"].astype(str).str.contains(", op_id = ").any()
    ((distinct_texts,),) = sql("SELECT count(DISTINCT text) FROM NVTX_EVENTS")
    assert nvtx["name"].nunique() < 200 < 16_000 < distinct_texts
    ((text, start),) = sql("SELECT text, start FROM NVTX_EVENTS ORDER BY rowid LIMIT 1")
    row = nvtx.iloc[0]
    args = json.loads(row["args"])
    name, op_id = re.fullmatch(r"(.*), op_id = (\d+)", text).groups()
    assert (row["start_ns"] + trace.metadata["origin_ns"], row["name"], args["op_id"]) == (start, name, int(op_id))
    assert args["eventType"] == "NvtxPushPopRange"


def test_other_rows_say_where_they_come_from(events):
    other = _kind(events, "other")
    sources = {json.loads(a)["source"] for a in other["args"]}
    assert sources == {"CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_OVERHEAD"}
    assert {"Stream sync", "Stream wait sync", "Command Buffer Full"} <= set(other["name"])
    assert (other["device"] == "cpu").all()


def test_metadata(trace, sql):
    meta = trace.metadata
    assert meta["source"]["format"] == "nsys"
    assert meta["schema_version"] == "3.25.0"
    assert meta["nsys_version"] == "2026.2.1.210"
    assert meta["driver_version"] == "580.95.05"
    assert [d["device"] for d in meta["devices"]] == ["cuda:0", "cuda:1"]
    assert meta["processes"] == {"111": {"name": "python3"}, "112": {"name": "python3"}}
    reader = meta["reader"]
    for table, rows in reader["tables"].items():
        assert sql(f"SELECT count(*) FROM {table}") == [(rows,)]
    assert reader["tables"]["CUPTI_ACTIVITY_KIND_KERNEL"] == 3442
    assert "TARGET_INFO_CUDA_STREAM" in reader["unread_tables"]
    assert reader["skipped"] == {}
    text = json.dumps(meta)
    assert "HF_API_KEY" not in text and "DeviceEnvironment" not in text


def test_gpu_info_from_target_info_gpu(export, tmp_path):
    copy = tmp_path / "with_gpus.sqlite"
    shutil.copyfile(export, copy)
    with sqlite3.connect(copy) as con:
        con.execute("CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, "
                    "busLocation TEXT, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER, "
                    "smCount INTEGER, uuid TEXT, chipName TEXT, cuDevice INTEGER, computeMajor INTEGER, "
                    "computeMinor INTEGER)")
        con.executemany("INSERT INTO TARGET_INFO_GPU VALUES (0, ?, 'NVIDIA H100 80GB HBM3', ?, 85029158912, "
                        "3352320000000, 1980000000, 132, ?, 'GH100', ?, 9, 0)",
                        [(i, f"0000:{i + 1:02x}:00.0", f"GPU-{i}", i) for i in range(2)])
    devices = read_nsys(copy).metadata["devices"]
    assert [(d["device"], d["name"], d["sm_count"], d["compute_capability"]) for d in devices] == [
        ("cuda:0", "NVIDIA H100 80GB HBM3", 132, "9.0"), ("cuda:1", "NVIDIA H100 80GB HBM3", 132, "9.0")]
    assert devices[0]["memory_bytes"] == 85029158912
    assert devices[1]["memory_bandwidth_bytes_per_s"] == 3352320000000
    assert devices[1]["source"]["busLocation"] == "0000:02:00.0"


def test_registry_sniffs_and_reads_the_export(export):
    assert sniff_format(export) == "nsys"
    assert read_trace(export).events.num_rows == 27388


def test_cli_import_and_show(export, tmp_path, sql):
    runner = CliRunner()
    root = tmp_path / "traces"
    result = runner.invoke(main, ["import", str(export), "--out", str(root), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (run_id,) = json.loads(result.stdout)
    assert (root / run_id / "raw" / export.name).read_bytes() == export.read_bytes()
    result = runner.invoke(main, ["show", run_id, "--out", str(root), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["events"]["kernel"] == 3442
    expected = {f"cuda:{d}": ns for d, ns in
                sql("SELECT deviceId, sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY deviceId")}
    assert summary["kernel_ns"] == expected


# -- hand-made exports for what the fixture lacks -------------------------------------------------------

SCHEMA = """
CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_CUDA_DEV_MEM_EVENT_OPER (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
CREATE TABLE ENUM_CUPTI_SYNC_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT);
INSERT INTO ENUM_CUPTI_SYNC_TYPE VALUES (3, 'CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE', 'Stream sync');
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL,
    gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER,
    launchType INTEGER  -- REFERENCES ENUM_CUDA_KERNEL_LAUNCH_TYPE(id)
);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start INTEGER NOT NULL, end INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL
);
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (
    start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, syncType INTEGER NOT NULL
);
CREATE TABLE NVTX_EVENTS (
    start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, text TEXT, globalTid INTEGER,
    textId INTEGER, domainId INTEGER
);
CREATE TABLE OSRT_API (start INTEGER NOT NULL, end INTEGER NOT NULL, globalTid INTEGER, nameId INTEGER NOT NULL);
CREATE TABLE CUBLAS_EVENTS (start INTEGER NOT NULL, end INTEGER NOT NULL, globalTid INTEGER, nameId INTEGER NOT NULL);
CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (
    start INTEGER NOT NULL, globalPid INTEGER NOT NULL, deviceId INTEGER NOT NULL, address INTEGER NOT NULL,
    bytes INTEGER NOT NULL, memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL, correlationId INTEGER
);
CREATE TABLE GPU_METRICS (timestamp INTEGER, value REAL);
"""
STRINGS = [(1, "gemm_kernel_templated"), (2, "gemm"), (3, "cudaLaunchKernel_v7000"), (4, "poll"),
           (5, "cublasSgemm_v2"), (6, "registered step"), (7, "cudaMalloc_v3020")]


def _tid(pid, tid):
    return (1 << 48) | (pid << 24) | tid


def _pid(pid):
    return (1 << 48) | (pid << 24)


@pytest.fixture
def handmade(tmp_path):
    """Two processes (10, 20) on cuda:0 stream 7, NVTX of every kind, OS/cuBLAS calls and GPU memory."""
    path = tmp_path / "my export #1.sqlite"
    with sqlite3.connect(path) as con:
        con.executescript(SCHEMA)
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", STRINGS)
        con.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", [("EXPORT_SCHEMA_VERSION", "3.11.0")])
        con.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)",
                        [(34, "NvtxMark", "NvtxMark"), (59, "NvtxPushPopRange", "NvtxPushPopRange"),
                         (60, "NvtxStartEndRange", "NvtxStartEndRange"), (75, "NvtxDomainCreate", "NvtxDomainCreate"),
                         (33, "NvtxCategory", "NvtxCategory")])
        con.executemany("INSERT INTO ENUM_CUDA_MEM_KIND VALUES (?, ?, ?)",
                        [(1, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"),
                         (2, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device")])
        con.executemany("INSERT INTO ENUM_CUDA_DEV_MEM_EVENT_OPER VALUES (?, ?, ?)",
                        [(0, "CUDA_DEV_MEM_EVENT_OPR_ALLOCATION", "Allocation"),
                         (1, "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION", "Deallocation")])
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 7, ?, ?, 1, 2, 4, 2, 1, 128, 1, 1, 0)",
                        [(2000, 2500, 5, _pid(10)), (2600, 2700, 5, _pid(20)), (2800, 2900, 99, _pid(10))])
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?)",
                        [(1100, 1200, _tid(10, 11), 5, 3), (1150, 1180, _tid(20, 21), 5, 3),
                         (1300, 1400, _tid(10, 11), 6, 7)])
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (?, ?, 0, 7, ?, ?, 3)",
                        [(1320, 1390, 6, _pid(10)), (5000, 5100, 42, _pid(10))])
        con.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?, ?)", [
            (900, None, 75, "my domain", _tid(10, 11), None, 3),
            (905, None, 33, "a category", _tid(10, 11), None, 3),
            (1000, 1500, 59, "aten::mm, seq = 4, op_id = 9, sizes = [[2, 3], [3, 4]], input_op_ids = [(1,0)]",
             _tid(10, 11), None, 0),
            (1050, 1250, 59, None, _tid(10, 11), 6, 3),
            (1060, 3000, 60, "async work", _tid(10, 11), None, 0),
            (1070, None, 34, "checkpoint", _tid(10, 11), None, 0),
            (1080, None, 59, "never closed", _tid(10, 11), None, 0),
        ])
        con.executemany("INSERT INTO OSRT_API VALUES (?, ?, ?, 4)", [(1410, 1450, _tid(10, 11))])
        con.executemany("INSERT INTO CUBLAS_EVENTS VALUES (?, ?, ?, 5)", [(1090, 1210, _tid(10, 11))])
        con.executemany("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (?, ?, 0, ?, ?, ?, ?, ?)", [
            (1390, _pid(10), 0xA000, 4096, 2, 0, 6),
            (1395, _pid(10), 0xB000, 512, 1, 0, None),
            (1600, _pid(10), 0xA000, 4096, 2, 1, None),
            (800, _pid(10), 0xC000, 1024, 2, 0, None),
        ])
        con.executemany("INSERT INTO GPU_METRICS VALUES (?, ?)", [(1, 0.5)])
    return path


def test_handmade_export_rows(handmade):
    trace = read_nsys(handmade)
    events = trace.df()
    assert trace.metadata["origin_ns"] == 800  # the earliest memory event
    assert trace.kind_counts() == {"annotation": 4, "kernel": 3, "runtime": 3, "other": 3}
    by_name = events.set_index(events["name"].astype(str))
    assert by_name.loc["cudaLaunchKernel", "track"].tolist() == ["cpu/pid 10/thread 11", "cpu/pid 20/thread 21"]
    assert set(events.loc[events["kind"] == "kernel", "track"]) == {"cuda:0/pid 10/stream 7", "cuda:0/pid 20/stream 7"}
    mm = by_name.loc["aten::mm"]
    assert mm["shapes"] == "[[2, 3], [3, 4]]"
    assert json.loads(mm["args"])["seq"] == 4 and json.loads(mm["args"])["input_op_ids"] == "[(1,0)]"
    step = by_name.loc["registered step"]
    assert json.loads(step["args"])["domain"] == "my domain"
    assert by_name.loc["async work", "track"] == "cpu/pid 10/thread 11/nvtx start-end"
    assert by_name.loc["checkpoint", "dur_ns"] == 0
    assert by_name.loc["poll", "kind"] == "other"
    assert json.loads(by_name.loc["cublasSgemm_v2", "args"])["source"] == "CUBLAS_EVENTS"
    assert by_name.loc["Stream sync", "track"] == "cpu/pid 10/thread 11"


def test_handmade_export_links(handmade):
    events = read_nsys(handmade).df()
    kernels = events[events["kind"] == "kernel"].sort_values("start_ns")
    names = events["name"].astype(str).tolist()
    launchers = [names[i] if i >= 0 else None for i in kernels["launcher"]]
    # pid 10's launch sits in "registered step" inside aten::mm (cuBLAS call is no NVTX range);
    # pid 20's launch has no NVTX range; corr 99 was launched outside the export.
    assert launchers == ["registered step", None, None]


def test_handmade_export_memory(handmade):
    trace = read_nsys(handmade)
    memory = trace.memory.to_pandas()
    assert memory["ts_ns"].tolist() == [0, 590, 595, 800]
    assert memory["device"].astype(str).tolist() == ["cuda:0", "cuda:0", "cpu", "cuda:0"]
    assert memory["delta_bytes"].tolist() == [1024, 4096, 512, -4096]
    assert memory["allocated_bytes"].tolist() == [1024, 5120, 512, 1024]
    names = trace.events["name"].to_pylist()
    assert [names[i] if i >= 0 else None for i in memory["event"]] == [None, "aten::mm", None, None]


def test_handmade_export_reader_report(handmade):
    reader = read_nsys(handmade).metadata["reader"]
    assert reader["skipped"] == {
        "NVTX ranges without an end": 1,
        "NVTX domain definitions (names in args domain)": 1,
        "NVTX NvtxCategory records": 1,
        "synchronization records whose API call is not in the export": 1,
    }
    assert reader["unread_tables"] == {"GPU_METRICS": 1}
    assert reader["tables"]["CUDA_GPU_MEMORY_USAGE_EVENTS"] == 4
    assert "CUDNN_EVENTS" not in reader["tables"]
    assert reader["device_work_launched_outside_the_export"] == 1


def test_only_the_kernel_table_is_required(tmp_path):
    path = tmp_path / "minimal.sqlite"
    with sqlite3.connect(path) as con:
        con.executescript("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);"
                          "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER,"
                          " streamId INTEGER, shortName INTEGER);")
    trace = read_nsys(path)
    assert trace.events.num_rows == 0
    assert trace.metadata["schema_version"] is None
    assert trace.metadata["reader"]["tables"] == {"CUPTI_ACTIVITY_KIND_KERNEL": 0}


# -- bad input ---------------------------------------------------------------------------------------------


def _sqlite(path, script=""):
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA user_version = 1")  # writes the header: an empty but real database
        con.executescript(script)
    return path


@pytest.mark.parametrize(("make", "problem"), [
    (lambda p: p.write_bytes(b"\x00garbage, not a database\xff" * 200) and p, "not an SQLite database"),
    (lambda p: _sqlite(p), "not an Nsight Systems SQLite export"),
    (lambda p: _sqlite(p, "CREATE TABLE results (x INTEGER);"), "not an Nsight Systems SQLite export"),
    (lambda p: _sqlite(p, "CREATE TABLE StringIds (id INTEGER, value TEXT);"
                          "CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);"),
     "no CUPTI_ACTIVITY_KIND_KERNEL table: was the capture run with -t cuda?"),
])
def test_bad_input_names_the_file(tmp_path, make, problem):
    path = tmp_path / "capture.sqlite"
    make(path)
    with pytest.raises(TraceFormatError) as info:
        read_nsys(path)
    assert str(info.value).startswith(str(path))
    assert problem in str(info.value)
    assert "\n" not in str(info.value)


def test_garbage_named_sqlite_is_not_sniffed_as_nsys(tmp_path):
    path = tmp_path / "capture.sqlite"
    path.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(TraceFormatError, match=re.escape(str(path))):
        read_trace(path)


def test_truncated_export_is_reported(export, tmp_path):
    path = tmp_path / "truncated.sqlite"
    path.write_bytes(export.read_bytes()[: 1_000_000])
    with pytest.raises(TraceFormatError, match="corrupt or truncated SQLite database") as info:
        read_nsys(path)
    assert str(info.value).startswith(str(path))


def test_missing_kernel_column_is_reported(tmp_path):
    path = _sqlite(tmp_path / "odd.sqlite", "CREATE TABLE StringIds (id INTEGER, value TEXT);"
                                            "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER);")
    with pytest.raises(TraceFormatError, match="table CUPTI_ACTIVITY_KIND_KERNEL has no column deviceId, streamId"):
        read_nsys(path)
