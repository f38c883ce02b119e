"""The panel's committed `ICaptureRequest` (src/captureRequest.generated.ts) is what scripts/gen-capture-types
writes from the settings dataclasses now: a settings change without a regenerated type fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from workbench.server.capture_fields import capture_fields

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gen-capture-types"
COMMITTED = ROOT / "extensions" / "jupyterlab-workbench" / "src" / "captureRequest.generated.ts"


def test_the_committed_type_is_up_to_date(tmp_path):
    fresh = tmp_path / "captureRequest.generated.ts"
    done = subprocess.run([sys.executable, str(SCRIPT), str(fresh)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert fresh.read_text(encoding="utf-8") == COMMITTED.read_text(encoding="utf-8"), \
        "the settings changed: run scripts/gen-capture-types and commit its output"


def test_every_capture_option_is_an_optional_typed_field():
    declared = dict(re.findall(r"^  (\w+)\?: (.+);$", COMMITTED.read_text(encoding="utf-8"), re.MULTILINE))
    assert list(declared) == [field.key for field in capture_fields()]
    assert declared["batch"] == "number | number[]" and declared["seq"] == "number | number[] | null"  # sweeps
    assert declared["iterations"] == "number"
    assert declared["variants"] == "string[]" and declared["profile"] == "boolean"
    assert declared["overrides"] == "{ [key: string]: unknown }" and declared["kernel_name"] == "string | null"


def test_bad_usage_is_refused():
    done = subprocess.run([sys.executable, str(SCRIPT), "a", "b"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "gen-capture-types [OUT]" in done.stderr
