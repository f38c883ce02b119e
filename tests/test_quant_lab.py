"""The quantization lab on the trained built-ins: calibration from the training data, the sensitivity ranking's
stability across calibration seeds, and the held-out metric behind every recipe."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from workbench.errors import WorkbenchError  # noqa: E402
from workbench.quant.lab import compare_recipes, quant_task  # noqa: E402
from workbench.quant.sensitivity import layer_sensitivity  # noqa: E402

pytestmark = pytest.mark.slow  # trains tiny-gpt once on a machine without its cached checkpoint (~2 minutes)


@pytest.fixture(scope="module")
def tasks():
    return {seed: quant_task("tiny-gpt", calibration_seed=seed) for seed in (0, 1)}


def test_calibration_comes_from_the_training_text(tasks):
    from workbench.models.trained.corpus import stdlib_corpus

    corpus = stdlib_corpus()
    (windows,) = tasks[0].inputs
    assert windows.shape[0] == 16  # the calibration batch
    for window in windows[:4]:
        text = bytes(window.tolist())
        assert text in corpus.train and text not in corpus.held_out
    assert not torch.equal(windows, tasks[1].inputs[0])  # another seed, other windows


def test_sensitivity_ranking_is_stable_across_calibration_seeds(tasks):
    tables = {seed: layer_sensitivity(task.module, task.inputs, ["mxfp4", "int4/group32"])
              for seed, task in tasks.items()}
    for fmt in ("mxfp4", "int4/group32"):
        a, b = (t[t["format"] == fmt].set_index("layer")["sqnr_db"] for t in tables.values())
        assert a.sort_values().index[:2].tolist() == b.sort_values().index[:2].tolist()  # the top layers agree
        assert a.corr(b, method="spearman") > 0.9


def test_recipes_are_judged_on_held_out_perplexity(tasks):
    task = tasks[0]
    assert task.metric == "held-out perplexity" and task.about.startswith("tiny-gpt: trained on the Python")
    table = compare_recipes(task, ["*.weight=int8/channel", "*.weight=mxfp4,*.input=mxfp4"], measure=False)
    reference, int8, mxfp4 = table["metric"].tolist()
    assert reference == pytest.approx(task.facts["value"])  # the checkpoint's own held-out perplexity
    assert reference < task.facts["baseline"]["value"] / 3  # far below the unigram model's
    assert abs(int8 - reference) < 0.01 * reference < mxfp4 - reference  # 8 bits keep it; 4 bits cost


def test_a_calibration_seed_needs_training_data():
    with pytest.raises(WorkbenchError, match="calibration seed applies to the trained built-ins"):
        quant_task("mlp", calibration_seed=1)
