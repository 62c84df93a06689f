"""PyTorch's own engines for training over several processes: DistributedDataParallel and FSDP2.

:class:`headcut.training.engine.Trainer` runs every forward and backward of a step through one of these
(:func:`start`), so the gradients are averaged by the engine, not by headcut:

* ``single`` (one process): the loss function on the model, nothing else.
* ``ddp``: the model and the gate tensors are the parameters of one module (:class:`_Step`, whose forward is
  the loss function) wrapped in ``torch.nn.parallel.DistributedDataParallel``: its reducer averages the
  gradients in buckets while the backward runs; every process holds the whole model, its gradients and its
  optimizer state.
* ``fsdp``: a structural copy of the model (its parameters share the model's storage until
  ``fully_shard`` cuts them) is sharded with FSDP2's ``fully_shard``: each attention block's transformer layer
  is one unit, the rest of the model the root unit. Its parameters become DTensor
  shards on the training device: each process holds 1/N of the weights, gradients and optimizer state, and
  gathers one layer's weights at a time for its forward and backward (reduce-scatter of the gradients).
  The gate tensors (a few floats per head) stay whole on every process; a ``DistributedDataParallel`` over
  the same step module, told to ignore the sharded model's parameters, averages their gradients. The
  caller's model is the whole copy: :meth:`Engine.gather` writes the trained weights back into it (one
  parameter at a time), before every evaluation and checkpoint and at the end; the optimizer state is
  moved between the caller's form (whole tensors, the single-process checkpoint layout) and the shards by
  :meth:`Engine.shard_optimizer` / :meth:`Engine.gather_optimizer`.
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..adapters import adapter_for
from ..errors import HeadcutError
from ..model.layer_cache import layer_stack
from .distributed import Dist

LossFn = Callable[[nn.Module, dict[str, Any], int], tuple[torch.Tensor, dict[str, Any]]]


def resolve_engine(requested: str, dist: Dist) -> str:
    """The engine a run uses (``requested``: a checked ``TrainConfig.engine``): ``single`` for one process;
    ``auto``: ``fsdp`` when accelerate's launcher was told to use FSDP (``ACCELERATE_USE_FSDP``), else ``ddp``."""
    if not dist.active:
        return "single"
    if requested == "auto":
        return "fsdp" if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes") else "ddp"
    return requested


def engine_note(requested: str, dist: Dist) -> list[str]:
    """The note of an engine named for a run of one process (where it changes nothing), else none."""
    if requested == "auto" or dist.active:
        return []
    return [f"the {requested} engine applies to several processes (accelerate launch, torchrun); this run has one"]


class _Step(nn.Module):
    """The module an engine runs: ``model`` and the gate tensors (registered as its parameters as they are,
    not copies: the gate learner computes the gates from these very tensors), the loss as its forward."""

    def __init__(self, model: nn.Module, gates: list[torch.Tensor], loss_fn: LossFn) -> None:
        super().__init__()
        self.model = model
        for i, g in enumerate(gates):
            self._parameters[f"gate{i}"] = g  # register_parameter would want an nn.Parameter, i.e. a copy
        self.__dict__["_loss_fn"] = loss_fn  # not a submodule, even when it is a module holding a teacher

    def forward(self, batch: dict[str, Any], step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        return self._loss_fn(self.model, batch, step)


def _ddp(module: nn.Module, device: torch.device, ignore: list[str] | None = None) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    if ignore:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, ignore)

    # static_graph: the same parameters take part in every step, and those a loss never reaches (a pooler
    # a token task does not use) are found once, at the first step, not traversed for every step; the
    # buffers (positions, rotary frequencies) are the same everywhere and never trained: no sync per forward
    kwargs: dict[str, Any] = {"device_ids": [device.index or 0]} if device.type == "cuda" else {}
    sync = (
        "forward_sync_buffers"
        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        else "broadcast_buffers"
    )
    kwargs[sync] = False
    return DistributedDataParallel(module, static_graph=True, **kwargs)


def is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def whole(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a collective: every process calls it); any other tensor as it is."""
    return t.full_tensor() if is_dtensor(t) else t


def rebuilt(like: torch.optim.Optimizer, groups: list[dict[str, Any]], state: dict[str, Any]) -> torch.optim.Optimizer:
    """An optimizer of ``like``'s type over ``groups`` (each carrying every hyper-parameter) holding ``state``."""
    new = type(like)(groups)
    new.load_state_dict(state)
    return new


class Engine:
    """One process's part in a training run; see the module doc. ``model``: the caller's model; ``gates``:
    the gate tensors trained with it; ``work``: the module trained in its place (fsdp's sharded copy; None: the
    model itself)."""

    name = "single"

    def __init__(
        self,
        model: nn.Module,
        gates: list[torch.Tensor],
        loss_fn: LossFn,
        dist: Dist,
        device: torch.device,
        work: nn.Module | None = None,
    ) -> None:
        self.model = model
        self.work = work if work is not None else model
        self.gates = gates
        self.dist = dist
        self.device = device
        self.step_module = _Step(self.work, gates, loss_fn)
        self.runner: nn.Module = self.step_module

    def trained(self) -> nn.Module:
        """The module whose parameters the optimizer trains."""
        return self.work

    def backward(self, batch: dict[str, Any], step: int, scale: float) -> tuple[torch.Tensor, dict[str, Any]]:
        """One micro-batch: the loss and its log values, and ``(loss * scale).backward()``, which averages the
        gradients over the processes (every micro-batch: DDP's static graph does not mix with ``no_sync``;
        the mean of sums is the sum of means)."""
        loss, extra = self.runner(batch, step)
        _check_loss(loss)
        (loss * scale).backward()
        return loss, extra

    def gather(self) -> None:
        """Put the trained weights into the caller's model (fsdp; the others train it in place)."""

    def shard_optimizer(self, optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        """The optimizer that trains :meth:`trained`'s parameters and the gates, with ``optimizer``'s state."""
        return optimizer

    def gather_optimizer(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """``optimizer``'s state dict with whole tensors (the single-process layout)."""
        return optimizer.state_dict()

    def close(self) -> None:
        """Release the engine's wrappers (the caller's model is a plain module again)."""
        self.runner = self.step_module = self.work = None  # type: ignore[assignment]


def _check_loss(loss: Any) -> None:
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        raise HeadcutError("the loss does not depend on anything being trained")


class DataParallel(Engine):
    """``ddp``: DistributedDataParallel over the model and the gates."""

    name = "ddp"

    def __init__(
        self, model: nn.Module, gates: list[torch.Tensor], loss_fn: LossFn, dist: Dist, device: torch.device
    ) -> None:
        super().__init__(model, gates, loss_fn, dist, device)
        self.runner = _ddp(self.step_module, device)


def layer_units(model: nn.Module) -> list[str]:
    """The names of the modules FSDP shards as units: each attention block's layer (the element of the
    outermost module list above it, as :func:`headcut.model.layer_cache.layer_stack` finds it), in order."""

    names = {id(m): n for n, m in model.named_modules()}
    units: list[str] = []
    for block in adapter_for(model).blocks(model.base_model):
        found = layer_stack(model, block)
        if found is not None and names[id(found[0][found[1]])] not in units:
            units.append(names[id(found[0][found[1]])])
    return units


def _structural_copy(model: nn.Module) -> nn.Module:
    """``model`` copied with its modules, hooks and buffers, whose parameters are new Parameter objects over
    the same storage (no memory): ``fully_shard`` replaces them by shards and never writes into them."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(p.detach(), requires_grad=p.requires_grad)
    return copy.deepcopy(model, memo)


class FullyShardedParallel(Engine):
    """``fsdp``: FSDP2 over a structural copy of the model, DistributedDataParallel over the gates."""

    name = "fsdp"

    def __init__(
        self, model: nn.Module, gates: list[torch.Tensor], loss_fn: LossFn, dist: Dist, device: torch.device
    ) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        shared = [b.name for b in adapter_for(model).blocks(model.base_model) if b.shared is not None]
        if shared:
            raise HeadcutError(
                "--engine fsdp cannot shard a layer that runs several times in one forward "
                f"({shared[0]}: a shared layer, as ALBERT's): use --engine ddp"
            )
        work = _structural_copy(model)
        mesh = init_device_mesh(device.type, (dist.world,))
        for unit in layer_units(work):
            fully_shard(work.get_submodule(unit), mesh=mesh)
        fully_shard(work, mesh=mesh)
        super().__init__(model, gates, loss_fn, dist, device, work)
        if gates:
            ignore = [f"model.{n}" for n, _ in work.named_parameters()] + [
                f"model.{n}" for n, _ in work.named_buffers()
            ]
            self.runner = _ddp(self.step_module, device, ignore)
        else:
            self.runner = self.step_module

    def gather(self) -> None:
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, p in self.work.named_parameters():
                value = whole(p)  # every process gathers each parameter in the same order
                own[name].copy_(value.to(own[name].device))
                del value

    def shard_optimizer(self, optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        from torch.distributed.tensor import distribute_tensor

        state = optimizer.state_dict()
        params = [p for g in groups for p in g["params"]]
        for index, entry in list(state["state"].items()):
            p = params[int(index)]
            if not is_dtensor(p):
                continue
            entry = state["state"][index] = dict(entry)  # the state dict shares the optimizer's own dicts
            for key, value in list(entry.items()):
                if isinstance(value, torch.Tensor) and value.shape == p.shape and value.dim() > 0:
                    entry[key] = distribute_tensor(value.detach().to(self.device), p.device_mesh, p.placements)
        return rebuilt(optimizer, groups, state)

    def gather_optimizer(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        state = optimizer.state_dict()
        for index, entry in list(state["state"].items()):
            entry = state["state"][index] = dict(entry)  # the state dict shares the optimizer's own dicts
            for key, value in list(entry.items()):
                if isinstance(value, torch.Tensor) and is_dtensor(value):
                    entry[key] = value.full_tensor()
        return state


ENGINES: dict[str, type[Engine]] = {"single": Engine, "ddp": DataParallel, "fsdp": FullyShardedParallel}


def start(
    requested: str, model: nn.Module, gates: list[torch.Tensor], loss_fn: LossFn, dist: Dist, device: torch.device
) -> Engine:
    """The engine of this run (:func:`resolve_engine`), wrapping ``model`` and ``gates``."""
    return ENGINES[resolve_engine(requested, dist)](model, gates, loss_fn, dist, device)
