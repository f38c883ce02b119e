"""`workbench export` (issue 29): a bundle written as a Perfetto protobuf trace or Chrome Trace Event JSON, imported
back with the same event counts per kind, kernel time and launch → kernel flows (Kineto, nsys and XSpace fixtures,
expected figures from the raw files where they can be read here), the protobuf checked against Perfetto's published
schema, the Perfetto reader on general and broken input, and the command's exit codes.

Perfetto's own parser (trace_processor) cannot run here: the `perfetto` package downloads its binary at first use.
The encoding is instead decoded with classes protoc generated from the published schema's messages
(`tests/data/perfetto/`), which share no code with the encoder.
"""

from __future__ import annotations

import gzip
import json
import random
import sqlite3
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import fixture_path, load_raw

from workbench.cli import main
from workbench.errors import TraceFormatError
from workbench.export import export_run
from workbench.imports import import_traces
from workbench.trace.model import Trace
from workbench.trace.registry import read_trace, sniff_format
from workbench.trace.store.bundle import open_bundle

pb = pytest.importorskip("google.protobuf")  # in the dev environment (xprof brings it); the workbench needs none
sys.path.insert(0, str(Path(__file__).resolve().parent / "data" / "perfetto"))
import perfetto_trace_subset_pb2 as schema  # noqa: E402
from google.protobuf.unknown_fields import UnknownFieldSet  # noqa: E402

KINETO = ("kineto", "resnet50_v100_train.pt.trace.json.gz")
NSYS = ("nsys", "h100_2gpu_1s.sqlite")
XSPACE = ("xspace", "tf_gpu_multi_worker", "plugins", "profile", "GPU-multi-worker")
SUFFIX = {"perfetto": ".perfetto-trace", "chrome": ".json"}
DEVICE = ("kernel", "memcpy", "memset")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def runs(root: Path) -> dict[str, str]:
    """Each fixture imported once: its run id."""
    paths = {"kineto": fixture_path(*KINETO), "nsys": fixture_path(*NSYS), "xspace": fixture_path(*XSPACE)}
    return {name: import_traces([path], root)[0] for name, path in paths.items()}


def _figures(trace: Trace, per_process: bool = False) -> tuple[dict[str, int], int, Counter]:
    """(events per kind, kernel ns, flows) of a Trace: a flow is a device event and the runtime call with its
    correlation id (in its process, where ids are counted per process: nsys, XSpace), told by (launch name, work
    name, work duration, work start less launch start)."""
    ev = trace.events.select(["start_ns", "dur_ns", "name", "kind", "corr", "pid"]).to_pandas()
    ev["kind"] = ev["kind"].astype(str)
    kernel_ns = int(ev.loc[ev["kind"] == "kernel", "dur_ns"].sum())
    key = ["pid", "corr"] if per_process else ["corr"]
    runtime = ev[(ev["kind"] == "runtime") & (ev["corr"] >= 0)].drop_duplicates(key, keep=False)
    work = ev[ev["kind"].isin(DEVICE) & (ev["corr"] >= 0)]
    joined = work.merge(runtime, on=key, suffixes=("", "_launch"))
    flows = Counter(zip(joined["name_launch"].astype(str), joined["name"].astype(str), joined["dur_ns"],
                        joined["start_ns"] - joined["start_ns_launch"], strict=True))
    return dict(ev["kind"].value_counts()), kernel_ns, flows


def _kineto_raw() -> tuple[dict[str, int], int, int]:
    """(events per kind, kernel ns, flows) of the raw Kineto fixture: X records by their 2021 category and instants
    other than `[memory]` as annotations, kernel durations in ns as the µs written, device records whose
    correlation id a runtime record has (as many as the file's `s` flow records)."""
    with gzip.open(fixture_path(*KINETO), "rt") as f:
        everything = json.load(f)["traceEvents"]
    records = [r for r in everything if r.get("ph") == "X"]
    kinds = {"Operator": "op", "Runtime": "runtime", "Kernel": "kernel", "Memcpy": "memcpy", "Memset": "memset",
             "Trace": "annotation"}
    counts = Counter(kinds[r["cat"]] for r in records)
    counts["annotation"] += sum(1 for r in everything if r.get("ph") == "i" and r.get("name") != "[memory]")
    kernel_ns = sum(round(r["dur"] * 1000) for r in records if r["cat"] == "Kernel")
    launched = {r["args"]["correlation"] for r in records if r["cat"] == "Runtime" and "correlation" in r["args"]}
    flows = sum(1 for r in records if r["cat"] in ("Kernel", "Memcpy", "Memset")
                and r["args"].get("correlation") in launched)
    assert flows == sum(1 for r in everything if r.get("ph") == "s")
    return dict(counts), kernel_ns, flows


def _nsys_raw() -> tuple[dict[str, int], int, int]:
    """(device events per kind, kernel ns, flows) of the raw nsys fixture: CUPTI activity rows, and device rows
    whose (process, correlation id) a CUDA runtime call has."""
    db = sqlite3.connect(f"file:{fixture_path(*NSYS)}?mode=ro", uri=True)
    tables = {"kernel": "CUPTI_ACTIVITY_KIND_KERNEL", "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
              "memset": "CUPTI_ACTIVITY_KIND_MEMSET"}
    counts = {kind: db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] for kind, table in tables.items()}
    kernel_ns = db.execute("SELECT SUM(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    launched = set(db.execute("SELECT (globalTid >> 24) & 16777215, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"))
    flows = sum(1 for table in tables.values() for row in
                db.execute(f"SELECT (globalPid >> 24) & 16777215, correlationId FROM {table}") if row in launched)
    db.close()
    return counts, kernel_ns, flows


@pytest.mark.parametrize("fmt", ["perfetto", "chrome"])
@pytest.mark.parametrize("name", ["kineto", "nsys", "xspace"])
def test_export_round_trip_keeps_counts_kernel_time_and_flows(name: str, fmt: str, runs: dict[str, str], root: Path,
                                                               tmp_path: Path) -> None:
    bundle = open_bundle(runs[name], root)
    out = tmp_path / f"{name}{SUFFIX[fmt]}"
    summary = export_run(bundle.path, fmt, out)
    back = read_trace(out)
    assert sniff_format(out) == ("perfetto" if fmt == "perfetto" else "kineto")
    counts, kernel_ns, flows = _figures(back)
    original_counts, original_kernel_ns, original_flows = _figures(bundle.trace(), per_process=name != "kineto")
    if name == "kineto":
        raw_counts, raw_kernel_ns, raw_flows = _kineto_raw()
        assert counts == raw_counts
    elif name == "nsys":  # its other kinds (NVTX ranges, runtime calls, overheads) come from many tables
        raw_counts, raw_kernel_ns, raw_flows = _nsys_raw()
        assert {k: counts[k] for k in DEVICE} == raw_counts
        assert counts == original_counts
    else:  # XSpace is protobuf that only jax's or xprof's parser reads here: the original import is the reference
        raw_kernel_ns, raw_flows = original_kernel_ns, sum(original_flows.values())
        assert counts == original_counts
    assert kernel_ns == raw_kernel_ns == original_kernel_ns
    assert sum(flows.values()) == summary["flows"] == raw_flows > 0
    assert flows == original_flows
    assert summary["kinds"] == original_counts and summary["events"] == back.events.num_rows
    assert summary["bytes"] == out.stat().st_size
    tracks = set(bundle.trace().events["track"].to_pylist())
    assert len(set(back.events["track"].to_pylist())) == len(tracks)
    if name == "kineto":  # Kineto's lanes come back with their labels in both formats, memory too in JSON
        assert set(back.events["track"].to_pylist()) == tracks
        memory = bundle.trace().memory.num_rows
        assert (back.memory.num_rows if fmt == "chrome" else back.counters.num_rows) == memory > 0


def _packets(path: Path) -> list[Any]:
    trace = schema.Trace()
    trace.ParseFromString(path.read_bytes())
    return list(trace.packet)


def _no_unknown_fields(message: Any) -> None:
    assert len(UnknownFieldSet(message)) == 0, f"{type(message).__name__} has fields the schema lacks"
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        for item in (value if field.is_repeated else [value]):
            _no_unknown_fields(item)


def test_perfetto_export_decodes_against_the_published_schema(runs: dict[str, str], root: Path,
                                                               tmp_path: Path) -> None:
    bundle = open_bundle(runs["nsys"], root)
    out = tmp_path / "nsys.perfetto-trace"
    summary = export_run(bundle.path, "perfetto", out)
    packets = _packets(out)
    for packet in packets:
        _no_unknown_fields(packet)
    assert all(p.trusted_packet_sequence_id == 1 for p in packets)
    assert packets[0].sequence_flags == schema.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    events = [p for p in packets if p.HasField("track_event")]
    assert all(p.sequence_flags == schema.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE for p in events
               if p.track_event.type != schema.TrackEvent.TYPE_COUNTER)
    described = {p.track_descriptor.uuid for p in packets if p.HasField("track_descriptor")}
    names: dict[int, str] = {}
    seen: Counter = Counter()
    stacks: dict[int, list[str]] = {}
    last: dict[int, int] = {}
    flows = ends = 0
    for p in events:
        for entry in p.interned_data.event_names:
            names[entry.iid] = entry.name
        e = p.track_event
        assert e.track_uuid in described
        assert p.timestamp >= last.get(e.track_uuid, 0)  # each track's events in time order
        last[e.track_uuid] = p.timestamp
        flows += len(e.terminating_flow_ids)
        if e.type == schema.TrackEvent.TYPE_SLICE_BEGIN:
            stacks.setdefault(e.track_uuid, []).append(names[e.name_iid])
            seen[names[e.name_iid]] += 1
        elif e.type == schema.TrackEvent.TYPE_SLICE_END:
            stacks[e.track_uuid].pop()
            ends += 1
        elif e.type == schema.TrackEvent.TYPE_INSTANT:
            seen[names[e.name_iid]] += 1
    assert not any(stacks.values())
    ev = bundle.trace().events
    assert seen == Counter(ev["name"].to_pylist())
    assert ends == int((ev["dur_ns"].to_numpy() > 0).sum())
    assert flows == summary["flows"]


def test_chrome_export_is_trace_event_json(runs: dict[str, str], root: Path, tmp_path: Path) -> None:
    bundle = open_bundle(runs["kineto"], root)
    out = tmp_path / "kineto.json"
    summary = export_run(bundle.path, "chrome", out)
    records = json.loads(out.read_text())["traceEvents"]
    phases = Counter(r["ph"] for r in records)
    assert phases["X"] == bundle.trace().events.num_rows
    assert phases["s"] == phases["f"] == summary["flows"]
    threads = {r["args"]["name"] for r in records if r["ph"] == "M" and r["name"] == "thread_name"}
    assert {"thread 25738", "stream 7"} <= threads


def _general_trace(path: Path) -> Path:
    """A TrackEvent trace as an instrumented app writes one, built with the schema's classes: a process and its
    thread, a custom track, interned names, nested slices, an instant, a flow and a counter track."""
    trace = schema.Trace()

    def packet(**fields: Any) -> Any:
        p = trace.packet.add(trusted_packet_sequence_id=7, **fields)
        return p

    app = schema.ProcessDescriptor(pid=42, process_name="app")
    packet(track_descriptor=schema.TrackDescriptor(uuid=1, process=app), sequence_flags=1)
    packet(track_descriptor=schema.TrackDescriptor(uuid=2, thread=schema.ThreadDescriptor(pid=42, tid=43,
                                                                                            thread_name="main")))
    packet(track_descriptor=schema.TrackDescriptor(uuid=3, parent_uuid=1, name="gpu queue"))
    packet(track_descriptor=schema.TrackDescriptor(uuid=4, name="fps", counter=schema.CounterDescriptor()))
    first = packet(timestamp=1000, track_event=schema.TrackEvent(type=1, track_uuid=2, name_iid=1, categories=["app"],
                                                                  flow_ids=[99]), sequence_flags=2)
    first.interned_data.event_names.add(iid=1, name="frame")
    packet(timestamp=1100, track_event=schema.TrackEvent(type=1, track_uuid=2, name="draw"), sequence_flags=2)
    packet(timestamp=1200, track_event=schema.TrackEvent(type=3, track_uuid=2, name="tick"), sequence_flags=2)
    packet(timestamp=1300, track_event=schema.TrackEvent(type=2, track_uuid=2), sequence_flags=2)
    packet(timestamp=1400, track_event=schema.TrackEvent(type=1, track_uuid=3, name="work", terminating_flow_ids=[99]))
    packet(timestamp=1450, track_event=schema.TrackEvent(type=4, track_uuid=4, double_counter_value=59.5))
    packet(timestamp=1500, track_event=schema.TrackEvent(type=2, track_uuid=3))
    packet(timestamp=2000, track_event=schema.TrackEvent(type=2, track_uuid=2))
    path.write_bytes(trace.SerializeToString())
    return path


def test_reader_reads_a_general_track_event_trace(tmp_path: Path) -> None:
    trace = read_trace(_general_trace(tmp_path / "app.pftrace"))
    rows = {r["name"]: r for r in trace.events.to_pylist()}
    assert rows["frame"]["dur_ns"] == 1000 and rows["frame"]["start_ns"] == 0 and rows["frame"]["depth"] == 0
    assert rows["draw"]["dur_ns"] == 200 and rows["draw"]["parent"] >= 0 and rows["tick"]["dur_ns"] == 0
    assert rows["frame"]["track"] == rows["draw"]["track"] == "cpu/main"
    assert rows["work"]["track"] == "cpu/gpu queue" and rows["work"]["dur_ns"] == 100
    assert rows["frame"]["corr"] == rows["work"]["corr"] >= 0  # the flow links them
    assert rows["frame"]["pid"] == 42 and rows["frame"]["tid"] == 43
    assert json.loads(rows["frame"]["args"]) == {"cat": "app"}
    assert trace.counters.to_pylist() == [{"ts_ns": 450, "device": "cpu", "name": "fps", "value": 59.5}]


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def test_reader_refuses_broken_input_naming_the_file(tmp_path: Path) -> None:
    good = _general_trace(tmp_path / "good.pftrace").read_bytes()
    cases = {
        "truncated": good[:len(good) - 5],
        "garbage": bytes(random.Random(1).randrange(256) for _ in range(4000)),
        "huge": b"\x0a" + _varint(1 << 40) + b"\x40\x01",
        "bad wire type": b"\x0a\x03\x47\x01\x02",
        "empty": b"",
    }
    for label, data in cases.items():
        path = tmp_path / f"{label.replace(' ', '-')}.perfetto-trace"
        path.write_bytes(data)
        with pytest.raises(TraceFormatError) as caught:
            read_trace(path, format="perfetto")
        assert str(path) in str(caught.value), label
    with pytest.raises(TraceFormatError, match="declares 1,099,511,627,776 bytes"):
        read_trace(tmp_path / "huge.perfetto-trace")


def test_mutated_traces_read_or_are_refused(tmp_path: Path) -> None:
    """A small fuzz: each mutation of a valid trace reads into a Trace or raises TraceFormatError, nothing else."""
    good = _general_trace(tmp_path / "seed.pftrace").read_bytes()
    rng = random.Random(29)
    outcomes = Counter()
    for case in range(400):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            choice = rng.random()
            if choice < 0.5:
                data[at] = rng.randrange(256)
            elif choice < 0.75:
                del data[at:at + rng.randint(1, 8)]
            else:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        path = tmp_path / f"case{case}.perfetto-trace"
        path.write_bytes(bytes(data))
        try:
            trace = read_trace(path, format="perfetto")
        except TraceFormatError as exc:
            assert str(path) in str(exc)
            outcomes["refused"] += 1
        else:
            assert (trace.events["dur_ns"].to_numpy() >= 0).all()
            outcomes["read"] += 1
        path.unlink()
    assert outcomes["read"] and outcomes["refused"]


def test_xspace_files_still_sniff_as_xspace(tmp_path: Path) -> None:
    folder = fixture_path(*XSPACE)
    xplane = next(folder.glob("*.xplane.pb"))
    assert sniff_format(xplane) == "xspace"
    renamed = tmp_path / "host.pb"
    renamed.write_bytes(xplane.read_bytes())
    assert sniff_format(renamed) == "xspace"


def test_cli_export_json_summary_default_name_and_exit_codes(runs: dict[str, str], root: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(main, ["export", runs["nsys"], "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["path"] == str(tmp_path / f"{runs['nsys']}.perfetto-trace") and summary["format"] == "perfetto"
    assert summary["kinds"]["kernel"] == 3442 and summary["flows"] > 0
    result = runner.invoke(main, ["export", runs["nsys"], "--format", "chrome", "--out", str(root), "--json"])
    assert json.loads(result.stdout)["path"] == str(tmp_path / f"{runs['nsys']}.json")
    for args in (["export", "no-such-run"], ["export", runs["nsys"], "-o", str(tmp_path)],
                 ["export", runs["nsys"], "--format", "svg"]):
        result = runner.invoke(main, [*args, "--out", str(root)])
        assert result.exit_code == 2, result.output
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error:")


def test_interrupted_export_leaves_no_file(runs: dict[str, str], root: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import workbench.export.chrome as chrome

    def interrupt(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(chrome, "_event", interrupt)
    out_before = tmp_path / "kept.json"
    out_before.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        export_run(open_bundle(runs["kineto"], root).path, "chrome", out_before)
    assert out_before.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]


def test_report_writes_each_runs_trace_beside_it_embedding_small_ones(runs: dict[str, str], root: Path,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import base64

    import workbench.report as report

    bundle = open_bundle(runs["nsys"], root)
    html_path = report.write_run_report([bundle], tmp_path / "r.html", "r")
    trace = tmp_path / f"r.{bundle.run_id}.perfetto-trace"
    assert sniff_format(trace) == "perfetto"
    html = html_path.read_text()
    assert trace.name in html and "ui.perfetto.dev" in html and "PING" in html
    assert base64.b64encode(trace.read_bytes()[:3000]).decode()[:4000] in html  # small: embedded
    monkeypatch.setattr(report, "EMBED_BYTES", 1000)
    html = report.write_run_report([bundle], tmp_path / "big.html", "big").read_text()
    assert base64.b64encode(trace.read_bytes()[:3000]).decode()[:4000] not in html  # large: fetched beside it


def test_an_export_named_pb_sniffs_as_perfetto(runs: dict[str, str], root: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.pb"
    export_run(open_bundle(runs["kineto"], root).path, "perfetto", out)
    assert sniff_format(out) == "perfetto"
    odd = tmp_path / "run.bin"
    odd.write_bytes(out.read_bytes())
    assert sniff_format(odd) == "perfetto"


@pytest.mark.parametrize("fmt", ["perfetto", "chrome"])
def test_critical_path_track_tiles_the_step(fmt: str, runs: dict[str, str], root: Path, tmp_path: Path) -> None:
    """`--critical-path` adds the typical step's path under the lanes: one slice per segment, tiling the step (its
    span from the raw trace's ProfilerStep#5), the trace's own events untouched."""
    raw = load_raw(fixture_path(*KINETO))["traceEvents"]
    step = next(e for e in raw if e.get("name") == "ProfilerStep#5")
    out = tmp_path / f"path{SUFFIX[fmt]}"
    result = CliRunner().invoke(main, ["export", runs["kineto"], "--format", fmt, "--critical-path", "-o", str(out),
                                       "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["critical_path"]["track"] == "critical path (step 0)"
    events = read_trace(out).df()
    pid = events["pid"].to_numpy()
    on_path = events[pid == pid[events["name"].astype(str).str.startswith("cpu op: ").to_numpy()][0]]
    assert len(on_path) == summary["critical_path"]["segments"]
    assert on_path["dur_ns"].sum() == round(step["dur"] * 1000)
    assert (on_path["kind"].astype(str) == "annotation").all()
    own = open_bundle(runs["kineto"], root).trace().events.num_rows
    assert len(events) == own + len(on_path)
