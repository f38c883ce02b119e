"""The LLM commands: `generate` (generation runs with a KV cache: TTFT, TPOT, tokens/s, KV bytes) and
`llm-model` (the analytical model's projection of a transformer config on a device). Their tables come from
`workbench.views.llm_text`, which the HTML views place too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from workbench.cli.capture import finish_sweep
from workbench.cli.options import comma_list, json_option, out_option, parse_overrides, set_option
from workbench.cli.render import errors, out, print_blocks, print_json, progress
from workbench.errors import WorkbenchError
from workbench.limits import MAX_ITERATIONS, check_limits
from workbench.paths import checked_output, checked_root
from workbench.views.llm_text import generation_table, llm_model_blocks


@click.command()
@click.option("--model", default="tiny-gpt", show_default=True,
              help="The built-in tiny-gpt (configure it with --set), or a Hugging Face model: hf-config:<preset> "
                   "(e.g. hf-config:llama-3-8b --set layers=2 hidden=256) or hf:<id or local folder>, run by its "
                   "own generate(), attention and caches.")
@click.option("--attention", default=None, callback=comma_list(str), metavar="LIST",
              help="Attention kinds to sweep, comma-separated: mha, gqa, mqa, mla (default: the model config's); "
                   "--set kv_heads=N sets GQA's kv heads, --set kv_latent=N MLA's latent width.")
@click.option("--kv", default="fp32", show_default=True, callback=comma_list(str), metavar="LIST",
              help="KV-cache formats to sweep: fp32, bf16, fp16, int8 (per-token scales), int8-per-head.")
@click.option("--cache", default=None, callback=comma_list(str), metavar="LIST",
              help="Hugging Face models: transformers caches to sweep: dynamic (default), static, quantized "
                   "(optimum-quanto int4), quantized-hqq, quantized-fp8.")
@click.option("--prompt", default="128", show_default=True, callback=comma_list(int), metavar="LIST",
              help="Prompt lengths to sweep.")
@click.option("--new", default="64", show_default=True, callback=comma_list(int), metavar="LIST",
              help="New tokens to generate (sweepable).")
@click.option("--batch", default="1", show_default=True, callback=comma_list(int), metavar="LIST",
              help="Batch sizes to sweep.")
@click.option("--speculative", default=0, show_default=True, type=click.IntRange(min=0), metavar="K",
              help="Also run speculative decoding with K draft tokens per round (0: off; batch 1).")
@click.option("--draft-layers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Speculative draft: the target's first N layers (an HF model's assisted generation: up to all "
                   "of them, a draft identical to the target).")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N].")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(min=1, max=MAX_ITERATIONS),
              help="Timed generations per run (interleaved across runs).")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(min=0))
@click.option("--threads", default=None, type=click.IntRange(min=1), help="torch threads during the runs.")
@click.option("--profile/--no-profile", default=True, show_default=True,
              help="Capture one generation per run with torch.profiler.")
@click.option("--with-stack", is_flag=True, help="Record Python stacks in the trace (slower).")
@set_option("Model config override, e.g. --set layers=4 --set kv_latent=64.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write an HTML report (generation figures, then the runs) to this file.")
@out_option
@json_option
@click.option("--progress-json", is_flag=True, help="Progress as JSON lines on stderr, for programs.")
def generate(model: str, attention: tuple[str, ...] | None, kv: tuple[str, ...], cache: tuple[str, ...] | None,
             prompt: tuple[int, ...],
             new: tuple[int, ...], batch: tuple[int, ...], speculative: int, draft_layers: int, device: str,
             repeats: int, warmup: int, threads: int | None, profile: bool, with_stack: bool,
             overrides: tuple[str, ...], report_path: Path | None, out_dir: str | None, as_json: bool,
             progress_json: bool) -> None:
    """Generate with a KV cache (prefill, then decode steps) and measure TTFT, TPOT, tokens/s and KV-cache
    bytes: one bundle per point of the sweep (attention × kv × batch × prompt × new) plus an experiment."""
    from workbench.llm.perf_model.hf_config import is_hf_ref

    with errors():  # misuse fails here, before torch loads (prompt and new are bounded by the model's max_seq)
        hf = is_hf_ref(model)
        if cache is not None and not hf:
            raise WorkbenchError("generate: --cache picks a Hugging Face model's cache (hf: / hf-config:); "
                                 "tiny-gpt's cache formats are --kv")
        model_overrides = parse_overrides(overrides)
        check_limits({"batch": max(batch), "warmup": warmup, "threads": threads, "overrides": model_overrides})
        root = checked_root(out_dir, writing=True)
        report_path = checked_output(report_path) if report_path is not None else None
    from workbench.llm.run import GenerateSettings, run_generation
    from workbench.profiling.settings import ProfileSettings

    with errors():
        common: dict[str, Any] = dict(
            model=model, attention=attention or (None,), kv=kv, batch=batch, prompt=prompt, new=new,
            speculative=speculative, draft_layers=draft_layers, device=device, warmup=warmup, repeats=repeats,
            profile=profile, profile_settings=ProfileSettings(with_stack=with_stack), threads=threads,
            model_overrides=model_overrides,
        )
        if hf:  # the model's own generate() (imports transformers)
            from workbench.llm.hf_run import HFGenerateSettings, run_hf_generation

            settings, run = HFGenerateSettings(**common, cache=cache or ("dynamic",)), run_hf_generation
        else:
            settings, run = GenerateSettings(**common), run_generation
        with progress(as_json, progress_json) as bars:
            result = run(settings, root, progress=bars)
    runs = [r.to_dict() for r in result.runs]
    finish_sweep(result.experiment_id, root, runs, generation_table(result.experiment_id, runs), "run",
                 report_path, as_json)


@click.command(name="llm-model")
@click.option("--config", "config_text", required=True, metavar="CONFIG",
              help="A preset (tiny-gpt, llama-3-8b, deepseek-v2-lite), inline key=value pairs "
                   "('tiny-gpt,kv_heads=2' or 'layers=4,d_model=512,heads=8,vocab=32000'), a JSON/YAML file, "
                   "a Hugging Face config: hf:<id or local folder> (local only) or hf-config:<preset> (with --set).")
@set_option("hf-config: preset override, e.g. --set layers=2 --set kv_heads=2.")
@click.option("--device", default="h100", show_default=True, metavar="SPEC",
              help="A built-in device (h100, a100, l4, tpu-v5e...), cpu (measured), or an accelerator YAML.")
@click.option("--batch", "batches", default="1", show_default=True,
              help="Batch sizes: 1,8,64 or a doubling range 1..256.")
@click.option("--prompt", "prompts", default="512", show_default=True, help="Prompt lengths (tokens; 4k = 4096).")
@click.option("--new", "news", default="128", show_default=True, help="Generated tokens per sequence.")
@click.option("--context", "contexts", default=None,
              help="Contexts for the KV-cache and crossover sweep (default: 128..max_seq, doubling).")
@click.option("--spec-k", default=None, type=click.IntRange(min=1),
              help="Speculative decoding: tokens drafted per target pass.")
@click.option("--acceptance", default=0.7, show_default=True, type=click.FloatRange(0, 1),
              help="Speculative decoding: probability a drafted token is accepted.")
@click.option("--draft-cost", default=0.05, show_default=True, type=click.FloatRange(min=0),
              help="Speculative decoding: draft step time over target step time.")
@click.option("--overhead-ms", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Fixed cost per forward pass (launch / dispatch), added to each pass.")
@click.option("--prefill-logits", default="last", show_default=True, type=click.Choice(["last", "all"]),
              help="Logits of the last prompt token (serving engines) or of all (a plain forward).")
@click.option("--prefill-chunk", default=None, type=click.IntRange(min=1),
              help="Prefill in chunks of this many tokens (bounds the activation memory).")
@click.option("--memory-fraction", default=0.9, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="Share of device memory the model may use.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the projection (its tables, the KV-cache view) to this HTML file.")
@json_option
def llm_model(config_text: str, overrides: tuple[str, ...], device: str, batches: str, prompts: str, news: str,
              contexts: str | None,
              spec_k: int | None, acceptance: float, draft_cost: float, overhead_ms: float, prefill_logits: str,
              prefill_chunk: int | None, memory_fraction: float, html_path: Path | None, as_json: bool) -> None:
    """Analytical LLM inference model: FLOPs, bytes, KV cache, TTFT/TPOT from the roofline, crossover
    batch, longest context and speculative speedup of a transformer config on a device (a projection)."""
    from workbench.hardware import resolve_device_spec
    from workbench.llm import perf_model as pm

    with errors():
        config = _llm_config(config_text, parse_overrides(overrides))
        spec = resolve_device_spec(device)
        result = pm.llm_projection(
            config, spec, batches=pm.parse_sweep(batches, "--batch"), prompts=pm.parse_sweep(prompts, "--prompt"),
            news=pm.parse_sweep(news, "--new"), contexts=pm.parse_sweep(contexts, "--context") if contexts else None,
            spec_k=spec_k, acceptance=acceptance, draft_cost=draft_cost, overhead_s=overhead_ms / 1e3,
            prefill_logits=prefill_logits, memory_fraction=memory_fraction, prefill_chunk=prefill_chunk)
        if html_path is not None:
            from workbench.report import write_report
            from workbench.views.llm_model import projection_view

            layout = projection_view(result, title=f"{config.name} on {spec.name}")
            result["html"] = str(write_report(layout, html_path, title=f"workbench llm-model: {config.name}"))
    if as_json:
        print_json(result)
    else:
        print_blocks(llm_model_blocks(result))
        if result.get("html"):
            out.print(f"view: {result['html']}")


def _llm_config(text: str, overrides: dict[str, Any]) -> Any:
    """The `LLMConfig` of `--config`: an hf: / hf-config: reference (with `--set` overrides for a preset), else
    what `perf_model.parse_config` reads."""
    from workbench.llm import perf_model as pm
    from workbench.llm.perf_model.hf_config import hf_llm_config, is_hf_ref

    if is_hf_ref(text.strip()):
        return hf_llm_config(text.strip(), overrides)
    if overrides:
        raise WorkbenchError("llm-model: --set applies to hf-config: presets; give other keys inline in --config "
                             "('tiny-gpt,kv_heads=2')")
    return pm.parse_config(text)
