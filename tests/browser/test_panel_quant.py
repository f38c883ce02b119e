"""The panel's Quantization section in a real `jupyter lab`, driven with headless Chromium: a bad format shows the
server's message in place; the lab on the small built-in `mlp` with random weights, two formats and two recipes
runs as a job with its status, and on success its views open in a "Quantization: mlp" tab: the layers × formats
heat map and the recipes' table draw (canvases, the table's cells naming the recipes), and the tab lays the views
out again when the panel's width changes. Screenshot: docs/images/panel-quant.png."""
# ruff: noqa: F811  (the Lab fixtures, imported from test_lab_browser, are the tests' arguments)

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from test_lab_browser import (  # noqa: F401 (browser, lab, page: the fixtures of Chromium, a Lab and its page)
    CAPTURE_TIMEOUT_MS,
    browser,
    canvases,
    lab,
    layout_width,
    page,
    pytestmark,
    shot,
    wait_for_plots,
)

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
FORMATS = ["int8/channel", "nvfp4"]
RECIPES = ["*.weight=int8/channel", "*.weight=nvfp4,*.input=nvfp4"]
HEAT_MAP_TITLE = "output SQNR (dB) with one layer alone in each format: lower is worse"
VIEW = '[id^="workbench-quant-"]'
FIGURE_TITLES = ("() => Bokeh.documents.flatMap((d) => [...d.all_models].filter((m) => m.type == 'Figure')"
                 ".map((m) => m.title?.text ?? ''))")
TABLE_CELLS = """(root) => {
  const cells = (node) => [...node.querySelectorAll('.slick-cell')].map(c => c.textContent.trim()).concat(
    ...[...node.querySelectorAll('*')].filter(e => e.shadowRoot).map(e => cells(e.shadowRoot)));
  return cells(root);
}"""
"""The text of every drawn cell of the Bokeh tables under an element, their shadow DOMs included."""


def fill(page, values: dict[str, str]) -> None:
    for name, value in values.items():
        page.locator(f"#jp-Workbench-quant-{name}").fill(value)


def test_the_quantization_lab_from_the_panel(lab, page):
    widths: list[int] = []
    page.on("request", lambda r: widths.append(int(parse_qs(urlsplit(r.url).query)["width"][0]))
            if "/workbench/api/quant/" in r.url and "/view?width=" in r.url else None)
    sidebar = page.locator("#jp-workbench-sidebar")
    sidebar.locator(".jp-Workbench-quantSection > summary").click()
    section = sidebar.get_by_role("region", name="Quantization")
    run = section.get_by_role("button", name="Run", exact=True)

    # a mistake the server finds: the format parser's message, in place, with no path of the server
    fill(page, {"model": "mlp", "formats": "int8/channel, fp7"})
    section.locator("#jp-Workbench-quant-weights").select_option("random")
    section.locator("#jp-Workbench-quant-measure").uncheck()  # the lab alone: no kernel timed
    run.click()
    error = section.locator(".jp-Workbench-error")
    error.wait_for(timeout=60_000)
    assert "formats: unknown format 'fp7' in 'fp7'" in error.text_content()
    assert str(lab.root_dir) not in error.text_content()

    fill(page, {"formats": ", ".join(FORMATS), "recipes": "\n".join(RECIPES), "budget": "sqnr=20"})
    run.click()
    outcome = section.locator(".jp-Workbench-quantOutcome")
    section.get_by_role("progressbar").or_(outcome).first.wait_for(timeout=30_000)
    assert error.count() == 0  # the last attempt's error went away
    if section.get_by_role("progressbar").count():
        label = section.locator(".jp-Workbench-task").text_content()
        assert label == "mlp: 2 formats, 2 recipes", label
    outcome.wait_for(timeout=CAPTURE_TIMEOUT_MS)
    assert "jp-mod-succeeded" in (outcome.get_attribute("class") or ""), outcome.text_content()
    assert outcome.locator(".jp-Workbench-outcomeText").text_content() == (
        "Quantization lab on mlp: 2 recipes, 4 layers × 2 formats")  # mlp: four Linears

    # the views open in their own tab, as wide as the panel
    tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="Quantization: mlp")
    tab.wait_for(timeout=30_000)
    wait_for_plots(page, VIEW)
    assert canvases(page, VIEW) > 0
    titles = page.evaluate(FIGURE_TITLES)
    assert HEAT_MAP_TITLE in titles, titles
    page.wait_for_function(f"() => ({TABLE_CELLS})(document.querySelector({json.dumps(VIEW)}))"
                           f".includes({json.dumps(RECIPES[1])})", timeout=30_000)
    cells = page.locator(VIEW).evaluate(TABLE_CELLS)
    assert all(recipe in cells for recipe in ["fp32 (reference)", *RECIPES]), cells
    assert page.locator(f"{VIEW} .jp-Workbench-viewStatus").is_hidden()
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMAGES / "panel-quant.png"))

    # a narrower window: the tab asks for a narrower layout, drawn from the job's tables
    first = widths[-1]
    with page.expect_response(lambda r: "/view?width=" in r.url, timeout=30_000) as narrower:
        page.set_viewport_size({"width": 1100, "height": 950})
    assert narrower.value.ok
    assert layout_width(narrower.value.url) <= first - 300, (first, narrower.value.url)
    page.locator(f"{VIEW} .jp-Workbench-viewStatus").wait_for(state="hidden", timeout=30_000)
    assert canvases(page, VIEW) > 0
    shot(page, "40-quant-narrow")

    # closed, the outcome's button opens it again
    tab.locator(".lm-TabBar-tabCloseIcon").click()
    tab.wait_for(state="detached")
    outcome.get_by_role("button", name="Show the views").click()
    tab.wait_for(timeout=30_000)
    wait_for_plots(page, VIEW)
    assert page.seen.errors == []
    assert page.seen.dialogs == []
