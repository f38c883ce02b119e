"""Capture jobs of the Jupyter server: command lines run as subprocesses on the server's event loop.

At most `max_running` jobs run at once; the others wait in a FIFO queue of at most `max_queued` (a job
beyond it is refused with QueueFull). A job may carry a `check` run as it starts (e.g. that the folder it
writes into is still allowed); a WorkbenchError from it fails the job without starting it.

A job's command prints its result as JSON on stdout (the CLI's `--json`) and its progress as JSON lines
on stderr (the CLI's `--progress-json`, see `workbench.progress.JsonProgress`); every other stderr line
goes to the job's log tail. A job is queued, then running, then succeeded (exit code 0), failed or cancelled.

Cancelling a running job sends SIGINT to its process group (the CLI stops as on Ctrl-C: nothing
half-written is kept), then SIGKILL if it has not exited after a grace period. Jobs live in memory:
they end with the server (`shutdown`), their runs stay on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from workbench.errors import EXIT_INTERRUPTED, EXIT_PARTIAL, WorkbenchError
from workbench.trace.store.bundle import utc_now

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
FINISHED: tuple[JobStatus, ...] = ("succeeded", "failed", "cancelled")
LOG_LINES = 50
"""Lines of a job's stderr kept for its status (progress lines excluded)."""
_LINE_LIMIT = 1 << 20
"""Longest stderr line read whole; a longer one is replaced by a note in the log."""


@dataclass(eq=False)
class Job:
    """One command line and what is known of its run so far.

    `request` is what the client asked for (shown back in the status); `tasks` maps each progress task
    to `{"completed", "total", "done"}`, and `task` is the one that moved last.
    """

    argv: list[str]
    request: dict[str, Any]
    cwd: Path | None = None
    check: Callable[[], None] | None = field(default=None, repr=False)
    job_id: str = field(default_factory=lambda: secrets.token_hex(8))
    status: JobStatus = "queued"
    created: str = field(default_factory=utc_now)
    started: str | None = None
    finished: str | None = None
    exit_code: int | None = None
    result: Any = None
    error: str | None = None
    task: str | None = None
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    log: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    cancel_requested: bool = False
    process: asyncio.subprocess.Process | None = field(default=None, repr=False)
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    def to_dict(self, queue_position: int | None = None) -> dict[str, Any]:
        """The job as JSON for the API; `queue_position` counts from 1 for the next job to start."""
        current = self.tasks.get(self.task or "", {})
        return {
            "id": self.job_id,
            "status": self.status,
            "request": self.request,
            "created": self.created,
            "started": self.started,
            "finished": self.finished,
            "queue_position": queue_position,
            "progress": {"task": self.task, "completed": current.get("completed"), "total": current.get("total"),
                         "tasks": {name: dict(state) for name, state in self.tasks.items()}},
            "log": list(self.log),
            "exit_code": self.exit_code,
            "result": self.result,
            "error": self.error,
        }

    def record_line(self, line: str) -> None:
        """Take one stderr line: a progress event updates `tasks`, anything else joins the log tail."""
        event = _progress_event(line)
        if event is None:
            self.log.append(line)
            return
        self.task = event["task"]
        self.tasks[event["task"]] = {"completed": event["completed"], "total": event.get("total"),
                                     "done": bool(event.get("done"))}

    def _end(self, status: JobStatus, error: str | None = None) -> None:
        self.status, self.error, self.finished = status, error, utc_now()
        self.process = None
        self.done.set()


def _progress_event(line: str) -> dict[str, Any] | None:
    """The progress event a line holds (a JSON object with a string `task` and an integer `completed`)."""
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("task"), str):
        return None
    completed = event.get("completed")
    return event if isinstance(completed, int) and not isinstance(completed, bool) else None


class QueueFull(WorkbenchError):
    """A job submitted while every slot is taken and the queue holds `max_queued` jobs already."""


class JobManager:
    """Runs jobs on the current asyncio loop, `max_running` at a time, at most `max_queued` more queued in
    order. Finished jobs are kept for their status, the `keep_finished` most recent ones.
    """

    def __init__(self, max_running: int = 1, grace_s: float = 10.0, keep_finished: int = 100,
                 max_queued: int = 8) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be at least 1, got {max_running}")
        if max_queued < 0:
            raise ValueError(f"max_queued must be at least 0, got {max_queued}")
        self.max_running = max_running
        self.max_queued = max_queued
        self.grace_s = grace_s
        self.keep_finished = keep_finished
        self._jobs: dict[str, Job] = {}
        self._queue: deque[Job] = deque()
        self._running: set[Job] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, argv: Sequence[str], request: dict[str, Any], cwd: Path | None = None,
               check: Callable[[], None] | None = None) -> Job:
        """Queue `argv` as a new job and start it if a slot is free; must be called on the loop. `check` runs
        as the job starts. Raises QueueFull when no slot is free and the queue is full."""
        if len(self._running) >= self.max_running and len(self._queue) >= self.max_queued:
            raise QueueFull(f"the capture queue is full: {len(self._running)} job(s) running and "
                            f"{len(self._queue)} waiting, the most this server allows; wait for one to end or "
                            "cancel one")
        job = Job(list(argv), request, cwd, check)
        self._jobs[job.job_id] = job
        self._queue.append(job)
        self._start_queued()
        self._forget_old()
        return job

    def get(self, job_id: str) -> Job | None:
        """The job `job_id`, or None if there is none (or it was forgotten)."""
        return self._jobs.get(job_id)

    def jobs(self) -> list[Job]:
        """Every job known, oldest first."""
        return list(self._jobs.values())

    def queue_position(self, job: Job) -> int | None:
        """1 for the next queued job to start, 2 for the one after...; None when `job` is not queued."""
        return self._queue.index(job) + 1 if job in self._queue else None

    def describe(self, job: Job) -> dict[str, Any]:
        """`job.to_dict` with its place in the queue."""
        return job.to_dict(self.queue_position(job))

    async def cancel(self, job: Job) -> Job:
        """Cancel `job`: a queued one leaves the queue; a running one is interrupted, then killed if it has
        not exited after the grace period. Returns when the job has ended (a finished job is returned as is)."""
        if job.is_finished:
            return job
        job.cancel_requested = True
        if job in self._queue:
            self._queue.remove(job)
            job._end("cancelled")
            return job
        _signal_group(job, signal.SIGINT)
        try:
            await asyncio.wait_for(job.done.wait(), self.grace_s)
        except asyncio.TimeoutError:
            _signal_group(job, signal.SIGKILL)
            await job.done.wait()
        return job

    async def shutdown(self) -> None:
        """Cancel every queued and running job and wait for them to end (the server is stopping)."""
        for job in list(self._queue):
            await self.cancel(job)
        await asyncio.gather(*(self.cancel(job) for job in list(self._running)))

    def _start_queued(self) -> None:
        while self._queue and len(self._running) < self.max_running:
            job = self._queue.popleft()
            try:
                if job.check is not None:
                    job.check()
            except WorkbenchError as exc:
                job._end("failed", str(exc))
                continue
            self._running.add(job)
            job.status, job.started = "running", utc_now()
            task = asyncio.ensure_future(self._run(job))
            self._tasks.add(task)  # a reference, so the task is not garbage-collected while it runs
            task.add_done_callback(self._tasks.discard)

    def _forget_old(self) -> None:
        finished = [job for job in self._jobs.values() if job.is_finished]
        for job in finished[: max(len(finished) - self.keep_finished, 0)]:
            del self._jobs[job.job_id]

    async def _run(self, job: Job) -> None:
        """Run `job` to its end; whatever happens, its slot is freed and the next queued job starts."""
        try:
            await self._run_process(job)
        except Exception as exc:  # a bug here must not leave the job running forever or block the queue
            _signal_group(job, signal.SIGKILL)
            job._end("failed", f"the server lost track of the job: {type(exc).__name__}: {exc}")
        finally:
            self._running.discard(job)
            self._start_queued()

    async def _run_process(self, job: Job) -> None:
        try:
            process = await asyncio.create_subprocess_exec(
                *job.argv, cwd=job.cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, limit=_LINE_LIMIT,
            )
        except OSError as exc:
            job._end("failed", f"cannot start {job.argv[0]}: {exc}")
            return
        job.process = process
        if job.cancel_requested:  # cancelled while the process was starting
            _signal_group(job, signal.SIGINT)
        assert process.stdout is not None and process.stderr is not None
        stdout, _ = await asyncio.gather(process.stdout.read(), _follow(job, process.stderr))
        job.exit_code = await process.wait()
        if job.cancel_requested:
            _signal_group(job, signal.SIGKILL)  # helpers the command left behind in its group
        _finish(job, stdout)


async def _follow(job: Job, stream: asyncio.StreamReader) -> None:
    """Feed `stream`'s lines to the job until EOF."""
    while True:
        try:
            raw = await stream.readline()
        except ValueError:  # a line longer than the limit (it is dropped from the buffer)
            job.log.append(f"[a line longer than {_LINE_LIMIT} bytes was left out]")
            continue
        if not raw:
            return
        job.record_line(raw.decode("utf-8", "replace").rstrip("\r\n"))


def _finish(job: Job, stdout: bytes) -> None:
    """Set the job's end state from its exit code and output: the result is stdout's JSON, when any."""
    text = stdout.decode("utf-8", "replace").strip()
    problem = None
    if text:
        try:
            job.result = json.loads(text)
        except ValueError as exc:
            problem = f"its output is not JSON ({exc}): {text[:200]!r}"
    if job.cancel_requested:
        job._end("cancelled")
    elif job.exit_code == 0 and problem is None:
        job._end("succeeded")
    else:
        job._end("failed", _failure(job, problem))


def _failure(job: Job, problem: str | None) -> str:
    """Why a job failed, in one line: the CLI's own `error:` line when it printed one."""
    errors = [line for line in job.log if line.startswith("error:")]
    if errors:
        return errors[-1].removeprefix("error:").strip()
    if problem:
        return problem
    if job.exit_code == EXIT_PARTIAL and job.result is not None:
        return ("some requests or load points failed (what completed was written); see the runs of the result"
                if job.argv[3:4] == ["serve"] else "some variants failed (the others were written); see the runs "
                "of the result")
    if job.exit_code == EXIT_INTERRUPTED:
        return "interrupted"
    return f"exited with code {job.exit_code}; see the log"


def _signal_group(job: Job, sig: signal.Signals) -> None:
    """Send `sig` to the job's process group (its command and any helpers it started), if it runs."""
    if job.process is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.process.pid, sig)
