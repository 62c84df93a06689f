"""The setup of a job that may run in several processes (``torchrun``, ``accelerate launch``): the agreement
of its processes before training (:class:`Agreement`), on a fingerprint of the run (its weights, data and
settings: :func:`run_fingerprint`), so that a setup error in one process stops them all with its line."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from .. import __version__
from ..data import Calibration
from ..errors import HeadcutError, first_line, label
from ..files.space import file_error
from ..training.checkpoint import digest, has_checkpoint
from ..training.distributed import from_env, launched_processes, lost_process
from .base import data_config

#: values of each parameter that a model's digest in :func:`run_fingerprint` reads (with every name and shape)
SAMPLED_VALUES = 64


class Agreement:
    """The setup of a job that may run in several processes (``torchrun``, ``accelerate launch``), up to the
    agreement of its processes (:meth:`headcut.training.distributed.Dist.agree`). The job runs inside
    :meth:`guard` and calls :meth:`agree` once its model and data are loaded, before its first collective. An
    error before that point, in any process, goes to the other processes through the agreement (the process
    joins the process group for it if it had not yet), so that every process stops at once with the failed
    process's line instead of waiting for it (torchrun would SIGKILL a process blocked in a collective after 30
    seconds; one blocked in the process group's rendezvous waits for 30 minutes)."""

    def __init__(self) -> None:
        #: whether this process has taken part in the agreement (every later error is its own)
        self.reached = False

    def agree(self, dist: Any, fingerprint: Callable[[], Mapping[str, str]]) -> None:
        """The agreement of ``dist``'s processes on ``fingerprint()`` (:func:`run_fingerprint`; computed only
        when there are several processes; an error computing it goes to the others as any setup error)."""
        mine = fingerprint() if dist.active else {}
        self.reached = True
        dist.agree(mine)

    @contextmanager
    def guard(self) -> Iterator[None]:
        """The job: an error before :meth:`agree` in a run of several processes is exchanged with the other
        processes, and every process raises the same one line (``process 1: <its error>``); the failed process
        raises its own error as it is when it is not a refusal (a bug keeps its traceback). After the agreement,
        a collective that fails because another process went away is a one-line error."""

        try:
            yield
        except Exception as exc:
            if launched_processes() <= 1:
                raise
            if self.reached:
                lost = lost_process(exc)
                if lost is None:
                    raise
                raise lost from None
            self.reached = True
            message, refusal = _setup_error(exc)
            agreed: HeadcutError | None = None
            try:
                dist = from_env()
            except Exception:
                raise exc from None
            try:
                dist.agree(error=message)
            except HeadcutError as stop:
                agreed = stop
            if agreed is not None and refusal:
                raise agreed from None
            raise


def _setup_error(exc: Exception) -> tuple[str, bool]:
    """What the other processes are told of ``exc`` (a refusal's own message, its options marked as
    :func:`headcut.errors.label` marks them) and whether it is a refusal (one line, no traceback)."""
    if isinstance(exc, HeadcutError):
        return Exception.__str__(exc), True
    if isinstance(exc, OSError):
        error = file_error(exc)
        if error is not None:
            return Exception.__str__(error), True
    return f"{type(exc).__name__}: {first_line(exc)}", False


def weights_digest(model: nn.Module) -> str:
    """A digest of ``model``'s weights: every name, dtype and shape, and the first :data:`SAMPLED_VALUES` values
    of each tensor (two copies of different checkpoints differ there; reading every weight would cost seconds a
    gigabyte)."""

    return digest(
        {
            name: [str(t.dtype), list(t.shape), None if t.is_meta else t.detach().reshape(-1)[:SAMPLED_VALUES].cpu()]
            for name, t in model.state_dict().items()
        }
    )


def data_settings(spec: Any, split: str, data_options: Mapping[str, Any] | None, seed: int) -> dict[str, Any]:
    """The settings of reading ``spec`` (a data file or ``datasets`` name) that every process of a run must
    share: every field of its :class:`DataConfig` but the path (two machines may keep the data in other
    places); none for rows given in memory."""
    if spec is None or isinstance(spec, Calibration):
        return {}
    config = data_config(spec, split, data_options, seed)
    return {k: v for k, v in asdict(config).items() if k != "path"}


def run_fingerprint(
    settings: Mapping[str, Any],
    models: Mapping[str, nn.Module | None],
    reads: Mapping[str, Calibration | None],
    found: str | None = None,
) -> dict[str, str]:
    """What must be the same in every process of a run (:meth:`Agreement.agree`), as phrases that complete
    ``process N ...``: the versions of headcut and torch, ``settings`` (keyword: value), each of ``models``
    (keyword: module) by :func:`weights_digest`, each of ``reads`` (keyword: data) by its examples and the
    digest of its batches (the digest a resume checkpoint records), and ``found`` (what the process found in
    its resume checkpoint folder, with ``resume``)."""

    out = {"ran headcut": __version__, "ran torch": torch.__version__}
    for name, value in settings.items():
        out[f"was given {label(name)}"] = _setting(value)
    for name, module in models.items():
        out[f"loaded {label(name)} with"] = "no model" if module is None else f"weights digest {weights_digest(module)}"
    for name, cal in reads.items():
        out[f"read {label(name)} with"] = (
            "no data" if cal is None else f"{cal.examples} examples (digest {digest(cal.batches)})"
        )
    if found is not None:
        out["found"] = found
    return out


def checkpoint_found(checkpoint_dir: str | os.PathLike[str] | None) -> str:
    """What a resumed run found in its checkpoint folder, for :func:`run_fingerprint` (every process of the run
    must find the same: a folder that only one machine has is refused before the work)."""

    found = checkpoint_dir is not None and has_checkpoint(checkpoint_dir)
    return "a resume checkpoint" if found else "no resume checkpoint"


def _setting(value: Any) -> str:
    """A setting's value in a fingerprint (and the message that shows it)."""
    if value is None:
        return "none"
    if isinstance(value, (str, int, float, bool)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return ",".join(_setting(v) for v in value)
    try:
        text = json.dumps(value, sort_keys=True, default=str)
    except ValueError:
        text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
