"""`workbench mcp` driven by the MCP SDK's own stdio client: each tool's figures equal the CLI's `--json` for the
same question, the SQL tool refuses what the sandbox refuses, capture tools exist only with `--allow-capture`, and
no answer exceeds its size bound (pages joined give the whole answer)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pyarrow.parquet as pq
import pytest

from tests.conftest import fixture_path, load_raw

pytest.importorskip("mcp")

from click.testing import CliRunner
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from workbench.agents.mcp_server import CAPTURE_TOOLS, READ_ONLY_TOOLS
from workbench.agents.paging import MAX_CHARS
from workbench.analysis.sql import QueryError, run_query
from workbench.cli import main
from workbench.imports import import_traces
from workbench.trace.store.bundle import open_bundle

REFUSED_SQL = "COPY (SELECT 1) TO 'x.csv'"
WINDOW_NS = 2_000_000
"""The spans test's window: the first 2 ms of the trace."""


class Client:
    """Tool calls over one stdio session of `workbench mcp`, each answer's pages joined into one reply; every
    page's text is kept to check the size bound."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session
        self.pages: list[str] = []

    async def text(self, tool: str, **arguments: Any) -> tuple[bool, str]:
        result = await self.session.call_tool(tool, arguments)
        (content,) = result.content
        self.pages.append(content.text)
        return bool(result.is_error), content.text

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """The whole reply of `tool`, its pages fetched and joined (list items, or pieces of the JSON text)."""
        items: list[Any] = []
        parts: list[str] = []
        offset: int | None = 0
        reply: dict[str, Any] = {}
        while offset is not None:
            failed, text = await self.text(tool, **arguments, offset=offset)
            assert not failed, text
            reply = json.loads(text)
            page = reply.pop("page")
            if page["unit"] == "chars":
                parts.append(reply["json_part"])
            elif page["unit"] == "items":
                key = next(k for k, v in reply.items() if isinstance(v, list) and len(v) == page["items"])
                items += reply[key]
            offset = page["next"]
        if parts:
            return json.loads("".join(parts))
        if items:
            reply[key] = items
        return reply


def session_run(root: Path, script: Any, *extra: str) -> Any:
    """Run `script(client)` against a `workbench mcp --root root` server started by the SDK's stdio client."""
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "workbench", "mcp", "--root", str(root), *extra])

    async def go() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await script(Client(session), session)

    return anyio.run(go)


def cli_json(root: Path, *args: str) -> Any:
    result = CliRunner().invoke(main, [*args, "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mcp-traces")
    import_traces([fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"),
                   fixture_path("kineto", "diff_control.json.gz"), fixture_path("kineto", "diff_test.json.gz")],
                  folder)
    return folder


@pytest.fixture(scope="module")
def served(root: Path) -> dict[str, Any]:
    """Every read-only tool's answer on the fixtures, from one server session, with the tools it lists."""
    by_name = {row["name"]: row["run"] for row in cli_json(root, "ls")}
    runs = [by_name["resnet50_v100_train"], by_name["diff_control"], by_name["diff_test"]]
    resnet, control, test = runs

    async def script(client: Client, session: ClientSession) -> dict[str, Any]:
        tools = [tool.name for tool in (await session.list_tools()).tools]
        prompt = await session.get_prompt("why_is_this_run_slow", {"run": resnet})
        record = await session.read_resource(f"workbench://runs/{resnet}/run.json")
        return {
            "tools": tools, "prompt": prompt.messages[0].content.text, "record": record.contents[0].text,
            "list_runs": await client.call("list_runs"),
            "run_summary": await client.call("run_summary", run=resnet, top=7),
            "top_kernels": await client.call("top_ops", run=resnet, kind="kernel", top=12),
            "top_ops": await client.call("top_ops", run=resnet, kind="op", top=12),
            "findings": await client.call("findings", run=resnet),
            "critical_path": await client.call("critical_path", run=resnet),
            "sql": await client.call("sql", query="SELECT name, dur_ns FROM events ORDER BY row", runs=[resnet],
                                     limit=3000),
            "compare": await client.call("compare", runs=[control, test], top=15),
            "spans": await client.call("spans", run=resnet, start_ns=0, end_ns=WINDOW_NS, max_spans=2000),
            "refused": await client.text("sql", query=REFUSED_SQL, runs=[resnet]),
            "missing": await client.text("run_summary", run="no-such-run"),
            "run_files": await client.call("run_files", run=resnet),
            "file_resource": (await session.read_resource(f"workbench://runs/{resnet}/files/run.json")).contents[0].text,
            "outside": [await _resource_error(session, f"workbench://runs/{resnet}/files/{name}")
                        for name in ("nope.json", "..", "..%2F..%2Fetc%2Fpasswd")],
            "pages": client.pages,
        }

    return {"runs": runs, **session_run(root, script)}


async def _resource_error(session: ClientSession, uri: str) -> str:
    """The one-line error reading `uri` gives (fails the test if it reads)."""
    try:
        await session.read_resource(uri)
    except Exception as exc:  # the SDK raises its McpError
        return str(exc)
    raise AssertionError(f"{uri} was read")


def test_tools_listed_without_capture(served: dict[str, Any]) -> None:
    assert sorted(served["tools"]) == sorted(READ_ONLY_TOOLS)
    assert not set(CAPTURE_TOOLS) & set(served["tools"])


def test_capture_tools_only_when_allowed(root: Path) -> None:
    async def script(client: Client, session: ClientSession) -> list[str]:
        return [tool.name for tool in (await session.list_tools()).tools]

    assert sorted(session_run(root, script, "--allow-capture")) == sorted((*READ_ONLY_TOOLS, *CAPTURE_TOOLS))


def test_runs_summary_and_ops_equal_the_cli(root: Path, served: dict[str, Any]) -> None:
    assert served["list_runs"]["runs"] == cli_json(root, "ls")
    resnet = served["runs"][0]
    assert served["run_summary"] == cli_json(root, "show", resnet, "--top", "7")
    show = cli_json(root, "show", resnet, "--top", "12")
    assert served["top_kernels"]["rows"] == show["top_kernels"]
    assert served["top_ops"]["rows"] == show["top_ops"]
    assert len(served["top_kernels"]["rows"]) == 12


def test_summary_figures_match_the_raw_trace(served: dict[str, Any]) -> None:
    """The served kernel count and time are the raw Kineto file's (not only the CLI's)."""
    raw = load_raw(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"))
    kernels = [e for e in raw["traceEvents"] if str(e.get("cat")).lower() == "kernel" and e.get("ph") == "X"]
    summary = served["run_summary"]
    assert summary["events"]["kernel"] == len(kernels)
    assert sum(summary["kernel_ns"].values()) == pytest.approx(sum(e["dur"] for e in kernels) * 1000, abs=len(kernels))


def test_findings_path_and_compare_equal_the_cli(root: Path, served: dict[str, Any]) -> None:
    resnet, control, test = served["runs"]
    analysis = cli_json(root, "analyze", resnet)
    assert served["findings"]["findings"] == analysis["findings"]
    assert served["findings"]["findings"], "the fixture has findings"
    assert all("evidence" in f for f in served["findings"]["findings"])
    path = dict(served["critical_path"])
    assert path.pop("run") == resnet
    assert path == analysis["critical_path"]
    assert served["compare"] == cli_json(root, "diff", control, test, "--top", "15")


def test_sql_equals_the_cli_and_refuses_what_the_sandbox_refuses(root: Path, served: dict[str, Any]) -> None:
    resnet = served["runs"][0]
    cli = cli_json(root, "query", resnet, "SELECT name, dur_ns FROM events ORDER BY row", "--limit", "3000")
    assert served["sql"] == cli
    assert len(cli["rows"]) == 3000  # many pages: the join is checked too
    with pytest.raises(QueryError) as refused:
        run_query([open_bundle(resnet, root)], REFUSED_SQL)
    failed, text = served["refused"]
    assert failed and text.endswith(str(refused.value)) and "\n" not in text
    failed, text = served["missing"]
    assert failed and "no-such-run" in text and "\n" not in text


def test_spans_of_a_window_match_the_events_table(root: Path, served: dict[str, Any]) -> None:
    """The window's event count is the events table's rows overlapping it (an instant counts 1 ns), and every
    listed span overlaps it."""
    resnet = served["runs"][0]
    events = pq.read_table(open_bundle(resnet, root).path / "events.parquet", columns=["start_ns", "dur_ns"])
    start, dur = events["start_ns"].to_numpy(), events["dur_ns"].to_numpy()
    overlapping = int(((start < WINDOW_NS) & (start + dur.clip(min=1) > 0)).sum())
    spans = served["spans"]
    assert spans["events"] == overlapping
    assert spans["listed"] == len(spans["spans"]) <= 2000
    assert sum(lane["in_window"] for lane in spans["lanes"] if lane["listed"]) == len(spans["spans"])
    assert all(s["start_ns"] < WINDOW_NS and s["start_ns"] + max(s["dur_ns"], 1) > 0 for s in spans["spans"])


def test_every_answer_is_within_its_bound(served: dict[str, Any]) -> None:
    assert served["pages"]
    assert max(len(text) for text in served["pages"]) <= MAX_CHARS
    assert len(served["pages"]) > 12  # the sql and compare answers needed several pages


def test_prompt_and_resource(served: dict[str, Any]) -> None:
    resnet = served["runs"][0]
    assert resnet in served["prompt"] and "findings" in served["prompt"]
    assert json.loads(served["record"])["trace"]


def test_run_files_and_their_resources(root: Path, served: dict[str, Any]) -> None:
    resnet = served["runs"][0]
    folder = open_bundle(resnet, root).local_files()
    listed = {f["name"]: f for f in served["run_files"]["files"]}
    assert "run.json" in listed and listed["run.json"]["bytes"] == (folder / "run.json").stat().st_size
    assert all(not n.endswith(".parquet") for n in listed)
    assert served["file_resource"] == (folder / "run.json").read_text(encoding="utf-8")
    missing, *outside = served["outside"]
    assert "has no file 'nope.json'" in missing and all("Unknown resource" in text for text in outside), outside
    assert all(str(root) not in text for text in served["outside"])


def test_capture_and_import_tools(tmp_path: Path) -> None:
    """With --allow-capture: import a real trace and capture a built-in model; a model outside the policy and an
    unknown option are refused in one line, and nothing is written for them."""
    async def script(client: Client, session: ClientSession) -> dict[str, Any]:
        return {
            "imported": await client.call("import_trace", paths=[str(fixture_path("kineto", "diff_control.json.gz"))]),
            "captured": await client.call("capture", options={"model": "mlp", "variants": ["eager"], "batch": 2,
                                                              "iterations": 2, "warmup": 1, "device": "cpu"}),
            "foreign": await client.text("capture", options={"model": "os:system"}),
            "unknown": await client.text("capture", options={"model": "mlp", "colour": "red"}),
            "runs": await client.call("list_runs"),
        }

    got = session_run(tmp_path, script, "--allow-capture")
    (imported,) = got["imported"]["runs"]
    captured = got["captured"]
    assert captured["exit_code"] == 0
    listed = {row["run"]: row for row in cli_json(tmp_path, "ls")}
    assert set(listed) == {imported, *(run["run_id"] for run in captured["result"]["runs"])}
    assert listed[imported]["name"] == "diff_control"
    assert [row["model"] for row in listed.values() if row["run"] != imported] == ["mlp"]
    for failed, text in (got["foreign"], got["unknown"]):
        assert failed and "\n" not in text.strip()
    assert "built-in" in got["foreign"][1] or "allowed" in got["foreign"][1], got["foreign"][1]
    assert "colour" in got["unknown"][1]
    assert {row["run"] for row in got["runs"]["runs"]} == set(listed)  # the server lists what it wrote
