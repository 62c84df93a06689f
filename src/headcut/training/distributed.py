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
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..errors import HeadcutError


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
            torch.distributed.barrier()

    def average(self, value: float) -> float:
        """``value`` averaged over the processes (a step's loss, for its log and the divergence check, so
        that every process stops at the same step); the gradients are averaged by the training engine
        (:mod:`headcut.training.parallel`)."""
        if not self.active:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return float(t) / self.world

    def max_difference(self, tensors: list[torch.Tensor]) -> float:
        """The largest absolute difference of ``tensors`` between any process and rank 0 (0.0 in a
        single process): how far the processes' copies have drifted apart."""
        if not self.active or not tensors:
            return 0.0
        flat = torch.cat([t.detach().reshape(-1).to(torch.float64).cpu() for t in tensors])
        ref = flat.clone()
        torch.distributed.broadcast(ref, src=0)
        diff = (flat - ref).abs().max().reshape(1)
        torch.distributed.all_reduce(diff, op=torch.distributed.ReduceOp.MAX)
        return float(diff)

    def device(self, requested: str) -> torch.device:
        """The device this process trains on (:func:`headcut.devices.check_device`): ``cpu``, ``mps``, ``cuda:N``,
        ``cuda`` (this process's GPU: ``cuda:local_rank`` in a multi-process run) or ``auto`` (cuda when
        available)."""
        from ..devices import check_device

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
