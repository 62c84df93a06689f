"""The resume checkpoint of a training run: where its folder lies (``<out>.headcut-checkpoint`` beside the
output), how a state file is written (:func:`atomic_save`: whole or absent) and read back (:func:`read_state`),
the checks a resumed state must pass (:func:`check_weights`, :func:`check_optimizer`, :func:`check_scheduler`),
the run's identity digest (:func:`digest`), and the resume hint of an interrupted job (:func:`locked_output`).
The training loop that writes and resumes it is :class:`headcut.training.engine.Trainer`."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..errors import HeadcutError, is_finite, shown
from ..files.atomic import OutputDir
from ..files.names import NAME_MAX, embedded_name
from ..files.space import free_space, write_error
from ..interrupts import Interrupted, deferred_signals
from .finite import first_nonfinite

#: the suffix of the resume-checkpoint folder a training command keeps beside ``--out``
CHECKPOINT_SUFFIX = ".headcut-checkpoint"
#: the checkpoint's file name under ``checkpoint_dir``
CHECKPOINT_NAME = "checkpoint.pt"
#: version of the checkpoint layout
CHECKPOINT_FORMAT = 1
#: config fields a resumed run may change (its length, how often it evaluates and checkpoints, and the engine
#: of a multi-process run: every engine writes the same checkpoint layout); every other field must match
RESUME_MAY_CHANGE = ("epochs", "max_steps", "eval_every", "checkpoint_every", "engine")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _described(value: Any) -> str:
    """A checkpoint value in a message: a tensor by its shape and dtype, anything else by its type."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of {str(value.dtype).removeprefix('torch.')}, shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def check_weights(saved: Any, mine: dict[str, torch.Tensor], damaged: Callable[[str], HeadcutError]) -> None:
    """A checkpoint's model weights ``saved`` have exactly the names, shapes and dtypes of ``mine`` (the
    model's ``state_dict``): ``load_state_dict`` would otherwise copy some of them and then fail."""
    if not isinstance(saved, dict):
        raise damaged(f"its weights are {_described(saved)}, not a model's state")
    missing = [k for k in mine if k not in saved]
    extra = [k for k in saved if k not in mine]
    if missing or extra:
        which = f"it lacks {missing[0]!r}" if missing else f"it holds {shown(extra[0], 80)}, which the model has not"
        raise damaged(f"its weights are not this model's ({which})")
    for key, tensor in mine.items():
        value = saved[key]
        if not isinstance(value, torch.Tensor) or value.shape != tensor.shape or value.dtype != tensor.dtype:
            raise damaged(f"its weight {key} is {_described(value)}, the model's {_described(tensor)}")


#: the state AdamW keeps for every parameter it has updated (and ``max_exp_avg_sq`` with ``amsgrad``)
ADAMW_STATE = ("step", "exp_avg", "exp_avg_sq")


def check_optimizer(
    saved: Any, optimizer: torch.optim.Optimizer, step: int, damaged: Callable[[str], HeadcutError]
) -> None:
    """A checkpoint's optimizer state ``saved`` fits ``optimizer`` (an AdamW over this run's parameters) at
    optimizer step ``step``: the same groups over the same number of parameters with the same settings, and for
    each parameter its moments in the parameter's shape and a step count in [1, ``step``]. PyTorch's
    ``load_state_dict`` checks only the group sizes, so anything else would fail in a later training step."""
    mine = optimizer.state_dict()
    if (
        not isinstance(saved, dict)
        or not isinstance(saved.get("state"), dict)
        or not isinstance(saved.get("param_groups"), list)
    ):
        raise damaged("its optimizer state is not an optimizer's (a state and parameter groups)")
    groups = saved["param_groups"]
    if len(groups) != len(mine["param_groups"]):
        raise damaged(f"its optimizer has {len(groups)} parameter groups, this run's {len(mine['param_groups'])}")
    params: dict[int, tuple[torch.Tensor, bool]] = {}
    for i, (group, own, live) in enumerate(zip(groups, mine["param_groups"], optimizer.param_groups)):
        if not isinstance(group, dict):
            raise damaged(f"its optimizer's parameter group {i} is {_described(group)}, not a dict")
        ids = group.get("params")
        if not isinstance(ids, list) or not all(_whole(p) for p in ids) or ids != own["params"]:
            count = len(ids) if isinstance(ids, list) else _described(ids)
            raise damaged(
                f"its optimizer state does not fit this run's parameters (group {i} holds {count} "
                f"parameters, this run's {len(own['params'])})"
            )
        for key, value in group.items():
            if key in ("params", "lr") or key not in own:
                continue
            if type(value) is not type(own[key]) or value != own[key]:
                raise damaged(f"its optimizer's {key} {shown(value, 40)} (group {i}) is not this run's {own[key]!r}")
        amsgrad = bool(own.get("amsgrad", False))
        params.update((index, (p, amsgrad)) for index, p in zip(own["params"], live["params"]))
    for index, entry in saved["state"].items():
        if not _whole(index) or index not in params:
            raise damaged(f"its optimizer state names a parameter {shown(index, 40)} this run does not have")
        param, amsgrad = params[index]
        needed = ADAMW_STATE + (("max_exp_avg_sq",) if amsgrad else ())
        if not isinstance(entry, dict) or any(k not in entry for k in needed):
            raise damaged(f"its optimizer state of parameter {index} lacks AdamW's {', '.join(needed)}")
        for key in needed[1:]:
            value = entry[key]
            if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.shape != param.shape:
                raise damaged(
                    f"its optimizer state does not fit this run's parameters: {key} of parameter {index} "
                    f"is {_described(value)}, the parameter has shape {tuple(param.shape)}"
                )
        count = entry["step"]
        if isinstance(count, torch.Tensor) and count.dim() == 0 and not count.is_complex():
            count = count.item()
        if not _real(count) or not is_finite(count) or count != int(count) or not 1 <= count <= step:
            what = _described(count) if not _real(count) else shown(count)
            raise damaged(f"its optimizer step {what} of parameter {index} is not a whole number in [1, {step}]")


def check_scheduler(saved: Any, scheduler: Any, step: int, damaged: Callable[[str], HeadcutError]) -> None:
    """A checkpoint's LR-schedule state ``saved`` fits ``scheduler`` (this run's ``LambdaLR``) at optimizer step
    ``step``: its counter at that step, this run's base learning rates, finite last learning rates and no field
    a schedule does not have (``load_state_dict`` sets every field it is given on the schedule)."""
    mine = scheduler.state_dict()
    if not isinstance(saved, dict):
        raise damaged(f"its LR schedule is {_described(saved)}, not a schedule's state")
    unknown = [k for k in saved if k not in mine]
    if unknown:
        raise damaged(f"its LR schedule has a field {shown(unknown[0], 40)} this run's schedule has not")
    last = saved.get("last_epoch")
    if not _whole(last) or last != step:
        raise damaged(f"its LR schedule is at step {shown(last, 40)}, not at its step {step}")
    if "_step_count" in saved and (not _whole(saved["_step_count"]) or saved["_step_count"] != step + 1):
        raise damaged(f"its LR schedule's step count {shown(saved['_step_count'], 40)} is not {step + 1}")
    for key, value in saved.items():
        own = mine[key]
        if key == "base_lrs" and (not isinstance(value, list) or not all(_real(v) for v in value) or value != own):
            raise damaged(f"its LR schedule's base learning rates {shown(value)} are not this run's {own}")
        if key == "_last_lr" and (
            not isinstance(value, list) or len(value) != len(own) or not all(_real(v) and is_finite(v) for v in value)
        ):
            raise damaged(f"its LR schedule's last learning rates {shown(value)} are not {len(own)} finite numbers")
        if key == "lr_lambdas" and (
            not isinstance(value, list)
            or len(value) != len(own)
            or any(v is not None or o is not None for v, o in zip(value, own))
        ):
            raise damaged("its LR schedule's functions are not this run's")
        if isinstance(own, bool) and not isinstance(value, bool):
            raise damaged(f"its LR schedule's {key} {shown(value, 40)} is not True or False")


def check_resumable(
    path: Path,
    state: dict[str, Any],
    *,
    identity: dict[str, Any],
    total_steps: int,
    batches: int,
    model: dict[str, torch.Tensor],
    gates: list[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> None:
    """Refuse a checkpoint ``state`` (read from ``path``) that this run cannot continue: missing parts, another run's
    identity, a step past the run's end, a place in the data, weights, optimizer or schedule that do not fit, and
    non-finite values; each a one-line error."""
    missing = [k for k in ("model", "gates", "optimizer", "scheduler", "step", "identity", "history") if k not in state]
    if missing:
        raise HeadcutError(f"{path} is damaged (no {missing[0]!r}); start over without --resume")

    def damaged(why: str) -> HeadcutError:
        return HeadcutError(
            f"--resume: the checkpoint in {path.parent} is damaged: {why}; start over without "
            "--resume (and with --force)"
        )

    step = state["step"]
    if not _whole(step) or step < 0:
        raise damaged(f"its step {shown(step)} is not a whole number >= 0")
    if not isinstance(state["identity"], dict):
        raise damaged("it holds no run identity")
    changed = differences(state["identity"], identity)
    if changed:
        listed = "; ".join(changed[:6]) + (f"; and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise HeadcutError(
            f"{path} belongs to a run with other settings or data, so it cannot be resumed "
            f"by this one ({listed}); resume with the same settings, or start over without "
            "--resume"
        )
    if step > total_steps:
        raise HeadcutError(
            f"{path}: checkpoint is at step {shown(step)}, past this run's {total_steps} "
            f"steps; resume with a run of at least {shown(step)} steps, or start over without "
            "--resume"
        )
    check_position(state, batches, damaged)
    check_training_state(state, model, gates, optimizer, scheduler, damaged)
    for what, key in (
        ("weights", "model"),
        ("gates", "gates"),
        ("optimizer state", "optimizer"),
        ("method's state", "extra"),
    ):
        bad = first_nonfinite(state.get(key), floats=key == "extra")
        if bad is not None:
            raise damaged(f"non-finite values (nan or inf) in its {what}, at {bad}")


def check_position(state: dict[str, Any], batches: int, damaged: Callable[[str], HeadcutError]) -> None:
    """The checkpoint's place in the data (epoch, position and order) must be one this run can continue."""
    n = batches
    epoch, position, order = state.get("epoch"), state.get("position"), state.get("order")
    if not _whole(epoch) or epoch < 0:
        raise damaged(f"its epoch {shown(epoch)} is not a whole number >= 0")
    if not _whole(position) or not 0 <= position <= n:
        raise damaged(f"its position {shown(position)} in the epoch is not in [0, {n}]")
    if order is not None:
        if (
            not isinstance(order, torch.Tensor)
            or order.dtype != torch.int64
            or order.dim() != 1
            or order.numel() != n
            or not torch.equal(order.sort().values, torch.arange(n))
        ):
            raise damaged(f"its batch order is not an order of the {n} batches")
    if not isinstance(state["history"], list):
        raise damaged("its history is not a list")


def check_training_state(
    state: dict[str, Any],
    model: dict[str, torch.Tensor],
    gates: list[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    damaged: Callable[[str], HeadcutError],
) -> None:
    """The checkpoint's weights, gates, optimizer and LR-schedule state, random states and history fit this
    run (names, counts, shapes, kinds, the schedule at the checkpoint's step), so that restoring them cannot
    fail halfway and no training step fails on them later."""
    check_weights(state["model"], model, damaged)
    saved_gates = state["gates"]
    if not isinstance(saved_gates, list) or len(saved_gates) != len(gates):
        raise damaged(f"its gates are not this run's {len(gates)} gate tensors")
    for i, (saved, mine) in enumerate(zip(saved_gates, gates)):
        if not isinstance(saved, torch.Tensor) or not saved.is_floating_point() or saved.shape != mine.shape:
            raise damaged(f"its gate tensor {i} is {_described(saved)}, not {_described(mine)}")
    check_optimizer(state["optimizer"], optimizer, state["step"], damaged)
    check_scheduler(state["scheduler"], scheduler, state["step"], damaged)
    for key in ("generator", "rng_cpu"):
        value = state.get(key)
        if value is None and key == "rng_cpu":
            continue
        try:
            if not isinstance(value, torch.Tensor):
                raise TypeError(type(value).__name__)
            torch.Generator().set_state(value)  # a scratch generator: this run's are untouched
        except (RuntimeError, TypeError, ValueError):
            raise damaged(f"its random state {key!r} is not a random generator's state") from None
    cuda = state.get("rng_cuda")
    if cuda is not None and not (isinstance(cuda, torch.Tensor) and cuda.dtype == torch.uint8 and cuda.dim() == 1):
        raise damaged("its random state 'rng_cuda' is not a CUDA generator's state")
    for i, entry in enumerate(state["history"]):
        if (
            not isinstance(entry, dict)
            or not all(isinstance(k, str) for k in entry)
            or not _whole(entry.get("step"))
            or not _real(entry.get("loss"))
            or not isinstance(entry.get("eval", {}), dict)
        ):
            raise damaged(f"its history entry {i} is not a training step's (a step, a loss)")


def has_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> bool:
    """Whether the folder holds a resume checkpoint: the engine's ``checkpoint.pt`` or a method's own
    state file (``*.pt``, e.g. the lottery's), temporaries not counted."""
    ckpt = Path(checkpoint_dir).expanduser()
    return ckpt.is_dir() and any(
        p.suffix == ".pt" and not p.name.startswith(".") and p.is_file() for p in ckpt.iterdir()
    )


def prepare_checkpoint_dir(checkpoint_dir: str | os.PathLike[str], resume: bool, restart: bool) -> None:
    """Refuse ``resume`` without a checkpoint, and a fresh run over the checkpoint of another run unless
    ``restart`` (which then discards it: see :func:`clear_checkpoint_dir`). Before any work."""
    ckpt = Path(checkpoint_dir).expanduser()
    if resume and not has_checkpoint(ckpt):
        raise HeadcutError(f"--resume: no checkpoint at {ckpt}; run without --resume to start")
    if not resume and ckpt.exists() and not restart:
        raise HeadcutError(
            f"{ckpt} holds the checkpoint of an interrupted run: pass --resume to continue it or --force to start over"
        )


def clear_checkpoint_dir(checkpoint_dir: str | os.PathLike[str]) -> None:
    """Discard the checkpoint folder of an earlier run (a fresh run that was allowed to restart)."""
    ckpt = Path(checkpoint_dir).expanduser()
    if ckpt.exists():
        shutil.rmtree(ckpt)


def plain(value: Any) -> Any:
    """A log value as something ``torch.load(weights_only=True)`` reads back: numbers, str, lists."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def digest(tensors: Any) -> str:
    """A SHA-256 digest of (nested dicts/lists of) tensors and plain values, in order."""
    h = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(value, dict):
            for k in value:
                h.update(str(k).encode())
                feed(value[k])
        elif isinstance(value, (list, tuple)):
            for v in value:
                feed(v)
        else:
            h.update(repr(value).encode())

    feed(tensors)
    return h.hexdigest()[:16]


def differences(saved: dict[str, Any], mine: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(saved) | set(mine)):
        a, b = saved.get(key), mine.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} {shown(a)} -> {shown(b)}")
    return out


def atomic_save(obj: Any, dest: Path) -> None:
    """``torch.save(obj)`` to ``dest`` through a temporary file in the same folder, then a rename: the
    file is whole or absent, also after a crash or a stop signal."""
    created = not dest.parent.exists()
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = free_space(dest.parent)
    # a stop signal waits for the file to be whole (one cut inside torch.save leaves a broken zip)
    with deferred_signals():
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.headcut-tmp-{os.getpid()}-", dir=dest.parent)
        fh = _Recording(os.fdopen(fd, "wb"))
        try:
            with fh.file:
                torch.save(obj, fh)
                fh.flush()
                os.fsync(fh.file.fileno())
            os.replace(tmp, dest)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if created:  # the folder this write made, still empty: nothing stays behind
                with contextlib.suppress(OSError):
                    dest.parent.rmdir()
            # torch.save turns the file's OSError (a full disk) into a RuntimeError that names no errno
            cause = fh.error if fh.error is not None else exc
            error = (
                write_error(cause, "write the checkpoint", dest, dest.parent, _tensor_bytes(obj), free=free)
                if isinstance(exc, Exception)
                else None
            )
            if error is None:
                raise
            raise error from None


class _Recording:
    """A binary file whose write errors are kept (``error``) before they are raised."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return int(self.file.write(data))
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        try:
            self.file.flush()
        except OSError as exc:
            self.error = exc
            raise


def _tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in ``obj`` (nested dicts, lists and tuples)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def read_state(path: Path, fmt: int) -> dict[str, Any]:
    """A state file headcut wrote with :func:`atomic_save` (a resume checkpoint), read with
    ``weights_only=True`` (our own files, but they hold only tensors and plain values); a one-line
    error for a damaged file or another ``format``."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated, overwritten, or not a checkpoint at all
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HeadcutError(
            f"{path} is damaged and cannot be resumed ({why[:120]}); start over without --resume (and with --force)"
        ) from None
    if not isinstance(state, dict) or state.get("format") != fmt:
        found = state.get("format") if isinstance(state, dict) else None
        raise HeadcutError(f"{path}: unknown checkpoint format {shown(found)}; start over without --resume")
    return state


def checkpoint_dir_for(out: str | os.PathLike[str]) -> Path:
    """The checkpoint folder of a run writing ``out``: ``<out>.headcut-checkpoint`` beside it (for a
    name too long for that, the shortened copy of :func:`embedded_name`)."""
    path = Path(out).expanduser()
    name = path.name if len(os.fsencode(path.name + CHECKPOINT_SUFFIX)) <= NAME_MAX else embedded_name(path.name)
    return path.with_name(name + CHECKPOINT_SUFFIX)


@contextmanager
def locked_output(
    target: OutputDir, main: bool, out: Path, checkpoint: str | os.PathLike[str] | None
) -> Iterator[None]:
    """The work of a job that writes ``out``: the output locked (on the main process of a data-parallel run),
    and an interruption that says where the resume checkpoint is and how to resume (training jobs)."""
    with target if main else contextlib.nullcontext():
        try:
            yield
        except KeyboardInterrupt as exc:
            if checkpoint is None or target.committed:
                raise
            signum = getattr(exc, "signum", signal.SIGINT)
            if has_checkpoint(checkpoint):
                hint = (
                    f"nothing was written to {out}; the last checkpoint is kept in {checkpoint}: run the same "
                    "command with --resume to continue"
                )
            else:
                hint = f"nothing was written to {out}; no checkpoint had been written yet"
            raise Interrupted(signum, hint) from None
