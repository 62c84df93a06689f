"""The names headcut gives the files beside an output (temporaries, old copies, locks), and the name
length checks."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import HeadcutError

#: files whose presence marks a folder as written by headcut (reports; config.json is checked apart)
REPORT_FILES = ("headcut-report.json", "headcut-finetune.json")
TMP_TAG = ".headcut-tmp-"
OLD_TAG = ".headcut-old-"
LOCK_TAG = ".headcut-lock"
#: the longest name most file systems take (bytes); used where the file system cannot be asked
NAME_MAX = 255
#: the longest copy of a name that headcut's own files beside it embed (bytes): the rest of NAME_MAX
#: leaves room for ``.``, a tag, a pid, a random part and a short suffix
EMBED_MAX = 200
#: the longest suffix a temporary file keeps of its target's name (bytes)
SUFFIX_MAX = 16


def _cut(name: str, size: int) -> str:
    """The longest start of ``name`` whose encoded form has at most ``size`` bytes."""
    out, used = [], 0
    for ch in name:
        n = len(os.fsencode(ch))
        if used + n > size:
            break
        out.append(ch)
        used += n
    return "".join(out)


def embedded_name(name: str) -> str:
    """The copy of ``name`` that headcut's files beside it (temporaries, old copies, lock) embed: the
    name itself, or for a name too long to leave room for the additions, its start and a hash of the
    whole (the same for the same name, so a later run still recognises them)."""
    raw = os.fsencode(name)
    if len(raw) <= EMBED_MAX:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:12]
    return f"{_cut(name, EMBED_MAX - len(digest) - 1)}~{digest}"


def temp_suffix(name: str) -> str:
    suffix = Path(name).suffix
    return suffix if len(os.fsencode(suffix)) <= SUFFIX_MAX else ""


def real_path(path: str | os.PathLike[str]) -> Path:
    """``path`` made absolute with every symbolic link resolved (also for parts that do not exist yet)."""
    return Path(path).expanduser().resolve(strict=False)


def inside(path: Path, folder: Path) -> bool:
    """Whether the real path ``path`` is ``folder`` or lies below it."""
    return path == folder or folder in path.parents


def _name_max(path: Path) -> tuple[int, int]:
    """The longest name and path (bytes) the file system of ``path`` (or its nearest existing folder) takes."""
    folder = path
    while True:
        try:
            if folder.is_dir():
                break
        except OSError:
            pass
        if folder.parent == folder:
            break
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX"), os.pathconf(folder, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):
        return NAME_MAX, 4096


def check_names(path: str | os.PathLike[str], flag: str) -> None:
    """Refuse a path with a name longer than its file system allows (NAME_MAX), or a path too long as a
    whole (PATH_MAX), before anything touches it (the system would answer ENAMETOOLONG)."""
    full = Path(os.path.abspath(Path(path).expanduser()))
    name_max, path_max = _name_max(full.parent)
    for part in full.parts[1:]:
        size = len(os.fsencode(part))
        if size > name_max:
            shown = part if len(part) <= 40 else part[:32] + "..." + part[-5:]
            raise HeadcutError(
                f"{flag}: the name {shown} is {size} bytes long and the file system allows at most "
                f"{name_max}; choose a shorter name"
            )
    size = len(os.fsencode(str(full)))
    if size >= path_max:
        raise HeadcutError(
            f"{flag}: the path is {size} bytes long and the file system allows at most {path_max - 1}; "
            "choose a shorter path"
        )
