"""XSpace reader on GPU device planes: a real two-host TensorFlow GPU profile (the XSpace structure JAX
writes on GPUs too) and small XSpaces in XLA's newer GPU layout built from text.

Expected figures come from the raw files through `jax.profiler.ProfileData`, never from the reader.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import fixture_path

from workbench.analysis.breakdown import kernel_time_by_device
from workbench.cli import main
from workbench.trace import read_trace
from workbench.trace.model import Trace

jax = pytest.importorskip("jax", reason="the XSpace reader needs jax (pip install 'workbench[jax]')")

RUN = ("xspace", "tf_gpu_multi_worker", "plugins", "profile", "GPU-multi-worker")
GPU_PLANE = re.compile(r"/device:GPU:(\d+)")
STREAM_LINE = re.compile(r"Stream #\d+\((\w+)\)")
DERIVED_LINES = {"TensorFlow Ops": "op", "TensorFlow Name Scope": "annotation", "Steps": "annotation"}


def _raw_host(path: Path) -> dict[str, Any]:
    """Per GPU and kind (stream lines only): [count, ns]; the correlation ids of the host's launch and copy
    calls, and those of them that run inside an enclosing range on their thread."""
    work: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    calls: set[int] = set()
    enclosed: set[int] = set()
    for plane in jax.profiler.ProfileData.from_file(str(path)).planes:
        gpu = GPU_PLANE.fullmatch(plane.name)
        for line in plane.lines:
            stream = STREAM_LINE.fullmatch(line.name)
            if gpu and stream:
                kind = "kernel" if stream[1] == "Compute" else "memcpy" if stream[1].startswith("Memcpy") else "?"
                for event in line.events:
                    work[(f"cuda:{gpu[1]}", kind)][0] += 1
                    work[(f"cuda:{gpu[1]}", kind)][1] += round(event.duration_ns)
            elif not gpu:
                open_ends: list[float] = []
                for event in sorted(line.events, key=lambda e: (e.start_ns, -e.duration_ns)):
                    while open_ends and open_ends[-1] <= event.start_ns:
                        open_ends.pop()
                    corr = dict(event.stats).get("correlation_id")
                    if corr is not None:
                        calls.add(corr)
                        if open_ends:
                            enclosed.add(corr)
                    open_ends.append(event.start_ns + event.duration_ns)
    return {"work": dict(work), "calls": calls, "enclosed": enclosed}


@pytest.fixture(scope="module")
def run_dir() -> Path:
    return fixture_path(*RUN)


@pytest.fixture(scope="module")
def raw(run_dir: Path) -> dict[str, dict[str, Any]]:
    """`_raw_host` per host (file stem), in file-name order (the reader's `pid` order)."""
    return {p.name.removesuffix(".xplane.pb"): _raw_host(p) for p in sorted(run_dir.glob("*.xplane.pb"))}


@pytest.fixture(scope="module")
def trace(run_dir: Path) -> Trace:
    return read_trace(run_dir)


@pytest.fixture(scope="module")
def events(trace: Trace) -> Any:
    frame = trace.df()
    for column in ("kind", "device", "track", "name"):
        frame[column] = frame[column].astype(str)
    return frame


def _expected(raw: dict[str, dict[str, Any]], kind: str) -> dict[str, list[int]]:
    return {f"{host}/{gpu}": counts for host, r in raw.items() for (gpu, k), counts in r["work"].items() if k == kind}


def test_the_fixture_is_two_hosts_with_665_kernels_on_gpu_4_and_6(raw: dict[str, dict[str, Any]]) -> None:
    """The raw figures the issue quotes (from ProfileData alone), so the fixture is the one described."""
    assert len(raw) == 2
    for r in raw.values():
        assert r["work"][("cuda:4", "kernel")] == [665, 14_825_385]
        assert r["work"][("cuda:6", "kernel")] == [665, 14_865_363]


def test_kernels_and_copies_per_host_and_gpu_match_the_raw_file(events: Any, raw: dict[str, dict[str, Any]]) -> None:
    for kind in ("kernel", "memcpy"):
        rows = events[events["kind"] == kind]
        got = {d: [len(g), int(g["dur_ns"].sum())] for d, g in rows.groupby("device")}
        assert got == _expected(raw, kind), kind
    assert not (events["kind"] == "other").any()  # every line of this profile has a kind of its own


def test_hosts_are_kept_apart(events: Any, raw: dict[str, dict[str, Any]]) -> None:
    hosts = list(raw)
    kernels = events[events["kind"] == "kernel"]
    assert set(kernels["device"]) == {f"{h}/cuda:{n}" for h in hosts for n in (4, 6)}
    for pid, host in enumerate(hosts):
        mine = events[events["device"].str.startswith(f"{host}/")]
        assert set(mine["pid"]) == {pid}
        assert set(mine["track"].map(lambda t: t.split("/")[0])) == {host}
    host_rows = events[events["device"] == "cpu"]
    assert set(host_rows["pid"]) == {0, 1}
    assert all(t.split("/")[1] in hosts for t in host_rows["track"])


def test_every_kernel_and_copy_is_on_its_stream_track(events: Any) -> None:
    for kind, types in (("kernel", r"Compute"), ("memcpy", r"Memcpy\w+")):
        rows = events[events["kind"] == kind]
        pattern = re.compile(rf"(?P<device>[^/]+/cuda:\d+)/Stream #\d+\({types}\)")
        matches = [pattern.fullmatch(t) for t in rows["track"]]
        assert all(matches), kind
        assert [m["device"] for m in matches] == rows["device"].tolist()


def test_derived_lines_have_their_own_kinds_and_no_kernel_time(trace: Trace, events: Any,
                                                               raw: dict[str, dict[str, Any]]) -> None:
    line = events["track"].map(lambda t: t.rsplit("/", 1)[-1])
    for name, kind in DERIVED_LINES.items():
        rows = events[line == name]
        assert len(rows) and set(rows["kind"]) == {kind}, name
    # "TensorFlow Ops" spans exactly the kernels: counting it too would double the kernel time.
    ops_on_gpu = events[(line == "TensorFlow Ops")]
    kernel_ns = {d: ns for d, (_, ns) in _expected(raw, "kernel").items()}
    assert ops_on_gpu.groupby("device")["dur_ns"].sum().to_dict() == kernel_ns
    assert kernel_time_by_device(trace) == kernel_ns  # what `workbench show` reports as kernel time


def test_launch_links_through_correlation_ids(events: Any, raw: dict[str, dict[str, Any]]) -> None:
    device_work = events[events["kind"].isin(["kernel", "memcpy"])]
    runtime = events[events["kind"] == "runtime"]
    assert (device_work["corr"] >= 0).all() and (runtime["corr"] >= 0).all()
    assert (runtime["device"] == "cpu").all()
    kernels = device_work[device_work["kind"] == "kernel"]
    assert (kernels["launcher"] >= 0).mean() == 1.0  # every kernel's launch runs inside a TF op
    for pid, r in enumerate(raw.values()):
        assert set(runtime.loc[runtime["pid"] == pid, "corr"]) == r["calls"]
        mine = device_work[device_work["pid"] == pid]
        assert set(mine["corr"]) == r["calls"]
        assert set(mine.loc[mine["launcher"] >= 0, "corr"]) == r["enclosed"]  # copies from bare threads: none
    calls = runtime.reset_index().set_index(["pid", "corr"])["index"]
    for row in kernels.itertuples():
        launcher = events.loc[row.launcher]
        call = events.loc[calls[(row.pid, row.corr)]]
        assert (launcher["kind"], launcher["device"], launcher["pid"]) == ("op", "cpu", row.pid)
        assert launcher["track"] == call["track"]
        assert launcher["start_ns"] <= call["start_ns"] < launcher["start_ns"] + launcher["dur_ns"]


def test_launch_configuration_and_copy_sizes(events: Any) -> None:
    kernel = events[events["kind"] == "kernel"].iloc[0]
    args = json.loads(kernel["args"])
    details = dict(p.split(":") for p in args["kernel_details"].split())
    assert args["grid"] == [int(v) for v in details["grid"].split(",")]
    assert args["block"] == [int(v) for v in details["block"].split(",")]
    assert (args["registers per thread"], args["shared memory"]) == (int(details["regs"]), int(details["shm"]))
    assert "correlation_id" not in args  # in the corr column
    for row in events[events["kind"] == "memcpy"].itertuples():
        size = re.search(r"size:(\d+)", json.loads(row.args)["memcpy_details"])
        assert row.bytes == float(size[1])


def test_device_properties_from_the_plane_stats(trace: Trace, run_dir: Path) -> None:
    expected = {}
    for path in sorted(run_dir.glob("*.xplane.pb")):
        host = path.name.removesuffix(".xplane.pb")
        for plane in jax.profiler.ProfileData.from_file(str(path)).planes:
            if gpu := GPU_PLANE.fullmatch(plane.name):
                expected[f"{host}/cuda:{gpu[1]}"] = dict(plane.stats)
    got = {d["device"]: d for d in trace.metadata["devices"]}
    assert got.keys() == expected.keys()
    for device, stats in expected.items():
        props = got[device]
        assert props["sm_count"] == stats["core_count"]
        assert props["memory_bytes"] == stats["memory_size"]
        assert props["memory_bandwidth_bytes_per_s"] == stats["memory_bandwidth"]
        assert props["clock_hz"] == stats["clock_rate"] * 1000  # the stat is in kHz
        assert props["compute_capability"] == f"{stats['compute_cap_major']}.{stats['compute_cap_minor']}"


def test_cli_import_show_and_analyze_see_the_kernels(run_dir: Path, raw: dict[str, dict[str, Any]],
                                                     tmp_path: Path) -> None:
    runner, root = CliRunner(), tmp_path / "traces"

    def invoke(*args: Any) -> Any:
        result = runner.invoke(main, [str(a) for a in args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    (run_id,) = invoke("import", run_dir, "--out", root, "--json")
    summary = invoke("show", run_id, "--out", root, "--json")
    kernels = _expected(raw, "kernel")
    assert summary["kernel_ns"] == {d: ns for d, (_, ns) in kernels.items()}
    assert summary["events"]["kernel"] == sum(n for n, _ in kernels.values())
    assert summary["top_kernels"] and summary["top_kernels"][0]["total_ns"] > 0
    report = invoke("analyze", run_id, "--out", root, "--json")
    copies = _expected(raw, "memcpy")
    for device, (_, kernel_ns) in kernels.items():
        busy = report["idle"][device]["busy_ns"]
        assert kernel_ns <= busy <= kernel_ns + copies.get(device, [0, 0])[1]


_XLA_GPU_XSPACE = """
planes {
  id: 1 name: "/host:CPU"
  lines { id: 11 name: "python" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 5000000 }
    events { metadata_id: 2 offset_ps: 1000000 duration_ps: 1000000 stats { metadata_id: 1 uint64_value: 5 } } }
  event_metadata { key: 1 value { id: 1 name: "dot_general:DotGeneral" } }
  event_metadata { key: 2 value { id: 2 name: "cuLaunchKernel" } }
  stat_metadata { key: 1 value { id: 1 name: "correlation_id" } }
}
planes {
  id: 2 name: "/host:CUPTI"
  lines { id: 77 name: "Host Threads/77" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 2500000 duration_ps: 500000 stats { metadata_id: 1 uint64_value: 6 } } }
  event_metadata { key: 1 value { id: 1 name: "cuMemcpyDtoDAsync_v2" } }
  stat_metadata { key: 1 value { id: 1 name: "correlation_id" } }
}
planes {
  id: 3 name: "/device:GPU:0"
  stats { metadata_id: 10 str_value: "NVIDIA H100 80GB HBM3" }
  stats { metadata_id: 11 str_value: "Nvidia" }
  stats { metadata_id: 12 int64_value: 132 }
  lines { id: 7 name: "Stream #7(Kernel,MemcpyD2D)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 4000000 duration_ps: 2000000 stats { metadata_id: 1 uint64_value: 5 }
             stats { metadata_id: 2
               str_value: "regs:32 static_shared:512 dynamic_shared:1024 grid:8,2,1 block:128,1,1 occ_pct:50.0" } }
    events { metadata_id: 2 offset_ps: 7000000 duration_ps: 1000000 stats { metadata_id: 1 uint64_value: 6 }
             stats { metadata_id: 3 str_value: "kind_src:device kind_dst:device size:4096 dest:0 async:1" } } }
  lines { id: 8 name: "Stream #8(Memset)" timestamp_ns: 1000
    events { metadata_id: 3 offset_ps: 9000000 duration_ps: 500000
             stats { metadata_id: 4 str_value: "kind:device num_bytes:256 async:1" } } }
  lines { id: 9 name: "Stream #9(CudaGraph)" timestamp_ns: 1000
    events { metadata_id: 6 offset_ps: 9000000 duration_ps: 500000 } }
  lines { id: 100 name: "XLA Ops" timestamp_ns: 1000
    events { metadata_id: 4 offset_ps: 4000000 duration_ps: 2000000 } }
  lines { id: 101 name: "Framework Ops" timestamp_ns: 1000
    events { metadata_id: 5 offset_ps: 4000000 duration_ps: 2000000 } }
  lines { id: 102 name: "Launch Stats" timestamp_ns: 1000
    events { metadata_id: 5 offset_ps: 4000000 duration_ps: 2000000 } }
  event_metadata { key: 1 value { id: 1 name: "loop_fusion_kernel" } }
  event_metadata { key: 2 value { id: 2 name: "MemcpyD2D" } }
  event_metadata { key: 3 value { id: 3 name: "Memset" } }
  event_metadata { key: 4 value { id: 4 name: "fusion.1" } }
  event_metadata { key: 5 value { id: 5 name: "jit_f/dot_general" } }
  event_metadata { key: 6 value { id: 6 name: "graph launch" } }
  stat_metadata { key: 1 value { id: 1 name: "correlation_id" } }
  stat_metadata { key: 2 value { id: 2 name: "kernel_details" } }
  stat_metadata { key: 3 value { id: 3 name: "memcpy_details" } }
  stat_metadata { key: 4 value { id: 4 name: "Memset_details" } }
  stat_metadata { key: 10 value { id: 10 name: "gpu_device_name" } }
  stat_metadata { key: 11 value { id: 11 name: "device_vendor" } }
  stat_metadata { key: 12 value { id: 12 name: "core_count" } }
}
planes {
  id: 4 name: "/device:GPU:1"
  stats { metadata_id: 11 str_value: "AMD" }
  lines { id: 1 name: "Stream #1(Kernel)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 1000000 } }
  event_metadata { key: 1 value { id: 1 name: "rocm_kernel" } }
  stat_metadata { key: 11 value { id: 11 name: "device_vendor" } }
}
"""


@pytest.fixture
def xla_gpu_rows(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The rows of the XLA-layout XSpace above (one host), by name."""
    path = tmp_path / "gpuhost.xplane.pb"
    path.write_bytes(jax.profiler.ProfileData.text_proto_to_serialized_xspace(_XLA_GPU_XSPACE))
    trace = read_trace(path)
    rows = trace.events.to_pylist()
    by_name = {r["name"]: {**r, "row": i} for i, r in enumerate(rows)}
    derived = [(r["track"], r["kind"]) for r in rows if r["name"] == "jit_f/dot_general"]
    return {**by_name, "metadata": trace.metadata, "jit_f/dot_general": derived}


def test_xla_gpu_layout_kinds_per_stream_event_and_line(xla_gpu_rows: dict[str, dict[str, Any]]) -> None:
    kinds = {name: (r["kind"], r["device"], r["track"]) for name, r in xla_gpu_rows.items() if isinstance(r, dict)
             and "kind" in r}
    assert kinds["loop_fusion_kernel"] == ("kernel", "cuda:0", "cuda:0/Stream #7(Kernel,MemcpyD2D)")
    assert kinds["MemcpyD2D"] == ("memcpy", "cuda:0", "cuda:0/Stream #7(Kernel,MemcpyD2D)")
    assert kinds["Memset"] == ("memset", "cuda:0", "cuda:0/Stream #8(Memset)")
    assert kinds["graph launch"][0] == "other"  # a stream's event that is no kernel, copy or memset
    assert kinds["fusion.1"] == ("hlo", "cuda:0", "cuda:0/XLA Ops")
    derived = sorted(xla_gpu_rows["jit_f/dot_general"])
    assert derived == [("cuda:0/Framework Ops", "op"), ("cuda:0/Launch Stats", "other")]
    assert kinds["rocm_kernel"] == ("kernel", "rocm:1", "rocm:1/Stream #1(Kernel)")  # vendor AMD, no details
    assert kinds["cuLaunchKernel"] == ("runtime", "cpu", "cpu/python")
    assert kinds["cuMemcpyDtoDAsync_v2"] == ("runtime", "cpu", "cpu/host:CUPTI/Host Threads/77")
    assert kinds["dot_general:DotGeneral"][0] == "op"
    assert xla_gpu_rows["Memset"]["bytes"] == 256.0 and xla_gpu_rows["MemcpyD2D"]["bytes"] == 4096.0
    kernel_args = json.loads(xla_gpu_rows["loop_fusion_kernel"]["args"])
    assert (kernel_args["grid"], kernel_args["block"]) == ([8, 2, 1], [128, 1, 1])
    assert (kernel_args["registers per thread"], kernel_args["shared memory"]) == (32, 512 + 1024)


def test_xla_gpu_layout_links_and_device_properties(xla_gpu_rows: dict[str, dict[str, Any]]) -> None:
    kernel, copy = xla_gpu_rows["loop_fusion_kernel"], xla_gpu_rows["MemcpyD2D"]
    assert (kernel["corr"], xla_gpu_rows["cuLaunchKernel"]["corr"]) == (5, 5)
    assert kernel["launcher"] == xla_gpu_rows["dot_general:DotGeneral"]["row"]
    # The CUPTI plane's call sits on a thread line of its own, with no host op around it.
    assert (copy["corr"], copy["launcher"]) == (6, -1)
    assert xla_gpu_rows["Memset"]["corr"] == -1 and xla_gpu_rows["fusion.1"]["launcher"] == -1
    devices = {d["device"]: d for d in xla_gpu_rows["metadata"]["devices"]}
    assert (devices["cuda:0"]["name"], devices["cuda:0"]["sm_count"]) == ("NVIDIA H100 80GB HBM3", 132)
    assert devices["rocm:1"]["vendor"] == "AMD"
