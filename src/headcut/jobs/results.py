"""What the jobs that write a model return: :class:`Written` (a model, its report and ``save``) and
:class:`Pruned` (``prune``'s, with the mask, the method's result and the trajectory)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from ..arguments.kinds import values
from ..arguments.table import checked
from ..errors import HeadcutError, label
from ..extras import usable
from ..files.atomic import OutputDir, OutputFile
from ..files.special import special_kind
from ..model import saving
from ..model.masks import HeadMask
from ..outputs.formats import parse_formats
from ..outputs.reports import PRUNE_REPORT, write_trajectory_csv, write_trajectory_png
from .saving import save_model


@dataclass(kw_only=True)
class Written:
    """What the commands that write a model return: ``model``, ``report`` (what the report file inside the
    output and ``--json`` hold) and ``save(out)``, which writes both atomically (see the module's doc)."""

    REPORT: ClassVar[str] = PRUNE_REPORT

    model: nn.Module
    report: dict[str, Any]
    source: Path | None = None
    notes: list[str] = field(default_factory=list)
    reads: dict[str, Any] = field(default_factory=dict)
    trust_remote_code: bool = False
    formats: tuple[str, ...] = ("safetensors",)
    gguf_type: str = "f16"

    @checked("Written.save")
    def save(
        self,
        out: str | os.PathLike[str] | OutputDir,
        force: bool = False,
        *,
        formats: str | Sequence[str] | None = None,
        gguf_type: str | None = None,
    ) -> saving.SavedModel:
        """Write the model, its report and its model card (``README.md``) to ``out`` (atomically; ``force``
        replaces only a folder headcut wrote). ``formats``: ``safetensors``, ``onnx``, ``gguf`` or several
        (default: the command's ``formats``); ``gguf_type``: ``f16``, ``f32`` or ``q8_0``."""

        with values():
            chosen = parse_formats(formats) if formats is not None else self.formats
        return save_model(
            self.model,
            out,
            self.source,
            force,
            self.report,
            self.REPORT,
            self.reads,
            self.trust_remote_code,
            chosen,
            gguf_type or self.gguf_type,
        )


@dataclass(kw_only=True)
class Pruned(Written):
    """What :func:`prune` produced: ``model`` (slimmed), ``mask`` (kept heads, the input model's
    numbering: ``export --mask`` replays it), ``report`` (what ``headcut-report.json`` and ``--json`` hold)
    and ``result`` (:class:`headcut.pruning.PruneResult`: trajectory, training run, ...). ``save(out)``
    writes the model with its report; ``write_trajectory(csv)`` the metric after every step."""

    mask: HeadMask
    result: Any
    #: the trajectory files :func:`prune` wrote (with ``out`` and a ``trajectory`` path)
    written: list[Path] = field(default_factory=list)

    @checked("Pruned.write_trajectory")
    def write_trajectory(
        self, csv_path: str | os.PathLike[str] | OutputFile, png: bool = True, force: bool = False
    ) -> list[Path]:
        """Write the trajectory (one row per step) to a ``.csv`` file, and its plot beside it as ``.png``
        when matplotlib is installed and imports (and ``png``); returns the files written."""

        csv_file = csv_path if isinstance(csv_path, OutputFile) else OutputFile(csv_path, "--trajectory", force=force)
        if csv_file.path.suffix.lower() != ".csv":
            raise HeadcutError(
                f"{label('trajectory')} must name a .csv file (a .png is written beside it), got {csv_file.path}"
            )
        png_file = OutputFile(csv_file.path.with_suffix(".png"), "--trajectory (its PNG)", force=csv_file.force)
        if not isinstance(csv_path, OutputFile):
            csv_file.check()
        png = png and usable("matplotlib")
        if png:
            png_file.check()
        temps: list[Path] = []
        try:
            temps.append(csv_file.temp())
            write_trajectory_csv(temps[0], self.result)
            if png:
                temps.append(png_file.temp())
                name = Path(self.report["model"]).name
                write_trajectory_png(temps[1], self.result, f"{name}: {self.result.method}")
            for temp, final in zip(temps, (csv_file, png_file)):
                final.commit(temp)
            temps = []
        finally:
            for temp in temps:
                temp.unlink(missing_ok=True)
        if not png and special_kind(png_file.path) is None:
            png_file.path.unlink(missing_ok=True)  # a stale PNG of an earlier run (never a pipe or a device)
        return [csv_file.path] + ([png_file.path] if png else [])
