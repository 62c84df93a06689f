"""Data-parallel training across processes (``accelerate launch``, ``torchrun``), with no global state.

A run started by ``accelerate launch --num_processes N headcut ...`` (or ``torchrun``) has
``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` in its environment; :func:`from_env` joins the process
group then (through HF accelerate's ``PartialState`` when it is installed, else
``torch.distributed.init_process_group``: gloo on CPU, nccl on CUDA) and returns a :class:`Dist`,
which the caller passes down to the training engine. A single process gets ``Dist()`` (world 1) and
nothing else changes.

What the trainer does with it (:class:`headcut.training.engine.Trainer`): every process trains on its
own shard of the batches (``batches[rank::world]``, cut to the shortest shard so every process makes
the same number of steps), through one of PyTorch's engines (:mod:`headcut.training.parallel`:
DistributedDataParallel, or FSDP2 with ``--engine fsdp``), which averages the gradients of the model and
of the gates over the processes, so every process applies the same update and the weights and gates
stay identical everywhere. The torch RNG is seeded identically in every process (gate samples are the
same on every process; each sees different data). Only the main process (rank 0) writes checkpoints and
outputs.

Processes that disagree must not hang. Before its first training collective a job calls :meth:`Dist.agree` in
every process, with what that process read and was given (its fingerprint) or the error that stopped its setup:
the processes exchange them, and every one of them raises the same one-line :class:`HeadcutError` when any
process failed (``process 1: <its error>``) or when the fingerprints differ (``process 1 read --data with ...,
process 0 ...``), so no process goes on to wait for another that will never come. The collectives that headcut
waits on itself (:meth:`Dist.barrier`, :meth:`Dist.average`, :meth:`Dist.max_difference`, the agreement) are
started asynchronously and waited for in short sleeps, so a stop signal (torchrun's SIGTERM to every process when
one has failed, Ctrl-C) is handled at once; a process that stops while a collective is still open leaves the
process group to the end of the process (see :func:`_abandon`), and a collective that fails because another
process went away is a one-line error.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..devices import check_device
from ..errors import HeadcutError, SharedError, first_line

#: the longest pause between two looks at a collective in progress (seconds): how late a finished collective
#: may be noticed; a stop signal is handled at once, whatever the pause
LONGEST_PAUSE_S = 0.005
#: what every disagreement message ends with
SAME_EVERYWHERE = "every process of a run must read the same model and data and be given the same settings"


@dataclass(frozen=True)
class Dist:
    """This process's place in a data-parallel run: ``rank`` of ``world`` processes (``local_rank``:
    on this machine). ``Dist()`` is a single process."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Whether this process writes outputs (rank 0)."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.active:
            wait(torch.distributed.barrier(async_op=True))

    def average(self, value: float) -> float:
        """``value`` averaged over the processes (a step's loss, for its log and the divergence check, so
        that every process stops at the same step); the gradients are averaged by the training engine
        (:mod:`headcut.training.parallel`)."""
        if not self.active:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self._collective_device())
        wait(torch.distributed.all_reduce(t, async_op=True))
        return float(t) / self.world

    def max_difference(self, tensors: list[torch.Tensor]) -> float:
        """The largest absolute difference of ``tensors`` between any process and rank 0 (0.0 in a
        single process): how far the processes' copies have drifted apart."""
        if not self.active or not tensors:
            return 0.0
        device = self._collective_device()
        flat = torch.cat([t.detach().reshape(-1).to(torch.float64).cpu() for t in tensors]).to(device)
        ref = flat.clone()
        wait(torch.distributed.broadcast(ref, src=0, async_op=True))
        diff = (flat - ref).abs().max().reshape(1)
        wait(torch.distributed.all_reduce(diff, op=torch.distributed.ReduceOp.MAX, async_op=True))
        return float(diff)

    def exchange(self, value: Any) -> list[Any]:
        """Every process's ``value`` (JSON: dicts, lists, strings, numbers, None), in the order of the ranks: a
        collective every process calls. ``[value]`` in a single process."""
        if not self.active:
            return [value]
        device = self._collective_device()
        payload = json.dumps(value).encode()
        size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
        sizes = [torch.zeros_like(size) for _ in range(self.world)]
        wait(torch.distributed.all_gather(sizes, size, async_op=True))
        longest = max(int(s) for s in sizes)
        mine = torch.zeros(longest, dtype=torch.uint8)
        if payload:
            mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        mine = mine.to(device)
        everyone = [torch.zeros_like(mine) for _ in range(self.world)]
        wait(torch.distributed.all_gather(everyone, mine, async_op=True))
        return [json.loads(bytes(t[: int(n)].cpu().tolist()).decode()) for t, n in zip(everyone, sizes)]

    def agree(self, fingerprint: Mapping[str, str] | None = None, error: str | None = None) -> None:
        """The agreement of a run's processes before they train (a collective every process calls once, after
        its setup and before its first other collective; see the module's doc). ``fingerprint``: what must be
        the same in every process, each entry a phrase (``read --data with``, ``was given --max-steps``) and
        this process's value; ``error``: the message of the error that stopped this process's setup (its
        fingerprint is then not needed). Raises the same one-line :class:`HeadcutError` in every process when a
        process gave an error or a value differs from process 0's; nothing in a single process but the error
        given. Only the main process's error prints (:class:`headcut.errors.SharedError`)."""
        if not self.active:
            if error is not None:
                raise HeadcutError(error)
            return
        shared = self.exchange({"error": error, "fingerprint": dict(fingerprint or {})})
        errors = [(rank, s["error"]) for rank, s in enumerate(shared) if s["error"] is not None]
        if errors:
            raise SharedError(_failed(errors, self.world), echo=self.main)
        first = shared[0]["fingerprint"]
        for rank, s in enumerate(shared[1:], start=1):
            mine = s["fingerprint"]
            for key in [*first, *(k for k in mine if k not in first)]:
                if mine.get(key) != first.get(key):
                    raise SharedError(
                        f"process {rank} {key} {mine.get(key, 'nothing')}, process 0 "
                        f"{first.get(key, 'nothing')}: {SAME_EVERYWHERE}",
                        echo=self.main,
                    )

    def _collective_device(self) -> torch.device:
        """Where the tensors of headcut's own collectives live: this process's GPU when the process group has
        NCCL alone (which takes no CPU tensors), else the CPU."""
        return (
            torch.device("cuda", self.local_rank)
            if str(torch.distributed.get_backend()) == "nccl"
            else torch.device("cpu")
        )

    def device(self, requested: str) -> torch.device:
        """The device this process trains on (:func:`headcut.devices.check_device`): ``cpu``, ``mps``, ``cuda:N``,
        ``cuda`` (this process's GPU: ``cuda:local_rank`` in a multi-process run) or ``auto`` (cuda when
        available)."""

        check_device(requested)
        if requested in ("cpu", "mps") or requested.startswith("cuda:"):
            return torch.device(requested)
        if requested == "auto" and not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", self.local_rank if self.active else torch.cuda.current_device())


def from_env(cpu: bool | None = None) -> Dist:
    """The :class:`Dist` of this process: joins the process group when the environment says this is one
    of several processes (``WORLD_SIZE`` > 1), else ``Dist()``. ``cpu``: force the gloo backend (default:
    gloo unless CUDA is available)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return Dist()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    if not torch.distributed.is_available():
        raise HeadcutError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    if not torch.distributed.is_initialized():
        use_cpu = cpu if cpu is not None else not torch.cuda.is_available()
        try:
            from accelerate import PartialState  # optional extra: headcut[accelerate]
        except ImportError:
            PartialState = None  # noqa: N806
        if PartialState is not None:
            PartialState(cpu=use_cpu)
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend="gloo" if use_cpu else "nccl")
    return Dist(rank=torch.distributed.get_rank(), world=torch.distributed.get_world_size(), local_rank=local_rank)


def launched_processes() -> int:
    """How many processes the launcher (``accelerate launch``, ``torchrun``) started for this run: its
    ``WORLD_SIZE``, 1 without one."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


def wait(work: Any) -> None:
    """Wait for a collective started with ``async_op=True``: in sleeps of at most :data:`LONGEST_PAUSE_S`, so
    that a stop signal's handler runs at once (a collective waited for in C++ holds off Python's signal
    handlers: torchrun's SIGTERM would go unanswered until its SIGKILL). A collective that fails because
    another process went away is a one-line :class:`HeadcutError`; a stop signal during the wait leaves the
    process group to the end of the process (:func:`_abandon`) and is raised on."""
    pause = 0.00005
    try:
        while not work.is_completed():
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE_S)
        work.wait()
    except BaseException as exc:
        if not isinstance(exc, Exception):  # a stop signal (KeyboardInterrupt, headcut's Interrupted)
            _abandon()
            raise
        lost = lost_process(exc)
        if lost is None:
            raise
        raise lost from None


def lost_process(exc: BaseException) -> HeadcutError | None:
    """The one-line error of a collective that failed because another process of the run went away (its
    connection closed or reset: it failed or was killed, and its own output says why), else None. PyTorch raises
    a ``DistError``, or from DDP's reducer inside a backward pass a ``RuntimeError`` that quotes gloo's
    transport."""
    if not isinstance(exc, RuntimeError):
        return None
    text = first_line(exc)
    if not (isinstance(exc, torch.distributed.DistError) or "gloo" in text.lower()):
        return None
    text = text.split(" This is typically")[0].rstrip(".")
    if text.startswith("[") and "] " in text:  # the C++ source location
        text = text.split("] ", 1)[1]
    return HeadcutError(
        f"another process of this run stopped while this one waited for it ({text}); that process's own output says why"
    )


def _abandon() -> None:
    """Keep the process group alive to the end of the process. A collective that is still open holds one of the
    group's threads in a receive that only the other processes can end; the group's destructor joins that
    thread, so the interpreter's exit would wait for them (with torchrun: until its SIGKILL, 30 s later). An
    extra reference that is never given back (CPython's ``Py_IncRef``) keeps the destructor from running: the
    process exits at once, and the operating system closes its connections."""

    group = torch.distributed.group.WORLD
    if group is None:
        return
    try:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))
    except (AttributeError, OSError):  # not CPython: nothing to hold it with
        pass


def _failed(errors: list[tuple[int, str]], world: int) -> str:
    """The one line of a run some of whose processes failed: ``(rank, message)`` of each failed process, by
    rank. The message itself when every process failed the same way (what one process would say), else the
    first failed process's, prefixed with the processes that gave it."""
    messages = {message for _, message in errors}
    first = errors[0][1]
    if len(errors) == world and len(messages) == 1:
        return first
    ranks = [str(rank) for rank, message in errors if message == first]
    who = f"process {ranks[0]}" if len(ranks) == 1 else f"processes {', '.join(ranks)}"
    return f"{who}: {first}"
