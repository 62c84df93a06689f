"""Measuring a change in one layer without running the layers before it: every decoder layer's output on a fixed
list of batches is recorded once, and a forward that only changes layer ``i`` runs, in place of layers ``0 .. i-1``,
stand-ins that return layer ``i-1``'s recorded output for the batch (the embeddings, masks and positions are
computed as usual; layers ``i ..`` run). What changes in layer ``i`` is invisible to the layers before it, so the
result is the full forward's, at the cost of the layers from ``i`` on: half a forward on average over the layers.

The layers are found from the blocks' paths (the numbered container holding a block's attention: ``layers.3``
of ``layers.3.self_attn``), so nothing here names a family; :meth:`LayerReplay.check` compares one replayed
measure with the full one, and a model where the two disagree (a layer reading more than the one before it) is
measured in full instead (:meth:`LayerReplay.usable`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

from ..adapters import Block


def layer_path(block: Block) -> tuple[str, int] | None:
    """The container and index of the layer holding ``block`` (``("layers", 3)`` for ``layers.3.self_attn``), or
    None where its path has no numbered part or the block's module is shared."""
    if block.shared is not None:
        return None
    parts = block.attn.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].isdigit():
            return ".".join(parts[:i]), int(parts[i])
    return None


def _stand_in(outputs: list[Any]) -> Callable[..., Any]:
    """A layer's forward while replaying: the recorded output of the layer before the first one run, batch after
    batch (the layer's module stays in place: its attributes and the model's structure are unchanged)."""
    calls = [0]

    def forward(*args: Any, **kwargs: Any) -> Any:
        if calls[0] >= len(outputs):
            raise RuntimeError("replay: more batches than were recorded")
        out = outputs[calls[0]]
        calls[0] += 1
        hidden = args[0] if args else kwargs.get("hidden_states")
        first = out[0] if isinstance(out, tuple) else out
        if hidden is not None and getattr(hidden, "shape", None) != getattr(first, "shape", None):
            raise RuntimeError("replay: a batch differs from the one recorded")
        return out

    return forward


class LayerReplay:
    """The recorded outputs of a model's layers (in the container the blocks name) on the batches one measure
    runs; :meth:`from_layer` runs a measure from one layer on."""

    def __init__(self, model: nn.Module, blocks: list[Block]) -> None:
        self.base = model.base_model
        found = {layer_path(b) for b in blocks}
        containers = {f[0] for f in found if f is not None}
        self.container: str | None = containers.pop() if len(containers) == 1 and None not in found else None
        self.layer_of = {b.name: p[1] for b in blocks if (p := layer_path(b)) is not None}
        self.outputs: dict[int, list[Any]] = {}
        self.usable = False

    def _layers(self) -> nn.ModuleList | None:
        if self.container is None:
            return None
        layers = self.base.get_submodule(self.container)
        return layers if isinstance(layers, nn.ModuleList) else None

    def record(self, measure: Callable[[], float]) -> float:
        """Run ``measure`` (one forward per batch, in a fixed order) while recording every layer's outputs; its
        value. Then compare a replayed run of it with it (:meth:`check`)."""
        layers = self._layers()
        if layers is None:
            return measure()
        self.outputs = {i: [] for i in range(len(layers))}

        def keep(i: int) -> Any:
            def hook(_m: nn.Module, _a: Any, out: Any) -> None:
                self.outputs[i].append(_detached(out))

            return hook

        handles = [layer.register_forward_hook(keep(i)) for i, layer in enumerate(layers)]
        try:
            value = measure()
        finally:
            for handle in handles:
                handle.remove()
        self.usable = self.check(measure, value)
        if not self.usable:
            self.outputs = {}
        return value

    def check(self, measure: Callable[[], float], value: float) -> bool:
        """Whether a measure replayed from the middle layer gives ``value`` again (to 1e-5, relative)."""
        layers = self._layers()
        if layers is None or len(layers) < 2:
            return False
        try:
            with self.from_index(len(layers) // 2):
                again = measure()
        except RuntimeError:
            return False
        return abs(again - value) <= 1e-5 * max(abs(value), 1.0)

    @contextmanager
    def from_layer(self, block: str) -> Iterator[None]:
        """Inside: a forward runs from ``block``'s layer on (every forward in full where replay is not usable)."""
        index = self.layer_of.get(block)
        if not self.usable or index is None:
            yield
            return
        with self.from_index(index):
            yield

    @contextmanager
    def from_index(self, index: int) -> Iterator[None]:
        layers = self._layers()
        if layers is None or index < 1 or not self.outputs:
            yield
            return
        recorded = self.outputs[index - 1]
        replaced = []
        try:
            for i in range(index):
                layers[i].forward = _stand_in(recorded)
                replaced.append(layers[i])
            yield
        finally:
            for layer in replaced:
                del layer.forward


def _detached(out: Any) -> Any:
    if isinstance(out, tuple):
        return tuple(_detached(o) for o in out)
    return out.detach() if hasattr(out, "detach") else out
