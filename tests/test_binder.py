"""binder/: the files repo2docker (mybinder.org) reads. They must name everything the notebooks import, and
following their steps in a fresh virtual environment (`pip install -r binder/requirements.txt`, then
`binder/postBuild`, from the repository root) must give a working install with the extensions enabled."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+ (tomllib)")

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
NOTEBOOKS = ROOT / "notebooks"
RUNTIME_MODULES = {"ipykernel"}
"""Modules a notebook needs beyond its own imports: the kernel that runs it."""


def notebook_imports() -> set[str]:
    """Top-level modules the notebooks' code cells import, the standard library and workbench left out."""
    modules: set[str] = set()
    for path in NOTEBOOKS.glob("*.ipynb"):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Import):
                    modules |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"workbench"}


def binder_requirements() -> list[Requirement]:
    """What binder installs: the requirement lines of requirements.txt and the project with the extras
    postBuild names, the project's own requirements read from pyproject.toml."""
    lines = [line.split("#")[0].strip() for line in (BINDER / "requirements.txt").read_text().splitlines()]
    wanted = [Requirement(line) for line in lines if line and not line.startswith("-")]
    (extras,) = re.findall(r'pip install "\.\[([a-z0-9_,-]+)\]"', (BINDER / "postBuild").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted += [Requirement(text) for text in project["dependencies"]]
    for extra in extras.split(","):
        wanted += [Requirement(text) for text in project["optional-dependencies"][extra]]
    return wanted


def closure(requirements: list[Requirement]) -> set[str]:
    """The distributions the requirements pull in, following the installed distributions' metadata."""
    seen: set[str] = set()
    todo = [(req, frozenset(req.extras)) for req in requirements]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if name == "workbench":  # the project's extras, already expanded from pyproject.toml
            continue
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": extra}) for extra in extras | {""}):
                todo.append((sub, frozenset(sub.extras)))
    return {key.split("[")[0] for key in seen}


def test_binder_files_are_what_repo2docker_reads():
    assert re.fullmatch(r"python-3\.\d+", (BINDER / "runtime.txt").read_text().strip())
    # an environment.yml would switch repo2docker to conda and make it ignore runtime.txt and requirements.txt
    assert not (BINDER / "environment.yml").exists() and not (BINDER / "environment.yaml").exists()
    requirements = (BINDER / "requirements.txt").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in requirements
    assert re.search(r"^torch==[\d.]+\+cpu$", requirements, re.MULTILINE)
    post_build = BINDER / "postBuild"
    assert os.access(post_build, os.X_OK) and post_build.read_text().startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in post_build.read_text()
    subprocess.run(["bash", "-n", str(post_build)], check=True)
    assert [r.name for r in binder_requirements()][:1] == ["torch"]


def test_binder_installs_everything_the_notebooks_import():
    imported = notebook_imports() | RUNTIME_MODULES
    assert {"pandas", "torch"} <= imported  # the parse found the notebooks' imports
    installed = closure(binder_requirements())
    providers = metadata.packages_distributions()
    missing = {module for module in imported
               if not {canonicalize_name(d) for d in providers.get(module, [])} & installed}
    assert missing == set(), f"binder/ does not install what provides {sorted(missing)}"


def source_copy(destination: Path) -> Path:
    """The repository's files as a fresh clone would have them plus uncommitted ones (git's view, ignored
    build outputs left out), copied to `destination`."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout to know which files a clone holds")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_binder_steps_in_a_fresh_venv(tmp_path):
    """repo2docker's steps: `pip install -r binder/requirements.txt`, then `binder/postBuild`, from the root of
    a fresh copy, in a new virtual environment (pip's cache is reused). The PyTorch CPU index is out of reach
    on a machine without internet; pip then takes torch from its other sources (its configured wheels), and
    `PIP_RETRIES=0` keeps it from retrying that index for every package."""
    repo = source_copy(tmp_path / "repo")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(venv), PIP_RETRIES="0",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    run(["pip", "install", "-r", "binder/requirements.txt"], repo, env)
    log = run(["bash", "binder/postBuild"], repo, env)
    assert "workbench.server" in log and "jupyterlab-workbench" in log

    modules = sorted(notebook_imports() | RUNTIME_MODULES | {"workbench.ui", "jax", "xprof"})
    check = ("import importlib, sys, torch, workbench\n"
             "for name in sys.argv[1:]: importlib.import_module(name)\n"
             "print(torch.__version__, workbench.__file__)")
    version, location = run([str(venv / "bin" / "python"), "-c", check, *modules], tmp_path, env).split()
    assert version.endswith("+cpu")
    assert Path(location).is_relative_to(venv)  # installed into the venv, not imported from a source tree
