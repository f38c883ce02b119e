"""What `workbench project` and `wb.project` project: a captured run (its measured steps' ops), a model file (an
ONNX model, a saved torch.export program, an XLA HLO module: `workbench.codesign.file_graphs`) or a model (one
forward of its example inputs), as an operator graph and the number of steps it covers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    import pandas as pd

    from workbench.llm.perf_model import LLMConfig
    from workbench.models.loaded import LoadedModel
    from workbench.trace.store.bundle import Bundle


@dataclass(frozen=True)
class GraphSource:
    """An operator graph, what it came from ("run <id>" or "model <name> batch x seq") and the steps it covers;
    for a decoder-only language model (tiny-gpt, an `hf-config:` causal LM) its performance-model config and the
    sequence length of the forward, which the attention-variant guidance reads."""

    graph: pd.DataFrame
    label: str
    steps: int
    llm: LLMConfig | None = None
    batch: int = 1
    seq: int | None = None


@dataclass(frozen=True)
class SetModel:
    """A member of the model set `workbench project --models` takes: a model reference, its config overrides
    (a reduced size, built in code: nothing is downloaded) and a sequence length."""

    ref: str
    overrides: Mapping[str, Any]
    seq: int | None = None


MODEL_SET: dict[str, SetModel] = {
    "tiny-gpt": SetModel("tiny-gpt", {}, 128),
    "llama-reduced": SetModel("hf-config:llama-3-8b", {"layers": 2, "hidden": 512, "heads": 8, "vocab": 2048}, 128),
    "resnet50": SetModel("torchvision:resnet50", {}),
    "vit": SetModel("hf-config:vit-base", {"layers": 2}),
    "bert": SetModel("hf-config:bert-base", {"layers": 2, "vocab": 2048}, 128),
}
"""Short names of the model set: tiny-gpt as built in; Llama-3-8B's architecture (GQA, SwiGLU, RMSNorm, RoPE) at
2 layers of width 512; ResNet-50 whole (torchvision, seeded weights); ViT-B/16 and BERT-base at 2 of their 12
layers (each layer is the same, so the step is a sixth of the full model's, its mix the same)."""


def set_model_graph(name: str, *, batch: int = 1) -> GraphSource:
    """The graph of one forward of the model set's member `name` (`MODEL_SET`); any other name is a model
    reference `load_model` takes."""
    member = MODEL_SET.get(name)
    if member is None:
        return model_graph(name, batch=batch)
    return model_graph(member.ref, batch=batch, seq=member.seq, overrides=dict(member.overrides))


def run_graph(bundle: Bundle) -> GraphSource:
    """The graph of a run's measured steps (the whole trace without a measure phase), from recorded shapes."""
    from workbench.analysis.breakdown import phase_window
    from workbench.analysis.steps import steps_in
    from workbench.codesign.graph import graph_from_trace
    from workbench.trace.schema import PHASE_MEASURE

    trace = bundle.trace()
    graph = graph_from_trace(trace.df(), phase_window(trace, PHASE_MEASURE))
    if graph.empty:
        raise WorkbenchError(f"run {bundle.run_id!r}: no operator with recorded shapes to project (capture with "
                             "shapes recorded: torch.profiler record_shapes, which `workbench capture` sets)")
    return GraphSource(graph, f"run {bundle.run_id}", steps_in(trace))


def model_graph(model: str, *, batch: int = 1, seq: int | None = None, timed: bool = False,
                overrides: dict[str, Any] | None = None) -> GraphSource:
    """The graph of one forward of `model` (any reference `load_model` takes) on its seeded example inputs."""
    from workbench.codesign.graph import graph_from_model
    from workbench.models.registry import load_model

    loaded = load_model(model, **(overrides or {}))
    inputs = loaded.make_inputs(batch=batch, seq=seq) if loaded.default_seq is not None \
        else loaded.make_inputs(batch=batch)
    length = (seq or loaded.default_seq) if loaded.default_seq is not None else None
    shape = f"batch {batch}" + (f", seq {length}" if length is not None else "")
    return GraphSource(graph_from_model(loaded.module, tuple(inputs), timed=timed), f"model {loaded.name} ({shape})",
                       1, llm_config(loaded, model, overrides or {}), batch, length)


def llm_config(loaded: LoadedModel, ref: str, overrides: Mapping[str, Any]) -> LLMConfig | None:
    """The performance model's config of a decoder-only language model: tiny-gpt (its config on the perf model's
    tiny-gpt preset) or an `hf-config:` causal LM; None for any other model."""
    if loaded.source == "builtin" and loaded.name == "tiny-gpt":
        from workbench.llm.perf_model import make_config

        keys = ("layers", "d_model", "heads", "kv_heads", "vocab", "max_seq", "mlp_ratio", "attention", "kv_latent")
        return make_config({"preset": "tiny-gpt", "name": "tiny-gpt",
                            **{k: loaded.config[k] for k in keys if loaded.config.get(k) is not None}})
    if loaded.source == "hf-config":
        from workbench.llm.perf_model.hf_config import hf_llm_config
        from workbench.models.hf_presets import preset

        if preset(ref.partition(":")[2]).task == "causal-lm":
            return hf_llm_config(ref, overrides)
    return None


def file_graph(ref: str, shapes: Mapping[str, Any] | None = None) -> GraphSource | None:
    """The graph of a model file `ref` names (a path, or `onnx:<path>`): ONNX (its dynamic input dims from
    `shapes`), a saved torch.export program or XLA HLO text; None when `ref` names no such file."""
    from workbench.codesign.file_graphs import file_kind, graph_from_file

    path = Path(ref.removeprefix("onnx:"))
    kind = file_kind(path) if path.is_file() else None
    if kind is None:
        if shapes:
            raise WorkbenchError(f"--shape gives input sizes of an ONNX file; {ref!r} is not one")
        return None
    return GraphSource(graph_from_file(path, shapes), f"{kind} file {path.name}", 1)


def graph_source(ref: str, root: str | Path, *, batch: int = 1, seq: int | None = None,
                 shapes: Mapping[str, Any] | None = None) -> GraphSource:
    """A model file when `ref` names one (`file_graph`), a run when it names one under `root` (or a bundle
    folder), else a model reference."""
    from workbench.trace.store.bundle import open_bundle

    from_file = file_graph(ref, shapes)
    if from_file is not None:
        return from_file
    try:
        bundle = open_bundle(ref, root)
    except WorkbenchError:
        return model_graph(ref, batch=batch, seq=seq)
    return run_graph(bundle)
