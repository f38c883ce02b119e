"""Text reports every surface places: the number format, HTML tables, the generation and llm-model tables,
and the views a kind of runs adds (generation, ranks)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from bokeh.embed import json_item
from bokeh.models import Tabs

from workbench.hardware import resolve_device_spec
from workbench.llm import perf_model as pm
from workbench.views.llm_model import projection_view
from workbench.views.llm_text import GENERATION_COLUMNS, generation_table, llm_model_blocks
from workbench.views.run_kinds import is_rank_set, with_kind_views
from workbench.views.text_tables import Cell, TextTable, cells, format_number, html_table, paragraph_html


@pytest.mark.parametrize(("value", "suffix", "text"), [
    (None, "", "-"), ("n/a", "", "n/a"), (12.345, "", "12.3"), (0.5, "x", "0.5x"), (4096, "", "4,096"),
    (1234.4, "x", "1,234x"), (-0.000123456, "", "-0.000123"), (999.4, "", "999"),
])
def test_format_number(value, suffix, text):
    assert format_number(value, suffix) == text


def test_cells_and_tables():
    assert cells(3.14159, None, "a", Cell("b", "bad")) == (Cell("3.14"), Cell("-"), Cell("a"), Cell("b", "bad"))
    with pytest.raises(ValueError, match="a row of 1 cells for 2 columns"):
        TextTable("t", ("a", "b"), ((Cell("x"),),))


def test_cells_of_several_tones():
    table = TextTable("t", ("a",), (((Cell("1"), Cell(" <late>", "bad")),),))  # one row of one cell
    assert '<td style="text-align:right;padding:2px 8px">1<span style="color:red;"> &lt;late&gt;</span></td>' \
        in html_table(table)


def test_html_tables_escape_every_text():
    table = TextTable("<i>title</i>", ("name", "<ms>"), ((Cell("<img src=x onerror=alert(1)>", "bad"), Cell("1.5")),),
                      left=frozenset({"name"}))
    text = html_table(table)
    assert "<img" not in text and "<i>" not in text and "<ms>" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "&lt;ms&gt;" in text
    assert 'style="text-align:left;color:red;padding:2px 8px">&lt;img' in text
    assert 'style="text-align:right;padding:2px 8px">1.5</td>' in text


def test_generation_table():
    runs = [{"variant": "mha-fp32", "status": "ok", "run_id": "r1", "llm": {
                "ttft_ms": 12.345, "tpot_ms": 1.5, "tpot_p99_ms": 2.25, "tokens_per_s": 1234.4, "kv_cache_bytes": 65536,
                "speculative": {"acceptance_rate": 0.75, "speedup_vs_greedy": 1.5}}},
            {"variant": "mla-int8", "status": "failed", "run_id": "r2", "error": "boom", "llm": None}]
    table = generation_table("gen-1", runs)
    assert table.title == "generation gen-1" and table.columns == GENERATION_COLUMNS
    assert [c.text for c in table.rows[0]] == ["mha-fp32", "ok", "12.3", "1.5", "2.25", "1,234", "65,536", "0.75",
                                               "1.5x", "r1"]
    assert table.rows[0][1].tone == "good"
    assert [c.text for c in table.rows[1]] == ["mla-int8", "failed", *["-"] * 7, "r2"]
    assert table.rows[1][1].tone == "bad"


@pytest.fixture(scope="module")
def projection():
    config = pm.parse_config("tiny-gpt,kv_heads=2")
    return pm.llm_projection(config, resolve_device_spec("h100"), batches=[1, 8], prompts=[64, 4096], news=[16],
                             contexts=[128, 512], spec_k=3)


def test_llm_model_blocks(projection):
    headline, scenarios, contexts, *rest = llm_model_blocks(projection)
    config, weights = projection["config"], projection["weights"]
    text = "".join(part.text for part in headline)
    assert text.startswith(f"{config['name']} on {projection['device']['name']} (a projection")
    assert f"{weights['params'] / 1e9:.3g}B params" in text
    assert [part.text for part in headline if part.tone == "strong"] == [config["name"], projection["device"]["name"]]
    assert len(scenarios.rows) == len(projection["scenarios"]) == 4
    for row, scenario in zip(scenarios.rows, projection["scenarios"], strict=True):
        named = dict(zip(scenarios.columns, row, strict=False))  # "bound" twice: the first is the prefill's
        assert named["batch"].text == str(scenario["batch"]) and named["prompt"].text == str(scenario["prompt"])
        assert named["TTFT ms"].text == format_number(scenario["ttft_ms"])
        if scenario["beyond_max_seq"]:  # the number as it is, the warning in red
            assert named["new"] == (Cell(str(scenario["new"])), Cell(" (> max_seq)", "bad"))
        else:
            assert named["new"] == Cell(str(scenario["new"]))
    assert any(s["beyond_max_seq"] for s in projection["scenarios"])  # the 4096-token prompt exceeds tiny-gpt's
    assert [row[0].text for row in contexts.rows] == ["128", "512"]
    variants = next(b for b in rest if isinstance(b, TextTable))
    assert variants.title == "KV cache per sequence at 512 tokens, by attention variant"
    at_longest = [r for r in projection["kv_cache"] if r["context"] == 512]
    assert [row[0].text for row in variants.rows] == list(dict.fromkeys(r["variant"] for r in at_longest))
    assert rest[-1].startswith("speculative decoding (k=3")


def test_paragraphs_as_html():
    assert paragraph_html("a <b>") == "a &lt;b&gt;"
    assert paragraph_html((Cell("<x>", "strong"), Cell(" & y"))) == \
        '<span style="font-weight:bold;">&lt;x&gt;</span> &amp; y'


def test_projection_view_places_the_text_report(projection):
    text = json.dumps(json_item(projection_view(projection, title="t")))
    assert "scenarios" in text and "by context (one sequence)" in text and "KV-cache size" in text


def fake_bundle(rank=None, kind=None):
    return SimpleNamespace(record=SimpleNamespace(rank=rank, kind=kind), has_trace=False)


def test_rank_sets():
    assert is_rank_set([fake_bundle(0), fake_bundle(1)])
    assert not is_rank_set([fake_bundle(0)])  # one rank: nothing to set beside it
    assert not is_rank_set([fake_bundle(0), fake_bundle(0)])  # the same rank twice: not one job
    assert not is_rank_set([fake_bundle(0), fake_bundle(None)])


def test_runs_of_no_kind_keep_their_layout():
    from bokeh.models import Div

    layout = Div(text="x")
    assert with_kind_views(layout, [fake_bundle(), fake_bundle()], "runs") is layout
    ranks = with_kind_views(layout, [fake_bundle(0), fake_bundle(1)], "compare", width=600)
    assert isinstance(ranks, Tabs) and [t.title for t in ranks.tabs] == ["ranks", "compare"]
