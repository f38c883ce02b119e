"""What an agent asks of a traces root, answered by the functions the command line's `--json` prints: each answer
is a JSON-ready dict and the name of its main list (what `paging.page` cuts), and the figures are those of the
matching command (`ls`, `show`, `analyze`, `query`, `diff`), so an agent and a person reading the CLI agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError

TOP_LIMIT = 100
"""Most rows a `top` parameter may ask for (ops, kernels, deltas, path names)."""
MAX_SPANS = 2_000
"""Most spans a window answer lists (lanes past it are counted, not listed)."""
MAX_FILE_BYTES = 256 << 10
"""Largest bundle file a resource reads (run.json and the like; the tables are for the sql tool)."""
OP_KINDS = {"op": "top_ops", "kernel": "top_kernels"}
"""`top_ops`'s kinds and the `show --json` field that holds each."""

Answer = tuple[dict[str, Any], str | None]
"""A reply and the key of its main list (None: a dict paged as text)."""


def _top(top: int) -> int:
    if not 1 <= top <= TOP_LIMIT:
        raise WorkbenchError(f"top: expected 1 to {TOP_LIMIT}, got {top}")
    return top


def list_runs(root: Path) -> Answer:
    """The runs of the root, oldest first, as `workbench ls --json` lists them, and the experiments with their
    run ids."""
    from workbench.analysis.summary import run_row
    from workbench.trace.store.bundle import list_bundles
    from workbench.trace.store.experiment import list_experiments

    problems: list[str] = []
    runs = [run_row(b.run_id, b.info) for b in list_bundles(root, on_problem=lambda p, m: problems.append(m))]
    experiments = [{"experiment": e.experiment_id, "model": e.info.get("model"), "created": e.info.get("created"),
                    "runs": e.run_ids} for e in list_experiments(root, on_problem=lambda p, m: problems.append(m))]
    return {"experiments": experiments, "skipped": problems, "runs": runs}, "runs"


def run_summary(root: Path, run: str, top: int = 10) -> Answer:
    """`workbench show RUN --json --top TOP`: status, latency, events per kind, kernel time, top ops and kernels."""
    from workbench.analysis.summary import run_summary as summary
    from workbench.trace.store.bundle import open_bundle

    return summary(open_bundle(run, root), top=_top(top)), None


def top_ops(root: Path, run: str, kind: str = "kernel", top: int = 10) -> Answer:
    """The top ops or kernels of a run by total time, the rows of `show --json`'s `top_ops` or `top_kernels`."""
    if kind not in OP_KINDS:
        raise WorkbenchError(f"kind: expected one of {', '.join(OP_KINDS)}, got {kind!r}")
    summary, _ = run_summary(root, run, top)
    return {"run": summary["run"], "kind": kind, "window": summary["ops_window"], "rows": summary[OP_KINDS[kind]]}, \
        "rows"


def findings(root: Path, run: str) -> Answer:
    """`workbench analyze RUN --json`'s findings (ranked, each with its evidence rows and next step), with the
    device figures and the window they cover."""
    from workbench.analysis.findings.bottlenecks import analyze_run
    from workbench.trace.store.bundle import open_bundle

    result = analyze_run(open_bundle(run, root))
    return {"run": result["run"], "device": result["device"], "window": result["window"],
            "findings": result["findings"]}, "findings"


def critical_path(root: Path, run: str, step: int | None = None, top: int = 10) -> Answer:
    """The critical path of a step (by default the median one) as `analyze --json` carries it: its length, time
    per segment kind, the top names by path share and what-ifs."""
    from workbench.analysis.critical_path import critical_path as path_of
    from workbench.analysis.critical_path import path_summary
    from workbench.trace.store.bundle import open_bundle

    bundle = open_bundle(run, root)
    if not bundle.has_trace:
        raise WorkbenchError(f"run {run!r} has no trace")
    return {"run": bundle.run_id, **path_summary(path_of(bundle.trace(), step), top=_top(top))}, None


def spans(root: Path, run: str, start_ns: int | None = None, end_ns: int | None = None,
          max_spans: int = 500) -> Answer:
    """The spans overlapping [start_ns, end_ns) (default the whole run), lane by lane, sparse lanes first, at
    most `max_spans` of them (`workbench.analysis.spans.queries.window`, the timeline's query); a lane past
    the budget is counted, not listed."""
    from workbench.analysis.spans import queries
    from workbench.trace.store.bundle import open_bundle

    if not 1 <= max_spans <= MAX_SPANS:
        raise WorkbenchError(f"max_spans: expected 1 to {MAX_SPANS}, got {max_spans}")
    bundle = open_bundle(run, root)
    _, index = queries.open_run(bundle)
    start = index.extent[0] if start_ns is None else start_ns
    end = index.extent[1] if end_ns is None else end_ns
    reply = queries.window(bundle, start, end, 1, max_spans=max_spans)
    listed: list[dict[str, Any]] = []
    lanes = []
    for lane in reply["lanes"]:
        lanes.append({key: lane[key] for key in ("lane", "device", "track", "label", "in_window")}
                     | {"listed": lane["mode"] == "spans"})
        if lane["mode"] != "spans":
            continue
        columns = lane["spans"]
        for i, row in enumerate(columns["row"]):
            listed.append({"lane": lane["lane"], "row": row, "start_ns": columns["start_ns"][i],
                           "dur_ns": columns["dur_ns"][i], "depth": columns["depth"][i],
                           "name": reply["names"][columns["name"][i]], "kind": reply["kinds"][columns["kind"][i]]})
    listed.sort(key=lambda s: (s["start_ns"], s["lane"], s["depth"]))
    return {"run": reply["run"], "start_ns": reply["start_ns"], "end_ns": reply["end_ns"],
            "extent_ns": reply["extent_ns"], "events": reply["events"], "listed": len(listed), "lanes": lanes,
            "spans": listed}, "spans"


def sql(root: Path, query: str, runs: list[str] | None = None, limit: int = 100) -> Answer:
    """`workbench query RUNS "SQL" --json` (every run when `runs` is empty): one SELECT in the sandbox, with its
    limits (`workbench.analysis.sql`)."""
    from workbench.analysis.sql import run_query
    from workbench.trace.store.bundle import list_bundles
    from workbench.trace.store.resolve import resolve_runs

    bundles = resolve_runs(runs, root) if runs else list_bundles(root)
    return run_query(bundles, query, limit=limit).to_json(), "rows"


def compare(root: Path, runs: list[str], baseline: str | None = None, top: int = 10) -> Answer:
    """`workbench diff RUNS --json --top TOP`: step time, device busy/idle and overlap, and the op and kernel
    deltas of each run against the baseline (default the first)."""
    from workbench.analysis.diff import trace_comparison
    from workbench.trace.store.resolve import resolve_runs

    return trace_comparison(resolve_runs(runs, root), baseline).to_json(_top(top)), None


TEXT_SUFFIXES = (".json", ".txt", ".md", ".yaml", ".yml", ".csv", ".log", ".hlo")
"""Suffixes of the files `run_files` lists."""


def run_files(root: Path, run: str) -> Answer:
    """A run's small text files (its folder's and its compile/ folder's, at most `MAX_FILE_BYTES` each) with
    their sizes and resource URIs: what the `workbench://runs/{run}/...` resources read."""
    from workbench.trace.store.bundle import open_bundle

    folder = open_bundle(run, root).local_files()
    files = []
    for sub in ("", "compile"):
        here = folder / sub
        if not here.is_dir():
            continue
        for path in sorted(here.iterdir()):
            if not path.is_file() or path.is_symlink() or path.suffix not in TEXT_SUFFIXES:
                continue
            size = path.stat().st_size
            if size <= MAX_FILE_BYTES:
                name = f"{sub}/{path.name}" if sub else path.name
                uri = f"workbench://runs/{run}/{'compile' if sub else 'files'}/{path.name}"
                files.append({"name": name, "bytes": size, "uri": uri})
    return {"run": run, "files": files}, "files"


def run_file(root: Path, run: str, name: str) -> str:
    """The text of one of a bundle's small files (`run.json`, and the like), for resources."""
    from workbench.trace.store.bundle import open_bundle

    folder = open_bundle(run, root).local_files()
    path = (folder / name).resolve()
    if not path.is_relative_to(folder.resolve()) or not path.is_file():
        raise WorkbenchError(f"run {run!r} has no file {name!r}")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise WorkbenchError(f"run {run!r}: {name!r} is larger than {MAX_FILE_BYTES >> 10} KiB; query its tables "
                             f"with the sql tool instead")
    return path.read_text(encoding="utf-8")
