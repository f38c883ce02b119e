"""Importing a file that was imported before gives its existing run and says so; `--force` imports it again; a
file changed since (another size) or another file of the same name imports anew."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from workbench.trace.store.bundle import list_bundles

DATA = Path(__file__).parent / "data" / "serving" / "aiperf" / "profile_export.jsonl"


def _import(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", "import", *args, "--json"], capture_output=True,
                          text=True, timeout=300)


def test_a_file_imported_again_gives_its_run_and_force_imports_it_anew(tmp_path: Path):
    source = tmp_path / "profile_export.jsonl"
    shutil.copy(DATA, source)
    root = str(tmp_path / "traces")
    (first,) = json.loads(_import(str(source), "--out", root).stdout)
    again = _import(str(source), "--out", root)
    assert again.returncode == 0 and json.loads(again.stdout) == [first]
    said = " ".join(again.stderr.split())
    assert f"{source} is run {first} (same file, same size)" in said and "--force" in said
    assert [b.run_id for b in list_bundles(root)] == [first]
    (forced,) = json.loads(_import(str(source), "--out", root, "--force").stdout)
    assert forced != first and len(list_bundles(root)) == 2


def test_a_changed_file_or_another_of_the_same_name_imports_anew(tmp_path: Path):
    source = tmp_path / "a" / "profile_export.jsonl"
    source.parent.mkdir()
    shutil.copy(DATA, source)
    root = str(tmp_path / "traces")
    (first,) = json.loads(_import(str(source), "--out", root).stdout)
    lines = source.read_text().splitlines(keepends=True)
    source.write_text("".join(lines[:-1]))  # one request fewer: another size
    (changed,) = json.loads(_import(str(source), "--out", root).stdout)
    other = tmp_path / "b" / "profile_export.jsonl"
    other.parent.mkdir()
    shutil.copy(source, other)  # same name and size, another path
    (elsewhere,) = json.loads(_import(str(other), "--out", root).stdout)
    assert len({first, changed, elsewhere}) == 3 and len(list_bundles(root)) == 3
