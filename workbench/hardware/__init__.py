"""Hardware figures for roofline and cost analyses: the built-in device table, the measured local CPU
and user-defined accelerators, all as `DeviceSpec` values. Nothing is measured at import."""

from workbench.hardware.accelerator import AcceleratorSpecError, load_accelerator
from workbench.hardware.cpu_probe import local_cpu_spec
from workbench.hardware.device import DTYPES, DeviceSpec
from workbench.hardware.specs import device_spec, device_table, list_devices, match_device, resolve_device_spec

__all__ = [
    "DTYPES",
    "AcceleratorSpecError",
    "DeviceSpec",
    "device_spec",
    "device_table",
    "list_devices",
    "load_accelerator",
    "local_cpu_spec",
    "match_device",
    "resolve_device_spec",
]
