"""What a killed run leaves: temporaries beside an output and ``headcut-KIND-PID-*`` scratch folders."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .names import OLD_TAG, TMP_TAG, embedded_name


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def remove_stale(target: Path, all_of_them: bool = False) -> list[Path]:
    """Remove the temporaries of ``target`` (``.NAME.headcut-tmp-PID-*`` and ``.NAME.headcut-old-PID-*``
    beside it) that a dead process left; with ``all_of_them`` (the caller holds ``target``'s lock, so
    nobody else writes it) every one. An old copy whose replacement never arrived (a run killed by SIGKILL
    between the two renames of its commit) is put back in place instead: the earlier output, as it was.
    Returns what was removed."""
    parent = target.parent
    if not parent.is_dir():
        return []
    name = re.escape(embedded_name(target.name))
    pattern = re.compile(rf"^\.{name}({re.escape(TMP_TAG)}|{re.escape(OLD_TAG)})([0-9]{{1,9}})-")
    removed = []
    for entry in sorted(parent.iterdir()):
        m = pattern.match(entry.name)
        if m and (all_of_them or not pid_alive(int(m.group(2)))):
            if m.group(1) == OLD_TAG and not target.exists() and not target.is_symlink():
                with contextlib.suppress(OSError):
                    os.rename(entry, target)
                    continue
            remove_path(entry)
            removed.append(entry)
    return removed


#: headcut's private temporaries in the system's temporary folder: ``headcut-KIND-PID-...`` (folders, and the files
#: written through special outputs), so that a run can tell which were left by a process that is gone
SCRATCH = re.compile(r"headcut-[a-z]+-([0-9]{1,9})-.+")


@contextmanager
def scratch_folder(kind: str, parent: str | os.PathLike[str] | None = None) -> Iterator[Path]:
    """A private temporary folder ``headcut-KIND-PID-*`` (in ``parent``, default the system's temporary folder),
    removed on exit; those a killed run left there are removed first (:func:`remove_stale_scratch`)."""
    remove_stale_scratch(parent)
    with tempfile.TemporaryDirectory(prefix=f"headcut-{kind}-{os.getpid()}-", dir=parent) as folder:
        yield Path(folder)


def remove_stale_scratch(parent: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove this user's ``headcut-KIND-PID-*`` temporaries (in ``parent``, default the system's temporary folder)
    whose process is gone: what a SIGKILL left behind (spilled activations can be gigabytes). Returns them."""
    root = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        match = SCRATCH.fullmatch(entry.name)
        pid = int(match.group(1)) if match else 0
        if not pid or pid == os.getpid():  # not headcut's, or this run's
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid != os.geteuid() or pid_alive(pid):
            continue
        remove_path(Path(entry.path))
        removed.append(Path(entry.path))
    return removed
