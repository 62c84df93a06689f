"""The files an output folder holds besides (or instead of) safetensors: ONNX, GGUF and a DeciLM folder.

``--format`` names them, comma-separated (``safetensors``, ``onnx``, ``gguf``, ``decilm``; default
``safetensors``). :func:`check_formats` refuses what cannot be written before any long work starts
(a missing optional extra, a family the format cannot express); :func:`write_formats` writes them
into the staging folder of the output, from the slimmed model in memory, and returns what each
wrote (the report's ``formats`` entry and the model card read it).

Without ``safetensors`` the folder keeps ``config.json`` (with the cut record: per-block head
counts), the tokenizer files, the report and the model card, but no PyTorch weights and no model
code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from ...catalog import OUTPUT_FORMATS
from ...errors import HeadcutError
from ...model.saving import HEADCUT_FILES
from .decilm import check_decilm, export_decilm
from .gguf import check_gguf, export_gguf
from .onnx import check_onnx, export_onnx


def parse_formats(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"safetensors,onnx"`` (or a sequence) as a tuple in a stable order; one-line errors."""
    if value is None:
        return ("safetensors",)
    parts = value.split(",") if isinstance(value, str) else list(value)
    names = [str(p).strip().lower() for p in parts if str(p).strip()]
    if not names:
        raise HeadcutError("--format is empty; choose from " + ", ".join(OUTPUT_FORMATS))
    unknown = [n for n in names if n not in OUTPUT_FORMATS]
    if unknown:
        raise HeadcutError(
            f"unknown --format {unknown[0]!r}; choose from {', '.join(OUTPUT_FORMATS)} "
            "(comma-separated, e.g. safetensors,onnx)"
        )
    return tuple(f for f in OUTPUT_FORMATS if f in names)


def check_formats(model: nn.Module, formats: Sequence[str], gguf_type: str = "f16", cut: str | None = None) -> None:
    """Refuse formats that cannot be written for ``model`` (before the work that precedes saving): each
    writer's own check (its optional extra installed, the model something it can express; ``cut``: the
    kind of cut a search will make, ``uniform`` or ``any``)."""
    if "onnx" in formats:
        check_onnx(model)
    if "gguf" in formats:
        check_gguf(model, gguf_type, cut)
    if "decilm" in formats:
        check_decilm(model, cut)


def _drop_weights(folder: Path) -> None:
    """Remove the PyTorch weights and model code of a staging folder (formats without safetensors)."""

    for f in folder.iterdir():
        if f.name.endswith(".safetensors") or f.name == "model.safetensors.index.json" or f.name in HEADCUT_FILES:
            f.unlink()
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("auto_map", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def write_formats(
    model: nn.Module, folder: Path, formats: Sequence[str], gguf_type: str = "f16", progress: Any = None
) -> dict[str, Any]:
    """Write the ONNX / GGUF files ``formats`` asks for into ``folder`` (holding the saved checkpoint);
    drop the safetensors weights if ``formats`` leaves them out. Returns ``{format: what it wrote}``."""
    out: dict[str, Any] = {}
    if "onnx" in formats:
        out["onnx"] = export_onnx(model, folder).to_json()
    if "gguf" in formats:
        out["gguf"] = export_gguf(model, folder, outtype=gguf_type).to_json()
    if "decilm" in formats:
        out["decilm"] = export_decilm(model, folder).to_json()
    if "safetensors" not in formats:
        _drop_weights(folder)
    else:
        out["safetensors"] = {"files": sorted(f.name for f in folder.iterdir() if f.name.endswith(".safetensors"))}
    return out
