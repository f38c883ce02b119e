"""Hardware specs: the built-in table and its sources, user accelerator YAML, prices, the CPU probe."""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

import pytest
import yaml

from workbench.errors import WorkbenchError
from workbench.hardware import (
    AcceleratorSpecError,
    DeviceSpec,
    cpu_probe,
    device_spec,
    device_table,
    list_devices,
    load_accelerator,
    match_device,
    resolve_device_spec,
)
from workbench.hardware.units import UnitError, parse_quantity

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "accelerators" / "npu-example.yaml"
NVIDIA = ("a100-sxm-80gb", "a100-sxm-40gb", "a100-pcie-80gb", "h100-sxm", "h100-pcie", "h200", "l4", "l40s", "b200")
TPUS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e")
FIGURE_FIELDS = ("memory_bandwidth", "memory_size", "sram", "clock", "price_per_hour", "matrix_unit")


def _raw_table() -> dict:
    return yaml.safe_load(resources.files("workbench.hardware").joinpath("devices.yaml").read_text())


# --- the built-in table ----------------------------------------------------------------------------


def test_table_has_the_issue_devices_with_their_dtypes():
    names = list_devices()
    assert set(NVIDIA) | set(TPUS) <= set(names)
    for name in NVIDIA:
        spec = device_spec(name)
        assert spec.kind == "gpu"
        assert {"fp32", "tf32", "bf16", "fp16", "int8"} <= set(spec.peak_flops), name
        if name.startswith(("h1", "h2", "l4", "l40s", "b2")):
            assert "fp8" in spec.peak_flops, name
    for name in TPUS:
        spec = device_spec(name)
        assert spec.kind == "tpu" and {"bf16", "int8"} <= set(spec.peak_flops)
        assert spec.matrix_unit in ((128, 128), (256, 256))
    for name in names:
        spec = device_spec(name)
        assert spec.memory_bw_bytes_per_s > 1e11 and spec.memory_bytes and spec.memory_bytes > 1e10
        # dense peaks: matrix dtypes are at least the fp32 rate, 8-bit at least the 16-bit rate
        if "fp32" in spec.peak_flops:
            assert spec.peak_flops["bf16"] >= spec.peak_flops["fp32"]
        assert spec.peak_flops["int8"] >= spec.peak_flops["bf16"]


def test_datasheet_figures_are_dense_and_in_base_units():
    h100 = device_spec("h100-sxm")
    assert h100.peak_flops["bf16"] == 989.5e12  # 1,979 TFLOPS with sparsity / 2
    assert h100.peak_flops["fp8"] == 1979e12
    assert h100.memory_bw_bytes_per_s == 3.35e12
    assert device_spec("a100").memory_bw_bytes_per_s == 2039e9
    assert device_spec("tpu-v4").memory_bytes == 32 * 2**30
    assert device_spec("v5e").peak_flops == {"bf16": 197e12, "int8": 393e12}  # Cloud TPU v5e page
    assert device_spec("h200").ridge_point("bf16") == pytest.approx(989.5e12 / 4.8e12)


def test_every_figure_has_a_source_url():
    raw = _raw_table()["devices"]
    for name, entry in raw.items():
        figures = [(f"peak_flops.{d}", v) for d, v in entry["peak_flops"].items()]
        figures += [(key, entry[key]) for key in FIGURE_FIELDS if key in entry]
        for key, figure in figures:
            assert isinstance(figure, dict) and str(figure.get("source", "")).startswith("https://"), (name, key)
        spec = device_spec(name)
        attrs = {"memory_bw_bytes_per_s", "memory_bytes", "sram_bytes", "clock_hz", "price_per_hour", "matrix_unit"}
        given = {f"peak_flops.{d}" for d in spec.peak_flops} | {a for a in attrs if getattr(spec, a) is not None}
        assert given == set(spec.sources), name
        assert all(url.startswith("https://") for url in spec.sources.values())
        assert spec.uncertain <= set(spec.sources)


def test_uncertain_figures_are_marked():
    b200 = device_spec("b200")
    assert "peak_flops.bf16" in b200.uncertain and "memory_bytes" in b200.uncertain
    assert "price_per_hour" in device_spec("tpu-v5p").uncertain
    assert not device_spec("h100").uncertain - {"price_per_hour"}


def test_names_and_aliases_are_case_insensitive_and_unknown_lists_valid():
    assert device_spec("H100").name == device_spec(" h100-SXM ").name == "h100-sxm"
    assert device_spec("Trillium").name == "tpu-v6e"
    with pytest.raises(WorkbenchError, match=r"unknown device 'h900'.*h100-sxm.*tpu-v6e"):
        device_spec("h900")


@pytest.mark.parametrize(("reported", "expected"), [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA B200", "b200"),
    ("TPU v4", "tpu-v4"),
    ("TPU v5 lite", "tpu-v5e"),
    ("TPU v5", "tpu-v5p"),
    ("TPU v6 lite", "tpu-v6e"),
    ("Tesla V100-DGXS-32GB", None),
    ("NVIDIA H200 NVL", None),
])
def test_match_reported_device_names(reported, expected):
    found = match_device(reported)
    assert (found.name if found else None) == expected


def test_device_table_frame():
    table = device_table()
    assert table["name"].tolist() == list_devices()
    assert table.set_index("name").loc["h100-sxm", "bf16"] == pytest.approx(989.5)
    assert table.set_index("name").loc["tpu-v5e", "memory_gb_per_s"] == pytest.approx(819)


# --- prices ------------------------------------------------------------------------------------------


def test_price_override_argument_then_file_then_table(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_PRICES", raising=False)
    assert device_spec("tpu-v5e").price_per_hour == 1.20
    prices = tmp_path / "prices.yaml"
    prices.write_text("v5e: 0.8\nexample-npu: 0.01\n")
    monkeypatch.setenv("WORKBENCH_PRICES", str(prices))
    spec = device_spec("tpu-v5e")
    assert spec.price_per_hour == 0.8 and "price_per_hour" not in spec.uncertain
    assert spec.sources["price_per_hour"] == "user override"
    assert device_spec("tpu-v5e", price_per_hour=0.5).price_per_hour == 0.5
    assert resolve_device_spec(EXAMPLE).price_per_hour == 0.01
    assert device_spec("l4").price_per_hour == 0.56  # not in the file: the table's figure


def test_bad_prices_file_names_it(tmp_path, monkeypatch):
    prices = tmp_path / "prices.yaml"
    prices.write_text("h100: cheap\n")
    monkeypatch.setenv("WORKBENCH_PRICES", str(prices))
    with pytest.raises(WorkbenchError, match=r"prices\.yaml.*'h100'.*non-negative number"):
        device_spec("h100")


# --- user accelerators -------------------------------------------------------------------------------


def test_example_accelerator_loads():
    spec = load_accelerator(EXAMPLE)
    assert (spec.name, spec.kind) == ("example-npu", "custom")
    assert spec.peak_flops == {"int8": 8.192e12, "bf16": 2.048e12, "fp32": 0.256e12}
    assert spec.memory_bw_bytes_per_s == 68e9 and spec.memory_bytes == 8 * 2**30
    assert spec.sram_bytes == 4 * 2**20 and spec.matrix_unit == (64, 64) and spec.clock_hz == 1e9
    assert spec.uncertain == {"peak_flops.fp32"} and not spec.measured
    assert spec.peak("fp16") == ("fp32", 0.256e12)  # no fp16 figure: the fp32 peak applies
    assert resolve_device_spec(str(EXAMPLE)) == spec
    assert spec.to_dict()["matrix_unit"] == [64, 64]


def test_resolve_passes_specs_and_names():
    spec = device_spec("l4")
    assert resolve_device_spec(spec) is spec
    assert resolve_device_spec("l4") == spec
    assert resolve_device_spec(spec, price_per_hour=9.0).price_per_hour == 9.0


MINIMAL = "name: n\npeak_flops: {bf16: 1 TFLOP/s}\nmemory_bandwidth: 100 GB/s\n"


@pytest.mark.parametrize(("text", "field", "problem"), [
    ("peak_flops: {bf16: 1 TFLOP/s}\nmemory_bandwidth: 1 GB/s\n", "name", "required"),
    ("name: n\nmemory_bandwidth: 1 GB/s\n", "peak_flops", "required"),
    ("name: n\npeak_flops: {int3: 5 TOPS}\nmemory_bandwidth: 1 GB/s\n", "peak_flops.int3", "unknown dtype"),
    ("name: n\npeak_flops: {bf16: 1 TB/s}\nmemory_bandwidth: 1 GB/s\n", "peak_flops.bf16", "cannot read"),
    ("name: n\npeak_flops: {bf16: 0}\nmemory_bandwidth: 1 GB/s\n", "peak_flops.bf16", "positive"),
    ("name: n\npeak_flops: {bf16: 1 TFLOP/s}\n", "memory_bandwidth", "required"),
    (MINIMAL.replace("100 GB/s", "100 TFLOP/s"), "memory_bandwidth", "cannot read"),
    (MINIMAL + "memroy_size: 8 GB\n", "memroy_size", "unknown field"),
    (MINIMAL + "memory_size: -8 GB\n", "memory_size", "non-negative"),
    (MINIMAL + "matrix_unit: 64 by 64\n", "matrix_unit", "rows x columns"),
    (MINIMAL + "kind: fpga\n", "kind", "must be one of"),
    (MINIMAL + "clock: {value: 1 GHz, source: my notebook}\n", "clock.source", "URL"),
    (MINIMAL + "clock: {value: 1 GHz, sauce: x}\n", "clock.sauce", "unknown key"),
    (MINIMAL + "price_per_hour: lots\n", "price_per_hour", "non-negative number"),
])
def test_bad_accelerator_yaml_names_file_and_field(tmp_path, text, field, problem):
    path = tmp_path / "chip.yaml"
    path.write_text(text)
    with pytest.raises(AcceleratorSpecError) as info:
        load_accelerator(path)
    message = str(info.value)
    assert str(path) in message and f"field '{field}'" in message and problem in message
    assert info.value.field == field


def test_unreadable_or_malformed_accelerator_file(tmp_path):
    with pytest.raises(AcceleratorSpecError, match=r"missing\.yaml: cannot read"):
        resolve_device_spec(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(AcceleratorSpecError, match=r"broken\.yaml: not valid YAML.*line"):
        load_accelerator(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(AcceleratorSpecError, match=r"list\.yaml: expected a mapping"):
        load_accelerator(listing)


@pytest.mark.parametrize(("text", "family", "value"), [
    ("3.35 TB/s", "bandwidth", 3.35e12), ("819 GBps", "bandwidth", 819e9), ("80 GiB", "bytes", 80 * 2**30),
    ("141 GB", "bytes", 141e9), ("989.5 TFLOP/s", "flops", 989.5e12), ("4.5 POPS", "flops", 4.5e15),
    ("197 TFLOPS", "flops", 197e12), ("1.98 GHz", "hertz", 1.98e9), (2e9, "hertz", 2e9), ("1e3 B", "bytes", 1e3),
])
def test_quantities(text, family, value):
    assert parse_quantity(text, family) == pytest.approx(value)


@pytest.mark.parametrize(("text", "family"), [("1 GiFLOP/s", "flops"), ("5 TB", "bandwidth"), ("fast", "flops"),
                                              (True, "bytes"), ("nan B", "bytes"), (float("inf"), "flops")])
def test_bad_quantities(text, family):
    with pytest.raises(UnitError):
        parse_quantity(text, family)


# --- the CPU probe -----------------------------------------------------------------------------------


def _quick(threads, **_):
    """The real measurement at sizes small enough for a test."""
    return REAL_MEASURE(threads, target_s=0.001, max_n=128, copy_bytes=2**20, repeats=2)


REAL_MEASURE = cpu_probe.measure_cpu


def test_measure_cpu_gives_positive_finite_figures():
    result = _quick(1)
    assert result["threads"] == 1 and result["repeats"] == 2
    assert {"fp32", "bf16"} <= set(result["peak_flops"])
    for value in [*result["peak_flops"].values(), result["memory_bw_bytes_per_s"]]:
        assert math.isfinite(value) and value > 0
    assert all(n in (128,) for n in result["matmul_n"].values())


def test_cpu_spec_is_cached_per_machine_and_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(cpu_probe, "measure_cpu", lambda threads, **kw: calls.append(threads) or _quick(threads))
    first = cpu_probe.local_cpu_spec(1)
    assert calls == [1]
    assert isinstance(first, DeviceSpec) and first.kind == "cpu" and first.measured
    assert "1 torch thread" in first.description
    assert set(first.sources) == {*(f"peak_flops.{d}" for d in first.peak_flops), "memory_bw_bytes_per_s"}
    (cache,) = tmp_path.glob("cpu-*.json")
    assert cache == cpu_probe.cache_path()
    again = cpu_probe.local_cpu_spec(1)
    assert calls == [1] and again == first  # from the cache, not measured again
    cpu_probe.local_cpu_spec(2)
    assert calls == [1, 2]
    cpu_probe.local_cpu_spec(1, force=True)
    assert calls == [1, 2, 1]
    assert resolve_device_spec("cpu").measured  # torch's thread count is 1 or 2 here: cached either way


def test_unreadable_cache_is_measured_again_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_probe, "measure_cpu", _quick)
    cpu_probe.cache_path().parent.mkdir(parents=True, exist_ok=True)
    cpu_probe.cache_path().write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable CPU measurement cache"):
        spec = cpu_probe.local_cpu_spec(1)
    assert spec.peak_flops["fp32"] > 0
    assert cpu_probe.local_cpu_spec(1) == spec


def test_cache_dir_default_and_override(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cpu_probe.cache_dir() == tmp_path / "xdg" / "workbench"
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "mine"))
    assert cpu_probe.cache_path().parent == tmp_path / "mine"
