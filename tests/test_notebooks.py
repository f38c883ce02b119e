"""The notebooks of notebooks/: each runs top to bottom in a fresh kernel (nbclient, offline, tiny models)
and its outputs show what its text promises; an executed notebook exports to HTML (nbconvert with the
`offline` template of notebooks/templates/) that carries BokehJS and its plots and loads nothing remote. The
notebooks' first line, `workbench.quiet.quiet()`, keeps the libraries' known chatter out of their outputs (stderr)
and leaves the user's own warnings and errors there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import FIXTURES, fixture_path

nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' (nbformat, nbclient, nbconvert)")
nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' (nbclient)")
nbconvert = pytest.importorskip("nbconvert", reason="pip install -e '.[test]' (nbconvert)")
bs4 = pytest.importorskip("bs4", reason="beautifulsoup4 comes with nbconvert")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
TEMPLATES = NOTEBOOKS / "templates"
CELL_TIMEOUT_S = 600
"""Per cell; the slowest cells compile with torch.compile (10-30 s cold on two cores) or import JAX."""
BOKEH_LOAD = "application/vnd.bokehjs_load.v0+json"
BOKEH_EXEC = "application/vnd.bokehjs_exec.v0+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
REMOTE_SCRIPT = re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"']?\s*(https?:)?//", re.IGNORECASE)
REMOTE_STYLE = re.compile(r"<link\b[^>]*\bhref\s*=\s*[\"']?\s*(https?:)?//", re.IGNORECASE)
NOISE = re.compile(
    r"^(USDT|STAGE|INFO|WARNING|ERROR):\d{4}-\d\d-\d\d "  # Kineto
    r"|^[IWE]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\]"  # glog / absl (XLA, XProf) and torch's logger
    r"|absl::InitializeLog|gpuGetDeviceCount|External init callback"
    r"|register_constant\(\)|_pytree|_stable_hash_for_caching|No CUDA runtime is found",
    re.MULTILINE,
)
"""What the libraries under the notebooks are known to print on stderr: their chatter, not the notebook's."""


def execute(name: str, traces: Path, **env: str):
    """Run notebook `name` top to bottom in a fresh kernel started in notebooks/ (as Jupyter would), its
    runs written under `traces`; a cell that raises fails the test with its traceback."""
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    return run(nb, NOTEBOOKS, WORKBENCH_TRACES=str(traces), **env)


def run(nb, folder: Path, **env: str):
    """Execute `nb` in a fresh kernel started in `folder`, with `env` added to its environment. The kernel
    does not learn it runs under pytest, so it sends what is written to fds 1 and 2 (native libraries' lines)
    to the cells' outputs, as under Jupyter (ipykernel leaves the descriptors alone under pytest)."""
    with pytest.MonkeyPatch.context() as patch:  # the kernel inherits the environment
        patch.delenv("PYTEST_CURRENT_TEST", raising=False)
        for key, value in env.items():
            patch.setenv(key, value)
        nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def outputs(nb, tag: str) -> list:
    """The outputs of the code cell tagged `tag`."""
    (cell,) = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
    return cell.outputs


def table(cell_outputs: list) -> list[dict[str, str]]:
    """The rows of the DataFrame a cell returned, from its HTML, as {column: text}; the index under ""."""
    (html,) = [o.data["text/html"] for o in cell_outputs if "text/html" in o.get("data", {})]
    soup = bs4.BeautifulSoup(html, "html.parser")
    header = [th.get_text() for th in soup.select("thead tr")[0].find_all("th")]
    return [dict(zip(header, [cell.get_text() for cell in row.find_all(["th", "td"])], strict=True))
            for row in soup.select("tbody tr")]


def stderr(nb) -> str:
    """What the notebook's cells printed on stderr."""
    return "".join(o.text for c in nb.cells for o in c.get("outputs", [])
                   if o.output_type == "stream" and o.name == "stderr")


def assert_ran_clean(nb) -> None:
    """Every code cell ran, in order, none left an error output, and none printed the libraries' known chatter."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert errors == []
    noise = [line for line in stderr(nb).splitlines() if NOISE.search(line)]
    assert noise == []


def assert_plot(cell_outputs: list) -> None:
    """The cell drew a Bokeh layout (the embed script and its div)."""
    kinds = [set(o.get("data", {})) for o in cell_outputs]
    assert any(BOKEH_EXEC in k and "application/javascript" in k for k in kinds), kinds
    assert any("text/html" in k for k in kinds)


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory):
    return execute("01-quick-start", tmp_path_factory.mktemp("quick-start"))


def test_notebooks_are_stored_clean():
    """Stored without outputs (they are made by running), valid, each with the Python 3 kernel."""
    names = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    assert names == ["01-quick-start", "02-fusion", "03-quantization", "04-import-traces", "05-app", "06-real-models",
                     "07-many-ranks", "08-quantization"]
    for name in names:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.kernelspec.name == "python3"
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, (name, cell.source[:60])
                ast.parse(cell.source)


def test_quick_start(quick_start):
    assert_ran_clean(quick_start)
    rows = table(outputs(quick_start, "summary"))
    assert [(r["variant"], r["status"]) for r in rows] == [("eager", "ok"), ("bf16", "ok")]
    bf16 = rows[1]
    assert float(bf16["p50_ms"]) > 0 and float(bf16["speedup"]) > 0
    assert 10 < float(bf16["sqnr_db"]) < 100 and 0 <= float(bf16["top1"]) <= 1
    assert any(BOKEH_LOAD in o.get("data", {}) for o in outputs(quick_start, "views"))  # BokehJS, inline
    assert_plot(outputs(quick_start, "views"))


def test_exported_html_is_self_contained(quick_start, tmp_path):
    from bokeh import __version__ as bokeh_version
    from nbconvert import HTMLExporter

    offline = HTMLExporter(template_name="offline", extra_template_basedirs=[str(TEMPLATES)])
    body, _ = offline.from_notebook_node(quick_start)
    assert not REMOTE_SCRIPT.search(body) and not REMOTE_STYLE.search(body)
    soup = bs4.BeautifulSoup(body, "html.parser")
    remote = [(tag.name, name, value) for tag in soup.find_all(True) for name, value in tag.attrs.items()
              if name in ("src", "href", "data") and re.match(r"\s*(https?:)?//", str(value))]
    assert remote == []  # no script, style, image or frame from the network
    scripts = [s.get_text() for s in soup.find_all("script")]
    bokehjs = [s for s in scripts if f'"{bokeh_version}"' in s or f"'{bokeh_version}'" in s]
    assert bokehjs and max(map(len, bokehjs)) > 1_000_000  # BokehJS itself, inline
    for tag in soup.find_all("script"):  # BokehJS names CDNs it would use only for math text and icons
        if tag.get_text() in bokehjs:
            tag.decompose()
    assert "https://cdn" not in str(soup)  # nothing else names a CDN (require.js, MathJax, mermaid)
    assert not NOISE.search(soup.get_text("\n"))  # the exported outputs carry no chatter either
    assert any("embed_items_notebook" in s or "embed_items" in s for s in scripts)  # the plot
    assert soup.title.get_text() == "workbench: quick start"
    (tmp_path / "quick-start.html").write_text(body, encoding="utf-8")

    default, _ = HTMLExporter(template_name="lab").from_notebook_node(quick_start)
    assert REMOTE_SCRIPT.search(default)  # what the offline template leaves out (require.js, MathJax)


def test_quiet_keeps_the_users_own_warnings(tmp_path):
    """In a kernel, `quiet()` leaves out the native chatter written to fd 2 and the known deprecations, and keeps
    what the user's code writes and warns, native or Python."""
    cells = [
        "from workbench.quiet import quiet\nquiet()",
        "import logging, os, sys, warnings\n"
        "os.write(2, b'USDT:2026-12-04 22:11:47 1:1 SyncActivityProfilerHandler.cpp:39] profiler_start\\n')\n"
        "os.write(2, b'ERROR:2026-12-04 22:11:47 1:1 DeviceProperties.cpp:56] gpuGetDeviceCount failed\\n')\n"
        "os.write(2, b'E0000 00:00:1796422448.528759   16016 factory.cc:65] No UnifiedProfileProcessor\\n')\n"
        "os.write(2, b'my native error\\n')\n"
        "warnings.warn('my own warning', UserWarning)\n"
        "warnings.warn('Calling register_constant() on X is deprecated', FutureWarning)\n"  # from __main__: kept
        "pytree = logging.getLogger('torch.utils._pytree')\n"
        "pytree.warning('Calling register_constant() on Enum subclasses is deprecated')\n"
        "pytree.warning('my own pytree record')",
        "import sys, time\nsys.stderr.flush(); time.sleep(1)",  # lets fd 2's pipes drain into this cell at the latest
    ]
    printed = stderr(run(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), tmp_path))
    for kept in ("my native error", "my own warning", "on X is deprecated", "my own pytree record"):
        assert kept in printed, printed
    for left_out in ("profiler_start", "gpuGetDeviceCount", "UnifiedProfileProcessor", "Enum subclasses"):
        assert left_out not in printed, printed


@pytest.mark.slow
def test_fusion(tmp_path):
    nb = execute("02-fusion", tmp_path / "traces")
    assert_ran_clean(nb)
    rows = {r["variant"]: r for r in table(outputs(nb, "fusion-table"))}
    assert list(rows) == ["eager", "compile", "jax-jit", "jax-nofusion"]
    assert float(rows["jax-jit"]["fusions"]) > 0 and float(rows["jax-nofusion"]["fusions"]) == 0
    assert float(rows["jax-nofusion"]["kernels"]) > float(rows["jax-jit"]["kernels"])
    assert float(rows["compile"]["fusions"]) > 0 and float(rows["eager"]["fusions"]) == 0
    counts = {r[""]: r for r in table(outputs(nb, "hlo-counts"))}
    several = counts["fusing several ops"]
    assert float(several["jax-jit"]) > 0 and float(several["jax-nofusion"]) == 0
    assert float(counts["holding one op"]["jax-nofusion"]) == float(counts["fusion instructions"]["jax-nofusion"])
    assert_plot(outputs(nb, "views"))


@pytest.mark.slow
def test_quantization(tmp_path):
    nb = execute("03-quantization", tmp_path / "traces")
    assert_ran_clean(nb)
    rows = {r["variant"]: r for r in table(outputs(nb, "summary"))}
    assert list(rows) == ["eager", "bf16", "int8", "int8-weight-only"]
    assert float(rows["eager"]["speedup"]) == pytest.approx(1.0)
    for variant in ("bf16", "int8", "int8-weight-only"):
        assert 10 < float(rows[variant]["sqnr_db"]) < 100, rows[variant]
        assert float(rows[variant]["max_abs_error"]) > 0 and float(rows[variant]["speedup"]) > 0
    assert float(rows["int8"]["first_call_s"]) > float(rows["bf16"]["first_call_s"])  # compiled
    assert_plot(outputs(nb, "views"))


def test_quantization_lab(tmp_path):
    nb = execute("08-quantization", tmp_path / "traces")
    assert_ran_clean(nb)
    worst = table(outputs(nb, "worst"))
    assert len(worst) == 8 and all(float(row["sqnr_db"]) > 0 for row in worst)
    kinds = {(row["tensor"], row["format"]) for row in table(outputs(nb, "kinds"))}
    assert ("kv", "nvfp4") in kinds and ("linear.weight", "int4/group32") in kinds
    assert_plot(outputs(nb, "recipes"))
    assert "kept in bf16:" in "".join(o.get("text", "") for o in outputs(nb, "plan"))


def test_import_traces_without_fixtures(tmp_path):
    """Where shared/fixtures is absent (Binder) the notebook records a trace itself and imports that."""
    empty = tmp_path / "no-fixtures"
    empty.mkdir()
    nb = execute("04-import-traces", tmp_path / "traces", WORKBENCH_FIXTURES=str(empty))
    assert_ran_clean(nb)
    (row,) = table(outputs(nb, "summary"))
    assert "import-mlp" in row["run"] and row["device"] == "cpu" and int(row["op events"]) > 0
    names = [r["name"] for r in table(outputs(nb, "top"))]
    assert "aten::addmm" in names
    assert_plot(outputs(nb, "views"))


def test_import_traces_of_the_gpu_fixtures(tmp_path):
    fixture_path("kineto", "amd_mi250_train.json.gz")
    fixture_path("nsys", "h100_2gpu_1s.sqlite")
    nb = execute("04-import-traces", tmp_path / "traces", WORKBENCH_FIXTURES=str(FIXTURES))
    assert_ran_clean(nb)
    amd, h100 = table(outputs(nb, "summary"))
    assert "amd-mi250" in amd["run"] and "rocm" in amd["device"]
    assert "h100" in h100["run"] and "cuda:0" in h100["device"] and "cuda:1" in h100["device"]
    assert int(h100["kernel events"]) == 3442  # the fixture's kernels (see its README)
    top = table(outputs(nb, "top"))
    assert len(top) == 10 and all(float(r["total_us"]) > 0 for r in top)
    assert_plot(outputs(nb, "views"))


def test_app(tmp_path):
    nb = execute("05-app", tmp_path / "traces")
    assert_ran_clean(nb)
    shown = outputs(nb, "app")
    assert any(BOKEH_LOAD in o.get("data", {}) for o in shown)  # the app loads BokehJS for its views
    assert any(WIDGET_VIEW in o.get("data", {}) for o in shown)
    (result,) = [o.data["text/plain"] for o in outputs(nb, "result") if o.output_type == "execute_result"]
    value, label, variants = ast.literal_eval(result)
    assert value == 100 and variants == ["eager", "bf16"] and "2 runs" in label
    assert nb.metadata.widgets  # the widgets' state, stored by nbclient
    states = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    assert any(s["model_name"] == "BokehModel" for s in states.values())


def test_many_ranks(tmp_path):
    """8 ranks built in the notebook (rank 5 runs one GEMM more per step) imported, the straggler found from
    the per-rank queries, the ranks view drawn, and the same figures from a memory:// traces root."""
    nb = execute("07-many-ranks", tmp_path / "traces", WORKBENCH_CACHE=str(tmp_path / "cache"))
    assert_ran_clean(nb)
    (imported,) = [o.data["text/plain"] for o in outputs(nb, "import") if o.output_type == "execute_result"]
    experiment, runs, failed = ast.literal_eval(imported)
    assert runs == 8 and failed == {} and (tmp_path / "traces" / "experiments" / f"{experiment}.json").is_file()
    rows = table(outputs(nb, "ranks"))
    assert [int(r["rank"]) for r in rows] == list(range(8))
    assert [int(r["rank"]) for r in rows if r["straggler"] == "True"] == [5]
    assert {float(r["median_step_ns"]) for r in rows if r["rank"] != "5"} == {1e6}  # 1000 µs steps
    assert float(next(r for r in rows if r["rank"] == "5")["median_step_ns"]) == 1.3e6
    assert_plot(outputs(nb, "view"))
    (same,) = [o.data["text/plain"] for o in outputs(nb, "shared") if o.output_type == "execute_result"]
    assert same == "True"
    assert not list((tmp_path / "cache").rglob("*.parquet"))  # the URL's ranks were read where they lie


@pytest.mark.slow
def test_real_models(tmp_path):
    """The reduced Llama's batch sweep (torch and ORT variants), its curves and ORT's fusions, the reduced ViT,
    and a generation with the dynamic and static caches."""
    nb = execute("06-real-models", tmp_path / "traces")
    assert_ran_clean(nb)
    variants, batches = ["eager", "bf16", "ort", "ort-int8"], ["1", "2", "4"]
    sweep = table(outputs(nb, "sweep"))
    assert [(r["series"], r["batch"]) for r in sweep] == [(v, b) for v in variants for b in batches]
    assert all(float(r["p50_ms"]) > 0 and float(r["items_per_s"]) > 0 for r in sweep)
    for row in sweep:
        torch_run = row["series"] in ("eager", "bf16")
        assert (int(row["peak_bytes"]) > 0) if torch_run else row["peak_bytes"] == "<NA>", row  # as the text says
        if row["series"] == "eager":
            assert float(row["speedup"]) == pytest.approx(1.0)

    numerics = {r["variant"]: r for r in table(outputs(nb, "numerics"))}
    assert set(numerics) == {f"{v}-b{b}" for v in variants for b in batches}
    for batch in batches:
        assert float(numerics[f"ort-b{batch}"]["sqnr_db"]) > 100  # the same fp32 math, reordered
        for lossy in ("bf16", "ort-int8"):
            assert 10 < float(numerics[f"{lossy}-b{batch}"]["sqnr_db"]) < 100

    for row in table(outputs(nb, "crossovers")):  # which pairs cross depends on the machine's timings
        assert {row["winner"], row["loser"]} <= set(variants) and row["winner"] != row["loser"]
        assert float(row["batch_below"]) <= float(row["crossover_batch"]) <= float(row["batch_above"])
    front = table(outputs(nb, "pareto"))
    assert len(front) == 12 and front[0]["on_front"] == "True"  # nothing is faster than the fastest run
    assert_plot(outputs(nb, "views"))

    fusion = {r["variant"]: r for r in table(outputs(nb, "fusion-table"))}
    assert list(fusion) == [f"{v}-b4" for v in variants]
    assert fusion["ort-b4"]["framework"] == "onnxruntime" and float(fusion["ort-b4"]["fusions"]) > 0
    assert float(fusion["eager-b4"]["fusions"]) == 0
    detail = table(outputs(nb, "fusion-detail"))
    fused = [r for r in detail if r["fused"] == "True"]
    assert fused and all(float(r["change"]) > 0 for r in fused)
    assert sum(float(r["original"]) for r in detail) > sum(float(r["optimized"]) for r in detail)

    vit = {r["variant"]: r for r in table(outputs(nb, "vit-summary"))}
    assert list(vit) == variants and all(r["status"] == "ok" for r in vit.values())
    assert float(vit["ort"]["sqnr_db"]) > 100 and 10 < float(vit["ort-int8"]["sqnr_db"]) < 100

    generation = table(outputs(nb, "generation"))
    assert [(r["run"], r["status"]) for r in generation] == [("gqa-dynamic", "ok"), ("gqa-static", "ok")]
    layers, kv_heads, head_dim, context, fp32 = 2, 2, 256 // 4, 32 + 16 - 1, 4  # the notebook's LLAMA, prompt, new
    kv_bytes = 2 * layers * kv_heads * head_dim * context * fp32  # K and V
    for row in generation:
        assert int(row["kv_cache_bytes"]) == int(row["kv_cache_bytes_predicted"]) == kv_bytes
        assert float(row["ttft_ms"]) > 0 and float(row["sqnr_db vs recompute"]) > 60
    assert_plot(outputs(nb, "generation-views"))
