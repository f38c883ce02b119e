"""The lab's results as tables, and on disk: what a sensitivity scan found (`Sensitivity`), and a folder of
Parquet tables any process can draw the lab's views from without running it again (`workbench quant --tables`;
the Jupyter server's quantization jobs). Imports no torch.

A folder holds `<name>.parquet` per table (`recipes`, and the fields of `Sensitivity`) and `lab.json`
({"about", "device", "tables": [names]}), written last: a folder with `lab.json` is complete.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench.errors import WorkbenchError

LAB_FILE = "lab.json"
"""The file naming a results folder's tables and what the lab judged; written last."""


@dataclass(frozen=True)
class Sensitivity:
    """What a sensitivity scan found: per layer × format, per tensor kind × format, the outlier channels with
    SmoothQuant's effect, the worst layers' channel profiles, and weight error histograms."""

    layers: pd.DataFrame
    tensors: pd.DataFrame
    outliers: pd.DataFrame
    smoothing: pd.DataFrame
    profile: pd.DataFrame
    histograms: pd.DataFrame


@dataclass(frozen=True)
class LabResults:
    """What the lab's views draw: how the model was judged (`about`), the device of the projections, the recipes'
    table and the scan (None without one)."""

    about: str
    device: str
    recipes: pd.DataFrame
    sensitivity: Sensitivity | None


def save_results(folder: Path, results: LabResults) -> None:
    """`results` into `folder` (module docstring), `lab.json` last."""
    frames = {"recipes": results.recipes}
    if results.sensitivity is not None:
        frames.update({f.name: getattr(results.sensitivity, f.name) for f in dataclasses.fields(Sensitivity)})
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, frame in frames.items():
            frame.to_parquet(folder / f"{name}.parquet")
        (folder / LAB_FILE).write_text(json.dumps({"about": results.about, "device": results.device,
                                                   "tables": list(frames)}), encoding="utf-8")
    except OSError as exc:
        raise WorkbenchError(f"cannot write the lab's tables into {folder}: {exc.strerror or exc}") from exc


def load_results(folder: Path) -> LabResults:
    """The results `save_results` wrote into `folder`; a clear error when they cannot be read back."""
    try:
        facts = json.loads((folder / LAB_FILE).read_text(encoding="utf-8"))
        frames = {name: pd.read_parquet(folder / f"{name}.parquet") for name in facts["tables"]}
        recipes = frames.pop("recipes")
        sensitivity = Sensitivity(**frames) if frames else None
        return LabResults(str(facts["about"]), str(facts["device"]), recipes, sensitivity)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WorkbenchError(f"the lab's tables cannot be read back ({type(exc).__name__}); run it again") from exc


def parse_budget(text: str) -> dict[str, float]:
    """An error budget as users write it: `sqnr=30` (an SQNR floor in dB), `kl=0.01` (a KL ceiling), or both
    comma-separated."""
    budget: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep or key not in ("sqnr", "kl"):
            raise WorkbenchError(f"--budget '{part}': give sqnr=DB (a floor) and/or kl=NATS (a ceiling), "
                                 "e.g. --budget sqnr=30")
        try:
            budget[key] = float(value)
        except ValueError:
            raise WorkbenchError(f"--budget '{part}': {value!r} is no number") from None
    return budget
