"""Speculative decoding reproduces greedy decoding of the target, and counts what it proposed and accepted."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.llm.generate import generate
from workbench.llm.speculative import first_layers_draft, speculative_generate
from workbench.models import LoadedModel, load_model
from workbench.profiling.torch_profiler import TorchProfilerSession
from workbench.trace import read_trace

TARGET = {"vocab": 256, "layers": 3, "d_model": 64, "heads": 4, "max_seq": 96}
ATTENTIONS = {"mha": {}, "gqa": {"kv_heads": 2}, "mla": {"attention": "mla"}}
PROMPT, NEW = 12, 30


@cache
def _target(attention: str) -> LoadedModel:
    return load_model("tiny-gpt", **TARGET, **ATTENTIONS[attention])


def _prompt(loaded: LoadedModel) -> torch.Tensor:
    return loaded.make_inputs(1, PROMPT)[0]


@pytest.mark.parametrize(("attention", "kv_dtype", "draft_layers", "k"), [
    ("mha", "fp32", 1, 1), ("mha", "fp32", 2, 4), ("gqa", "fp32", 1, 3), ("gqa", "int8", 2, 2),
    ("mla", "fp32", 2, 3), ("mla", "bf16", 1, 4),
])
def test_speculative_decoding_reproduces_the_targets_greedy_output(attention, kv_dtype, draft_layers, k):
    loaded = _target(attention)
    prompt = _prompt(loaded)
    greedy = generate(loaded.module, prompt, NEW, kv_dtype=kv_dtype)
    spec = speculative_generate(loaded.module, first_layers_draft(loaded.module, draft_layers), prompt, NEW, k,
                                kv_dtype=kv_dtype)
    assert torch.equal(spec.tokens, greedy.tokens)
    # accounting: every round after the prefill emits its accepted proposals plus one target token
    assert spec.times.step_tokens[0] == 1 and spec.times.output_tokens == NEW
    assert spec.accepted == spec.times.output_tokens - 1 - spec.rounds
    assert 0 <= spec.accepted <= spec.proposed <= k * spec.rounds
    assert spec.acceptance_rate == spec.accepted / spec.proposed
    assert spec.kv_cache_bytes == greedy.kv_cache_bytes  # same format and capacity for the target


def test_a_separately_seeded_draft_still_gives_the_targets_output():
    loaded = _target("gqa")
    prompt = _prompt(loaded)
    draft = load_model("tiny-gpt", **{**TARGET, "layers": 1}, kv_heads=2, seed=7).module
    spec = speculative_generate(loaded.module, draft, prompt, NEW, 3)
    assert torch.equal(spec.tokens, generate(loaded.module, prompt, NEW).tokens)
    assert spec.proposed > 0 and spec.acceptance_rate is not None


def test_the_target_as_its_own_draft_has_every_proposal_accepted():
    loaded = _target("mha")
    prompt = _prompt(loaded)
    spec = speculative_generate(loaded.module, loaded.module, prompt, NEW, 4)
    assert spec.acceptance_rate == 1.0
    # full rounds emit k + 1 tokens (the bonus token), the last is cut so that exactly NEW come out
    assert spec.times.step_tokens[1:3] == (5, 5)
    assert torch.equal(spec.tokens, generate(loaded.module, prompt, NEW).tokens)


def test_first_layers_draft_shares_the_targets_modules():
    target = _target("mha").module
    draft = first_layers_draft(target, 2)
    assert len(draft.blocks) == 2
    assert draft.blocks[0] is target.blocks[0] and draft.lm_head is target.lm_head and draft.tok_emb is target.tok_emb
    assert len(target.blocks) == 3  # the target is untouched
    with pytest.raises(WorkbenchError, match=r"draft layers must be in 1\.\.2"):
        first_layers_draft(target, 3)


def test_rounds_are_labelled_with_draft_and_verify_inside(tmp_path):
    loaded = _target("mla")
    prompt = _prompt(loaded)
    with TorchProfilerSession(tmp_path, "spec") as session:
        spec = speculative_generate(loaded.module, first_layers_draft(loaded.module, 1), prompt, 6, 2)
    events = read_trace(session.trace_path).df()
    notes = events[events["kind"] == "annotation"].sort_values("start_ns")
    names = notes["name"].astype(str).tolist()
    assert names.count("prefill") == 1
    assert sum(name.startswith("decode ") for name in names) == spec.rounds
    assert names.count("verify") == spec.rounds
    decode0 = notes[notes["name"] == "decode 0"].iloc[0]
    verify = notes[notes["name"] == "verify"].iloc[0]
    assert verify["parent"] == decode0.name  # nested in its round


def test_one_new_token_needs_no_round():
    loaded = _target("gqa")
    spec = speculative_generate(loaded.module, first_layers_draft(loaded.module, 1), _prompt(loaded), 1, 3)
    assert spec.rounds == 0 and spec.proposed == 0 and spec.acceptance_rate is None
    assert torch.equal(spec.tokens, generate(loaded.module, _prompt(loaded), 1).tokens)


@pytest.mark.parametrize(("change", "message"), [
    ({"prompt": "batch2"}, "one sequence at a time; the prompt has batch 2"),
    ({"k": 0}, "k \\(draft tokens per round\\) must be an integer >= 1"),
    ({"draft": "other_vocab"}, "the draft's vocabulary \\(128\\) differs from the target's \\(256\\)"),
])
def test_speculative_rejects_bad_requests(change, message):
    loaded = _target("mha")
    prompt = loaded.make_inputs(2, PROMPT)[0] if change.get("prompt") else _prompt(loaded)
    draft = load_model("tiny-gpt", **{**TARGET, "vocab": 128, "layers": 1}).module if change.get("draft") \
        else first_layers_draft(loaded.module, 1)
    with pytest.raises(WorkbenchError, match=message):
        speculative_generate(loaded.module, draft, prompt, 4, change.get("k", 2))
