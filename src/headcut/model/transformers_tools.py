"""The transformers library as headcut calls it: its own loading bars and reports silenced, and the Auto classes
of a model family."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import huggingface_hub
import transformers


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' and the Hub's own loading bars and LOAD REPORT tables off for the block (headcut
    reports what it loads in its own words); their settings are restored afterwards."""
    logging = transformers.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    hub_bars = not huggingface_hub.utils.are_progress_bars_disabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
        if hub_bars:
            huggingface_hub.utils.enable_progress_bars()


def auto_classes(config: Any) -> dict[str, str]:
    """Auto class name -> transformers class name, for every Auto class this family supports."""
    out: dict[str, str] = {}
    for name in dir(transformers):
        if not name.startswith("AutoModel"):
            continue
        auto = getattr(transformers, name)
        mapping = getattr(auto, "_model_mapping", None)
        names = getattr(mapping, "_model_mapping", None)
        if not isinstance(names, dict):
            continue
        cls_name = names.get(config.model_type)
        if isinstance(cls_name, str) and isinstance(getattr(transformers, cls_name, None), type):
            out[name] = cls_name
    return out
