"""``headcut.info``: a model's attention blocks and size."""

from __future__ import annotations

from typing import Any

from ..arguments.table import checked
from ..model.info import info as describe
from ..progress import quiet
from .base import ModelLike, load_model


@checked("info")
def info(
    model: ModelLike, *, task: str | None = None, allow_pickle: bool = False, trust_remote_code: bool = False
) -> Any:
    """The attention blocks (name, kind, layer, heads, KV heads, head size), head total and parameter count
    of ``model`` (``headcut info``); a :class:`headcut.model.info.ModelInfo` whose ``to_json()`` is the JSON."""

    loaded = load_model(model, task, allow_pickle, trust_remote_code, [], quiet())
    return describe(loaded.module)
