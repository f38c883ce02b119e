"""SQL over run bundles: DuckDB views of their tables, one `run` column across runs, read-only and sandboxed.

The tables a query sees (schema and examples: docs/sql.md):

    events    the Trace's events of every run, with `run` (the run id) and `row` (the row within its run, which
              `parent` and `launcher` refer to)
    memory, counters                                the Trace's other tables, with `run`
    kernel_metrics, cuda_allocator, cuda_segments   a bundle's optional tables, where some run has them
    runs      one row per run: the fields of `workbench ls --json` plus `batch` and the latency percentiles

The bundles' Parquet files are read (memory-mapped) into Arrow tables and registered before any SQL runs, on a
connection opened with DuckDB's external access off and its configuration locked: a query cannot read or write
a file (`read_csv`, `COPY`, `ATTACH`, `INSTALL`, `LOAD` fail), reach Python objects by name, spill to disk or
turn the sandbox off. Only one `SELECT` (or `EXPLAIN`) statement is accepted; at most `limit` rows come back
(`truncated` says whether there were more), and a query still running after `timeout_s` is interrupted. Every
failure is a `QueryError` of one line.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from workbench.analysis.noise import latency_noise
from workbench.analysis.summary import run_row
from workbench.errors import WorkbenchError
from workbench.trace.bundle import OPTIONAL_TABLES, TABLES, Bundle, json_safe

if TYPE_CHECKING:
    import duckdb
    import pandas as pd

DEFAULT_LIMIT = 1_000
"""Rows a query returns unless asked for more."""
MAX_LIMIT = 100_000
"""Most rows one query may return."""
DEFAULT_TIMEOUT_S = 30.0
"""Seconds a query may run before it is interrupted."""
MEMORY_LIMIT = "4GB"
"""DuckDB's memory limit for a query (it may not spill to disk)."""
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
    """Run `sql` (one SELECT) over `bundles` in a sandboxed DuckDB connection; see the module docstring."""
    if not 1 <= limit <= MAX_LIMIT:
        raise QueryError(f"limit: expected 1 to {MAX_LIMIT} rows, got {limit}")
    import duckdb

    with connect(bundles) as con:
        _check_statement(con, sql)
        timer = threading.Timer(timeout_s, con.interrupt)
        timer.start()
        try:
            table = con.sql(sql).limit(limit + 1).to_arrow_table()
        except duckdb.InterruptException as exc:
            raise QueryError(f"the query ran longer than {timeout_s:g} s and was stopped; narrow it "
                             "(a WHERE on run, kind or time)") from exc
        except duckdb.Error as exc:
            raise QueryError(_one_line(exc, con)) from exc
        finally:
            timer.cancel()
    return QueryResult(table.slice(0, limit), table.num_rows > limit)


def connect(bundles: Sequence[Bundle]) -> duckdb.DuckDBPyConnection:
    """A sandboxed in-memory DuckDB connection with the views of `bundles`' tables (module docstring)."""
    import duckdb

    if not bundles:
        raise QueryError("no runs to query: name run ids (see `workbench ls`), or all runs")
    ids = [bundle.run_id for bundle in bundles]
    repeated = sorted({run for run in ids if ids.count(run) > 1})
    if repeated:
        raise QueryError(f"run(s) named more than once: {', '.join(repeated)}")
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
    """One of a bundle's tables (None when it has none); events gain their `row`."""
    if name in TABLES:
        if not bundle.has_trace:
            return None
        table = getattr(bundle.trace(), name)
        if name == "events":
            table = table.append_column("row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
        return table
    return bundle.table(name)


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
    """Refuse anything but one SELECT or EXPLAIN statement."""
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
