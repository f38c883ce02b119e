"""The framework's own profiler (the default): torch.profiler, or jax.profiler for JAX variants, in this
process, around the variant's labelled lifecycle (`workbench.profiling.lifecycle`)."""

from __future__ import annotations

from workbench.profiling.lifecycle import profile_variant
from workbench.profiling.registry import FRAMEWORK, ProfileRequest, ProfilerSpec, register_profiler
from workbench.profiling.result import ProfiledRun


def profile_in_process(request: ProfileRequest) -> ProfiledRun:
    """The variant's profiled lifecycle in this process under its backend's framework session."""
    return profile_variant(request.variant, request.loaded, request.inputs, request.folder, request.settings,
                           on_progress=lambda: request.on_progress(1))


register_profiler(ProfilerSpec(FRAMEWORK, "the framework's own profiler (torch.profiler, jax.profiler)",
                               profile_in_process, label="{framework}"))
