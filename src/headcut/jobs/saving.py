"""How a job saves a model: with its report and model card inside the folder, atomically, in the formats asked
for (:func:`save_model`), and the local files a job reads (which an output must never replace)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from ..data import DataConfig
from ..files.atomic import OutputDir
from ..files.names import real_path
from ..files.plan import check_paths
from ..model import saving
from ..model.stock import stock_form
from ..outputs.formats import check_formats, write_formats
from ..outputs.modelcard import write_card
from ..outputs.reports import weights_bytes
from ..outputs.serving import engines, not_served
from ..recipes import RECIPE_FILE, from_dict, recipe_yaml


def save_model(
    model: nn.Module,
    out: str | os.PathLike[str] | OutputDir,
    source: Path | None,
    force: bool,
    report: dict[str, Any],
    report_name: str,
    reads: Mapping[str, Any],
    trust_remote_code: bool,
    formats: Sequence[str] = ("safetensors",),
    gguf_type: str = "f16",
) -> saving.SavedModel:
    """Save ``model`` with ``report`` and a model card inside it (the report's ``out``, weights size and
    ``formats`` filled in); ``formats``: see :mod:`headcut.outputs.formats`."""

    check_formats(model, formats, gguf_type)
    target_path = out.path if isinstance(out, OutputDir) else Path(out)
    check_paths(reads={k: v for k, v in reads.items() if v is not None}, writes={}, replaces={"--out": target_path})
    report["out"] = str(target_path)
    form = stock_form(model)
    report["checkpoint"] = form.to_json()  # its loader names the folder OUT (the report's "out")

    def write(folder: Path) -> None:
        if tuple(formats) != ("safetensors",):
            report["formats"] = write_formats(model, folder, formats, gguf_type)
        if isinstance(report.get("size_bytes"), dict):
            report["size_bytes"]["after"] = weights_bytes(folder) if "safetensors" in formats else None
        serving_entries(report, model)
        write_card(
            folder, model, report, source=source, formats=report.get("formats"), has_weights="safetensors" in formats
        )
        write_report(folder, report, report_name)

    saved = saving.save(
        model,
        out if isinstance(out, OutputDir) else target_path,
        source=source,
        force=force,
        extra=write,
        trust_remote_code=trust_remote_code,
        form=form,
    )
    if saved.notes:
        report.setdefault("notes", []).extend(n for n in saved.notes if n not in report.get("notes", []))
    return saved


def serving_entries(report: dict[str, Any], model: nn.Module) -> None:
    """The report's ``engines`` (what loads the output) and, for a causal LM no serving engine loads,
    ``not_served`` (what would make it servable): :mod:`headcut.outputs.serving`."""
    causal_lm = bool(getattr(model, "can_generate", lambda: False)()) and not getattr(
        model.config, "is_encoder_decoder", False
    )
    report["engines"] = engines(report, causal_lm)
    report["not_served"] = not_served(report, causal_lm)


def write_report(folder: Path, report: dict[str, Any], name: str) -> None:
    """The report file ``name`` in ``folder`` (a save's staging folder) and, for a prune, its resolved recipe
    beside it as YAML (:data:`headcut.recipes.RECIPE_FILE`: ``--recipe OUT/headcut-recipe.yaml`` replays it)."""
    (folder / name).write_text(json.dumps(report, indent=2) + "\n")
    if isinstance(report.get("recipe"), dict):
        (folder / RECIPE_FILE).write_text(recipe_yaml(from_dict(report["recipe"], "the run's recipe")))


def local_reads(**specs: Any) -> dict[str, Path | None]:
    out: dict[str, Path | None] = {}
    for name, spec in specs.items():
        path = spec.path if isinstance(spec, DataConfig) else spec
        if isinstance(path, (str, os.PathLike)) and Path(path).expanduser().exists():
            out[name] = real_path(path)
    return out


def spec_path(spec: Any) -> Any:
    """The path of a data spec given as a path or DataConfig (None otherwise)."""
    if isinstance(spec, DataConfig):
        return spec.path
    return spec if isinstance(spec, (str, os.PathLike)) else None
