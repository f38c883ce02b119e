"""Modules of the earlier flat layout of `workbench.trace` and `workbench.analysis` still import by their old
names, as the very modules of the new layout (`workbench.moved`), so notebooks written before keep working."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from workbench.analysis import MOVED as ANALYSIS_MOVED
from workbench.trace import MOVED as TRACE_MOVED


@pytest.mark.parametrize(("package", "moved"), [("workbench.trace", TRACE_MOVED),
                                               ("workbench.analysis", ANALYSIS_MOVED)])
def test_every_old_name_is_the_new_module(package, moved):
    for old, new in moved.items():
        module = importlib.import_module(f"{package}.{old}")
        assert module is importlib.import_module(f"{package}.{new}")
        assert module.__spec__.name == f"{package}.{new}"  # the alias leaves the module's own spec alone


def test_a_notebook_of_the_flat_layout_runs_in_a_fresh_interpreter():
    script = ("from workbench.trace.bundle import open_bundle, write_bundle\n"
              "from workbench.trace.kineto import read_kineto\n"
              "from workbench.analysis.bottlenecks import find_bottlenecks\n"
              "import workbench.trace.store.bundle as store\n"
              "assert open_bundle is store.open_bundle\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_name_that_never_existed_is_still_missing():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("workbench.trace.no_such_module")
