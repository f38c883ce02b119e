"""Capture defaults that keep numbers trustworthy and output clean: one torch thread on machines of few cores
unless told otherwise (`workbench.threads`), and native profilers' log lines (Kineto's `USDT:`/`STAGE:`, glog-style
XLA and TensorFlow lines) filtered out of fds 1 and 2 while a profiler runs (`workbench.profiling.quiet`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import TINY_CAPTURE

from workbench import threads
from workbench.profiling.quiet import NativeChatter

CHATTER = [
    b"USDT:2026-12-03 14:00:55 9240:9240 SyncActivityProfilerHandler.cpp:52] profiler_start\n",
    b"STAGE:2026-12-03 14:00:36 9071:9071 SyncActivityProfilerHandler.cpp:60] Completed Stage: Collection\n",
    b"I1203 14:00:48.123456 1234 xplane_to_trace.cc:12] Converted 3 planes\n",
    b"W1203 14:00:48.123456   77 cpu_client.cc:9] cpu client created\n",
    b"2026-12-03 14:00:48.123456: I external/xla/xla/pjrt/pjrt_client.cc:12] started\n",
    b"ERROR:2026-12-03 13:31:50 16043:16043 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35\n",
]
KEPT = [b"{\"task\": \"profile eager\", \"completed\": 1, \"total\": 7, \"done\": false}\n", b"plain output\n",
        b"F1203 14:00:48.123456 1234 fatal.cc:1] Check failed: a fatal error is never hidden\n",
        b"\r\x1b[2Kprogress 3/7"]


@pytest.mark.parametrize(("cores", "given", "used"), [(1, None, 1), (2, None, 1), (4, None, 1), (8, None, None),
                                                      (2, 3, 3), (16, 2, 2)])
def test_one_thread_by_default_on_few_cores(monkeypatch, cores, given, used):
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    assert threads.default_threads(given) == used


def test_torch_threads_applies_the_default_and_restores(monkeypatch):
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    with threads.torch_threads(None):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_native_chatter_is_left_out_and_the_rest_passes_in_order(capfd):
    with NativeChatter():
        for fd in (1, 2):
            for line in [CHATTER[0], KEPT[0], *CHATTER[1:3], KEPT[1], *CHATTER[3:], KEPT[2], KEPT[3]]:
                os.write(fd, line)
    out, err = capfd.readouterr()
    for text in (out, err):
        assert text.encode() == b"".join(KEPT)


def test_a_closed_filter_restores_the_descriptors(capfd):
    chatter = NativeChatter()
    chatter.close()
    chatter.close()  # idempotent
    os.write(2, CHATTER[0])
    assert capfd.readouterr().err.encode() == CHATTER[0]


@pytest.mark.slow
def test_a_capture_prints_no_profiler_chatter(tmp_path):
    """A real CPU capture through the CLI, after checking that torch.profiler prints chatter here at all."""
    bare = subprocess.run([sys.executable, "-c", "import torch\nwith torch.profiler.profile():\n    torch.ones(2) + 1"],
                          capture_output=True, timeout=300)
    if b"USDT:" not in bare.stdout + bare.stderr:
        pytest.skip("this torch's Kineto prints no USDT lines: nothing to filter")
    done = subprocess.run([sys.executable, "-m", "workbench", "capture", *TINY_CAPTURE, "--variants", "eager",
                           "--out", str(tmp_path / "traces")], capture_output=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    for stream in (done.stdout, done.stderr):
        assert b"USDT:" not in stream and b"STAGE:" not in stream
    assert b"profile eager" in done.stderr  # the progress bars still reach the terminal
    assert b"experiment" in done.stdout
