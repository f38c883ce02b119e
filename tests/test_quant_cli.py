"""`workbench quant` end to end on a small tiny-gpt: the JSON's figures against direct computations, the text
report, the HTML views, and bad input as one line naming the recipe entry with exit 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from workbench.cli import main  # noqa: E402

SMALL = ["--weights", "random", "--set", "d_model=32", "layers=1", "heads=2", "--batch", "1", "--seq", "16"]


def quant(*args: str):
    return CliRunner().invoke(main, ["quant", *args, *SMALL])


@pytest.fixture(scope="module")
def model():
    from workbench.models.registry import load_model

    return load_model("tiny-gpt", d_model=32, layers=1, heads=2).module


def test_json_recipes_and_scan(model, tmp_path):
    html = tmp_path / "quant.html"
    result = quant("--formats", "int8/channel,mxfp4", "--quant", "linear.weight=mxfp4", "--quant",
                   "linear.weight=int8/channel", "--budget", "sqnr=200", "--json", "--html", str(html))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    recipes = {r["recipe"]: r for r in out["recipes"]}
    assert list(recipes) == ["fp32 (reference)", "linear.weight=mxfp4", "linear.weight=int8/channel"]
    reference = recipes["fp32 (reference)"]
    assert reference["sqnr_db"] is None and reference["kl"] == 0  # exact: no infinity in JSON
    params = dict(model.named_parameters())
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    expected = sum(p.numel() * 4 // 8 + p.numel() // 32 if name.removesuffix(".weight") in linear
                   and name.endswith(".weight") else p.numel() * 2 for name, p in params.items())
    assert recipes["linear.weight=mxfp4"]["weight_bytes"] == expected
    assert reference["weight_bytes"] == sum(p.numel() * 4 for p in params.values())
    # 1 layer × (K, V) × 2 kv heads of 16 dims: fp32 reference 256 B per token, bf16 elsewhere 128 B
    assert reference["kv_bytes_per_token"] == 256 and recipes["linear.weight=mxfp4"]["kv_bytes_per_token"] == 128
    assert recipes["linear.weight=int8/channel"]["kernel"].startswith("torchao")
    assert recipes["linear.weight=int8/channel"]["measured_ms"] > 0
    assert recipes["linear.weight=mxfp4"]["kernel"].startswith("emulated only")
    assert recipes["linear.weight=int8/channel"]["sqnr_db"] > recipes["linear.weight=mxfp4"]["sqnr_db"]
    assert {r["format"] for r in out["layers"]} == {"int8/channel", "mxfp4"}
    assert len(out["layers"]) == 2 * len(linear)
    assert {r["tensor"] for r in out["tensors"]} == {"linear.weight", "linear.input", "kv", "q", "p"}
    plan = out["plan"]  # 200 dB cannot be met by int4: every layer kept, and said so
    assert plan["met"] is False and len(plan["kept"]) == len(linear)
    page = html.read_text()
    assert "output SQNR (dB) with one layer alone in each format" in page and "Pareto" in page


def test_text_report_names_the_sections():
    result = quant("--formats", "int8/channel", "--quant", "linear.weight=nvfp4,kv=fp8-e4m3/head", "--no-measure",
                   "--budget", "kl=1")
    assert result.exit_code == 0, result.output
    for words in ("KV: the KV cache): accuracy against the fp32 model", "most sensitive layers", "tensor kinds",
                  "activation outliers", "plan: int4/group32 with budget kl=1: meets"):
        assert words in result.stdout


@pytest.mark.parametrize("args, words", [
    (["--formats", "fp9"], "unknown format 'fp9'"),
    (["--formats", "int8/rows"], "unknown granularity 'rows'"),
    (["--quant", "blocks.*.qkv.weight=int8"], "blocks.*.qkv.weight=int8/tensor match no layer"),
    (["--quant", "linear.weight=int4/group48"], "recipe entry 'linear.weight=int4/group48' at "),
    (["--quant", "linear.bias=int8"], "names no tensor"),
    (["--budget", "sqnr=high"], "--budget 'sqnr=high': 'high' is no number"),
])
def test_bad_input_is_one_line_and_exit_2(args, words):
    result = quant(*args, "--no-scan", "--no-measure")
    assert result.exit_code == 2, result.output
    assert words in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_notebook_functions_draw_and_return_the_tables(monkeypatch):
    import workbench.notebook as wb

    drawn = []
    monkeypatch.setattr(wb, "_render", drawn.append)
    small = {"d_model": 32, "layers": 1, "heads": 2, "weights": "random"}
    scan = wb.quant_sensitivity("tiny-gpt", ["mxfp4"], batch=1, seq=16, **small)
    assert set(scan.layers["format"]) == {"mxfp4"} and not scan.outliers.empty
    table = wb.quant_compare("tiny-gpt", ["linear.weight=nvfp4"], measure=False, batch=1, seq=16, **small)
    assert table["recipe"].tolist() == ["fp32 (reference)", "linear.weight=nvfp4"]
    assert len(drawn) == 2
