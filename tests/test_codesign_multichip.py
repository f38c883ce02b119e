"""Several chips (`workbench.codesign.sharding`, `project(..., chips=p)`): the dataflow a forward records, a 2-layer
MLP on 2 and 4 chips worked out by hand (per-chip tiles, one all-reduce on the ring), tiny-gpt's Megatron sharding
(q/k/v and fc_in column-parallel, o_proj and fc_out row-parallel, attention by heads), a trace that cannot shard,
one chip equal to the one-chip projection, wrong `chip_links` in one line, and the `--chips` scaling table."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from click.testing import CliRunner
from torch import nn

from tests.npu import npu_yaml
from workbench.cli import main
from workbench.codesign.description import AcceleratorSpecError, load_description, parse_description
from workbench.codesign.graph import graph_from_model, graph_from_trace
from workbench.codesign.projection import project
from workbench.codesign.sensitivity import parse_sweep, scaling, sweep

NPU = npu_yaml(native_ops="matmul, elementwise, attention, norm, copy, softmax, other",
               extra="chip_links: {bandwidth: 50 GB/s, latency: 1 us}\n")
"""tests/test_codesign.py's chip (one 128 x 128 array at 1 GHz, 1 bf16 MAC per PE per cycle, 100 GB/s off chip)
with every operator native and a ring of chip links at 50 GB/s per chip per direction, 1 µs per hop."""
D, HIDDEN, TOKENS = 256, 1024, 128


@pytest.fixture
def npu(tmp_path: Path):
    path = tmp_path / "npu.yaml"
    path.write_text(NPU)
    return load_description(path)


@pytest.fixture(scope="module")
def mlp_graph() -> pd.DataFrame:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, D)).to(torch.bfloat16)
    return graph_from_model(model, (torch.randn(TOKENS, D, dtype=torch.bfloat16),))


def test_a_forward_records_which_row_fed_which(mlp_graph: pd.DataFrame) -> None:
    assert mlp_graph["name"].tolist() == ["addmm", "gelu", "addmm"]
    # the input comes from outside the graph; the Linear's transposed weight is a view the graph leaves out, yet
    # its storage is the parameter's
    assert mlp_graph["inputs_from"].tolist() == [(), (0,), (1,)]
    assert mlp_graph["weight_input"].tolist() == [True, False, True]


def test_mlp_on_two_chips_worked_by_hand(npu, mlp_graph: pd.DataFrame) -> None:
    table = project(mlp_graph, npu, chips=2).set_index("name", append=True)
    fc1, gelu, fc2 = (table.iloc[i] for i in range(3))
    assert [fc1["shard"], gelu["shard"], fc2["shard"]] == ["column", "sharded", "row"]
    # fc1, column-parallel: N = 1024 / 2 = 512 per chip: ⌈128/128⌉·⌈512/128⌉ = 4 tiles of K = 256 cycles, 1024 ns.
    # Each chip reads all of x (128·256·2 = 65,536 B) and the bias (2,048 B, counted whole with the activation),
    # half the weight (256·1024·2 / 2 = 262,144 B) and writes half the output (128·1024·2 / 2 = 131,072 B):
    # 460,800 B at 100 GB/s = 4,608 ns
    assert fc1["tiles"] == 4 and fc1["compute_ns"] == pytest.approx(1024.0)
    assert fc1["off_chip_bytes"] == 65_536 + 2_048 + 262_144 + 131_072
    assert fc1["memory_ns"] == pytest.approx(4608.0) and fc1["bound"] == "memory"
    assert fc1["comm_ns"] == 0
    # GELU on its half, fused after fc1: 65,536 elements · 8 cycles at 256 GFLOP/s = 2,048 ns, nothing off chip
    assert gelu["group"] == fc1["group"] == 0
    assert gelu["compute_ns"] == pytest.approx(2048.0) and gelu["off_chip_bytes"] == 0
    # fc2, row-parallel: K = 1024 / 2 = 512 per chip: ⌈128/128⌉·⌈256/128⌉ = 2 tiles of 512 cycles, 1024 ns.
    # Each chip reads its half of the activation and of the weight ((262,144 + 512 bias + 524,288) / 2 = 393,472 B)
    # and writes a partial output of full size, 128·256·2 = 65,536 B: 459,008 B, 4,590.08 ns
    assert fc2["tiles"] == 2 and fc2["compute_ns"] == pytest.approx(1024.0)
    assert fc2["off_chip_bytes"] == 393_472 + 65_536
    assert fc2["memory_ns"] == pytest.approx(4590.08)
    # then the one all-reduce of the MLP, 65,536 B on a ring of 2: 2·(1/2)·65,536 B / 50 GB/s = 1,310.72 ns
    # + 2·(2−1) hops of 1 µs = 3,310.72 ns, after the product: 7,900.8 ns, memory still the largest term
    assert fc2["comm_ns"] == pytest.approx(3310.72)
    assert fc2["time_ns"] == pytest.approx(4590.08 + 3310.72)
    assert fc2["bound"] == "memory"
    assert (table["comm_ns"] > 0).sum() == 1


def test_mlp_on_four_chips_worked_by_hand(npu, mlp_graph: pd.DataFrame) -> None:
    table = project(mlp_graph, npu, chips=4)
    fc1, gelu, fc2 = (table.iloc[i] for i in range(3))
    # fc1: N = 256 per chip, 2 tiles, 512 ns; 65,536 + 2,048 + (524,288 + 262,144) / 4 = 264,192 B: 2,641.92 ns
    assert fc1["tiles"] == 2 and fc1["compute_ns"] == pytest.approx(512.0)
    assert fc1["off_chip_bytes"] == 264_192
    # GELU on a quarter: 32,768 elements · 8 / 256 GFLOP/s = 1,024 ns
    assert gelu["compute_ns"] == pytest.approx(1024.0)
    # fc2: K = 256 per chip, 2 tiles of 256 cycles, 512 ns; (262,656 + 524,288) / 4 + 65,536 = 262,272 B
    assert fc2["tiles"] == 2 and fc2["compute_ns"] == pytest.approx(512.0)
    assert fc2["off_chip_bytes"] == 262_272
    # ring of 4: 2·(3/4)·65,536 / 50 GB/s = 1,966.08 ns + 2·3 hops of 1 µs = 7,966.08 ns, now the largest term
    assert fc2["comm_ns"] == pytest.approx(7966.08)
    assert fc2["bound"] == "chip-link"
    assert fc2["time_ns"] == pytest.approx(2622.72 + 7966.08)
    # through a switch both phases take one hop each: 1,966.08 + 2 · 1 µs
    switch = parse_description({**yaml.safe_load(NPU), "chip_links": {"bandwidth": "50 GB/s", "latency": "1 us",
                                                                      "topology": "switch"}}, origin="npu.yaml")
    assert project(mlp_graph, switch, chips=4).iloc[2]["comm_ns"] == pytest.approx(3966.08)


def test_mlp_scaling_table_worked_by_hand(npu, mlp_graph: pd.DataFrame) -> None:
    table = scaling(mlp_graph, npu, [1, 2, 4, 8])
    # 1 chip: 8,540.16 + 4,096 (GELU) + 8,524.8 (fc2: 852,480 B); 2 chips: 4,608 + 2,048 + 7,900.8; 4 chips:
    # 2,641.92 + 1,024 + 2,622.72 + 7,966.08. 8 chips: fc1 reads 67,584 + 786,432 / 8 = 165,888 B (1,658.88 ns),
    # the GELU 512 ns, fc2 786,944 / 8 + 65,536 = 163,904 B (1,639.04 ns) and its all-reduce
    # 2·(7/8)·65,536 / 50 GB/s = 2,293.76 ns + 14 hops of 1 µs: slower than on 2 chips
    assert table["time_ns"].tolist() == pytest.approx([21_160.96, 14_556.8, 14_254.72,
                                                       1_658.88 + 512 + 1_639.04 + 16_293.76])
    assert table["comm_ns"].tolist() == pytest.approx([0, 3_310.72, 7_966.08, 16_293.76])
    assert table["speedup"].iloc[1] == pytest.approx(21_160.96 / 14_556.8)
    assert table["efficiency"].iloc[2] == pytest.approx(21_160.96 / 14_254.72 / 4)


def test_one_chip_is_the_one_chip_projection(npu, mlp_graph: pd.DataFrame) -> None:
    one = project(mlp_graph, npu, chips=1)
    assert (one["shard"] == "replicated").all() and (one["comm_ns"] == 0).all()
    # the same graph without dataflow projects to the same figures, column for column
    blind = mlp_graph.assign(inputs_from=None, weight_input=None)
    pd.testing.assert_frame_equal(project(blind, npu), one, check_exact=True)
    # fc1 on one chip: 8 tiles of 256 cycles = 2,048 ns; 65,536 + 524,288 + 2,048 + 262,144 = 854,016 B: 8,540.16 ns
    assert one.iloc[0]["compute_ns"] == pytest.approx(2048.0)
    assert one.iloc[0]["time_ns"] == pytest.approx(8540.16)
    assert scaling(mlp_graph, npu, [1])["speedup"].tolist() == [1.0]


@pytest.fixture(scope="module")
def gpt_graph() -> pd.DataFrame:
    from workbench.codesign.sources import model_graph

    return model_graph("tiny-gpt", batch=2, seq=32).graph


def test_tiny_gpt_shards_like_megatron(npu, gpt_graph: pd.DataFrame) -> None:
    table = project(gpt_graph, npu, chips=2)
    layer = table["layer"].str.rsplit(".", n=1).str[-1]
    matmuls = table[table["kind"] == "matmul"]
    by_layer = dict(zip(layer[matmuls.index], matmuls["shard"], strict=True))
    assert {name: by_layer[name] for name in ("q_proj", "k_proj", "v_proj", "fc_in", "o_proj", "fc_out",
                                              "lm_head")} == {
        "q_proj": "column", "k_proj": "column", "v_proj": "column", "fc_in": "column", "o_proj": "row",
        "fc_out": "row", "lm_head": "column"}
    # two all-reduces per block (after o_proj and fc_out), 2 blocks
    reduced = table[table["comm_ns"] > 0]
    assert layer[reduced.index].tolist() == ["o_proj", "fc_out"] * 2
    # each all-reduces its fp32 output, 2·32 tokens x 256: 65,536 B on a ring of 2: 1,310.72 ns + 2 µs
    assert reduced["comm_ns"].tolist() == pytest.approx([3310.72] * 4)
    # attention splits its heads: 2 sequences · 8 heads = 16 per-head products, 8 on each chip
    attention = table[table["kind"] == "attention"]
    assert (attention["shard"] == "heads").all()
    one = project(gpt_graph, npu)
    ratio = attention["flops"] / one.loc[attention.index, "flops"]
    assert ratio.tolist() == pytest.approx([0.5, 0.5])
    # norms and the residual stream stay whole on every chip; the GELU runs on its half
    assert (table.loc[table["kind"] == "norm", "shard"] == "replicated").all()
    assert (table.loc[table["name"] == "gelu", "shard"] == "sharded").all()
    # the per-chip column-parallel q_proj: N = 256 / 2 = 128, ⌈64/128⌉·⌈128/128⌉ = 1 tile against 2 on one chip
    q = table.index[layer == "q_proj"][0]
    assert (table.loc[q, "tiles"], one.loc[q, "tiles"]) == (1, 2)


def test_a_trace_has_no_dataflow_and_stays_replicated(npu) -> None:
    import pyarrow as pa

    from workbench.trace import Trace, schema

    base = {"dur_ns": 1000, "kind": "op", "device": "cpu", "track": "cpu/thread 1", "pid": 1, "tid": 1, "corr": -1,
            "launcher": -1, "flops": None, "bytes": None, "args": None, "parent": -1, "depth": 0}
    rows = [{**base, "start_ns": 0, "name": "aten::linear", "shapes": "[[128, 256], [1024, 256], [1024]]",
             "dtypes": '["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]'},
            {**base, "start_ns": 2000, "name": "aten::linear", "shapes": "[[128, 1024], [256, 1024], [256]]",
             "dtypes": '["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]'}]
    graph = graph_from_trace(Trace(events=pa.Table.from_pylist(rows, schema=schema.EVENTS)).df())
    assert graph["inputs_from"].isna().all() and graph["weight_input"].isna().all()
    four = project(graph, npu, chips=4)
    assert four.attrs["dataflow"] is False
    assert (four["shard"] == "replicated").all() and (four["comm_ns"] == 0).all()
    assert four["time_ns"].tolist() == project(graph, npu)["time_ns"].tolist()


def test_chips_need_links_and_stay_within_the_part(npu, mlp_graph: pd.DataFrame) -> None:
    no_links = parse_description({k: v for k, v in yaml.safe_load(NPU).items() if k != "chip_links"},
                                 origin="npu.yaml")
    with pytest.raises(AcceleratorSpecError, match=r"field 'chip_links': required to project on 2 chips"):
        project(mlp_graph, no_links, chips=2)
    project(mlp_graph, no_links, chips=1)  # one chip needs no links
    eight = parse_description({**yaml.safe_load(NPU), "chip_links": {"bandwidth": "50 GB/s", "chips": 8}},
                              origin="npu.yaml")
    with pytest.raises(AcceleratorSpecError, match=r"field 'chip_links.chips': the part scales to 8 chips, not 16"):
        project(mlp_graph, eight, chips=16)


@pytest.mark.parametrize(("links", "field"), [
    ({"bandwidth": "-50 GB/s"}, "chip_links.bandwidth"),
    ({"bandwidth": 0}, "chip_links.bandwidth"),
    ({"latency": "1 us"}, "chip_links.bandwidth"),
    ({"bandwidth": "50 GB/s", "topology": "torus"}, "chip_links.topology"),
    ({"bandwidth": "50 GB/s", "latency": "-1 us"}, "chip_links.latency"),
    ({"bandwidth": "50 GB/s", "chips": 0}, "chip_links.chips"),
    ({"bandwidth": "50 GB/s", "lanes": 4}, "chip_links.lanes"),
    ("fast", "chip_links"),
])
def test_bad_chip_links_fail_in_one_line(tmp_path: Path, links: object, field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(NPU), "chip_links": links}))
    with pytest.raises(AcceleratorSpecError) as error:
        load_description(path)
    assert str(error.value).startswith(f"{path}: field '{field}'") and "\n" not in str(error.value)
    result = CliRunner().invoke(main, ["project", "mlp", "--accelerator", str(path), "--chips", "2"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and f"field '{field}'" in lines[0]


@pytest.mark.parametrize(("counts", "says"), [
    ("0,2", "--chips: chip counts are whole numbers >= 1"),
    ("two", "--chips: chip counts are whole numbers >= 1"),
    ("2,16", "field 'chip_links.chips': the part scales to 8 chips, not 16"),
])
def test_bad_chip_counts_are_one_line_exit_2(tmp_path: Path, counts: str, says: str) -> None:
    path = tmp_path / "npu.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(NPU), "chip_links": {"bandwidth": "50 GB/s", "chips": 8}}))
    result = CliRunner().invoke(main, ["project", "mlp", "--chips", counts, "--accelerator", str(path)])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and says in result.output


def test_scaling_is_monotone_in_link_bandwidth(npu, gpt_graph: pd.DataFrame) -> None:
    counts = [1, 2, 4, 8]
    tables = [scaling(gpt_graph, npu.scaled(chip_link=factor), counts) for factor in (0.25, 0.5, 1, 2, 4, 1000)]
    for slower, faster in itertools.pairwise(tables):
        assert (faster["time_ns"] <= slower["time_ns"]).all()
        assert (faster["comm_share"] <= slower["comm_share"]).all()
    # one chip sends nothing; bandwidth does not buy latency: at 1000x, 8 chips still wait 2·7 hops of 1 µs for each
    # of the 4 all-reduces (65,536 B each: 2·(7/8)·65,536 B / 50 TB/s = 2.29 ns beside them)
    assert all(table["comm_ns"].iloc[0] == 0 for table in tables)
    assert tables[-1]["comm_ns"].iloc[-1] == pytest.approx(4 * (14_000 + 2 * 7 / 8 * 65_536 / 50e12 * 1e9))
    # the chip_link sweep on 4 chips says the same
    name, values = parse_sweep("chip_link=0.5,1,2")
    swept = sweep(gpt_graph, npu, name, values, chips=4)
    assert swept["time_ns"].is_monotonic_decreasing
    assert swept.loc[swept["value"] == "1x", "time_ns"].iloc[0] == pytest.approx(tables[2]["time_ns"].iloc[2])
    name, values = parse_sweep("chips=1,2,4")
    assert sweep(gpt_graph, npu, name, values)["value"].tolist() == ["1 chip", "2 chips", "4 chips"]


def test_project_chips_prints_and_returns_the_scaling_table(tmp_path: Path) -> None:
    path = tmp_path / "npu.yaml"
    path.write_text(NPU)
    result = CliRunner().invoke(main, ["project", "tiny-gpt", "--accelerator", str(path), "--seq", "32",
                                       "--chips", "1,2,4", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    chips = data["chips"]
    table = pd.DataFrame(chips["scaling"])
    assert table["chips"].tolist() == [1, 2, 4]
    # one chip is the step the rest of the report projects
    assert table["time_ns"].iloc[0] == pytest.approx(data["step_ns"])
    assert table["speedup"].tolist() == pytest.approx((data["step_ns"] / table["time_ns"]).tolist())
    assert table["efficiency"].tolist() == pytest.approx((table["speedup"] / table["chips"]).tolist())
    ops = pd.DataFrame(chips["ops"])
    assert chips["largest"] == 4 and chips["dataflow"] is True and chips["note"] is None
    assert table["comm_ns"].iloc[-1] == pytest.approx(ops["comm_ns"].sum())
    assert (ops["shard"] == "row").sum() == 4
    text = CliRunner().invoke(main, ["project", "tiny-gpt", "--accelerator", str(path), "--seq", "32",
                                     "--chips", "1,2,4", "--top", "0"])
    assert text.exit_code == 0, text.output
    assert "scaling over chips" in text.output and "per shard on 4 chips" in text.output
    html_path = tmp_path / "chips.html"
    drawn = CliRunner().invoke(main, ["project", "tiny-gpt", "--accelerator", str(path), "--seq", "32",
                                      "--chips", "1,2,4", "--html", str(html_path), "--top", "0"])
    assert drawn.exit_code == 0, drawn.output
    page = html_path.read_text(encoding="utf-8")
    assert "step on several chips, tensor-parallel" in page and "time per shard on 4 chips" in page


def test_project_chips_on_a_captured_run_says_it_cannot_shard(tmp_path: Path) -> None:
    from conftest import fixture_path

    root = tmp_path / "traces"
    trace = fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz")
    imported = CliRunner().invoke(main, ["import", str(trace), "--out", str(root), "--json"])
    assert imported.exit_code == 0, imported.output
    (run,) = json.loads(imported.stdout)
    path = tmp_path / "npu.yaml"
    path.write_text(NPU)
    result = CliRunner().invoke(main, ["project", run, "--accelerator", str(path), "--chips", "1,4", "--json",
                                       "--out", str(root)])
    assert result.exit_code == 0, result.output
    chips = json.loads(result.output)["chips"]
    assert chips["dataflow"] is False and "no sharding possible without dataflow" in chips["note"]
    assert [row["speedup"] for row in chips["scaling"]] == pytest.approx([1.0, 1.0])
    assert {row["shard"] for row in chips["by_shard"]} == {"replicated"}
