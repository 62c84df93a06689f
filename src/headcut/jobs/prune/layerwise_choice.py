"""Whether a prune request runs layer-wise (:mod:`headcut.jobs.prune.layerwise`): asked for, or chosen when the
checkpoint would not fit the memory limit; and why a request cannot."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...devices import available_memory, gib, parse_size
from ...errors import HeadcutError, label
from ...model.checks import weight_files
from ...pruning import get_method
from ...pruning.ranked import ScoreMethod
from ...scoring.layerwise import LAYERWISE_SCORERS


def refusal(
    model: Any,
    method: str,
    config: Any,
    eval_data: Any,
    staged: Any,
    formats: Any,
    rounds: bool = False,
) -> str | None:
    """Why a prune request cannot run layer-wise (None: it can; ``staged``: the switches (or kinds) of the stages
    after the cut that run, each of which needs the whole model; ``rounds``: a recipe may cut it in rounds).
    Messages name keywords (:func:`label`)."""

    L = label
    chosen = get_method(method)
    if not isinstance(chosen, ScoreMethod) or chosen.rescoring or chosen.scorer not in LAYERWISE_SCORERS:
        able = ", ".join(LAYERWISE_SCORERS)
        return (
            f"method {method} needs the whole model; the methods that run layer-wise ({L('layerwise')}) are the "
            f"one-shot {able}"
        )
    if not isinstance(model, (str, os.PathLike)) or not Path(model).expanduser().is_dir():
        return f"{L('layerwise')} reads a local checkpoint folder of safetensors files, layer by layer"
    for given, name in (
        (config.max_drop is not None, "max_drop"),
        (config.trajectory, "trajectory"),
        (config.via is not None, "via"),
        (rounds, "recipe"),
        (eval_data is not None, "eval_data"),
        *((True, name) for name in staged),
    ):
        if given:
            return (
                f"{L(name)} needs the whole model in memory; a {L('layerwise')} run only scores, cuts and writes "
                "(evaluate the output with headcut eval)"
            )
    if formats is not None and tuple([formats] if isinstance(formats, str) else formats) not in (("safetensors",),):
        return f"{L('layerwise')} writes safetensors only (convert the output with headcut export)"
    return None


def checkpoint_bytes(folder: Path) -> int:
    """The bytes of a checkpoint's safetensors files."""

    return sum(f.stat().st_size for f in weight_files(folder) if f.is_file())


@dataclass
class Choice:
    """Whether a prune request runs layer-wise, why, and the memory limit it was judged against."""

    layerwise: bool
    reason: str
    max_memory: int


def choose(model: Any, layerwise: bool, max_memory: Any, can: str | None) -> Choice:
    """Layer-wise when asked, or when the checkpoint (times 1.25: activations and the working copy) would not fit
    ``max_memory`` (default: the machine's available memory) and the request can run layer-wise; refuses a
    request that cannot, for a checkpoint larger than the limit."""
    limit = parse_size(max_memory) if max_memory is not None else available_memory()
    where = f"{label('max_memory')} {gib(limit)}" if max_memory is not None else f"the {gib(limit)} of memory available"
    if layerwise:
        if can is not None:
            raise HeadcutError(can)
        return Choice(True, "asked for", limit)
    if not isinstance(model, (str, os.PathLike)) or not Path(model).expanduser().is_dir():
        return Choice(False, "", limit)
    size = checkpoint_bytes(Path(model).expanduser())
    if size * 1.25 <= limit:
        return Choice(False, "", limit)
    if can is None:
        return Choice(True, f"automatic: the checkpoint's {gib(size)} would not fit {where} whole", limit)
    if size > limit:
        raise HeadcutError(f"{model} holds {gib(size)} of weights, more than {where}; {can}")
    return Choice(False, "", limit)
