"""Capture requests derived from the settings dataclasses: their keys, types and defaults are the capture
command's, the words they make are ones the command accepts, and a setting of a new kind is noticed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import click
import pytest

from workbench.cli import main
from workbench.experiment import ExperimentSettings
from workbench.profiling.settings import ProfileSettings
from workbench.server.capture_fields import capture_fields, json_type_of
from workbench.server.capture_request import CaptureRequestError, capture_args

CAPTURE = main.commands["capture"]
SERVER_DECIDES = {"out_dir", "as_json", "report_path", "progress_json"}
"""Capture options a job does not choose: where it writes, its output format, the report file."""
OTHER_SPELLINGS = {"shapes"}
"""Capture options that spell another key: `--shape NAME=DIMS` is the `overrides` entry {"shapes": {NAME: dims}}."""


def cli_defaults() -> dict[str, Any]:
    """The capture command's parameters as it parses an empty command line."""
    with CAPTURE.make_context("capture", []) as ctx:
        return dict(ctx.params)


def test_the_keys_are_the_capture_commands_options():
    options = {p.name for p in CAPTURE.params if isinstance(p, click.Option)}
    assert {f.key for f in capture_fields()} == options - SERVER_DECIDES - OTHER_SPELLINGS
    assert {f.flag for f in capture_fields()} <= {opt for p in CAPTURE.params for opt in p.opts}


def test_every_settings_field_is_a_key():
    exposed = {f.path for f in capture_fields()}
    for field in dataclasses.fields(ExperimentSettings):
        if field.name != "profile_settings":
            assert (field.name,) in exposed
    assert {path for path in exposed if path[0] == "profile_settings"} <= {
        ("profile_settings", f.name) for f in dataclasses.fields(ProfileSettings)}


def test_defaults_are_the_cli_defaults():
    defaults = cli_defaults()
    for field in capture_fields():
        expected = defaults[field.key]
        if field.key == "variants":
            expected = expected.split(",")
        elif field.key == "overrides":
            expected = dict(expected)
        assert field.default == expected, field.key


SAMPLES = {"model": "mlp", "variants": ["eager", "int8"], "device": "cpu", "overrides": {"hidden": 8, "act": "relu"},
           "profiler": "framework", "kernel_name": "regex:gemm", "profile_shapes": "largest"}


@pytest.mark.parametrize("field", capture_fields(), ids=lambda f: f.key)
def test_the_words_of_each_key_parse_to_its_value(field):
    values = [SAMPLES[field.key]] if field.key in SAMPLES else \
        [True, False] if field.type == "boolean" else [field.minimum, field.maximum or field.minimum + 7]
    for value in values:
        args = capture_args({"model": "mlp", field.key: value})
        with CAPTURE.make_context("capture", args) as ctx:
            parsed = ctx.params[field.key]
        if field.key == "variants":
            parsed = parsed.split(",")
        elif field.key == "overrides":  # the repeated --set KEY=VALUE, values as JSON
            value = tuple(f"{key}={json.dumps(item)}" for key, item in value.items())
        assert parsed == value, (field.key, args)


def test_new_keys_reach_the_command_line():
    args = capture_args({"model": "mlp", "kernel_name": "regex:gemm", "launch_count": 5, "device": "cpu"})
    assert args == ["--model", "mlp", "--kernel-name", "regex:gemm", "--launch-count", "5", "--device", "cpu"]
    with pytest.raises(CaptureRequestError, match="ncu"):  # no ncu here, or no CUDA device for it
        capture_args({"model": "mlp", "profiler": "ncu"})
    with pytest.raises(CaptureRequestError, match="invalid device 'cuda:x'"):
        capture_args({"model": "mlp", "device": "cuda:x"})
    with pytest.raises(CaptureRequestError, match="listed more than once"):
        capture_args({"model": "mlp", "variants": "eager,eager"})


@pytest.mark.parametrize(("hint", "expected"), [
    (str, ("string", False)), (int | None, ("integer", True)), (tuple[str, ...], ("array", False)),
    (Mapping[str, Any], ("object", False)), (bool, ("boolean", False)), (str | None, ("string", True)),
])
def test_json_types_of_annotations(hint, expected):
    assert json_type_of(hint) == expected


@pytest.mark.parametrize("hint", [tuple[int, ...], dict[int, str], complex, list])
def test_a_setting_without_a_json_form_is_refused(hint):
    with pytest.raises(TypeError, match="no JSON form"):
        json_type_of(hint)
