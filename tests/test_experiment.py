"""Experiments end to end on a tiny model: bundles, traces, numerics, failures, progress."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

import workbench.experiment as experiment_module
import workbench.profiling.framework as framework_profiler
import workbench.runner as runner_module
from workbench.errors import BundleError, UnknownModelError, WorkbenchError
from workbench.experiment import DEFAULT_VARIANTS, ExperimentSettings, run_experiment
from workbench.profiling import ProfileSettings, progress_units
from workbench.trace.schema import LIFECYCLE_PHASES as LIFECYCLE
from workbench.trace.store.bundle import list_bundles, open_bundle
from workbench.trace.store.experiment import read_experiment

TINY_GPT = {"vocab": 64, "layers": 1, "d_model": 32, "heads": 4, "max_seq": 16}
PROFILE = ProfileSettings(warmup_steps=1, active_steps=2)
FAST = {"batch": 2, "warmup": 1, "iterations": 3, "profile_settings": PROFILE, "threads": 1}

FLAKY_MODEL = '''
import torch
from torch import nn


class Flaky(nn.Module):
    """Raises under autocast from its `fail_on_call`-th autocast call on."""

    def __init__(self, fail_on_call):
        super().__init__()
        self.fail_on_call = fail_on_call
        self.calls = 0
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        if torch.is_autocast_enabled("cpu"):
            self.calls += 1
            if self.calls >= self.fail_on_call:
                raise RuntimeError("flaky model raised")
        return self.linear(x)


def make(fail_on_call=1):
    return Flaky(fail_on_call), (torch.randn(2, 8),)
'''


class RecordingProgress:
    """A Progress that remembers what it was told."""

    def __init__(self) -> None:
        self.totals: dict[str, int | None] = {}
        self.advanced: Counter[str] = Counter()
        self.finished: list[str] = []

    def start(self, task: str, total: int | None = None) -> None:
        self.totals[task] = total
        self.advanced[task] = 0

    def advance(self, task: str, n: int = 1) -> None:
        self.advanced[task] += n

    def finish(self, task: str) -> None:
        self.finished.append(task)


def _hidden(root) -> list[str]:
    return [p.name for p in root.iterdir() if p.name.startswith(".")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One profiled experiment (eager, bf16) on a tiny GPT, shared by the tests that only read it."""
    root = tmp_path_factory.mktemp("traces")
    progress = RecordingProgress()
    settings = ExperimentSettings(model="tiny-gpt", variants=("eager", "bf16"), seq=16,
                                  model_overrides=TINY_GPT, **FAST)
    return root, run_experiment(settings, root, progress), progress


@pytest.fixture
def flaky(tmp_path, monkeypatch):
    (tmp_path / "wb_flaky_model.py").write_text(FLAKY_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "wb_flaky_model:make"


def test_every_variant_gets_a_bundle_with_phase_labels_memory_flops_and_raw_trace(tiny):
    root, result, _ = tiny
    assert [run.variant for run in result.runs] == ["eager", "bf16"]
    for run in result.runs:
        bundle = open_bundle(run.run_id, root)
        assert run.status == bundle.info["status"] == "ok"
        trace = bundle.trace()
        events = trace.df()
        annotations = set(events.loc[events["kind"] == "annotation", "name"].astype(str))
        assert {*LIFECYCLE, "step 0", "step 1"} <= annotations
        assert trace.memory.num_rows > 0
        assert events.loc[events["name"] == "aten::addmm", "flops"].gt(0).all()
        assert [p.name for p in bundle.raw_files()] == [f"{run.variant}.pt.trace.json"]


def test_numerics_are_measured_against_eager(tiny):
    _, result, _ = tiny
    eager, bf16 = (run.numerics for run in result.runs)
    assert eager["sqnr_db"] == "inf"
    assert eager["top1_agreement"] == 1.0
    assert eager["max_abs_error"] == 0.0
    assert math.isfinite(bf16["sqnr_db"]) and bf16["sqnr_db"] > 20
    assert 0 < bf16["max_abs_error"] < 0.1


def test_run_results_summarize_each_variant_for_the_cli(tiny):
    _, result, _ = tiny
    eager, bf16 = result.runs
    assert eager.speedup == 1.0
    assert bf16.speedup == pytest.approx(eager.p50_ms / bf16.p50_ms)
    row = json.loads(json.dumps(bf16.to_dict()))
    assert row["variant"] == "bf16" and row["run_id"] == bf16.run_id and row["path"] == str(bf16.path)
    assert row["p99_ms"] >= row["p50_ms"] > 0
    assert row["sqnr_db"] == bf16.numerics["sqnr_db"] and row["top1_agreement"] == bf16.numerics["top1_agreement"]
    assert eager.to_dict()["sqnr_db"] == "inf"


def test_run_json_records_model_settings_environment_stats_and_phases(tiny):
    root, result, _ = tiny
    info = open_bundle(result.runs[1].run_id, root).info
    assert info["experiment"] == result.experiment_id
    assert info["model"]["name"] == "tiny-gpt" and info["model"]["config"]["d_model"] == 32
    assert info["model"]["parameters"] > 0
    assert info["variant"]["name"] == "bf16" and info["variant"]["batch"] == 2
    assert (info["seq"], info["items_per_call"], info["tokens_per_call"]) == (16, 2, 32)
    assert info["environment"]["versions"]["torch"] == torch.__version__
    assert info["environment"]["torch_threads"] == 1
    assert info["benchmark"]["iterations"] == 3 and info["benchmark"]["torch_threads"] == 1
    assert info["benchmark"]["p50"] == result.runs[1].p50_ms > 0
    assert info["first_call_s"] > 0
    assert set(info["phases_ms"]["setup"]) == {"load", "compile"}
    assert set(info["phases_ms"]["profiled"]) == {*LIFECYCLE, "step 0", "step 1"}
    assert info["capture"]["settings"] == PROFILE.to_dict()
    assert info["op_flops"]["aten::addmm"] > 0


def test_the_experiment_record_groups_the_runs_and_no_temp_folder_is_left(tiny):
    root, result, _ = tiny
    record = read_experiment(root, result.experiment_id)
    assert record.run_ids == [run.run_id for run in result.runs]
    assert record.info["reference"] == "eager" and record.info["model"] == "tiny-gpt"
    assert record.info["failed"] == []
    assert {"load", "prepare", "benchmark", "profile eager", "profile bf16", "write"} <= set(record.info["phases_ms"])
    assert _hidden(root) == []
    assert len(list_bundles(root)) == 2
    assert result.path == root / "experiments" / f"{result.experiment_id}.json" and result.path.is_file()
    assert all(run.path == root / run.run_id and run.path.is_dir() for run in result.runs)


def test_a_failure_writing_the_record_keeps_none_of_the_runs(tmp_path, monkeypatch):
    root = tmp_path / "traces"

    def refused(*args, **kwargs):
        raise BundleError("record refused")

    monkeypatch.setattr(runner_module, "write_experiment", refused)
    settings = ExperimentSettings(model="mlp", variants=("eager", "bf16"), model_overrides={"hidden": 16}, **FAST)
    with pytest.raises(BundleError, match="record refused"):
        run_experiment(settings, root)
    assert list(root.iterdir()) == []


def test_a_traces_root_that_is_a_file_fails_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(experiment_module, "load_model", lambda *args, **kwargs: pytest.fail("loaded"))
    (tmp_path / "file").write_text("")
    with pytest.raises(WorkbenchError, match="not a folder"):
        run_experiment(ExperimentSettings(model="mlp", variants=("eager",), **FAST), tmp_path / "file")


def test_progress_hears_of_every_task(tiny):
    _, _, progress = tiny
    expected = {"prepare": 2, "prepare eager": 1, "prepare bf16": 1, "benchmark": 1 + 3,
                "profile eager": progress_units(PROFILE),
                "profile bf16": progress_units(PROFILE), "write": 3}
    assert progress.totals == expected
    assert dict(progress.advanced) == expected
    assert sorted(progress.finished) == sorted(expected)


@pytest.mark.parametrize(("fail_on_call", "stage"), [(1, "prepare"), (3, "benchmark")])
def test_a_failing_variant_gets_a_failed_bundle_and_the_others_go_on(tmp_path, flaky, fail_on_call, stage):
    root = tmp_path / "traces"
    settings = ExperimentSettings(model=flaky, variants=("eager", "bf16"),
                                  model_overrides={"fail_on_call": fail_on_call}, **FAST)
    result = run_experiment(settings, root)
    eager, bf16 = result.runs
    assert eager.status == "ok" and eager.p50_ms > 0
    assert bf16.status == "failed" and bf16.p50_ms is None
    assert f"variant bf16 failed during {stage}" in bf16.error and "flaky model raised" in bf16.error
    assert result.failed == [bf16]
    bundle = open_bundle(bf16.run_id, root)
    assert bundle.info["status"] == "failed" and bundle.info["error"] == bf16.error
    assert "RuntimeError" in bundle.info["traceback"]
    assert not bundle.has_trace and bundle.raw_files() == []
    assert open_bundle(eager.run_id, root).has_trace
    assert read_experiment(root, result.experiment_id).info["failed"] == ["bf16"]
    assert _hidden(root) == []


def test_a_profiling_failure_keeps_the_benchmark_and_removes_the_temp_folder(tmp_path, monkeypatch):
    root = tmp_path / "traces"

    def broken_profiler(variant, loaded, inputs, out_dir, settings, on_progress):
        (out_dir / f"{variant.name}.pt.trace.json").write_text("{")
        raise RuntimeError("profiler crashed")

    monkeypatch.setattr(framework_profiler, "profile_variant", broken_profiler)
    settings = ExperimentSettings(model="mlp", variants=("eager",), model_overrides={"hidden": 16}, **FAST)
    (run,) = run_experiment(settings, root).runs
    assert run.status == "failed" and "profiling" in run.error and "profiler crashed" in run.error
    info = open_bundle(run.run_id, root).info
    assert info["benchmark"]["iterations"] == 3 and info["numerics"]["sqnr_db"] == "inf"
    assert _hidden(root) == []


def test_without_profiling_bundles_still_carry_stats_and_numerics_against_an_unlisted_reference(tmp_path):
    root = tmp_path / "traces"
    threads = torch.get_num_threads()
    settings = ExperimentSettings(model="mlp", variants=("bf16",), profile=False,
                                  model_overrides={"hidden": 16}, **FAST)
    result = run_experiment(settings, root)
    assert torch.get_num_threads() == threads
    (run,) = result.runs
    bundle = open_bundle(run.run_id, root)
    assert run.status == "ok" and not bundle.has_trace
    assert bundle.info["capture"] is None and bundle.info["benchmark"]["torch_threads"] == 1
    assert math.isfinite(run.numerics["sqnr_db"]) and bundle.info["reference"] == "eager"
    assert run.speedup is None  # the reference was run for its output only, not timed
    assert bundle.info["seq"] is None and bundle.info["tokens_per_call"] is None
    assert read_experiment(root, result.experiment_id).run_ids == [run.run_id]


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"variants": ("eager", "nope")}, WorkbenchError, "valid variants: eager"),
        ({"model": "no-such-model"}, UnknownModelError, "built-in models"),
        ({"batch": 0}, WorkbenchError, "batch"),
    ],
)
def test_bad_settings_fail_before_anything_is_written(tmp_path, settings, error, match):
    root = tmp_path / "traces"
    with pytest.raises(error, match=match):
        run_experiment(ExperimentSettings(**{"variants": ("eager",), **settings}), root)
    assert not root.exists()


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"variants": ()}, "at least one variant"),
        ({"variants": ("eager", "bf16", "eager")}, "more than once: eager"),
        ({"iterations": 0}, "iterations"),
        ({"warmup": -1}, "warmup"),
        ({"threads": 0}, "threads"),
    ],
)
def test_settings_are_checked(settings, match):
    with pytest.raises(WorkbenchError, match=match):
        ExperimentSettings(**settings)


def test_the_defaults_are_the_default_experiment():
    settings = ExperimentSettings()
    assert (settings.model, settings.variants, settings.batch, settings.seq) == ("tiny-gpt", DEFAULT_VARIANTS, 4, None)
    assert settings.variants == ("eager", "bf16", "compile", "int8")
    assert settings.to_dict()["profile_settings"]["record_setup"] is True


@pytest.mark.parametrize(("variant", "device", "first"), [("jax-jit", "cuda", True), ("jax-jit", "cuda:1", True),
                                                         ("jax-jit", "cpu", False), ("eager", "cuda", False)])
def test_jax_variants_on_a_gpu_are_profiled_first(variant, device, first):
    from workbench.backends import get_variant

    assert experiment_module.profiled_first(get_variant(variant, 2, device)) is first


def test_runs_profiled_first_are_profiled_before_the_others_and_listed_in_order(tmp_path, monkeypatch):
    root = tmp_path / "traces"
    profiled: list[str] = []
    real = framework_profiler.profile_variant

    def recording(variant, *args, **kwargs):
        profiled.append(variant.name)
        return real(variant, *args, **kwargs)

    monkeypatch.setattr(framework_profiler, "profile_variant", recording)
    monkeypatch.setattr(experiment_module, "profiled_first", lambda variant: variant.name == "bf16")
    settings = ExperimentSettings(model="mlp", variants=("eager", "bf16"), model_overrides={"hidden": 16}, **FAST)
    result = run_experiment(settings, root)
    assert profiled == ["bf16", "eager"]
    assert [run.variant for run in result.runs] == ["eager", "bf16"]
    assert read_experiment(root, result.experiment_id).info["variants"] == ["eager", "bf16"]
