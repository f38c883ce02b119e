"""Issue 13, "no crash on any input": `workbench import` of mutated seeds of every trace format it reads
(Kineto/Chrome JSON plain, gzipped and in array form, XSpace, nsys SQLite) either writes one complete bundle
that `show` (and, on a sample, `report`) handles, or refuses the file in one line naming it; never a
traceback, a hang or debris. Cases come from benchmarks/fuzzing.py (`python benchmarks/fuzz.py` runs
thousands of them); a failure names the case number, which re-makes it."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from conftest import fixture_path, write_trace
from fuzz_check import CliResult, check_case, in_process, in_subprocess
from fuzz_seeds import Seeds, build_seeds
from fuzzing import FORMATS, Case, NoSeed, make_case, seed_cases

from workbench.analysis.timeline import density, union_intervals
from workbench.trace import read_trace

IN_PROCESS = range(300)
"""Cases run through click's runner in this process (fast)."""
IN_SUBPROCESS = (302, 303, 304)
"""Cases run as `python -m workbench` with a timeout, the command users run (gzipped JSON, XSpace, nsys:
each interpreter start costs seconds)."""
FOUND = (51652,)
"""Cases a long `benchmarks/fuzz.py` run found crashing, kept once fixed (51652: a thread id of one NUL
character, whose track numpy's str dtype cut to another name, so its events fell in no timeline lane)."""
REPORT_EVERY = 30
"""`workbench report` (seconds each) runs on every Nth case that imports."""


@pytest.fixture(scope="module")
def seeds() -> Seeds:
    """Every seed this machine can make (jax is imported once, here)."""
    return build_seeds()


def _case(number: int, seeds: Seeds) -> Case:
    try:
        return make_case(number, seeds)
    except NoSeed as exc:
        pytest.skip(str(exc))


def _check(case: Case, tmp_path: Path, cli, report: bool) -> None:
    outcome = check_case(case, tmp_path, cli, report=report)
    assert outcome.kind in ("ok", "error"), (f"{outcome.kind}: {case.label}\ninput: {tmp_path / 'input' / case.name}"
                                             f"\n{outcome.detail}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("number", [*IN_PROCESS, *FOUND])
def test_fuzzed_trace_imports_or_is_refused_in_one_line(number: int, seeds: Seeds, tmp_path: Path) -> None:
    _check(_case(number, seeds), tmp_path, in_process, report=number % REPORT_EVERY == 0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("words", ["many tracks", "in a line written", "REAL/TEXT in integer column"])
def test_the_first_case_of_a_mutation_kind_imports_and_reports(words: str, seeds: Seeds, tmp_path: Path) -> None:
    """The first case of each issue-22 mutation kind, with `workbench report` on it whatever its number."""
    def label(number: int) -> str:
        try:
            return make_case(number, seeds).label
        except NoSeed:
            return ""

    number = next((n for n in range(2_000) if words in label(n)), None)
    if number is None:
        pytest.skip(f"no {words!r} case among the first 2,000 with the seeds of this machine")
    _check(make_case(number, seeds), tmp_path, in_process, report=True)


@pytest.mark.parametrize("number", IN_SUBPROCESS)
def test_fuzzed_trace_through_the_real_command(number: int, seeds: Seeds, tmp_path: Path) -> None:
    _check(_case(number, seeds), tmp_path, in_subprocess(timeout_s=60), report=False)


def test_every_seed_imports_and_every_format_has_one(seeds: Seeds, tmp_path: Path) -> None:
    fixture_path("nsys")  # the nsys seeds and the real Kineto ones come from the shared fixtures
    pytest.importorskip("jax")
    assert [f for f in FORMATS if not seeds.has(f)] == []
    for i, case in enumerate(seed_cases(seeds)):
        outcome = check_case(case, tmp_path / str(i), in_process, report=i == 0)
        assert outcome.kind == "ok", f"{case.label}: {outcome.detail}"


def test_a_case_is_remade_by_its_number(seeds: Seeds) -> None:
    for number in range(2 * len(FORMATS)):
        try:
            assert make_case(number, seeds) == make_case(number, seeds)
        except NoSeed:
            continue


@pytest.mark.parametrize(("result", "leave", "kind"), [
    (CliResult(2, "", "error: {file}: not a trace\n"), None, "error"),
    (CliResult(2, "", "error: {file}: not a trace\n"), ".tmp-20260101-000000-import-x-ab12", "debris"),
    (CliResult(2, "", "error: not a trace\n"), None, "crash"),  # the file is not named
    (CliResult(2, "", "error: {file}: not\na trace\n"), None, "crash"),  # two lines
    (CliResult(1, "", "Traceback (most recent call last):\n  ...\nKeyError: 'ts'\n"), None, "crash"),
    (CliResult(0, "", ""), None, "crash"),  # exit 0 without a run id
])
def test_the_checker_tells_each_outcome(result: CliResult, leave: str | None, kind: str, tmp_path: Path) -> None:
    """The fuzz test could not fail if its checker missed what it looks for."""
    case = Case(0, "kineto-object", ("by hand",), "bad.json", b"{")

    def cli(args: list[str], root: Path) -> CliResult:
        if leave:
            (root / leave).mkdir(parents=True)
        return CliResult(result.exit_code, result.stdout, result.stderr.format(file=args[1]))

    assert check_case(case, tmp_path, cli).kind == kind



# -- what the fuzzing found, each as the smallest input that showed it ------------------------------


def _case_of(path: Path, fmt: str) -> Case:
    return Case(0, fmt, ("by hand",), path.name, path.read_bytes())


def _unwrap(value: Any) -> tuple[int, Any]:
    """(levels of one-element lists around it, the innermost value)."""
    levels = 0
    while isinstance(value, list):
        (value,) = value
        levels += 1
    return levels, value


def test_metadata_nested_past_the_recursion_limit_is_kept_as_json_text(tmp_path: Path) -> None:
    deep = "[" * 3000 + "1" + "]" * 3000
    path = tmp_path / "deep.json"
    path.write_text(f'{{"traceEvents": [{{"ph": "M", "name": "process_name", "pid": 1, "args": {{"labels": {deep}}}}}, '
                    f'{{"ph": "X", "name": "op", "pid": 1, "tid": 1, "ts": 1, "dur": 2}}], "distributedInfo": {deep}}}')
    assert check_case(_case_of(path, "kineto-object"), tmp_path / "run", in_process).kind == "ok"
    metadata = read_trace(path).metadata
    json.dumps(metadata)  # the bundle writer failed here: Python's json recurses once per level
    for value in (metadata["source"]["header"]["distributedInfo"], metadata["processes"]["1"]["name"]):
        levels, rest = _unwrap(value)
        assert isinstance(rest, str) and rest.strip("[]") == "1" and levels + rest.count("[") == 3000


def test_args_with_bytes_that_are_not_utf8_read_with_replacement_characters(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 1, '
                     b'"dur": 2, "args": {"file": "caf\xe9.py"}}, {"ph": "X", "name": "b", "pid": 1, "tid": 1, '
                     b'"ts": 5, "dur": 1, "args": {"n": 1}}]}'.replace(b"\\xe9", b"\xe9"))
    assert check_case(_case_of(path, "kineto-object"), tmp_path / "run", in_process).kind == "ok"
    trace = read_trace(path)
    assert [json.loads(a) for a in trace.events["args"].to_pylist()] == [{"file": "caf\ufffd.py"}, {"n": 1}]
    assert trace.metadata["reader"]["skipped"]["args holding bytes that are not UTF-8 (decoded with U+FFFD)"] == 1


def test_jax_chrome_trace_with_an_integer_of_5000_digits_in_args(tmp_path: Path) -> None:
    """JAX's own trace.json is classified as its XSpace is, by the args; msgspec refuses integers that long."""
    number = "1" * 5000
    path = tmp_path / "vm.trace.json"
    step = f'{{"ph": "X", "name": "train", "pid": 1, "tid": 2, "ts": 1, "dur": 5, "args": {{"step_num": {number}}}}}'
    path.write_text('{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}}, '
                    f"{step}]}}")
    assert check_case(_case_of(path, "kineto-object"), tmp_path / "run", in_process).kind == "ok"
    (row,) = read_trace(path).events.to_pylist()
    assert row["kind"] == "annotation" and row["args"] == f'{{"step_num": {number}}}'  # a step, args as written


@pytest.mark.parametrize("later", [b'"\xed\xa0\x80"', b"NaN", b"]"])
def test_integer_of_5000_digits_before_bad_json_is_refused_in_one_line(tmp_path: Path, later: bytes) -> None:
    """Python's json, which reads what msgspec cannot, must refuse what msgspec would have refused after it
    (an encoded surrogate, NaN, a syntax error)."""
    path = tmp_path / "long.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": ' + b"1" * 5000
                     + b', "args": {"x": ' + later + b"}}]}")
    assert check_case(_case_of(path, "kineto-object"), tmp_path / "run", in_process).kind == "error"


def _nsys_seed(tmp_path: Path, seeds: Seeds, name: str = "saxpy_mpi_cuda_nsys2022.sqlite") -> Path:
    fixture_path("nsys")
    path = tmp_path / "export.sqlite"
    path.write_bytes(dict(seeds.nsys)[name])
    return path


def test_nsys_shared_memory_that_is_no_number_stays_as_written(tmp_path: Path, seeds: Seeds) -> None:
    path = _nsys_seed(tmp_path, seeds)
    with sqlite3.connect(path) as con:
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET staticSharedMemory = 'NaN'")
        kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    con.close()
    events = read_trace(path).events
    args = [json.loads(a) for a, kind in zip(events["args"].to_pylist(), events["kind"].to_pylist(), strict=True)
            if kind == "kernel"]
    assert len(args) == kernels and all(a["staticSharedMemory"] == "NaN" and "shared memory" not in a for a in args)


@pytest.mark.parametrize(("seed", "at", "offset", "byte"), [
    # in the table's name in its sqlite_master row, which SQLite's error quotes: not UTF-8
    ("saxpy_mpi_cuda_nsys2022.sqlite", b"tableCUPTI_ACTIVITY_KIND_KERNELCUPTI_ACTIVITY_KIND_KERNEL", 11, b"\xe1"),
    # a quote opening a string in the CREATE TABLE statement, which SQLite's error quotes over many lines
    ("h100_2gpu_1s.sqlite", b"CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (\n    start", 42, b"'"),
])
def test_nsys_corrupt_schema_is_refused_in_one_line(tmp_path: Path, seeds: Seeds, seed: str, at: bytes, offset: int,
                                                    byte: bytes) -> None:
    path = _nsys_seed(tmp_path, seeds, seed)
    data = path.read_bytes()
    spot = data.index(at) + offset
    path.write_bytes(data[:spot] + byte + data[spot + 1:])
    outcome = check_case(_case_of(path, "nsys"), tmp_path / "run", in_process)
    assert outcome.kind == "error" and "corrupt or truncated SQLite database" in outcome.detail


_XSPACE = """planes {{ id: 1 name: "/host:CPU" lines {{ id: 1 name: "python" timestamp_ns: {ts}
  events {{ metadata_id: 1 offset_ps: 0 duration_ps: 1000 {stats} }}
  events {{ metadata_id: 1 offset_ps: 5000000 duration_ps: {dur} }} }}
  event_metadata {{ key: 1 value {{ id: 1 name: "cuLaunchKernel" }} }}
  stat_metadata {{ key: 1 value {{ id: 1 name: "correlation_id" }} }}
  stat_metadata {{ key: 2 value {{ id: 2 name: "blob" }} }} }}"""


def _xspace(tmp_path: Path, ts: int = 1000, stats: str = "", dur: int = 1000) -> Path:
    jax = pytest.importorskip("jax")
    path = tmp_path / "host.xplane.pb"
    text = _XSPACE.format(ts=ts, stats=stats, dur=dur)
    path.write_bytes(jax.profiler.ProfileData.text_proto_to_serialized_xspace(text))
    return path


def test_xspace_correlation_id_past_int64_stays_in_args(tmp_path: Path) -> None:
    path = _xspace(tmp_path, stats="stats { metadata_id: 1 uint64_value: 9223372036854775808 }")
    assert check_case(_case_of(path, "xspace"), tmp_path / "run", in_process).kind == "ok"
    first = read_trace(path).events.to_pylist()[0]
    assert first["corr"] == -1 and json.loads(first["args"]) == {"correlation_id": 2**63}


def test_xspace_stat_jax_cannot_decode_is_left_out_and_counted(tmp_path: Path) -> None:
    blob, corr = 'stats { metadata_id: 2 bytes_value: "\\377" }', "stats { metadata_id: 1 int64_value: 7 }"
    path = _xspace(tmp_path, stats=f"{blob} {corr}")
    assert check_case(_case_of(path, "xspace"), tmp_path / "run", in_process).kind == "ok"
    trace = read_trace(path)
    assert trace.events["corr"].to_pylist() == [7, -1]
    assert trace.metadata["reader"]["skipped"] == {"stats whose value is bytes that are not UTF-8 text (left out)": 1}


def test_xspace_times_past_2_62_ns_are_left_out_and_counted(tmp_path: Path) -> None:
    path = _xspace(tmp_path, ts=2**62 - 3000)  # the second event starts 5 µs later, past 2**62 ns
    assert check_case(_case_of(path, "xspace"), tmp_path / "run", in_process).kind == "ok"
    trace = read_trace(path)
    assert trace.events.num_rows == 1
    assert trace.metadata["reader"]["skipped"] == {"events whose start or end is not within ±2**62 ns (left out)": 1}


def test_xspace_that_protobuf_complains_about_is_refused_in_one_line(tmp_path: Path) -> None:
    path = _xspace(tmp_path)
    data = path.read_bytes()
    at = data.index(b"cuLaunchKernel")
    path.write_bytes(data[:at] + b"\xff" + data[at + 1:])
    outcome = check_case(_case_of(path, "xspace"), tmp_path / "run", in_subprocess(timeout_s=60))
    assert outcome.kind == "error" and "contains invalid UTF-8" in outcome.detail  # protobuf's log, in the line


def test_report_of_spans_near_2_62_ns_on_several_lanes(tmp_path: Path) -> None:
    """The timeline's union of busy intervals set lanes apart by lane · 2·span on one int64 axis."""
    far = 2**62 / 1000 - 1  # µs
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": i, "ts": 0, "dur": far}
              for i in range(3)] + [{"ph": "X", "cat": "cpu_op", "name": "late", "pid": 1, "tid": 0, "ts": far,
                                     "dur": 1}]
    path = write_trace(tmp_path / "long.json", events)
    assert check_case(_case_of(path, "kineto-object"), tmp_path / "run", in_process, report=True).kind == "ok"
    trace = read_trace(path)
    cells = density(trace, bins=4, levels=1).cells
    assert cells.groupby("lane")["busy"].min().tolist() == pytest.approx([1.0] * 3)  # busy from start to end


def test_union_of_intervals_near_int64_matches_a_plain_merge() -> None:
    rng = np.random.default_rng(13)
    for scale in (100, 2**61, 2**62):
        lane = rng.integers(0, 4, 40)
        start = rng.integers(0, scale, 40)
        end = start + rng.integers(0, scale, 40)
        got = list(zip(*(a.tolist() for a in union_intervals(lane, start, end, int(end.max()))), strict=True))
        expected = []
        for code in sorted(set(lane.tolist())):
            for s, e in sorted(zip(start[lane == code].tolist(), end[lane == code].tolist(), strict=True)):
                if expected and expected[-1][0] == code and s <= expected[-1][2]:
                    expected[-1] = (code, expected[-1][1], max(expected[-1][2], e))
                else:
                    expected.append((code, s, e))
        assert got == expected
