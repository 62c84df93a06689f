"""Options and plumbing shared by the commands that train (``prune`` with a learned-gate method,
``finetune``): step counts, learning rates, checkpoints and ``--resume``, the device, several
processes, and a progress bar that shows the loss, temperature/lambda, open heads and the metric."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import torch
import typer
from rich.progress import Progress

from ..distributed import Dist
from ..errors import HeadcutError
from .common import Interrupted, batch_progress

#: suffix of the checkpoint folder beside ``--out``
CHECKPOINT_SUFFIX = ".headcut-checkpoint"

Epochs = Annotated[
    Optional[int], typer.Option("--epochs", help="Passes over --data (default: 3; 1 for --mode pipelined).",
                                metavar="N")
]
MaxSteps = Annotated[Optional[int], typer.Option("--max-steps", help="Optimizer steps in all.", metavar="N")]
GradAccum = Annotated[Optional[int], typer.Option("--grad-accum", help="Batches per optimizer step.", metavar="N")]
WarmupSteps = Annotated[Optional[int], typer.Option("--warmup-steps", help="Linear warmup steps.", metavar="N")]
EvalEvery = Annotated[
    Optional[int], typer.Option("--eval-every", help="Evaluate --eval-data every N steps.", metavar="N")
]
CheckpointEvery = Annotated[
    Optional[int], typer.Option("--checkpoint-every", help="Write the resume checkpoint every N steps.", metavar="N")
]
Resume = Annotated[
    bool, typer.Option("--resume", help="Continue an interrupted run from OUT.headcut-checkpoint/.")
]
Device = Annotated[
    Optional[str], typer.Option("--device", help="Train on auto (CUDA when available; the default), cpu or "
                                "cuda; under accelerate launch/torchrun each process takes its own GPU.")
]


def checkpoint_dir_for(out: Path) -> Path:
    """The checkpoint folder of a run writing ``out``: ``<out>.headcut-checkpoint`` beside it."""
    out = out.expanduser()
    return out.with_name(out.name + CHECKPOINT_SUFFIX)


def check_resume(out: Path, resume: bool, force: bool) -> Path:
    """The checkpoint folder for ``out``, refusing ``--resume`` without a checkpoint and a fresh run over
    a stale one (unless ``--force``)."""
    ckpt = checkpoint_dir_for(out)
    if resume and not (ckpt / "checkpoint.pt").is_file():
        raise HeadcutError(f"--resume: no checkpoint at {ckpt}; run without --resume to start")
    if not resume and ckpt.exists() and not force:
        raise HeadcutError(f"{ckpt} holds the checkpoint of an interrupted run: pass --resume to continue it "
                           "or --force to start over")
    return ckpt


def clear_stale(ckpt: Path, resume: bool, dist: Dist) -> None:
    """Remove the checkpoint of another run (``--force`` without ``--resume``), on the main process."""
    if not resume and ckpt.exists() and dist.main:
        shutil.rmtree(ckpt)
    dist.barrier()


@contextmanager
def resumable(out: Path, ckpt: Path, every: int | None,
              on_step: Callable[[dict[str, Any]], None]) -> Iterator[Callable[[dict[str, Any]], None]]:
    """Run a training stage so that an interruption (Ctrl-C, SIGTERM, SIGHUP) says how to resume it:
    yields an ``on_step`` that also tracks the last checkpointed step."""
    last: list[int | None] = [None]

    def step(entry: dict[str, Any]) -> None:
        if every and entry["step"] % every == 0:
            last[0] = entry["step"]
        on_step(entry)

    try:
        yield step
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        if (ckpt / "checkpoint.pt").is_file():
            at = f"of step {last[0]} " if last[0] else ""
            hint = (f"nothing was written to {out}; the checkpoint {at}is kept in {ckpt}: run the same command with "
                    "--resume to continue")
        else:
            hint = f"nothing was written to {out}; no checkpoint had been written yet (one every {every} steps)"
        raise Interrupted(signum, hint) from None


def move_to(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    return model.to(device) if next(model.parameters()).device != device else model


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if (abs(value) >= 1e4 or 0 < abs(value) < 1e-3) else f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


def training_progress(description: str, total: int, metric: str | None,
                      dist: Dist) -> tuple[Progress, Callable[[int, int | None], None], Callable[[dict[str, Any]], None]]:
    """A progress bar (hidden on every process but the main one) and its two callbacks: ``(done,
    total)`` and ``on_step(history entry)``, which puts the loss, tau/lambda, open heads and the last
    eval metric in the description."""
    progress, update = batch_progress(description, total)
    if not dist.main:
        progress.disable = True
    task_id = progress.task_ids[0]
    last_metric: list[Any] = [None]

    def on_step(entry: dict[str, Any]) -> None:
        parts = [f"loss {_fmt(entry.get('task_loss', entry['loss']))}"]
        for key, label in (("kl", "KL"), ("tau", "tau"), ("lambda", "lambda"), ("open", "open heads")):
            if key in entry:
                parts.append(f"{label} {_fmt(entry[key])}")
        if metric is not None and isinstance(entry.get("eval"), dict) and metric in entry["eval"]:
            last_metric[0] = entry["eval"][metric]
        if last_metric[0] is not None:
            parts.append(f"{metric} {_fmt(last_metric[0])}")
        progress.update(task_id, description=f"{description} ({', '.join(parts)})")

    return progress, update, on_step
