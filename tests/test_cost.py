"""Cost per million calls, items and tokens: measured on the run's device, projected onto others."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TINY_CAPTURE

from workbench.analysis.cost import cost_table
from workbench.cli import main
from workbench.hardware import DeviceSpec, device_spec
from workbench.trace.store.bundle import open_bundle


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("cost")
    result = CliRunner().invoke(main, ["capture", *TINY_CAPTURE, "--variants", "eager", "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    return root, json.loads(result.stdout)["runs"][0]["run_id"]


def test_measured_cost_is_the_price_of_the_median_call(captured: tuple[Path, str]) -> None:
    root, run = captured
    bundle = open_bundle(run, root)
    (row,) = cost_table([bundle], price_per_hour=3.6).to_dict("records")
    p50_s = bundle.info["benchmark"]["p50"] / 1e3
    assert row["basis"] == "measured" and row["device"] == "cpu"
    assert row["usd_per_million_calls"] == pytest.approx(3.6 / 3600 * p50_s * 1e6)
    assert row["usd_per_million_items"] == pytest.approx(row["usd_per_million_calls"] / bundle.info["items_per_call"])
    assert row["usd_per_million_tokens"] == pytest.approx(row["usd_per_million_calls"] /
                                                          bundle.info["tokens_per_call"])
    assert np.isnan(cost_table([bundle]).loc[0, "usd_per_million_calls"])  # a CPU has no list price


def test_projection_scales_with_the_roofs(captured: tuple[Path, str]) -> None:
    root, run = captured
    bundle = open_bundle(run, root)
    h100 = device_spec("h100-sxm")
    twice = dataclasses.replace(h100, name="twice", peak_flops={k: 2 * v for k, v in h100.peak_flops.items()},
                                memory_bw_bytes_per_s=2 * h100.memory_bw_bytes_per_s)
    table = cost_table([bundle], [h100, twice]).set_index("device")
    projected = table[table["basis"] == "projection"]
    assert set(projected.index) == {"h100-sxm", "twice"}
    assert projected.loc["twice", "latency_ms"] == pytest.approx(projected.loc["h100-sxm", "latency_ms"] / 2)
    assert 0.5 < projected.loc["h100-sxm", "work_known"] <= 1
    assert projected.loc["h100-sxm", "usd_per_million_calls"] == pytest.approx(
        h100.price_per_hour / 3600 * projected.loc["h100-sxm", "latency_ms"] / 1e3 * 1e6)
    assert isinstance(twice, DeviceSpec)


def test_cli_prints_json_and_refuses_unknown_devices(captured: tuple[Path, str]) -> None:
    root, run = captured
    result = CliRunner().invoke(main, ["cost", run, "--device", "tpu-v5e", "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["basis"] for r in rows] == ["measured", "projection"] and rows[1]["device"] == "tpu-v5e"
    bad = CliRunner().invoke(main, ["cost", run, "--device", "nope", "--out", str(root)])
    assert bad.exit_code == 2 and "nope" in bad.output
