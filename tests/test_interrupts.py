"""Interrupted and killed commands: Ctrl-C exits 130 at any moment, and a traces root never holds half a
write (a run without its experiment record, a record naming missing runs); what a killed process leaves
behind is cleared by the next command that writes there, and only once its owner is gone."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import TINY_CAPTURE, write_trace

from workbench.cli import main
from workbench.errors import BundleError
from workbench.trace.store.bundle import list_bundles, open_bundle, write_bundle
from workbench.trace.store.experiment import list_experiments, write_experiment
from workbench.trace.store.scratch import owner_gone, scratch_name
from workbench.trace.store.staging import COMMITTED, staged, sweep

LONG_CAPTURE = [*TINY_CAPTURE, "--variants", "eager,bf16", "--iterations", "100000"]
"""A tiny capture made to run for minutes, so that a signal sent within seconds finds it running."""


def _command() -> list[str]:
    """The `workbench` console script beside this interpreter (what users run), else `python -m workbench`."""
    script = Path(sys.executable).with_name("workbench")
    return [str(script)] if script.exists() else [sys.executable, "-m", "workbench"]


def _entries(root: Path) -> list[str]:
    """Everything in `root` and its experiments folder, hidden entries included."""
    if not root.exists():
        return []
    found = [p.name for p in root.iterdir()]
    if (root / "experiments").is_dir():
        found += [f"experiments/{p.name}" for p in (root / "experiments").iterdir()]
    return sorted(found)


def _hidden(root: Path) -> list[str]:
    return [name for name in _entries(root) if name.rpartition("/")[2].startswith(".")]


def _info(**fields: object) -> dict[str, object]:
    return {"model": "m", "variant": "v", **fields}


@pytest.mark.parametrize("delay_s", [0.2, 0.5, 1.0, 3.0])
def test_ctrl_c_at_any_moment_exits_130_with_nothing_kept(tmp_path: Path, delay_s: float) -> None:
    root = tmp_path / "traces"
    proc = subprocess.Popen([*_command(), "capture", *LONG_CAPTURE, "--out", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(delay_s)
        assert proc.poll() is None, "the capture ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted: nothing half-written was kept" in stderr
    assert _entries(root) == []


def test_ctrl_c_while_writing_a_capture_keeps_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = pq.write_table
    calls: list[object] = []

    def interrupt_on_second_bundle(table: object, where: object, **kwargs: object) -> None:
        calls.append(where)
        if len(calls) > 3:  # the first bundle's three tables are written, then Ctrl-C
            raise KeyboardInterrupt
        real_write(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", interrupt_on_second_bundle)
    root = tmp_path / "traces"
    result = CliRunner().invoke(main, ["capture", *TINY_CAPTURE, "--variants", "eager,bf16", "--out", str(root)])
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.stderr
    assert len(calls) == 4
    assert _entries(root) == []


def _kill_during_write(root: Path, *, commit: bool) -> None:
    """In a child process: stage two bundles and a record in `root`, then die by SIGKILL before the
    commit or (`commit`) after the first bundle was moved into the root."""
    script = f"""
import os, signal
from pathlib import Path
from workbench.trace.store.bundle import write_bundle
from workbench.trace.store.experiment import write_experiment
from workbench.trace.store.staging import staged

def rename_then_die(src, dst, rename=os.rename):
    rename(src, dst)
    os.kill(os.getpid(), signal.SIGKILL)

with staged(Path({str(root)!r}), "exp-1") as stage:
    write_bundle(stage, "run-a", {{"experiment": "exp-1"}})
    write_bundle(stage, "run-b", {{"experiment": "exp-1"}})
    write_experiment(stage, "exp-1", {{"model": "m", "reference": "a", "runs": ["run-a", "run-b"]}})
    if {commit!r}:
        os.rename = rename_then_die  # the commit's first move into the root is the last thing it does
    else:
        os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr


def test_a_staged_group_killed_before_its_commit_is_never_listed_and_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "traces"
    _kill_during_write(root, commit=False)
    (stage,) = _hidden(root)
    assert stage.startswith(".staging-exp-1-") and owner_gone(stage)
    assert list_bundles(root) == [] and list_experiments(root) == []
    sweep(root)
    assert _entries(root) == []


def test_a_committed_group_killed_while_moving_in_is_completed_by_the_next_writer(tmp_path: Path) -> None:
    root = tmp_path / "traces"
    _kill_during_write(root, commit=True)
    assert [b.run_id for b in list_bundles(root)] == ["run-a"]  # moved before the kill; complete
    assert list_experiments(root) == []  # the record lands last
    (stage,) = _hidden(root)
    assert (root / stage / COMMITTED).is_file()
    with staged(root, "other"):  # any writer sweeps first
        pass
    assert sorted(b.run_id for b in list_bundles(root)) == ["run-a", "run-b"]
    (experiment,) = list_experiments(root)
    assert experiment.run_ids == ["run-a", "run-b"]
    assert _hidden(root) == []


def test_only_scratch_whose_owner_is_gone_is_swept(tmp_path: Path) -> None:
    root = tmp_path / "traces"
    root.mkdir()
    mine = scratch_name("tmp", "run-1")
    host, boot, pid, start = mine.rsplit("-", 2)[1].split(".")
    assert int(pid) == os.getpid()
    reused_pid = mine.replace(f"{pid}.{start}", f"{pid}.{int(start) + 1}")  # this pid, another process's start
    legacy = ".tmp-run-2-0a1b2c3d"  # written by an older workbench: owner unknown
    other_host = mine.replace(f"{host}.{boot}", f"{'0' * len(host)}.{boot}")
    other = subprocess.Popen([sys.executable, "-c", "from workbench.trace.store.scratch import scratch_name; "
                              "print(scratch_name('profile', 'eager'), flush=True); import time; time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        theirs = other.stdout.readline().strip()
        for name in (mine, reused_pid, legacy, other_host, theirs):
            (root / name).mkdir()
        assert [owner_gone(n) for n in (mine, reused_pid, legacy, other_host, theirs)] == [
            False, True, False, False, False]
        sweep(root)
        assert sorted(p.name for p in root.iterdir()) == sorted([mine, legacy, other_host, theirs])
    finally:
        other.kill()
        other.wait()
    assert owner_gone(theirs)
    sweep(root)
    assert sorted(p.name for p in root.iterdir()) == sorted([mine, legacy, other_host])


def test_a_group_whose_run_id_is_taken_is_refused_whole(tmp_path: Path) -> None:
    root = tmp_path / "traces"
    write_bundle(root, "run-a", _info())
    with pytest.raises(BundleError, match="already exists"), staged(root, "exp-1") as stage:
        write_bundle(stage, "run-b", _info())
        write_bundle(stage, "run-a", _info())
        write_experiment(stage, "exp-1", {"model": "m", "reference": "v", "runs": ["run-a", "run-b"]})
    assert _entries(root) == ["run-a"]
    assert open_bundle("run-a", root).info["variant"] == "v"


def _kill_at_random(command: list[str], delay_s: float) -> None:
    """Run `command` in its own process group and SIGKILL the group after `delay_s` (if still running)."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=delay_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - start


def _rank_job(folder: Path, ranks: int = 4, events: int = 20_000) -> Path:
    """A job of `ranks` Kineto traces of `events` host ops each, big enough that its import takes seconds."""
    folder.mkdir()
    for rank in range(ranks):
        write_trace(folder / f"rank{rank}.json",
                    [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 50}", "pid": 1, "tid": 1, "ts": 2 * i,
                      "dur": 1} for i in range(events)],
                    distributedInfo={"backend": "nccl", "rank": rank, "world_size": ranks},
                    baseTimeNanoseconds=1_700_000_000_000_000_000)
    return folder


def _assert_consistent(root: Path) -> None:
    """Every listed run opens with its tables; every experiment lists only runs that exist, and every run's
    experiment has its record."""
    listed = CliRunner().invoke(main, ["ls", "--out", str(root), "--json"])
    assert listed.exit_code == 0 and "skipped" not in listed.stderr, listed.output
    rows = json.loads(listed.stdout)
    for row in rows:
        bundle = open_bundle(row["run"], root)
        if bundle.has_trace:
            assert bundle.trace().events.num_rows > 0
    runs = {row["run"] for row in rows}
    problems: list[str] = []
    experiments = list_experiments(root, on_problem=lambda path, message: problems.append(message))
    assert problems == []
    for experiment in experiments:
        assert set(experiment.run_ids) <= runs, experiment.experiment_id
    recorded = {e.experiment_id for e in experiments}
    assert {row["experiment"] for row in rows if row["experiment"]} <= recorded


@pytest.mark.slow
def test_random_kills_during_capture_and_import_leave_only_whole_runs(tmp_path: Path) -> None:
    root = tmp_path / "traces"
    capture = [*_command(), "capture", *TINY_CAPTURE, "--variants", "eager,bf16", "--out", str(root)]
    job = _rank_job(tmp_path / "job")
    imports = [[*_command(), "import", "--ranks", str(job), "--out", str(root)],
               [*_command(), "import", *map(str, sorted(job.iterdir())), "--force", "--out", str(root)]]
    typical = {"capture": _timed(capture), "import": max(_timed(command) for command in imports)}
    before = {b.run_id for b in list_bundles(root)}
    assert len(before) == 2 + 4 + 4

    rng = random.Random(20261203)
    for attempt in range(10):
        kind = ("capture", "import")[attempt % 2]
        command = capture if kind == "capture" else imports[attempt // 2 % 2]
        _kill_at_random(command, rng.uniform(0.1, typical[kind]))
        _assert_consistent(root)

    assert before <= {b.run_id for b in list_bundles(root)}
    small = write_trace(tmp_path / "small.json", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                                                   "tid": 1, "ts": 0, "dur": 5}])
    wrote = CliRunner().invoke(main, ["import", str(small), "--out", str(root)])
    assert wrote.exit_code == 0, wrote.output
    assert _hidden(root) == []
    _assert_consistent(root)
