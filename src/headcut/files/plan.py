"""A command's outputs, checked before its work starts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import HeadcutError
from .atomic import OutputDir, OutputFile
from .names import inside, real_path


def check_paths(
    reads: Mapping[str, str | os.PathLike[str] | None],
    writes: Mapping[str, str | os.PathLike[str] | None],
    replaces: Mapping[str, str | os.PathLike[str] | None] | None = None,
) -> None:
    """Refuse outputs that would touch the run's inputs, before any work.

    ``reads``: flag -> local input path (the checkpoint folder, data files, teacher, mask; None or a
    non-local name is skipped). ``writes``: flag -> output path (files or folders). ``replaces``:
    flag -> folders the run may delete or replace as a whole (``--out`` and its checkpoint folder);
    an input inside one of them is refused. Symbolic links are resolved before comparing."""
    real_reads = {flag: real_path(p) for flag, p in reads.items() if p is not None}
    real_writes = {flag: real_path(p) for flag, p in writes.items() if p is not None}
    real_replaced = {flag: real_path(p) for flag, p in (replaces or {}).items() if p is not None}
    for wflag, w in {**real_writes, **real_replaced}.items():
        for rflag, r in real_reads.items():
            if w == r:
                raise HeadcutError(f"{wflag} {w} is the {rflag} input itself: headcut never writes over its inputs")
            if inside(w, r):
                raise HeadcutError(
                    f"{wflag} {w} lies inside the {rflag} input {r}: headcut never writes into its inputs"
                )
            if inside(r, w):
                raise HeadcutError(f"{wflag} {w} contains the {rflag} input {r}: writing it would delete the input")
    outs = list({**real_writes, **real_replaced}.items())
    for i, (flag_a, a) in enumerate(outs):
        for flag_b, b in outs[i + 1 :]:
            if inside(a, b) or inside(b, a):
                raise HeadcutError(f"{flag_a} {a} and {flag_b} {b} overlap: give them separate paths")


def local_input(value: Any) -> Path | None:
    """The local path of an input given as a path or a Hub/datasets name (None when not local)."""
    if value is None:
        return None
    p = Path(value).expanduser()
    return p if p.exists() or p.is_symlink() else None


def plan_outputs(
    *,
    reads: Mapping[str, Any],
    files: Mapping[str, Any] | None = None,
    out: Path | None = None,
    force: bool = False,
    checkpoint: Path | None = None,
    file_force: Mapping[str, bool] | None = None,
) -> tuple[OutputDir | None, dict[str, OutputFile]]:
    """Check every output of a command before its work starts (see :mod:`headcut.files`).

    ``reads``: flag -> input (paths, Hub ids or datasets names; only local ones are checked);
    ``files``: flag -> output file (``-`` and None skipped); ``out``: the output folder;
    ``checkpoint``: a folder the run may remove (its resume checkpoint); ``file_force``: files that
    need ``--force`` to be replaced. Returns the checked output folder and files."""
    file_paths = {flag: Path(p).expanduser() for flag, p in (files or {}).items() if p not in (None, "-")}
    check_paths(
        reads={flag: local_input(v) for flag, v in reads.items()},
        writes=file_paths,
        replaces={"--out": out, "the checkpoint folder": checkpoint},
    )
    target = OutputDir(out, force).check() if out is not None else None
    checked = {
        flag: OutputFile(p, flag, force=force or not (file_force or {}).get(flag, False)).check()
        for flag, p in file_paths.items()
    }
    return target, checked
