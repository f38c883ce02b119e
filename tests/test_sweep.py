"""Sweeps: `capture --batch 1,2,4` runs every (variant, shape) into one experiment, timed interleaved; the sweep
table, crossovers and Pareto front (checked on synthetic tables with known answers); the curves in the comparison
view; the notebook accessors; single-shape and old experiments as before; bad sizes refused in one line."""

from __future__ import annotations

import dataclasses
import json
import math
import tarfile
from pathlib import Path

import pandas as pd
import pytest
from bokeh.models import DataTable, LogScale
from bokeh.plotting import figure as Figure
from click.testing import CliRunner

import workbench as wb
from workbench import experiment as experiment_module
from workbench.analysis.experiment_tables import variant_table
from workbench.analysis.sweep import SWEEP_COLUMNS, crossovers, is_sweep, pareto, sweep_table
from workbench.cli import main
from workbench.cli.capture import sweep_blocks
from workbench.errors import BundleError, WorkbenchError
from workbench.experiment import ExperimentSettings
from workbench.server.capture_fields import json_type_of
from workbench.trace.store.bundle import open_bundle
from workbench.trace.store.experiment import read_experiment, write_experiment
from workbench.trace.store.records import ExperimentRecord, RunInfo, display_name, series_name
from workbench.trace.store.resolve import resolve_runs
from workbench.views.experiments import experiments_view
from workbench.views.text_tables import TextTable

OLD = Path(__file__).parent / "data" / "bundles-0.1.0-d3606ea.tar.gz"
MLP = ["--model", "mlp", "--set", "hidden=64", "--variants", "eager,bf16", "--iterations", "3", "--warmup", "1",
       "--threads", "1"]
BATCHES = (1, 2, 4)
LABELS = [f"{variant}-b{batch}" for variant in ("eager", "bf16") for batch in BATCHES]


@dataclasses.dataclass
class Sweep:
    root: Path
    out: dict
    visits: list[str]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Sweep:
    """One mlp sweep over batch 1, 2, 4 of eager and bf16, the largest shape profiled; every benchmark call of
    every (variant, shape) logged in order."""
    root = tmp_path_factory.mktemp("sweep")
    visits: list[str] = []
    workload = experiment_module._Experiment.workload

    def logged(self, run):
        timed = workload(self, run)
        call = timed.fn
        return dataclasses.replace(timed, fn=lambda: (visits.append(run.label), call())[1])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(experiment_module._Experiment, "workload", logged)
        done = CliRunner().invoke(main, ["capture", *MLP, "--batch", "1,2,4", "--profile-shapes", "largest",
                                         "--profile-steps", "1", "--steady-state-only", "--json", "--out", str(root)])
    assert done.exit_code == 0, done.output
    return Sweep(root, json.loads(done.stdout), visits)


def test_one_experiment_with_one_run_per_variant_and_shape(sweep):
    runs = sweep.out["runs"]
    assert [r["label"] for r in runs] == LABELS and all(r["status"] == "ok" for r in runs)
    assert [(r["variant"], r["batch"], r["seq"]) for r in runs] == [(v, b, None) for v in ("eager", "bf16")
                                                                    for b in BATCHES]
    path = sweep.root / "experiments" / f"{sweep.out['experiment']}.json"
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 2
    assert raw["grid"] == {"batch": [1, 2, 4], "seq": [None], "profile_shapes": "largest"}
    record = ExperimentRecord.from_json(raw, path.stem)
    assert record.grid == raw["grid"] and record.variants == LABELS and record.runs == [r["run_id"] for r in runs]
    for run in runs:
        bundle = open_bundle(run["run_id"], sweep.root)
        info = bundle.record
        assert (info.variant_name, info.batch, info.items_per_call, info.label) == (run["variant"], run["batch"],
                                                                                    run["batch"], run["label"])
        assert info.variant["batch"] == run["batch"] and display_name(info) == run["label"]
        profiled = run["batch"] == 4  # --profile-shapes largest
        assert bundle.has_trace is profiled and (info.capture is not None) is profiled


def test_every_benchmark_round_visits_every_variant_and_shape(sweep):
    rounds = 1 + 3  # warmup + iterations
    visits = sweep.visits
    assert len(visits) == rounds * len(LABELS)
    for r in range(rounds):
        assert sorted(visits[r * 6:(r + 1) * 6]) == sorted(LABELS), r
    assert len({tuple(visits[r * 6:(r + 1) * 6]) for r in range(rounds)}) > 1  # the order rotates between rounds


def test_the_sweep_table_has_a_curve_per_variant(sweep):
    bundles = resolve_runs([sweep.out["experiment"]], sweep.root)
    assert is_sweep(bundles)
    table = sweep_table(bundles)
    assert list(table.columns) == list(SWEEP_COLUMNS)
    curves = table.groupby("series", sort=False)["batch"].apply(list).to_dict()
    assert curves == {"eager": [1, 2, 4], "bf16": [1, 2, 4]}
    for row in table.itertuples():
        bench = json.loads((sweep.root / row.run / "run.json").read_text())["benchmark"]
        assert row.p50_ms == bench["p50"] and row.p99_ms == bench["p99"]
        assert row.items_per_s == pytest.approx(row.batch * 1e3 / bench["p50"])
        assert pd.isna(row.peak_bytes) is bool(row.batch != 4)
    eager = table[table["series"] == "eager"].set_index("batch")["p50_ms"]
    bf16 = table[table["series"] == "bf16"].set_index("batch")
    assert (table.loc[table["series"] == "eager", "speedup"] == 1.0).all()
    assert bf16["speedup"].tolist() == pytest.approx((eager / bf16["p50_ms"]).tolist())
    # the comparison table's speedups are per shape too
    compared = variant_table(bundles).set_index("variant")
    assert compared.loc["bf16-b2", "speedup"] == pytest.approx(eager[2] / bf16.loc[2, "p50_ms"])


def test_json_and_text_summaries_carry_the_sweep(sweep):
    summary = sweep.out["sweep"]
    assert [row["label"] for row in summary["table"]] == LABELS
    assert {row["run"] for row in summary["pareto"]} <= {row["run"] for row in summary["table"]}
    assert summary["pareto"] and all(set(row) >= {"p50_ms", "items_per_s", "on_front"} for row in summary["pareto"])
    blocks = sweep_blocks(summary)
    table = blocks[0]
    assert isinstance(table, TextTable) and "seq" not in table.columns and len(table.rows) == 6
    assert len(blocks) == 1 + len(summary["crossovers"])


def test_the_comparison_view_shows_the_curves(sweep):
    """The comparison view (which the HTML report, the panel's compare route and `wb.compare` place) opens on
    the sweep's curves."""
    bundles = resolve_runs([sweep.out["experiment"]], sweep.root)
    layout = experiments_view(bundles)
    titles = {fig.title.text for fig in layout.select({"type": Figure})}
    assert {"throughput (items/s at p50)", "Pareto: latency vs throughput (front outlined)"} <= titles
    batch_axes = [fig for fig in layout.select({"type": Figure}) if fig.xaxis[0].axis_label == "batch (log2)"]
    assert len(batch_axes) == 3 and all(isinstance(fig.x_scale, LogScale) for fig in batch_axes)
    assert list(batch_axes[0].xaxis[0].ticker.ticks) == [1, 2, 4]
    assert len(list(layout.select({"type": DataTable}))) >= 2


def test_the_notebook_gives_the_sweep_as_dataframes(sweep):
    experiment = sweep.out["experiment"]
    table = wb.sweep_table(experiment, root=sweep.root)
    assert table["label"].tolist() == LABELS
    front = wb.pareto(experiment, root=sweep.root)
    assert front["on_front"].any() and set(front["run"]) == set(table["run"])
    assert list(wb.crossovers(experiment, root=sweep.root).columns)[:4] == ["seq", "new", "winner", "loser"]


def _table(rows: list[tuple[str, int, int | None, float, float]]) -> pd.DataFrame:
    """A synthetic sweep table: (series, batch, seq, p50_ms, items_per_s) per row, every run ok."""
    frame = pd.DataFrame(rows, columns=["series", "batch", "seq", "p50_ms", "items_per_s"])
    return frame.assign(label=frame["series"] + "-b" + frame["batch"].astype(str), run=frame.index.astype(str),
                        status="ok", new=None)


def test_crossovers_of_a_synthetic_sweep():
    p50 = {"eager": [1.0, 2.0, 4.0, 8.0], "compile": [2.0, 2.5, 3.0, 4.0], "int8": [0.5, 1.0, 5.0, 9.0],
           "slow": [3.0, 4.0, 9.0, 9.0]}
    table = _table([(name, b, 128, ms, b / ms) for name, values in p50.items()
                    for b, ms in zip((1, 2, 4, 8), values, strict=True)])
    found = crossovers(table).set_index("winner")
    assert set(found.index) == {"compile", "eager"} and "slow" not in set(found["loser"])
    compile_ = found.loc["compile"]  # loses to eager at 2 (2.5 vs 2), wins at 4 (3 vs 4)
    assert (compile_["loser"], compile_["batch_below"], compile_["batch_above"]) == ("eager", 2, 4)
    assert compile_["speedup_below"] == pytest.approx(2.0 / 2.5) and compile_["speedup_above"] == pytest.approx(4 / 3)
    t = math.log(0.8) / (math.log(0.8) - math.log(4 / 3))
    assert compile_["crossover_batch"] == pytest.approx(2 ** (1 + t))
    # where the curves meet, both (log-log interpolated) have the same latency
    assert compile_["value"] == pytest.approx(math.exp(math.log(2.5) + t * math.log(3 / 2.5)))
    assert compile_["value"] == pytest.approx(math.exp(math.log(2.0) + t * math.log(4 / 2.0)))
    eager = found.loc["eager"]  # int8 wins at 2 (1 vs 2), loses at 4 (5 vs 4): eager starts to beat int8
    assert (eager["loser"], eager["batch_below"], eager["batch_above"]) == ("int8", 2, 4)
    assert eager["speedup_below"] == pytest.approx(0.5) and eager["speedup_above"] == pytest.approx(5 / 4)
    every = crossovers(table, reference=None)
    assert set(zip(every["winner"], every["loser"], strict=True)) == {("compile", "eager"), ("eager", "int8"),
                                                                      ("compile", "int8")}
    by_throughput = crossovers(table, metric="items_per_s")
    assert sorted(by_throughput["winner"]) == ["compile", "eager"]


def test_crossovers_stay_within_a_sequence_length():
    table = _table([("eager", 1, 128, 1.0, 1.0), ("eager", 2, 128, 2.0, 1.0), ("compile", 1, 128, 2.0, 0.5),
                    ("compile", 2, 128, 1.0, 2.0), ("eager", 1, 512, 1.0, 1.0), ("compile", 2, 512, 0.5, 4.0)])
    found = crossovers(table)
    assert found[["seq", "winner", "batch_above"]].values.tolist() == [[128, "compile", 2]]


def test_the_pareto_front_of_a_synthetic_sweep():
    table = _table([("a", 1, 128, 1.0, 100.0), ("a", 2, 128, 2.0, 300.0), ("b", 2, 128, 2.0, 200.0),
                    ("b", 4, 128, 3.0, 300.0), ("a", 4, 128, 4.0, 500.0), ("b", 8, 512, 9.0, 10.0)])
    front = pareto(table)
    on = set(front.loc[front["on_front"], "label"])
    assert on == {"a-b1", "a-b2", "a-b4", "b-b8"}  # b-b8 alone in its slice
    assert front.loc[front["seq"] == 128, "p50_ms"].is_monotonic_increasing


def test_series_of_generation_and_capture_runs():
    capture = RunInfo(run_id="r1", variant={"name": "bf16"}, label="bf16-b4", batch=4)
    assert (series_name(capture), display_name(capture)) == ("bf16", "bf16-b4")
    generation = RunInfo(run_id="r2", kind="generation", batch=2, variant={
        "name": "mha-int8-b2", "attention": "mha", "kv": "int8", "decoding": "greedy", "batch": 2, "new": 4})
    speculative = dataclasses.replace(generation, variant={**generation.variant, "decoding": "speculative"})
    assert (series_name(generation), series_name(speculative)) == ("mha-int8", "mha-int8-spec")


def test_a_single_shape_is_written_as_before(tmp_path):
    assert (ExperimentSettings(batch=[4]).batch, ExperimentSettings(batch=(4,)).grid()) == (4, None)
    done = CliRunner().invoke(main, ["capture", "--model", "mlp", "--set", "hidden=64", "--variants", "eager",
                                     "--batch", "2", "--iterations", "2", "--warmup", "0", "--no-profile", "--json",
                                     "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    out = json.loads(done.stdout)
    assert "sweep" not in out and out["runs"][0]["label"] is None and out["runs"][0]["batch"] == 2
    raw = json.loads((tmp_path / "experiments" / f"{out['experiment']}.json").read_text())
    assert raw["schema_version"] == 1 and raw["grid"] is None and raw["variants"] == ["eager"]
    assert json.loads((tmp_path / out["runs"][0]["run_id"] / "run.json").read_text())["label"] is None


def test_old_experiments_are_no_sweep(tmp_path):
    with tarfile.open(OLD) as archive:
        archive.extractall(tmp_path, filter="data")
    for path in (tmp_path / "experiments").glob("*.json"):
        bundles = resolve_runs([path.stem], tmp_path)
        assert not is_sweep(bundles)
        titles = {fig.title.text for fig in experiments_view(bundles).select({"type": Figure})}
        assert not any(title.startswith("Pareto") for title in titles)
        assert json.loads(path.read_text())["schema_version"] == 1


def test_record_versions_read_and_refused(tmp_path):
    record = ExperimentRecord(model="m", reference="eager", runs=["r1"], grid={"batch": [1, 2]}, schema_version=2)
    write_experiment(tmp_path, "exp-1", record)
    read = read_experiment(tmp_path, "exp-1")
    assert read.info["schema_version"] == 2 and read.info["grid"] == {"batch": [1, 2]}
    future = {"schema_version": 3, "model": "m", "reference": "eager", "runs": []}
    with pytest.raises(BundleError, match="newer"):
        ExperimentRecord.from_json(future, "exp-2")
    with pytest.raises(BundleError, match="newer"):
        ExperimentRecord.from_json({**future, "schema_version": [2]}, "exp-3")


@pytest.mark.parametrize(("args", "fragment"), [
    (["--batch", "1,x"], "not a comma-separated list of integers"),
    (["--batch", "0"], "x>=1"),
    (["--batch", ""], "at least one value"),
    (["--batch", "1,1"], "listed more than once"),
    (["--seq", "8,0"], "x>=1"),
    (["--profile-shapes", "some"], "--profile-shapes"),
])
def test_bad_sizes_are_refused_in_one_line(tmp_path, args, fragment):
    root = tmp_path / "traces"
    done = CliRunner().invoke(main, ["capture", "--model", "mlp", *args, "--out", str(root)])
    assert done.exit_code == 2, done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0]
    assert not root.exists()


@pytest.mark.parametrize("settings", [{"batch": []}, {"batch": [1, True]}, {"seq": [4, 4]}, {"batch": "4"},
                                      {"profile_shapes": "smallest"}])
def test_bad_settings_are_refused(settings):
    with pytest.raises(WorkbenchError):
        ExperimentSettings(model="mlp", **settings)


def test_a_sweepable_size_is_one_integer_in_a_capture_request():
    assert json_type_of(int | tuple[int, ...]) == ("integer", False)
    assert json_type_of(int | tuple[int, ...] | None) == ("integer", True)
    with pytest.raises(TypeError, match="no JSON form"):
        json_type_of(int | tuple[str, ...])


def test_a_generation_sweep_has_curves_per_attention_and_format(tmp_path):
    done = CliRunner().invoke(main, ["generate", "--set", "layers=1", "--set", "d_model=32", "--set", "heads=2",
                                     "--set", "max_seq=16", "--kv", "fp32,bf16", "--prompt", "4", "--new", "2",
                                     "--batch", "1,2", "--repeats", "2", "--warmup", "0", "--no-profile", "--threads",
                                     "1", "--json", "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    table = pd.DataFrame(json.loads(done.stdout)["sweep"]["table"])
    assert table.groupby("series", sort=False)["batch"].apply(list).to_dict() == {"mha-fp32": [1, 2],
                                                                                "mha-bf16": [1, 2]}
    assert set(table["seq"]) == {4} and set(table["new"]) == {2} and table["speedup"].isna().all()
