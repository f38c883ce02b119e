"""Model guidance, sensitivity across a model set and the projection report (`workbench.codesign.guidance`,
`workbench.codesign.sensitivity`, `workbench.views.projection`): each finding on a hand-built graph with its gain
worked out by hand, the KV cache per token of each attention variant by hand, sweeps that can only speed a step
up, and the `project` command's model set, HTML report and one-line errors."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from tests.npu import npu_yaml
from workbench.cli import main
from workbench.codesign.description import load_description
from workbench.codesign.graph import _frame, at_dtype, graph_row
from workbench.codesign.guidance import guidance
from workbench.codesign.projection import project
from workbench.codesign.sensitivity import buys_most, model_set_sweep, parse_sweep, sweep

NPU = npu_yaml()
"""tests/test_codesign.py's chip: one 128 x 128 array at 1 GHz, 1 bf16 MAC per PE per cycle; bf16 only."""
BF16, FP32 = "c10::BFloat16", "float"


@pytest.fixture
def npu(tmp_path: Path):
    path = tmp_path / "npu.yaml"
    path.write_text(NPU)
    return load_description(path)


def _graph(*ops: tuple[str, list, list]) -> pd.DataFrame:
    return _frame([graph_row(name, shapes, dtypes, None) for name, shapes, dtypes in ops])


def _finding(findings, kind):
    matches = [f for f in findings if f.kind == kind]
    assert len(matches) == 1, [f.kind for f in findings]
    return matches[0]


def test_padding_finding_rounds_a_weight_dimension_to_the_array(npu) -> None:
    # off-chip at 100 TB/s so the matmul is compute-bound
    fast = replace(npu, off_chip=replace(npu.off_chip, bandwidth=100e12))
    graph = _graph(("aten::mm", [[256, 256], [256, 150]], [BF16, BF16]))
    found = _finding(guidance(graph, fast), "padding")
    # before: ⌈256/128⌉·⌈150/128⌉ = 4 tiles of K = 256 cycles = 1024 ns (memory 284,672 B at 100 TB/s: 2.8 ns;
    # on-chip feed 4·256·256·2 B at 1 TB/s: 524 ns). N = 150 rounds to the nearest multiple of 128, 128: 2 tiles,
    # 512 ns (feed 262 ns). Gain 512 ns, half the step.
    assert found.step_ns == pytest.approx(1024.0)
    assert found.gain_ns == pytest.approx(512.0)
    assert found.gain_share == pytest.approx(0.5)
    row = found.evidence.iloc[0]
    assert (row["dim"], row["rounded"]) == ("N 150", 128)
    # the last tile column uses 150 - 128 = 22 of 128 columns: 150 of 256 columns in all
    assert row["columns_used"] == pytest.approx(150 / 256)
    assert row["shape"] == "256x256 @ 256x150"
    # idle MAC slots: 1024 ns · (1 − 256·256·150 / (4·128·128·256))
    assert "424 ns per step of MAC slots idle" in found.title


def test_host_fallback_finding_is_the_time_saved_running_the_kind_natively(npu) -> None:
    graph = _graph(("aten::softmax", [[100, 100], [], []], [BF16, "Scalar", "Scalar"]))
    found = _finding(guidance(graph, npu), "host fallback")
    # on the host (tests/test_codesign.py): 40,000 B at 10 GB/s 4 µs + 2 · 1 µs + 10 µs = 16 µs. Native: 5 FLOPs per
    # element + 7 more cycles per exp: 10⁴ · 12 / 256 GFLOP/s = 468.75 ns against 40,000 B at 100 GB/s = 400 ns.
    assert found.step_ns == pytest.approx(16_000.0)
    assert found.gain_ns == pytest.approx(16_000.0 - 468.75)
    assert found.evidence.iloc[0]["native_time_ns"] == pytest.approx(468.75)


def test_layout_finding_removes_the_copy_between_operators(npu) -> None:
    graph = _graph(("aten::mm", [[128, 128], [128, 128]], [BF16, BF16]), ("aten::clone", [[128, 128]], [BF16]),
                   ("aten::mm", [[128, 128], [128, 128]], [BF16, BF16]))
    found = _finding(guidance(graph, npu), "layout")
    # the clone reads and writes 128·128·2 B: 65,536 B at 100 GB/s = 655.36 ns, and nothing else changes
    assert found.gain_ns == pytest.approx(655.36)
    assert found.evidence["name"].tolist() == ["clone"]


def test_vector_finding_keeps_norm_tensors_on_chip(npu) -> None:
    graph = _graph(("aten::native_layer_norm", [[128, 256], [], [256], [256], []],
                    [BF16, "Scalar", BF16, BF16, "Scalar"]))
    found = _finding(guidance(graph, npu), "vector")
    # 8 FLOPs per element · 32,768 = 262,144 at 256 GFLOP/s = 1024 ns; bytes in, out, weight and bias:
    # 2 · 65,536 + 2 · 512 = 132,096 B at 100 GB/s = 1320.96 ns. On chip only the compute is left: gain 296.96 ns.
    assert found.step_ns == pytest.approx(1320.96)
    assert found.gain_ns == pytest.approx(296.96)
    assert "100.0% of the step" in found.title


def test_precision_finding_moves_fp32_bytes_of_a_bf16_array(npu) -> None:
    graph = _graph(("aten::mm", [[128, 128], [128, 128]], [FP32, FP32]))
    found = _finding(guidance(graph, npu), "precision")
    # fp32 runs as bf16 (128 cycles: 128 ns) but moves 3 · 128·128 · 4 B = 196,608 B at 100 GB/s = 1966.08 ns;
    # in bf16 half: 983.04 ns saved
    assert found.step_ns == pytest.approx(1966.08)
    assert found.gain_ns == pytest.approx(983.04)
    assert found.evidence.iloc[0]["run_dtype"] == "bf16"
    assert at_dtype(graph, "bf16")["bytes"].iloc[0] == 98_304


def test_attention_variants_by_kv_bytes_per_token(npu) -> None:
    from workbench.llm.perf_model import make_config

    # tiny-gpt's shape: 2 layers, 8 heads of 32, fp32
    config = make_config({"preset": "tiny-gpt"})
    graph = _graph(("aten::mm", [[128, 256], [256, 256]], [FP32, FP32]))
    found = _finding(guidance(graph, npu, llm=config, batch=1, context=128), "attention")
    per_token = found.evidence.set_index("variant")["kv_bytes_per_token"]
    # K and V · layers · kv heads · head dim · 4 B: MHA 2·2·8·32·4 = 4096; GQA (8/8 = 1 → at least 2 kv heads)
    # 2·2·2·32·4 = 1024; MQA 2·2·1·32·4 = 512; MLA caches a latent of 4·32 = 128 and a RoPE key of 16 per layer:
    # 2·(128 + 16)·4 = 1152
    assert per_token.to_dict() == {"mha": 4096, "gqa": 1024, "mqa": 512, "mla": 1152}
    read = found.evidence.set_index("variant")["kv_read_bytes"]
    # a decode step after 128 cached tokens reads all 129 entries
    assert read["mha"] == 129 * 4096 and read["mqa"] == 129 * 512
    assert "MQA instead of MHA" in found.title
    # the step is memory-bound: at least the KV bytes MQA does not read are saved (its K, V weights shrink too)
    assert found.gain_ns >= (read["mha"] - read["mqa"]) / 100e9 * 1e9


def test_sweeps_only_speed_a_step_up_as_a_figure_grows(npu) -> None:
    graph = _graph(("aten::mm", [[300, 256], [256, 1000]], [BF16, BF16]), ("aten::gelu", [[300, 1000]], [BF16]),
                   ("aten::native_layer_norm", [[300, 1000], [], [1000], [1000], []],
                    [BF16, "Scalar", BF16, BF16, "Scalar"]))
    for knob in ("bandwidth=0.25,0.5,1,2,4", "rate=0.25,1,4", "rate.bf16=0.5,1,2", "on_chip=0.01,0.1,1"):
        name, values = parse_sweep(knob)
        times = sweep(graph, npu, name, values)["time_ns"].tolist()
        assert all(a >= b for a, b in itertools.pairwise(times)), (knob, times)
    table = sweep(graph, npu, "bandwidth", [1.0])
    assert table["speedup"].iloc[0] == pytest.approx(1.0)


def test_array_knob_keeps_each_processing_element() -> None:
    import yaml

    from workbench.codesign.description import parse_description

    npu = parse_description(yaml.safe_load(NPU), origin="npu.yaml")
    small = npu.with_array(64, 64)
    # a quarter of the area: a quarter of the peak, still 1 MAC per PE per cycle
    assert small.matrix.rates["bf16"] == pytest.approx(32.768e12 / 4)
    row = project(_graph(("aten::mm", [[100, 100], [100, 100]], [BF16, BF16])), small).iloc[0]
    # ⌈100/64⌉² = 4 tiles of K = 100 cycles: 400 ns
    assert row["compute_ns"] == pytest.approx(400.0)
    name, values = parse_sweep("array=64x64,128x128")
    assert values == [(64, 64), (128, 128)]
    # at 100 TB/s the product is compute-bound: 400 ns on 64x64 against 100 ns as written
    fast = replace(npu, off_chip=replace(npu.off_chip, bandwidth=100e12))
    table = model_set_sweep({"a": _graph(("aten::mm", [[100, 100], [100, 100]], [BF16, BF16]))}, fast,
                            [(name, values)])
    assert table["factor"].tolist() == [0.25, 1.0]
    assert table["ratio"].tolist() == pytest.approx([4.0, 1.0])
    best = buys_most(table)
    assert best["value"].tolist() == ["128x128", "128x128"]


@pytest.mark.parametrize("bad", ["clock=2", "bandwidth=", "bandwidth=-1", "array=64", "array=0x64", "rate.bf12=2"])
def test_a_bad_sweep_is_one_line_exit_2(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "npu.yaml"
    path.write_text(NPU)
    result = CliRunner().invoke(main, ["project", "mlp", "--accelerator", str(path), "--sweep", bad])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and "--sweep" in result.output


@pytest.mark.parametrize(("args", "says"), [
    (["--models", "tiny-gpt,nonesuch", "--sweep", "bandwidth=1,2"], "unknown model 'nonesuch'"),
    (["--models", "mlp"], "give at least one --sweep"),
    (["mlp", "--models", "mlp", "--sweep", "bandwidth=1,2"], "one of them"),
    ([], "one of them"),
])
def test_bad_models_are_one_line_exit_2(tmp_path: Path, args: list, says: str) -> None:
    path = tmp_path / "npu.yaml"
    path.write_text(NPU)
    result = CliRunner().invoke(main, ["project", *args, "--accelerator", str(path)])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and says in result.output


def test_project_models_json_and_html(tmp_path: Path) -> None:
    path = tmp_path / "npu.yaml"
    path.write_text(NPU.replace("native_ops: [matmul, elementwise, norm, copy]", "native_ops: [matmul, elementwise, "
                                "norm, copy, attention, softmax, other]"))
    html = tmp_path / "set.html"
    result = CliRunner().invoke(main, ["project", "--models", "tiny-gpt,mlp", "--accelerator", str(path),
                                       "--sweep", "bandwidth=0.5,1,2", "--sweep", "array=64x64,128x128",
                                       "--dtype", "bf16", "--json", "--html", str(html)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    table = pd.DataFrame(data["sweeps"])
    assert sorted(set(table["model"])) == ["mlp", "tiny-gpt"]
    # the description as written is ratio 1; more bandwidth never slows a step
    assert table.loc[table["value"].isin(["1x", "128x128"]), "ratio"].tolist() == pytest.approx([1.0] * 4)
    for _, rows in table[table["figure"] == "bandwidth"].groupby("model"):
        assert rows["ratio"].is_monotonic_decreasing
    assert data["buys_most"][-1]["model"] == "(geometric mean)"
    page = html.read_text()
    assert "step time against bandwidth" in page and "step time against array" in page
    assert "which knob buys the most" in page


def test_project_one_model_prints_guidance_and_writes_the_report(tmp_path: Path) -> None:
    path = tmp_path / "npu.yaml"
    path.write_text(NPU)
    html = tmp_path / "one.html"
    result = CliRunner().invoke(main, ["project", "tiny-gpt", "--accelerator", str(path), "--sweep",
                                       "bandwidth=1,2", "--json", "--html", str(html)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    kinds = {f["kind"] for f in data["guidance"]}
    # tiny-gpt is fp32 (the array lacks it), MHA, and its attention is not native here
    assert {"precision", "attention", "host fallback"} <= kinds
    gains = [f["gain_ns"] for f in data["guidance"]]
    assert gains == sorted(gains, reverse=True)
    page = html.read_text()
    for text in ("projected time per operator", "projected time per step by operator kind",
                 "step time against bandwidth", "guidance: what fits this accelerator badly"):
        assert text in page
    text = CliRunner().invoke(main, ["project", "tiny-gpt", "--accelerator", str(path)])
    assert text.exit_code == 0 and "guidance 1 (" in text.output


def test_notebook_guidance_and_dtype_equal_the_cli(tmp_path: Path) -> None:
    import workbench as wb

    args = ["project", "tiny-gpt", "--accelerator", "tpu-v5e", "--dtype", "bf16", "--out", str(tmp_path), "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    cli = json.loads(result.stdout)
    table = wb.project("tiny-gpt", "tpu-v5e", dtype="bf16", root=tmp_path)
    assert table["time_ns"].sum() == pytest.approx(cli["step_ns"])
    found = wb.project_guidance("tiny-gpt", "tpu-v5e", dtype="bf16", root=tmp_path)
    assert found[["kind", "gain_ns"]].to_dict("records") == [
        {"kind": g["kind"], "gain_ns": pytest.approx(g["gain_ns"])} for g in cli["guidance"]]
    assert all(len(evidence) for evidence in found["evidence"])
