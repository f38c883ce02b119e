"""Issue 22, defect 3: the nsys reader on a copy of a real export (nsys 2022.2 saxpy) whose integer, id and
REAL columns hold values of the wrong type, set by SQL UPDATE: a REAL (±inf, 1.5, 1e300) in an INTEGER
column, text (`'3x'`) in a StringIds id, a BLOB in a time column, text or inf in a REAL column. Each
import succeeds, counts the values per `table.column` in `reader.skipped` (and sums them up in one line of
`reader.warnings`), and leaves the other rows as they were."""

from __future__ import annotations

import shutil
import sqlite3

import pyarrow as pa
import pytest
from click.testing import CliRunner
from conftest import fixture_path

from workbench.cli import main
from workbench.trace.nsys.reader import read_nsys

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"
INF = "9e999"  # SQLite's literal for +inf (it stores NaN as NULL)
NOT_INTEGER = "values that are not integers (REAL, text, BLOB), read as null"
NOT_FINITE = "values that are not finite numbers (text, BLOB, inf), read as null"
AS_WRITTEN = "kept in args as written (inf left out)"
COMPARED = ("start_ns", "dur_ns", "name", "kind", "device", "track", "pid", "tid", "corr", "parent", "launcher")
"""Event columns compared with the untouched export (args too, where the column changed is not in them)."""


@pytest.fixture(scope="module")
def export():
    return fixture_path("nsys", "saxpy_mpi_cuda_nsys2022.sqlite")


@pytest.fixture(scope="module")
def clean(export):
    return read_nsys(export)


def _mutated(export, tmp_path, *updates, params=()):
    path = tmp_path / "hostile.sqlite"
    shutil.copyfile(export, path)
    path.chmod(0o644)
    con = sqlite3.connect(path, isolation_level=None)
    try:
        for update in updates:
            con.execute(update, params)
    finally:
        con.close()
    return path


def _rows(trace, columns=COMPARED):
    return trace.events.select(list(columns)).to_pylist()


def _coerced(trace):
    return {k: v for k, v in trace.metadata["reader"]["skipped"].items() if ": " in k}


def _query(path, sql):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize(("table", "column", "value", "rows", "written"), [
    (NVTX, "uint64Value", INF, 24, None),  # the crash cases of the issue: json_array writes inf as `Inf`
    (NVTX, "uint64Value", "-" + INF, 24, None),
    (NVTX, "uint64Value", "1.5", 24, "1.5"),
    (NVTX, "rangeId", INF, 24, None),
    (NVTX, "rangeId", "1e300", 24, "1e+300"),
    (NVTX, "rangeId", "'3x'", 24, '"3x"'),
    (MEMCPY, "virtualAddress", INF, 15, None),
    (MEMCPY, "virtualAddress", "1.5", 15, "1.5"),
    (NVTX, "doubleValue", INF, 24, None),  # a REAL column
    (NVTX, "doubleValue", "'12abc'", 24, '"12abc"'),
])
def test_a_wrong_type_in_an_args_column_is_counted_and_kept_as_written(export, clean, tmp_path, table, column,
                                                                       value, rows, written):
    """Columns that only go to args keep what the export wrote (text as text, 1.5 as 1.5), as issue 13's
    fuzzing settled; inf, which JSON cannot hold, is left out as the reader leaves out every non-finite arg."""
    path = _mutated(export, tmp_path, f'UPDATE {table} SET "{column}" = {value}')
    trace = read_nsys(path)
    reason = NOT_FINITE if column == "doubleValue" else NOT_INTEGER
    assert _coerced(trace) == {f"{table}.{column}: {reason.replace('read as null', AS_WRITTEN)}": rows}
    assert _rows(trace) == _rows(clean)
    (warning,) = trace.metadata["reader"]["warnings"]
    assert warning == f"{rows} values of the wrong type read as null or text, in {table}.{column}"
    kind = "memcpy" if table == MEMCPY else "annotation"
    args = [a for a, k in zip(trace.events["args"].to_pylist(), trace.events["kind"].to_pylist(), strict=True)
            if k == kind]
    if written is None:
        assert args == [a for a, k in zip(clean.events["args"].to_pylist(), clean.events["kind"].to_pylist(),
                                          strict=True) if k == kind]
    else:
        assert args and all(f'"{column}":{written}' in a for a in args)


def test_nan_is_stored_as_null_and_reads_as_the_clean_export(export, clean, tmp_path):
    path = _mutated(export, tmp_path, f"UPDATE {NVTX} SET uint64Value = ?, rangeId = ?, doubleValue = ?",
                    params=(float("nan"),) * 3)
    trace = read_nsys(path)
    assert _coerced(trace) == {} and trace.metadata["reader"]["warnings"] == []
    assert _rows(trace, (*COMPARED, "args")) == _rows(clean, (*COMPARED, "args"))


@pytest.mark.parametrize("value", [INF, "1.5", "'3x'", "X'0102'"])
def test_a_memcpy_device_id_of_the_wrong_type_is_null_on_that_row_only(export, clean, tmp_path, value):
    (first,) = _query(export, f"SELECT min(rowid) FROM {MEMCPY}")[0]
    path = _mutated(export, tmp_path, f"UPDATE {MEMCPY} SET deviceId = {value} WHERE rowid = {first}")
    trace = read_nsys(path)
    assert _coerced(trace) == {f"{MEMCPY}.deviceId: {NOT_INTEGER}": 1}
    before, after = _rows(clean), _rows(trace)
    assert len(after) == len(before)
    changed = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if b != a]
    assert len(changed) == 1  # the copy, now on no device (device -1: its stream on the host)
    row = after[changed[0]]
    assert row["kind"] == "memcpy" and row["device"] == "cpu"
    assert row["start_ns"] == before[changed[0]]["start_ns"] and row["dur_ns"] == before[changed[0]]["dur_ns"]


def test_text_in_a_runtime_name_id_leaves_that_call_unnamed(export, clean, tmp_path):
    call = f"SELECT rowid, start, end FROM {RUNTIME} WHERE eventClass != 67 ORDER BY start DESC LIMIT 1"
    ((rowid, start, end),) = _query(export, call)
    path = _mutated(export, tmp_path, f"UPDATE {RUNTIME} SET nameId = '3x' WHERE rowid = {rowid}")
    trace = read_nsys(path)
    assert _coerced(trace) == {f"{RUNTIME}.nameId: {NOT_INTEGER}": 1}
    origin = trace.metadata["origin_ns"]
    assert origin == clean.metadata["origin_ns"]
    before, after = _rows(clean), _rows(trace)
    changed = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if b != a]
    assert len(after) == len(before) and len(changed) == 1
    row = after[changed[0]]
    assert (row["kind"], row["start_ns"], row["dur_ns"]) == ("runtime", start - origin, end - start)
    assert row["name"] is None and before[changed[0]]["name"] is not None


def test_text_in_a_kernel_name_id_falls_back_to_the_short_name(export, clean, tmp_path):
    ((rowid, short),) = _query(export, f"SELECT k.rowid, s.value FROM {KERNEL} k JOIN StringIds s "
                                       "ON s.id = k.shortName ORDER BY k.start DESC LIMIT 1")
    path = _mutated(export, tmp_path, f"UPDATE {KERNEL} SET demangledName = '3x' WHERE rowid = {rowid}")
    trace = read_nsys(path)
    assert _coerced(trace) == {f"{KERNEL}.demangledName: {NOT_INTEGER}": 1}
    kernels = trace.events.filter(pa.compute.equal(trace.events["kind"], "kernel"))
    clean_kernels = clean.events.filter(pa.compute.equal(clean.events["kind"], "kernel"))
    names, clean_names = kernels["name"].to_pylist(), clean_kernels["name"].to_pylist()
    assert len(names) == len(clean_names) == 5
    changed = [i for i, (a, b) in enumerate(zip(names, clean_names, strict=True)) if a != b]
    assert len(changed) == 1 and names[changed[0]] == short


def test_text_in_a_kernel_short_name_id_leaves_the_name_and_drops_the_arg(export, clean, tmp_path):
    path = _mutated(export, tmp_path, f"UPDATE {KERNEL} SET shortName = '3x'")
    trace = read_nsys(path)
    assert _coerced(trace) == {f"{KERNEL}.shortName: {NOT_INTEGER}": 5}
    assert _rows(trace) == _rows(clean)
    kernels = trace.df().query("kind == 'kernel'")
    assert len(kernels) == 5 and not kernels["args"].str.contains('"shortName"').any()


@pytest.mark.parametrize("column", ["start", "end"])
def test_a_blob_in_a_time_column_leaves_that_row_out(export, clean, tmp_path, column):
    (last,) = _query(export, f"SELECT rowid FROM {KERNEL} ORDER BY start DESC LIMIT 1")[0]
    path = _mutated(export, tmp_path, f"UPDATE {KERNEL} SET \"{column}\" = X'00' WHERE rowid = {last}")
    trace = read_nsys(path)
    skipped = trace.metadata["reader"]["skipped"]
    assert skipped[f"{KERNEL} rows whose start or end is not an integer within ±2**62 ns (left out)"] == 1
    assert _coerced(trace) == {}
    assert trace.metadata["reader"]["tables"][KERNEL] == 4
    kept = [r for r in _rows(clean) if not (r["kind"] == "kernel" and r["start_ns"] == max(
        x["start_ns"] for x in _rows(clean) if x["kind"] == "kernel"))]
    assert [(r["kind"], r["start_ns"], r["dur_ns"], r["name"]) for r in _rows(trace)] == [
        (r["kind"], r["start_ns"], r["dur_ns"], r["name"]) for r in kept]


def test_a_blob_in_an_integer_column_is_counted(export, clean, tmp_path):
    path = _mutated(export, tmp_path, f"UPDATE {MEMCPY} SET bytes = X'0102'")
    trace = read_nsys(path)
    assert _coerced(trace) == {f"{MEMCPY}.bytes: {NOT_INTEGER}": 15}
    copies = trace.df().query("kind == 'memcpy'")
    assert len(copies) == 15 and copies["bytes"].lt(0).all()  # unknown: -1, as for a NULL


def test_many_columns_at_once_are_each_counted(export, clean, tmp_path):
    path = _mutated(export, tmp_path, f"UPDATE {NVTX} SET uint64Value = {INF}, rangeId = 1.5",
                    f"UPDATE {MEMCPY} SET virtualAddress = {INF}, deviceId = 1.5",
                    f"UPDATE {RUNTIME} SET nameId = '3x' WHERE rowid % 2 = 0",
                    f"UPDATE {KERNEL} SET gridX = {INF}, mangledName = '3x'")
    trace = read_nsys(path)
    (runtime,) = _query(export, f"SELECT count(*) FROM {RUNTIME} WHERE rowid % 2 = 0")[0]
    (mangled,) = _query(export, f"SELECT count(mangledName) FROM {KERNEL}")[0]
    in_args = NOT_INTEGER.replace("read as null", AS_WRITTEN)
    expected = {  # args columns as written; mapped columns and StringIds ids as null
        f"{NVTX}.uint64Value: {in_args}": 24, f"{NVTX}.rangeId: {in_args}": 24,
        f"{MEMCPY}.virtualAddress: {in_args}": 15, f"{MEMCPY}.deviceId: {NOT_INTEGER}": 15,
        f"{RUNTIME}.nameId: {NOT_INTEGER}": runtime, f"{KERNEL}.gridX: {in_args}": 5,
        f"{KERNEL}.mangledName: {NOT_INTEGER}": mangled,  # NULL in this export: nothing to count
    }
    assert _coerced(trace) == {k: v for k, v in expected.items() if v}
    kernels = trace.df().query("kind == 'kernel'")
    assert len(kernels) == 5 and not kernels["args"].str.contains('"grid"').any()  # a grid without X is no grid
    assert len(trace.events) == len(clean.events)


def test_the_import_command_says_so_in_one_line(export, tmp_path):
    path = _mutated(export, tmp_path, f"UPDATE {NVTX} SET uint64Value = {INF}, rangeId = {INF}",
                    f"UPDATE {MEMCPY} SET virtualAddress = {INF}, deviceId = {INF}",
                    f"UPDATE {RUNTIME} SET nameId = '3x'")
    runner, root = CliRunner(), tmp_path / "traces"
    result = runner.invoke(main, ["import", str(path), "--out", str(root)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and result.exception is None
    (run_id,) = result.stdout.split()
    (runtime,) = _query(export, f"SELECT count(*) FROM {RUNTIME}")[0]
    total = 24 + 24 + 15 + 15 + runtime
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {run_id}: {total} values of the wrong type read as null or text, in 5 columns "
                        "(see reader.skipped)"]


@pytest.mark.parametrize("fetch_rows", [65536, 10])  # one chunk; chunks whose inferred types differ
def test_a_column_without_a_declared_type_holding_mixed_values_is_read_as_text(export, clean, tmp_path,
                                                                                monkeypatch, fetch_rows):
    monkeypatch.setattr("workbench.trace.nsys.tables._FETCH_ROWS", fetch_rows)
    path = _mutated(export, tmp_path, f"ALTER TABLE {RUNTIME} ADD COLUMN odd",
                    f"UPDATE {RUNTIME} SET odd = CASE WHEN rowid <= 50 THEN rowid ELSE 'x' || rowid END",
                    f"UPDATE {RUNTIME} SET odd = {INF} WHERE rowid = 7")
    trace = read_nsys(path)
    (rows,) = _query(export, f"SELECT count(*) FROM {RUNTIME}")[0]
    assert _coerced(trace) == {f"{RUNTIME}.odd: inf values, read as null": 1,
                               f"{RUNTIME}.odd: values of mixed types (read as text)": 49}
    assert _rows(trace) == _rows(clean) and rows > 50
    odd = trace.df().query("kind == 'runtime'")["args"].str.extract(r'"odd":("[^"]*")')[0].dropna()
    assert odd.str.fullmatch(r'"x?\d+"').all() and len(odd) > 0
