"""SQL over run bundles: DuckDB views of their tables, one `run` column across runs, read-only and sandboxed.

The tables a query sees (schema and examples: docs/sql.md):

    events    the Trace's events of every run, with `run` (the run id) and `row` (the row within its run, which
              `parent` and `launcher` refer to)
    memory, counters                                the Trace's other tables, with `run`
    kernel_metrics, cuda_allocator, cuda_segments   a bundle's optional tables, where some run has them
    runs      one row per run: the fields of `workbench ls --json` plus `batch` and the latency percentiles

An unknown number (NaN in the tables: a copy without `bytes`, a metric not collected) is null, which aggregates skip.

Every query runs in a child process of its own (`run_query`, the one entry of the CLI, the server and the
notebook), so its limits hold whatever the SQL does: the child reads the bundles' Parquet files (memory-mapped)
into Arrow tables and registers them on a DuckDB connection opened with external access off and its
configuration locked, checks the statement, then limits its own address space to what it holds plus
`MEMORY_LIMIT_BYTES` and a margin (`resource.RLIMIT_AS`: DuckDB's own `memory_limit` does not bound every
operator, e.g. `repeat('x', 2000000000)`), interrupts the query after `timeout_s` and is killed `KILL_GRACE_S`
later if it has not answered. A result over `MAX_RESULT_BYTES` is refused rather than sent.

The statement must be one `SELECT` (or `EXPLAIN` of one), and DuckDB's own parse of it (`json_serialize_sql`)
is walked before it runs: tables are the views below (and the query's own CTEs), table functions only
`ALLOWED_TABLE_FUNCTIONS`, and no function that shows the server's settings or files (`duckdb_settings()`,
`current_setting()`, every `duckdb_*()` and `pragma_*()`, `information_schema` and `pg_catalog`, `SHOW TABLES`).
So a query cannot read or write a file (`read_csv`, `glob`, `COPY`, `ATTACH`, `INSTALL`, `LOAD`), reach Python
objects by name, spill to disk, learn the server's paths or turn the sandbox off. At most `limit` rows come
back (`truncated` says whether there were more). Every failure is a `QueryError` of one line.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.analysis.noise import latency_noise
from workbench.analysis.sql_limits import DEFAULT_LIMIT, DEFAULT_TIMEOUT_S, MAX_LIMIT
from workbench.analysis.summary import run_row
from workbench.errors import WorkbenchError
from workbench.trace.store.bundle import OPTIONAL_TABLES, TABLES, Bundle, json_safe

if TYPE_CHECKING:
    import duckdb
    import pandas as pd

MEMORY_LIMIT_BYTES = 4 << 30
"""Memory a query may use beyond the runs' tables (DuckDB's `memory_limit`; it may not spill to disk)."""
MEMORY_LIMIT = f"{MEMORY_LIMIT_BYTES >> 20}MiB"
ADDRESS_MARGIN_BYTES = 2 << 30
"""Address space the query's process may take beyond its tables and MEMORY_LIMIT_BYTES (threads, arenas)."""
MAX_RESULT_BYTES = 256 << 20
"""Largest result (Arrow bytes) a query may return."""
KILL_GRACE_S = 5.0
"""Seconds past its time limit before a query's process that has not answered is killed."""
START_TIMEOUT_S = 300.0
"""Seconds the query's process may take to read the runs' tables before its query starts."""
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
"""The table functions a query may call (others read files, run SQL text or show the server's settings)."""
REFUSED_FUNCTIONS = frozenset({"current_setting", "getvariable", "getenv", "which_secret"})
"""Functions that show the server's settings (its paths among them)."""
REFUSED_PREFIXES = ("duckdb_", "pragma_")
"""Families of functions that show DuckDB's settings, catalog, files and secrets."""
_EXPLAIN = re.compile(r"\s*explain\b\s*(?:analy[sz]e\b\s*)?(?:\((?:[^()']|'[^']*')*\)\s*)?", re.IGNORECASE)
"""The EXPLAIN [ANALYZE] [(options)] before the SELECT it explains."""
RUNS_TABLE = "runs"
LATENCY_COLUMNS = ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms")
_SANDBOX = {
    "enable_external_access": False,  # no file, network or extension access
    "python_enable_replacements": False,  # no Python variables as tables
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "temp_directory": "",  # never spill to disk
    "memory_limit": MEMORY_LIMIT,
    "lock_configuration": True,  # no `SET` undoes the above
}


class QueryError(WorkbenchError):
    """A query that cannot run: not one SELECT, a SQL error, over its time limit; one line."""


@dataclass(frozen=True)
class QueryResult:
    """The rows of a query (at most its limit) and whether it had more."""

    table: pa.Table
    truncated: bool

    @property
    def columns(self) -> list[str]:
        return self.table.column_names

    def to_pandas(self) -> pd.DataFrame:
        return self.table.to_pandas()

    def to_json(self) -> dict[str, Any]:
        """`{"columns", "types", "rows" (lists of plain JSON values), "truncated"}`."""
        rows = [[_plain(value) for value in row.values()] for row in self.table.to_pylist()]
        return {"columns": self.columns, "types": [str(field.type) for field in self.table.schema],
                "rows": json_safe(rows), "truncated": self.truncated}


def run_query(bundles: Sequence[Bundle], sql: str, *, limit: int = DEFAULT_LIMIT,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> QueryResult:
    """Run `sql` (one SELECT) over `bundles` in a sandboxed DuckDB connection of a child process, within the time
    and memory limits of the module docstring; a QueryError of one line otherwise."""
    if not 1 <= limit <= MAX_LIMIT:
        raise QueryError(f"limit: expected 1 to {MAX_LIMIT} rows, got {limit}")
    if not timeout_s > 0:
        raise QueryError(f"timeout: expected a positive number of seconds, got {timeout_s!r}")
    _check_runs(bundles)
    request = {"bundles": [(str(b.path), b.run_id, b.info) for b in bundles], "sql": sql, "limit": limit,
               "timeout_s": timeout_s}
    header, payload = _in_child(request, timeout_s)
    if "error" in header:
        raise (QueryError if header.get("kind") == "query" else WorkbenchError)(str(header["error"]))
    table = pa.ipc.open_stream(payload).read_all()
    return QueryResult(table, bool(header["truncated"]))


def _in_child(request: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], bytes]:
    """Send `request` to a fresh query process and read its answer: a header (a JSON line) and the result's
    bytes. The process is killed when it has not answered KILL_GRACE_S after the time limit."""
    package = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (package, os.environ.get("PYTHONPATH")))),
           "MALLOC_ARENA_MAX": "2"}  # few malloc arenas: each reserves address space the limit counts
    command = [sys.executable, "-c", "from workbench.analysis.sql import serve_query; serve_query()"]
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, env=env)
        killed = False
        try:
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(pickle.dumps(request))
                process.stdin.close()
            except BrokenPipeError:
                pass
            reader = _Reader(process.stdout.fileno(), time.monotonic() + START_TIMEOUT_S)
            header = reader.header()
            if header is not None and header.get("started"):
                reader.deadline = time.monotonic() + timeout_s + KILL_GRACE_S
                header = reader.header()
            payload = b"" if header is None or "error" in header else reader.exactly(int(header["bytes"]))
            if header is not None and payload is not None:
                return header, payload
            killed = reader.timed_out
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
        errors.seek(0)
        stderr = errors.read()[-2000:].decode("utf-8", "replace")
    if killed:
        raise QueryError(_timed_out(timeout_s))
    raise QueryError(_child_failure(process.returncode, stderr))


class _Reader:
    """Reads a query process's answer from the pipe `fd` until `deadline` (time.monotonic())."""

    def __init__(self, fd: int, deadline: float) -> None:
        self.fd, self.deadline, self.buffer, self.timed_out = fd, deadline, b"", False

    def _more(self) -> bool:
        """Read what the pipe holds (waiting until the deadline); False at its end or the deadline."""
        left = self.deadline - time.monotonic()
        if left <= 0 or not select.select([self.fd], [], [], left)[0]:
            self.timed_out = True
            return False
        chunk = os.read(self.fd, 1 << 20)
        self.buffer += chunk
        return bool(chunk)

    def header(self) -> dict[str, Any] | None:
        """The next JSON line, or None when the process ended (or the deadline passed) before it."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > 1 << 20 or not self._more():
                return None
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            header = json.loads(line)
        except ValueError:
            return None
        return header if isinstance(header, dict) else None

    def exactly(self, size: int) -> bytes | None:
        """The next `size` bytes (at most MAX_RESULT_BYTES), or None when they do not all come in time."""
        if not 0 <= size <= MAX_RESULT_BYTES:
            return None
        while len(self.buffer) < size:
            if not self._more():
                return None
        return self.buffer[:size]


def serve_query() -> None:
    """The query process (`_in_child`): reads the request from stdin, answers on stdout (module docstring)."""
    import resource

    out = sys.stdout.buffer
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file of a process killed at its limits
    try:
        request = pickle.load(sys.stdin.buffer)  # from the parent process, which trusts itself
        bundles = [Bundle(Path(path), run_id, info) for path, run_id, info in request["bundles"]]
        with connect(bundles) as con:
            _check_statement(con, request["sql"])
            _limit_address_space(MEMORY_LIMIT_BYTES + ADDRESS_MARGIN_BYTES)
            _send(out, {"started": True})
            table, truncated = _execute(con, request["sql"], request["limit"], request["timeout_s"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        payload = sink.getvalue()
        _send(out, {"truncated": truncated, "bytes": payload.size})
        out.write(memoryview(payload))
    except QueryError as exc:
        _send(out, {"error": str(exc), "kind": "query"})
    except WorkbenchError as exc:
        _send(out, {"error": str(exc), "kind": "workbench"})
    except (MemoryError, pa.ArrowMemoryError):
        _send(out, {"error": _out_of_memory(), "kind": "query"})
    except Exception as exc:
        _send(out, {"error": f"the query failed: {type(exc).__name__}: {_flat(str(exc))}", "kind": "query"})
    out.flush()


def _execute(con: duckdb.DuckDBPyConnection, sql: str, limit: int, timeout_s: float) -> tuple[pa.Table, bool]:
    """The first `limit` rows of `sql` and whether there were more, interrupted after `timeout_s`."""
    import duckdb

    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    try:
        table = con.sql(sql).limit(limit + 1).to_arrow_table()
    except duckdb.InterruptException as exc:
        raise QueryError(_timed_out(timeout_s)) from exc
    except duckdb.OutOfMemoryException as exc:
        raise QueryError(_out_of_memory()) from exc
    except duckdb.Error as exc:
        raise QueryError(_one_line(exc, con)) from exc
    finally:
        timer.cancel()
    result = table.slice(0, limit)
    if result.nbytes > MAX_RESULT_BYTES:
        raise QueryError(f"the result is {result.nbytes / 2**20:,.0f} MiB, more than the {MAX_RESULT_BYTES >> 20} MiB "
                         "a query may return; select fewer rows or columns, or shorter values")
    return result, table.num_rows > limit


def _limit_address_space(allowance: int) -> None:
    """Let this process map at most `allowance` bytes more than it has mapped now (Linux; elsewhere no limit)."""
    import resource

    try:
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return
    resource.setrlimit(resource.RLIMIT_AS, (mapped + allowance, mapped + allowance))


def _send(out: Any, header: dict[str, Any]) -> None:
    out.write(json.dumps(header).encode() + b"\n")
    out.flush()


def _timed_out(timeout_s: float) -> str:
    return (f"the query ran longer than {timeout_s:g} s and was stopped; narrow it (a WHERE on run, kind or "
            "time)")


def _out_of_memory() -> str:
    return (f"the query needs more than the {MEMORY_LIMIT_BYTES >> 30} GiB of memory a query may use and was "
            "stopped; narrow it (a WHERE on run, kind or time) or return smaller values")


def _child_failure(code: int, stderr: str) -> str:
    """Why the query process ended without an answer, in one line."""
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return (f"the query's process ended on signal {name} without an answer (a query may use at most "
                f"{MEMORY_LIMIT_BYTES >> 30} GiB of memory); narrow it")
    last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    return f"the query's process failed (exit code {code}){': ' + last.strip()[:300] if last else ''}"


def _flat(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _check_runs(bundles: Sequence[Bundle]) -> None:
    if not bundles:
        raise QueryError("no runs to query: name run ids (see `workbench ls`), or all runs")
    ids = [bundle.run_id for bundle in bundles]
    repeated = sorted({run for run in ids if ids.count(run) > 1})
    if repeated:
        raise QueryError(f"run(s) named more than once: {', '.join(repeated)}")


def connect(bundles: Sequence[Bundle]) -> duckdb.DuckDBPyConnection:
    """A sandboxed in-memory DuckDB connection with the views of `bundles`' tables (module docstring), in this
    process: `run_query` opens it in a query process of its own, whose limits hold."""
    import duckdb

    _check_runs(bundles)
    con = duckdb.connect(":memory:", config=dict(_SANDBOX))
    try:
        con.register(f"_{RUNS_TABLE}", _runs_table(bundles))
        con.execute(f"CREATE VIEW {RUNS_TABLE} AS SELECT * FROM _{RUNS_TABLE}")
        for name in (*TABLES, *OPTIONAL_TABLES):
            parts = []
            for index, bundle in enumerate(bundles):
                table = _bundle_table(bundle, name)
                if table is not None:
                    con.register(f"_{name}_{index}", table)
                    parts.append(f"SELECT {_literal(bundle.run_id)} AS run, * FROM _{name}_{index}")
            if parts:
                con.execute(f"CREATE VIEW {name} AS " + " UNION ALL BY NAME ".join(parts))
    except BaseException:
        con.close()
        raise
    return con


def table_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The views a query may use on `con`."""
    names = con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY view_name").fetchall()
    return [name for (name,) in names if not name.startswith("_")]  # `_...`: the registered tables behind them


def _bundle_table(bundle: Bundle, name: str) -> pa.Table | None:
    """One of a bundle's tables (None when it has none), its unknown numbers null; events gain their `row`."""
    if name not in TABLES:
        table = bundle.table(name)
    elif not bundle.has_trace:
        return None
    else:
        table = getattr(bundle.trace(), name)
        if name == "events":
            table = table.append_column("row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    return None if table is None else _unknown_as_null(table)


def _unknown_as_null(table: pa.Table) -> pa.Table:
    """`table` with the NaN of its float columns as null: the tables write an unknown number (a copy's `bytes`, an
    uncollected metric) as NaN, which SQL would add up to NaN, while its aggregates skip null. Here rather than in
    the Parquet files, so that the bundles of every release read the same."""
    for index, field in enumerate(table.schema):
        if pa.types.is_floating(field.type):
            column = table.column(index)
            table = table.set_column(index, field, pc.if_else(pc.is_nan(column), pa.scalar(None, field.type), column))
    return table


def _runs_table(bundles: Sequence[Bundle]) -> pa.Table:
    """The `runs` table: each run's listing row, batch, latency percentiles (ms) and noise verdict."""
    rows = []
    for bundle in bundles:
        bench = bundle.record.benchmark or {}
        noise = latency_noise(bench)
        rows.append({**run_row(bundle.run_id, bundle.info), "batch": bundle.record.batch,
                     **{column: _number(bench.get(column.removesuffix("_ms"))) for column in LATENCY_COLUMNS},
                     "noisy": None if noise is None else noise.noisy})
    return pa.Table.from_pylist(rows)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _check_statement(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse anything but one SELECT or EXPLAIN statement, and any table or function of it that reaches past the
    runs' tables (`_check_references`)."""
    import duckdb

    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("the query is empty: give one SELECT statement")
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(_one_line(exc, con)) from exc
    if len(statements) != 1:
        raise QueryError(f"give one SELECT statement, not {len(statements)}")
    kind = statements[0].type
    if kind not in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN):
        raise QueryError(f"only SELECT queries run here (read-only), not {kind.name}")
    text = statements[0].query
    _check_references(con, _EXPLAIN.sub("", text, count=1) if kind == duckdb.StatementType.EXPLAIN else text)


def _check_references(con: duckdb.DuckDBPyConnection, select: str) -> None:
    """Walk DuckDB's parse of `select` (`json_serialize_sql`): every table it reads must be a view of the runs or
    one of its CTEs, every table function one of ALLOWED_TABLE_FUNCTIONS, and no function may show the server's
    settings (REFUSED_FUNCTIONS, REFUSED_PREFIXES)."""
    import duckdb

    try:
        (serialized,) = con.execute("SELECT json_serialize_sql(?)", [select]).fetchone() or ("{}",)
        tree = json.loads(serialized)
    except (duckdb.Error, ValueError) as exc:
        raise QueryError(f"the query could not be checked: {_flat(str(exc))}") from exc
    if tree.get("error"):
        raise QueryError(f"the query could not be checked ({_flat(str(tree.get('error_message')))}); give one plain "
                         "SELECT")
    tables = table_names(con)
    known = {name.lower() for name in tables} | {name.lower() for name in _cte_names(tree)}
    listed = ", ".join(tables)
    for node in _nodes(tree):
        kind = node.get("type")
        if kind == "TABLE_FUNCTION":
            name = str((node.get("function") or {}).get("function_name", "")).lower()
            if name in REFUSED_FUNCTIONS or name.startswith(REFUSED_PREFIXES):
                raise QueryError(f"{name}() is refused here: it shows the server's settings and files; a query reads "
                                 f"the runs' tables ({listed})")
            if name not in ALLOWED_TABLE_FUNCTIONS:
                raise QueryError(f"{name}() is refused here: a query reads the runs' tables ({listed}) and the table "
                                 f"functions {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))} only")
        elif node.get("class") == "FUNCTION":
            name = str(node.get("function_name", "")).lower()
            if name in REFUSED_FUNCTIONS or name.startswith(REFUSED_PREFIXES):
                raise QueryError(f"{name}() is refused here: it shows the server's settings and files; a query reads "
                                 f"the runs' tables ({listed})")
        elif kind == "BASE_TABLE":
            name = str(node.get("table_name", ""))
            schema, catalog = str(node.get("schema_name") or ""), str(node.get("catalog_name") or "")
            if schema.lower() not in ("", "main") or catalog.lower() not in ("", "memory") or name.lower() not in known:
                qualified = ".".join(part for part in (catalog, schema, name) if part)
                raise QueryError(f"no table {qualified!r} here (tables: {listed})")
        elif kind == "SHOW_REF" and node.get("table_name"):
            shown = str(node["table_name"]).strip('"').upper()
            raise QueryError(f"SHOW {shown} is refused here (tables: {listed})")


def _nodes(tree: Any) -> Any:
    """Every JSON object in `tree`, without recursion."""
    pending = [tree]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            yield item
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _cte_names(tree: Any) -> list[str]:
    """The names of the CTEs (`WITH name AS ...`) anywhere in a serialized statement."""
    return [str(entry["key"]) for node in _nodes(tree) if isinstance(node.get("cte_map"), dict)
            for entry in node["cte_map"].get("map", []) if isinstance(entry, dict) and "key" in entry]


def _one_line(exc: Exception, con: duckdb.DuckDBPyConnection) -> str:
    """DuckDB's message in one line; a missing table's names the tables there are."""
    import duckdb

    message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if isinstance(exc, duckdb.CatalogException):
        message += f" (tables: {', '.join(table_names(con))})"
    return message


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _plain(value: Any) -> Any:
    """A value DuckDB returned as plain JSON data: numbers, strings, lists and objects stay; bytes become hex,
    whole decimals integers, other decimals floats, anything else (times, dates, intervals) its text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Decimal):  # DuckDB's sums of integers are 128-bit: decimals in Arrow
        return int(value) if value == value.to_integral_value() else float(value)
    return str(value)
