"""Evaluate a model from one layer on: the layers below it run once, their output is replayed.

A method that changes one layer at a time and measures the model many times (AUBER's rewards)
wastes most of each forward on the layers below the one it changes, whose output cannot change.
:class:`LayerReplay` records, for a fixed list of batches, the output of the layer just below a
block's layer, then answers every later forward of those batches from the record: each layer below
is swapped, for the duration of the ``with``, for a stand-in that returns the recorded output of the
current batch (so the model's own code still runs the embeddings, the masks and every layer from the
block's on, unchanged).

Family-agnostic: the layer is the element of the nearest ``nn.ModuleList`` above the block's
attention module. The replay is refused (``ready`` False, with the reason in ``why``) where it
cannot be exact: the block is in its stack's first layer (nothing to skip), a layer below runs more
than once per forward (shared layers), or the replayed forward does not reproduce the full one on
the first batch (logits compared to 1e-4). Callers then evaluate the full model.

Batches must be fed in the recorded order, one forward each (:func:`headcut.evaluate` does); a
forward of another shape is refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..adapters import Block
from ..errors import HeadcutError


def layer_stack(model: nn.Module, block: Block) -> tuple[nn.ModuleList, int] | None:
    """The module list holding ``block``'s layer and the layer's index in it (None if there is none):
    the outermost list above the attention module (T5's blocks, not the sub-layers inside a block)."""
    base = model.base_model
    parts = block.attn.split(".")
    for cut in range(1, len(parts)):
        if not parts[cut].isdigit():
            continue
        try:
            holder = base.get_submodule(".".join(parts[:cut]))
        except AttributeError:
            continue
        if isinstance(holder, nn.ModuleList):
            return holder, int(parts[cut])
    return None


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    if isinstance(value, dict):
        for v in value.values():
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _logits(output: Any) -> torch.Tensor:
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    t = _first_tensor(output if not hasattr(output, "to_tuple") else output.to_tuple())
    if t is None:
        raise HeadcutError("the model's output has no tensor to compare")
    return t


class LayerReplay:
    """Replay the layers below ``block``'s layer for ``batches`` (see the module's doc).

    ``with replay.active(): evaluate(model, data)`` runs only the layers from the block's on;
    :meth:`record` must run first (with the model as it will stay below the block)."""

    def __init__(self, model: nn.Module, block: Block, batches: Sequence[dict[str, torch.Tensor]]) -> None:
        self.model = model
        self.batches = list(batches)
        self.records: list[Any] = []
        self.ready = False
        self.why: str | None = None
        found = layer_stack(model, block)
        if found is None:
            self.why = "no layer list above the block"
            self.stack, self.index = None, 0
            return
        self.stack, self.index = found
        if self.index == 0:
            self.why = "the block is in the first layer of its stack: nothing below it to replay"

    @property
    def layers_skipped(self) -> int:
        return self.index if self.ready else 0

    def _device(self) -> torch.device:
        return next(iter(self.model.parameters())).device

    def record(self) -> bool:
        """Run every batch once through the full model, keep the output of the layer below the
        block's, and check that a replayed forward gives the full model's logits on the first batch.
        Returns ``ready``."""
        if self.why is not None or self.stack is None:
            return False
        below = self.stack[self.index - 1]
        calls: list[Any] = []

        def keep(_module: nn.Module, _args: Any, output: Any) -> None:
            calls.append(output)

        device = self._device()
        was_training = self.model.training
        self.model.eval()
        first: torch.Tensor | None = None
        handle = below.register_forward_hook(keep)
        try:
            with torch.inference_mode():
                for i, batch in enumerate(self.batches):
                    calls.clear()
                    out = self.model(**{k: v.to(device) for k, v in batch.items()})
                    if len(calls) != 1:
                        self.why = f"the layer below the block ran {len(calls)} times in one forward (shared layers)"
                        return False
                    self.records.append(calls[0])
                    if i == 0:
                        first = _logits(out).float().clone()
        finally:
            handle.remove()
            self.model.train(was_training)
        if len(set(map(id, list(self.stack)[: self.index]))) != self.index:
            self.why = "a module appears twice in the layer list"
            return False
        assert first is not None
        try:
            with self.active(), torch.inference_mode():
                replayed = _logits(self.model(**{k: v.to(device) for k, v in self.batches[0].items()})).float()
        except Exception as exc:  # the model's code would not run on a replayed layer: fall back, say why
            self.why = f"the model does not run from a replayed layer ({type(exc).__name__}: {str(exc)[:120]})"
            self.ready = False
            self.records = []
            return False
        if replayed.shape != first.shape or not torch.allclose(replayed, first, atol=1e-4, rtol=1e-4):
            self.why = "a replayed forward differs from the full forward"
            self.records = []
            return False
        self.ready = True
        return True

    @contextmanager
    def active(self) -> Iterator[None]:
        """Inside: each forward of the model takes the next recorded batch's output for the layers
        below the block (the first forward the first batch)."""
        if self.stack is None or not self.records:
            raise HeadcutError("nothing recorded to replay")
        position = {"batch": -1}
        records = self.records

        def count(_module: nn.Module, _args: Any, _kwargs: Any) -> None:
            position["batch"] += 1
            if position["batch"] >= len(records):
                raise HeadcutError(f"the replay has {len(records)} batches; a forward asked for more")

        def stand_in(*args: Any, **kwargs: Any) -> Any:
            record = records[position["batch"]]
            given = _first_tensor(args) if args else _first_tensor(kwargs)
            kept = _first_tensor(record)
            if given is not None and kept is not None and given.shape[:2] != kept.shape[:2]:
                raise HeadcutError(
                    f"replay out of step: a batch of shape {tuple(given.shape[:2])} met the "
                    f"recorded {tuple(kept.shape[:2])}"
                )
            return record

        layers = list(self.stack)[: self.index]
        saved = [layer.__dict__.get("forward") for layer in layers]
        handle = self.model.register_forward_pre_hook(count, with_kwargs=True)
        try:
            for layer in layers:
                layer.forward = stand_in  # type: ignore[method-assign]
            yield
        finally:
            handle.remove()
            for layer, own in zip(layers, saved):
                if own is None:
                    del layer.forward
                else:
                    layer.forward = own  # type: ignore[method-assign]
