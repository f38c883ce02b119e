"""SQL over run bundles (`workbench.analysis.sql`, `workbench query`, `wb.sql`): docs/sql.md's three examples on
real imported traces, checked against figures computed from the raw JSON; the `run` column across runs; the
sandbox (no files, no writes, no settings, one SELECT, a row limit and a time limit); one-line errors."""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import fixture_path, load_raw, payload_trace, write_trace

import workbench as wb
from workbench.analysis.sql import QueryError, run_query
from workbench.cli import main
from workbench.imports import import_traces
from workbench.trace import read_trace
from workbench.trace.store.bundle import open_bundle, write_bundle

DOCS = Path(__file__).resolve().parents[1] / "docs" / "sql.md"
RESNET = ("kineto", "resnet50_v100_train.pt.trace.json.gz")
DIFF = ("kineto", "diff_control.json.gz")


def doc_query(title: str) -> str:
    """The SQL block under the heading `### title` of docs/sql.md: the tests run the documented text."""
    text = DOCS.read_text(encoding="utf-8")
    match = re.search(rf"^### {re.escape(title)}\n.*?```sql\n(.*?)```", text, re.S | re.M)
    assert match, f"no SQL example {title!r} in {DOCS}"
    return match.group(1)


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The ResNet-50 and HTA diff traces imported into one traces root: (root, {fixture: run id})."""
    root = tmp_path_factory.mktemp("sql") / "traces"
    paths = {name: fixture_path(*parts) for name, parts in (("resnet", RESNET), ("diff", DIFF))}
    ids = import_traces(list(paths.values()), root)
    return root, dict(zip(paths, ids, strict=True))


@functools.cache
def raw_events(parts: tuple[str, str]) -> list[dict]:
    """A fixture's raw events, read once."""
    return load_raw(fixture_path(*parts))["traceEvents"]


def bundles(imported, *names: str):
    root, ids = imported
    return [open_bundle(ids[name], root) for name in names]


def rows(result) -> list[dict]:
    reply = result.to_json()
    return [dict(zip(reply["columns"], row, strict=True)) for row in reply["rows"]]


def device_events(raw: list[dict], categories: tuple[str, ...]) -> list[dict]:
    return [e for e in raw if e.get("ph") == "X" and e.get("cat") in categories]


def runtime_start(raw: list[dict], category: str) -> dict[int, int]:
    """Start (µs) of each runtime call by correlation id."""
    return {e["args"]["correlation"]: e["ts"] for e in device_events(raw, (category,)) if "correlation" in e["args"]}


# --- the documented examples on real traces ---------------------------------------------------------------------

def test_top_kernels_per_step_on_resnet(imported):
    raw = raw_events(RESNET)
    steps = [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in raw
             if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")]
    launch = runtime_start(raw, "Runtime")
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for kernel in device_events(raw, ("Kernel",)):
        at = launch.get(kernel["args"]["correlation"])
        step = next((name for name, start, end in steps if at is not None and start <= at < end), None)
        if step is not None:
            totals[step, kernel["name"]][0] += 1
            totals[step, kernel["name"]][1] += kernel["dur"] * 1000
    expected = []
    for step in sorted({step for step, _ in totals}):
        ranked = sorted(((name, *totals[s, name]) for s, name in totals if s == step), key=lambda r: (-r[2], r[0]))
        expected += [(step, name, calls, ns) for name, calls, ns in ranked[:3]]
    assert len(expected) == 18  # six steps (ProfilerStep#5 to #10), three kernels each

    (bundle,) = bundles(imported, "resnet")
    got = [(r["step"], r["name"], r["calls"], r["total_ns"]) for r in rows(run_query([bundle], doc_query(
        "Top kernels per step")))]
    assert got == expected
    assert {r["run"] for r in rows(run_query([bundle], doc_query("Top kernels per step")))} == {bundle.run_id}


def test_launch_gaps_on_resnet(imported):
    raw = raw_events(RESNET)
    launch = runtime_start(raw, "Runtime")
    by_stream: dict[tuple, list[dict]] = defaultdict(list)
    for event in device_events(raw, ("Kernel", "Memcpy", "Memset")):
        by_stream[event["pid"], event["args"]["stream"]].append(event)
    gaps = []
    for events in by_stream.values():
        events.sort(key=lambda e: (e["ts"], e["dur"]))
        for before, event in itertools.pairwise(events):
            gap = event["ts"] - (before["ts"] + before["dur"])
            if gap > 0:
                delay = event["ts"] - launch[event["args"]["correlation"]]
                gaps.append((gap * 1000, delay * 1000, event["name"]))
    expected = sorted(gaps, key=lambda g: -g[0])[:10]

    got = [(r["gap_ns"], r["launch_delay_ns"], r["name"])
           for r in rows(run_query(bundles(imported, "resnet"), doc_query("Launch gaps")))]
    assert got == expected
    assert expected[0][2].startswith("Memcpy HtoD")  # the device waits for each step's input copy


def test_overlap_of_copies_and_compute_on_hta_trace(imported):
    raw = raw_events(DIFF)
    kernels = device_events(raw, ("kernel",))
    copies = device_events(raw, ("gpu_memcpy",))
    starts = np.array([k["ts"] for k in kernels])
    ends = starts + np.array([k["dur"] for k in kernels])
    devices = np.array([k["args"]["device"] for k in kernels])
    copy_us = overlapped_us = 0
    for copy in copies:
        start, end = copy["ts"], copy["ts"] + copy["dur"]
        shared = np.clip(np.minimum(end, ends) - np.maximum(start, starts), 0, None)
        copy_us += copy["dur"]
        overlapped_us += min(copy["dur"], int(shared[devices == copy["args"]["device"]].sum()))
    assert 0 < overlapped_us < copy_us  # some copies hide behind kernels, not all

    both = bundles(imported, "resnet", "diff")
    got = {r["run"]: r for r in rows(run_query(both, doc_query("Overlap of copies and compute")))}
    diff = got[both[1].run_id]
    assert (diff["device"], diff["copies"], diff["copy_ns"], diff["overlapped_ns"]) == (
        f"cuda:{copies[0]['args']['device']}", len(copies), copy_us * 1000, overlapped_us * 1000)
    assert diff["overlapped_share"] == pytest.approx(overlapped_us / copy_us, abs=5e-4)
    resnet = got[both[0].run_id]  # one stream: its copies never overlap a kernel
    assert (resnet["copies"], resnet["overlapped_ns"]) == (12, 0)


def test_run_column_and_runs_table_span_runs(imported):
    both = bundles(imported, "resnet", "diff")
    counts = {r["run"]: r["n"] for r in rows(run_query(both, "SELECT run, count(*) AS n FROM events GROUP BY run"))}
    assert counts == {b.run_id: b.trace().events.num_rows for b in both}
    listed = rows(run_query(both, "SELECT run, file, status FROM runs ORDER BY file"))
    assert [(r["file"], r["status"]) for r in listed] == [(DIFF[1], "ok"), (RESNET[1], "ok")]
    # `row` is the row `parent` refers to: every child's parent encloses it on its track
    orphans = run_query(both[:1], "SELECT count(*) AS n FROM events c JOIN events p ON p.row = c.parent "
                                  "WHERE c.start_ns < p.start_ns OR p.track <> c.track")
    assert rows(orphans) == [{"n": 0}]


# --- the sandbox and its limits ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A bundle of a tiny GPU-like trace."""
    root = tmp_path_factory.mktemp("small")
    write_bundle(root / "traces", "small", {"benchmark": {"p50": 1.0, "p99": 1.1}},
                 read_trace(payload_trace(root / "t.json")))
    return open_bundle("small", root / "traces")


@pytest.mark.parametrize(("sql", "words"), [
    ("COPY (SELECT 1) TO '{tmp}/out.csv'", "only SELECT"),
    ("SELECT * FROM read_csv('{secret}')", "read_csv() is refused here"),
    ("SELECT * FROM read_parquet('{tmp}/*.parquet')", "read_parquet() is refused here"),
    ("SELECT * FROM glob('{tmp}/*')", "glob() is refused here"),
    ("SELECT * FROM '{secret}'", "no table"),
    ("SELECT name, value FROM duckdb_settings()", "duckdb_settings() is refused here"),
    ("SELECT * FROM duckdb_settings", "no table 'duckdb_settings'"),
    ("SELECT current_setting('temp_directory') AS x", "current_setting() is refused here"),
    ("SELECT * FROM runs WHERE run IN (SELECT database_name FROM duckdb_databases())", "duckdb_databases()"),
    ("SELECT * FROM pragma_database_list()", "pragma_database_list() is refused"),
    ("SELECT * FROM information_schema.tables", "no table 'information_schema.tables'"),
    ("SELECT * FROM pg_catalog.pg_settings", "no table 'pg_catalog.pg_settings'"),
    ("SELECT * FROM query('SELECT * FROM duckdb_settings()')", "query() is refused here"),
    ("EXPLAIN SELECT * FROM duckdb_settings()", "duckdb_settings() is refused here"),
    ("SHOW TABLES", "SHOW TABLES is refused"),
    ("PRAGMA version", "only SELECT"),
    ("CALL pragma_version()", "only SELECT"),
    ("ATTACH '{tmp}/x.db'", "only SELECT"),
    ("INSTALL httpfs", "only SELECT"),
    ("LOAD httpfs", "only SELECT"),
    ("SET enable_external_access = true", "only SELECT"),
    ("CREATE TABLE t AS SELECT 1", "only SELECT"),
    ("SELECT 1; SELECT 2", "not 2"),
    ("", "empty"),
    ("SELECT * FROM nope", "tables: counters, events, memory, runs"),
    ("SELECT * FROM kernel_metrics", "tables: counters, events, memory, runs"),
    ("SELEC 1", "syntax error"),
])
def test_the_sandbox_refuses_with_one_line(small, tmp_path, sql, words):
    secret = tmp_path / "secret.csv"
    secret.write_text("password\nhunter2\n")
    with pytest.raises(QueryError) as caught:
        run_query([small], sql.format(tmp=tmp_path, secret=secret))
    message = str(caught.value)
    assert words in message
    assert "\n" not in message
    assert "hunter2" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.csv"]  # nothing written


def test_the_sandbox_still_runs_ctes_table_functions_explain_and_describe(small):
    kernels = rows(run_query([small], "SELECT count(*) AS n FROM events WHERE kind = 'kernel'"))[0]["n"]
    sql = ("WITH k AS (SELECT name FROM events WHERE kind = 'kernel') "
           "SELECT count(*) AS n, max(i) AS i FROM k, range(3) t(i), unnest([1, 2]) u(x)")
    assert rows(run_query([small], sql)) == [{"n": kernels * 6, "i": 2}]
    assert run_query([small], "EXPLAIN SELECT count(*) FROM events").table.num_rows >= 1
    assert "name" in {r["column_name"] for r in rows(run_query([small], "DESCRIBE events"))}


def test_python_variables_are_not_tables(small):
    import pyarrow as pa

    hidden = pa.table({"pw": ["hunter2"]})  # noqa: F841 (DuckDB would find it by name without the sandbox)
    with pytest.raises(QueryError, match="hidden"):
        run_query([small], "SELECT * FROM hidden")


def test_row_limit_and_time_limit(small):
    limited = run_query([small], "SELECT * FROM range(50) t(i)", limit=7)
    assert (limited.table.num_rows, limited.truncated) == (7, True)
    assert run_query([small], "SELECT * FROM range(7) t(i)", limit=7).truncated is False
    with pytest.raises(QueryError, match="limit: expected 1 to"):
        run_query([small], "SELECT 1", limit=0)
    with pytest.raises(QueryError, match=r"longer than 0\.2 s"):
        run_query([small], "SELECT count(*) FROM range(100000000) a, range(100000000) b", timeout_s=0.2)


def test_no_runs_or_a_run_twice(small):
    with pytest.raises(QueryError, match="no runs"):
        run_query([], "SELECT 1")
    with pytest.raises(QueryError, match="more than once: small"):
        run_query([small, small], "SELECT 1")


def test_runs_without_a_trace_are_listed_but_add_no_events(tmp_path):
    root = tmp_path / "traces"
    write_bundle(root, "failed", {"status": "failed", "error": "boom"})
    write_bundle(root, "traced", {}, read_trace(write_trace(tmp_path / "t.json", [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}])))
    both = [open_bundle(r, root) for r in ("failed", "traced")]
    assert rows(run_query(both, "SELECT run, status FROM runs ORDER BY run")) == [
        {"run": "failed", "status": "failed"}, {"run": "traced", "status": "ok"}]
    assert rows(run_query(both, "SELECT run, name, dur_ns FROM events")) == [
        {"run": "traced", "name": "aten::mm", "dur_ns": 2000}]


# --- the surfaces ------------------------------------------------------------------------------------------------

def test_cli_query_table_json_and_errors(imported):
    root, ids = imported
    runner = CliRunner()
    sql = "SELECT kind, count(*) AS n FROM events GROUP BY kind ORDER BY n DESC, kind"
    result = runner.invoke(main, ["query", ids["resnet"], sql, "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    reply = json.loads(result.stdout)
    assert reply["columns"] == ["kind", "n"]
    raw = raw_events(RESNET)
    assert dict(reply["rows"])["kernel"] == len(device_events(raw, ("Kernel",)))

    table = runner.invoke(main, ["query", "--all", "SELECT run, file FROM runs ORDER BY file", "--out", str(root)])
    assert table.exit_code == 0, table.output
    assert RESNET[1] in table.stdout and DIFF[1] in table.stdout

    truncated = runner.invoke(main, ["query", "--all", "SELECT * FROM events", "--limit", "2", "--out", str(root)])
    assert truncated.exit_code == 0
    assert "only the first 2 rows" in truncated.stderr

    for args, words in ((["query", ids["resnet"], "COPY events TO 'x.csv'"], "only SELECT queries"),
                        (["query", "no-such-run", "SELECT 1"], "no run 'no-such-run'"),
                        (["query", "--all", ids["resnet"], "SELECT 1"], "not both"),
                        (["query", "SELECT 1"], "name the runs")):
        failed = runner.invoke(main, [*args, "--out", str(root)])
        assert failed.exit_code == 2, failed.output
        assert words in failed.stderr
        assert len(failed.stderr.strip().splitlines()) == 1


def test_wb_sql_returns_a_dataframe(imported):
    root, ids = imported
    frame = wb.sql("SELECT run, count(*) AS n FROM memory GROUP BY run", runs=[ids["resnet"]], root=root)
    raw = raw_events(RESNET)
    assert frame.to_dict("records") == [{"run": ids["resnet"], "n": sum(
        1 for e in raw if e.get("name") == "[memory]")}]
    every = wb.sql("SELECT run FROM runs ORDER BY run", root=root)
    assert sorted(every["run"]) == sorted(ids.values())
    with pytest.warns(UserWarning, match="first 3 rows"):
        assert len(wb.sql("SELECT * FROM events", runs=ids["diff"], root=root, limit=3)) == 3


def test_cli_query_refuses_the_settings_and_bounds_a_huge_string(small):
    """The CLI's query runs within the server's sandbox and limits: the settings functions are refused, and a
    query building a 2 GB string stops with one line (memory or time, whichever comes first) in a process whose
    memory stays bounded (the issue's run reached 8 GB)."""
    import resource

    runner = CliRunner()
    root = str(small.path.parent)
    refused = runner.invoke(main, ["query", "small", "SELECT name, value FROM duckdb_settings()", "--out", root])
    assert refused.exit_code == 2, refused.output
    assert "duckdb_settings() is refused" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    huge = runner.invoke(main, ["query", "small", "SELECT repeat('x', 2000000000) AS s", "--out", root])
    assert huge.exit_code == 2, huge.output[:500]
    (line,) = huge.stderr.strip().splitlines()
    assert "memory a query may use" in line or "ran longer than" in line, line
    assert huge.stdout == ""
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the query's process, among others
    assert peak_kib < 7 << 20, f"a query process reached {peak_kib >> 20} GiB"
