"""Block-local distillation after a cut: each attention block the cut changed is trained alone to reproduce the
unpruned model's block on cached calibration inputs.

NVIDIA's Puzzle (Bercovich et al. 2024, "Puzzle: Distillation-Based NAS for Inference-Optimized LLMs": "blockwise
local distillation") trains every replacement block on its own, against the parent's block, with the parent's
activations as its input; the blocks are independent, so only one is in memory and trained at a time. Here, for
each block of the cut model with fewer query or KV heads than the unpruned model's block of the same name, in the
order a forward pass reaches them:

* the inputs of the block's attention module are cached for every calibration batch (its positional and keyword
  arguments, as the layer calls it: hidden states, position embeddings, masks), from the unpruned model
  (``inputs="unpruned"``, Puzzle's) or from the cut model with its earlier blocks already trained
  (``inputs="cut"``: the errors of the blocks before it are then part of what it learns to undo), and the unpruned
  block's output on the unpruned model's inputs;
* the block's weights (``train="attention"``: every parameter of the attention module; ``"output"``: the output
  projection only) take ``steps`` AdamW steps (learning rate ``lr``, no weight decay, cosine decay to 0), one
  cached batch per step in turn, on the loss

      L = sum over real tokens of ||a_cut(x) - a_unpruned(x_u)||^2 / sum of ||a_unpruned(x_u)||^2

  (the relative squared error of the block's output; ``x`` the cut model's cached input, ``x_u`` the unpruned
  one's, equal with ``inputs="unpruned"``), and the weights with the lowest loss over all cached batches (measured
  before training and after) are kept.

A block that kept no head, and a block whose module other blocks share (ALBERT), are left as they are."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..adapters.base import Block
from ..data.tasks import Calibration
from ..errors import HeadcutError
from ..model.surgery import model_blocks
from ..scoring.attention_maps import real_queries
from ..scoring.base import model_device, scoring_mode, to_device

#: what trains in each block, and where its inputs come from
TRAINED = ("attention", "output")
INPUTS = ("unpruned", "cut")


@dataclass
class DistilledBlock:
    """One block trained: its name, heads kept (query, KV), the relative squared error of its output over the
    cached batches before and after, and the steps taken."""

    name: str
    heads: int
    kv_heads: int
    error_before: float
    error_after: float
    steps: int

    def to_json(self) -> dict[str, Any]:
        return {
            "block": self.name,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "error_before": round(self.error_before, 6),
            "error_after": round(self.error_after, 6),
            "steps": self.steps,
        }


@dataclass
class BlockDistillResult:
    """What :func:`distill_blocks` did: the blocks trained in order, those left (no head kept, shared), the cached
    tokens per block, the settings and the wall time."""

    blocks: list[DistilledBlock] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    tokens: int = 0
    steps: int = 0
    lr: float = 0.0
    train: str = "attention"
    inputs: str = "unpruned"
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "lr": self.lr,
            "train": self.train,
            "inputs": self.inputs,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 1),
            "blocks": [b.to_json() for b in self.blocks],
            "skipped": self.skipped,
        }


class _Reached(Exception):
    """Raised by a hook to stop a forward pass once the block's attention has run."""


@dataclass
class _Call:
    """One cached call of an attention module: its arguments and keyword arguments (tensors detached)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, tuple):
        return tuple(_detached(v) for v in value)
    if isinstance(value, list):
        return [_detached(v) for v in value]
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def _output(value: Any) -> torch.Tensor:
    """The hidden states an attention module returns (the first item of a tuple)."""
    out = value[0] if isinstance(value, (tuple, list)) else value
    if not isinstance(out, torch.Tensor):
        raise HeadcutError(f"block distillation: an attention module returned {type(out).__name__}, not a tensor")
    return out


def _capture(
    model: nn.Module, attn: nn.Module, o: nn.Module | None, batch: dict[str, Any]
) -> tuple[_Call, torch.Tensor | None]:
    """One forward pass of ``batch`` through ``model``: the inputs of the attention module ``attn``'s first call
    and, given the block's output projection ``o``, what ``o`` returned (the pass stops there; without ``o`` it
    stops at ``attn``)."""
    seen: dict[str, Any] = {}

    def pre(m: nn.Module, args: Any, kwargs: Any) -> None:
        if "call" not in seen:
            seen["call"] = _Call(_detached(tuple(args)), {k: _detached(v) for k, v in kwargs.items()})
        if o is None:
            raise _Reached

    def post(m: nn.Module, args: Any, out: Any) -> None:
        if "call" in seen:
            seen["out"] = _output(out).detach()
            raise _Reached

    handles = [attn.register_forward_pre_hook(pre, with_kwargs=True)]
    if o is not None:
        handles.append(o.register_forward_hook(post))
    try:
        with torch.no_grad():
            model(**batch)
    except _Reached:
        pass
    finally:
        for h in handles:
            h.remove()
    if "call" not in seen or (o is not None and "out" not in seen):
        raise HeadcutError("block distillation: a forward pass never reached the block's attention module")
    return seen["call"], seen.get("out")


def _without_cache(call: _Call) -> _Call:
    """The call with no KV cache to fill (a cached call runs again and again): every cache argument None."""
    from transformers.cache_utils import Cache

    def plain(value: Any) -> Any:
        return None if isinstance(value, Cache) else value

    kwargs = {k: plain(v) for k, v in call.kwargs.items()}
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    return _Call(tuple(plain(a) for a in call.args), kwargs)


def _changed(student: list[Block], teacher: dict[str, Block]) -> list[Block]:
    return [
        b
        for b in student
        if b.heads > 0
        and b.shared is None
        and (b.heads, b.kv_heads) != (teacher[b.name].heads, teacher[b.name].kv_heads)
    ]


def distill_blocks(
    model: nn.Module,
    teacher: nn.Module,
    calibration: Calibration,
    *,
    steps: int,
    lr: float = 1e-3,
    train: str = "attention",
    inputs: str = "unpruned",
    seed: int = 0,
    progress: Callable[[int, int | None], None] | None = None,
) -> BlockDistillResult:
    """Train each attention block of ``model`` (a cut, slimmed copy of ``teacher``) that the cut changed to
    reproduce ``teacher``'s block on ``calibration`` (see the module's doc), in place. Both models on one device;
    their modes and ``requires_grad`` flags are restored afterwards. ``progress(done, total)``: steps taken over
    every block."""
    if steps < 1:
        raise HeadcutError(f"block distillation needs at least 1 step (got {steps})")
    if train not in TRAINED:
        raise HeadcutError(f"block distillation trains one of {', '.join(TRAINED)} (got {train!r})")
    if inputs not in INPUTS:
        raise HeadcutError(f"block distillation reads its inputs from one of {', '.join(INPUTS)} (got {inputs!r})")
    if not calibration.batches:
        raise HeadcutError("block distillation needs calibration data; the calibration set is empty")
    start = time.perf_counter()
    teacher_blocks = {b.name: b for b in model_blocks(teacher)}
    student_blocks = model_blocks(model)
    missing = [b.name for b in student_blocks if b.name not in teacher_blocks]
    if missing:
        raise HeadcutError(
            f"block distillation: the unpruned model has no block {missing[0]!r}: it is not the cut model's source"
        )
    changed = _changed(student_blocks, teacher_blocks)
    result = BlockDistillResult(steps=steps, lr=lr, train=train, inputs=inputs)
    result.skipped = [b.name for b in student_blocks if b.heads > 0 and b.shared is not None]
    result.skipped += [b.name for b in student_blocks if b.heads == 0]
    device = model_device(model)
    batches = [to_device(b, device) for b in calibration.batches]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    total = steps * len(changed)
    done = 0
    generator = torch.Generator().manual_seed(seed)
    try:
        with scoring_mode(model), scoring_mode(teacher):
            for p in model.parameters():
                p.requires_grad_(False)
            for block in changed:
                t_block = teacher_blocks[block.name]
                module = _BlockOutput(model, block)
                t_attn = teacher.base_model.get_submodule(t_block.attn)
                t_o = teacher.base_model.get_submodule(t_block.o)
                cached: list[tuple[_Call, torch.Tensor, torch.Tensor]] = []
                for batch in batches:
                    t_call, target = _capture(teacher, t_attn, t_o, batch)
                    assert target is not None
                    call = t_call if inputs == "unpruned" else _capture(model, module.attn, None, batch)[0]
                    mask = real_queries(batch, block.kind, target.shape[0], target.shape[1], target.device)
                    cached.append((_without_cache(call), target, mask))
                result.tokens = sum(int(m.sum()) for _, _, m in cached)
                trained = module.parameters_of(train)
                before = _error(module, cached)
                best, best_error = _state(trained), before
                optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
                order = torch.randperm(len(cached), generator=generator).tolist()
                for step in range(steps):
                    for group in optimizer.param_groups:
                        group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
                    call, target, mask = cached[order[step % len(order)]]
                    loss = _loss(module, call, target, mask)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    done += 1
                    if progress is not None:
                        progress(done, total)
                after = _error(module, cached)
                if after < best_error:
                    best_error = after
                else:  # training did not lower the error over the cached batches: the block as it was
                    _restore(trained, best)
                for p in trained:
                    p.requires_grad_(False)
                result.blocks.append(DistilledBlock(block.name, block.heads, block.kv_heads, before, best_error, steps))
                del cached, optimizer
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
    result.seconds = time.perf_counter() - start
    return result


class _BlockOutput:
    """A block of the cut model as a function of its attention module's inputs: the output of its output
    projection (inside the attention module, or applied to that module's output where the family keeps it
    outside, as BERT does)."""

    def __init__(self, model: nn.Module, block: Block) -> None:
        self.block = block
        self.attn = model.base_model.get_submodule(block.attn)
        self.o = model.base_model.get_submodule(block.o)
        self.inside = block.o.startswith(block.attn + ".")

    def __call__(self, call: _Call) -> torch.Tensor:
        if not self.inside:
            return _output(self.o(_output(self.attn(*call.args, **call.kwargs))))
        seen: list[torch.Tensor] = []
        handle = self.o.register_forward_hook(lambda m, a, out: seen.append(_output(out)))
        try:
            self.attn(*call.args, **call.kwargs)
        finally:
            handle.remove()
        return seen[0]

    def parameters_of(self, train: str) -> list[nn.Parameter]:
        """The parameters that train (``requires_grad`` set): the attention module's (and the output projection's
        where it is outside), or the output projection's alone."""
        chosen = list(self.o.parameters())
        if train == "attention":
            chosen = list(self.attn.parameters()) + ([] if self.inside else chosen)
        for p in chosen:
            p.requires_grad_(True)
        return chosen


def _loss(module: _BlockOutput, call: _Call, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = module(call)
    diff = (out.float() - target.float())[mask]
    return (diff * diff).sum() / (target.float()[mask] ** 2).sum().clamp_min(1e-12)


def _error(module: _BlockOutput, cached: list[tuple[_Call, torch.Tensor, torch.Tensor]]) -> float:
    """The relative squared error of the block's output over every cached batch."""
    sse, energy = 0.0, 0.0
    with torch.no_grad():
        for call, target, mask in cached:
            out = module(call).float()[mask]
            t = target.float()[mask]
            sse += float(((out - t) ** 2).sum())
            energy += float((t * t).sum())
    return sse / energy if energy > 0 else 0.0


def _state(params: list[nn.Parameter]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def _restore(params: list[nn.Parameter], saved: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, s in zip(params, saved, strict=True):
            p.copy_(s)
