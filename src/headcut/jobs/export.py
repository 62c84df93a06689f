"""``headcut.export``: remove the heads a mask drops (``headcut export``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..arguments.kinds import values
from ..arguments.table import checked
from ..catalog import GQA_POLICIES
from ..errors import HeadcutError, label
from ..files.names import real_path
from ..files.plan import plan_outputs
from ..model.masks import HeadMask, check_mask, read_mask_file
from ..model.surgery import slim
from ..outputs.formats import check_formats, parse_formats
from ..outputs.reports import export_report
from ..progress import quiet
from .base import ModelLike, load_model, plain_arguments
from .results import Written


@dataclass(kw_only=True)
class Exported(Written):
    """A model with the heads of a mask removed (:func:`export`): ``model`` (slimmed in place), ``slim``
    (:class:`headcut.model.surgery.SlimResult`) and ``report``; ``save(out)`` writes it with
    ``headcut-report.json``."""

    slim: Any


@checked("export")
def export(
    model: ModelLike,
    mask: HeadMask | Mapping[str, Any] | str | os.PathLike[str],
    *,
    gqa: str = "auto",
    task: str | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    formats: str | Sequence[str] | None = None,
    gguf_type: str = "f16",
    out: str | os.PathLike[str] | None = None,
    force: bool = False,
    arguments: dict[str, Any] | None = None,
) -> Exported:
    """Remove the heads ``mask`` drops (``headcut export``): a mask dict ``{"keep"|"drop": {block: [heads]}}``,
    a :class:`HeadMask` or a mask JSON file. ``formats``/``gguf_type``: what ``save`` writes (see
    :mod:`headcut.outputs.formats`), checked here before the work. ``out``/``force``: save the result there, the
    paths checked and locked before the model is loaded (``headcut export --out``)."""
    import contextlib

    arguments = arguments if arguments is not None else plain_arguments({"model": model, "gqa": gqa, "task": task})
    with values():
        if gqa not in GQA_POLICIES:
            raise HeadcutError(f"unknown {label('gqa')} policy {gqa!r}; choose one of {', '.join(GQA_POLICIES)}")
        chosen = parse_formats(formats)
    reads: dict[str, Any] = {}
    if isinstance(mask, (str, os.PathLike)):
        reads["--mask"] = real_path(mask)
        raw: Any = read_mask_file(mask)
    else:
        raw = mask.to_json() if isinstance(mask, HeadMask) else dict(mask)
        with values():
            check_mask(raw)  # its form, before the model is loaded (as a mask file's)
    target = None
    if out is not None:
        with values():
            target, _ = plan_outputs(
                reads={
                    label("model"): model if isinstance(model, (str, os.PathLike)) else None,
                    label("mask"): mask if isinstance(mask, (str, os.PathLike)) else None,
                },
                out=Path(out),
                force=force,
            )
    with target if target is not None else contextlib.nullcontext():
        exported = _export(model, raw, reads, gqa, task, allow_pickle, trust_remote_code, chosen, gguf_type, arguments)
        if target is not None:
            exported.save(target)
    return exported


def _export(
    model: ModelLike,
    raw: Any,
    reads: dict[str, Any],
    gqa: str,
    task: str | None,
    allow_pickle: bool,
    trust_remote_code: bool,
    chosen: tuple[str, ...],
    gguf_type: str,
    arguments: dict[str, Any],
) -> Exported:
    """The work of :func:`export` on a checked request."""

    notes: list[str] = []
    loaded = load_model(model, task, allow_pickle, trust_remote_code, notes, quiet())
    check_formats(loaded.module, chosen, gguf_type)
    if loaded.folder is not None:
        reads["MODEL"] = real_path(loaded.folder)
    result = slim(loaded.module, raw, gqa=gqa)
    notes += result.notes
    report = export_report(model=loaded.name, arguments=arguments, mask=raw, gqa=gqa, slimmed=result, notes=notes)
    return Exported(
        model=loaded.module,
        slim=result,
        report=report,
        source=loaded.folder,
        notes=notes,
        reads=reads,
        trust_remote_code=trust_remote_code,
        formats=chosen,
        gguf_type=gguf_type,
    )
