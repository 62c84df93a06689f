"""Where data or a checkpoint comes from: a local path, or a name on the Hugging Face Hub / in ``datasets``.

Standard library only, so that every module may ask without importing torch, transformers or datasets.
"""

from __future__ import annotations

from pathlib import Path

#: suffixes of the data files headcut reads (their ``datasets`` builders: :data:`headcut.data.config.FILE_FORMATS`)
DATA_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".parquet", ".txt")
#: compression suffixes ``datasets`` decompresses on the fly (text formats only)
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")


def looks_like_path(name: str) -> bool:
    """Whether ``name`` is meant as a local path: a Hub id is "name" or "org/name"."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def looks_local(path: str) -> bool:
    """Whether ``path`` names a local file (existing, path-like, or with a data file suffix) rather
    than a ``datasets`` name."""
    p = Path(path).expanduser()
    if p.exists() or looks_like_path(path):
        return True
    suffixes = [s.lower() for s in Path(path.partition(":")[0]).suffixes]
    return any(s in DATA_SUFFIXES or s in COMPRESSIONS for s in suffixes)
