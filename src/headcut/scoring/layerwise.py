"""Layer-wise scoring: the scores of every block of a streamed checkpoint (:mod:`headcut.model.streamed`),
computed one layer at a time on the recorded activations of the layer before, which stay in memory or are
spilled to a temporary folder (``headcut prune --layerwise``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from ..adapters import Block
from ..devices import trim_memory
from ..errors import HeadcutError, label
from ..files import leftovers, space
from ..model.streamed import Activations, LayerwiseStats, StreamedModel
from . import finish_scores, get_scorer
from .attention_maps import eager_attention
from .base import RawScores
from .fluctuation import input_moments, scores_from_moments

#: the scorers whose score of a block needs only its own layer's forward (or its weights)
LAYERWISE_SCORERS = ("fluctuation", "confidence", "entropy", "magnitude", "value-l1")
#: those of them that read attention maps (the layers then run with eager attention, the masks built for it)
MAP_SCORERS = ("confidence", "entropy")


class _LayerView(nn.Module):
    """One layer as the scorers see a model: ``base_model`` is the whole (mostly meta) model's, and a forward of
    calibration batch ``_hc_index`` runs only this layer, on its recorded inputs, keeping its output."""

    def __init__(
        self,
        layer: nn.Module,
        base: nn.Module,
        config: Any,
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
        inputs: Activations,
        outputs: Activations,
        attention: Sequence[nn.Module] = (),
    ) -> None:
        super().__init__()
        self.layer = layer
        object.__setattr__(self, "_base", base)
        self.config = config
        self.calls, self.inputs, self.outputs = calls, inputs, outputs
        object.__setattr__(self, "_attention", list(attention))

    @property
    def base_model(self) -> nn.Module:  # type: ignore[override]
        return self._base

    def forward(self, _hc_index: int, output_attentions: bool = False, **batch: Any) -> Any:
        """The layer on batch ``_hc_index``'s recorded input; with ``output_attentions``, an output whose
        ``attentions`` are the maps of the layer's attention modules (the weights each returns under eager
        attention), as a whole model's output has them."""
        if _hc_index != len(self.outputs):
            raise HeadcutError("layer-wise scoring: calibration batches must be run once each, in order")
        maps: list[torch.Tensor] = []
        handles = (
            [mod.register_forward_hook(lambda m, a, out: maps.append(out[1])) for mod in self._attention]
            if output_attentions
            else []
        )
        try:
            args, kwargs = self.calls[_hc_index]
            out = self.layer(self.inputs[_hc_index], *args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        hidden = out[0] if isinstance(out, tuple) else out
        self.outputs.append(hidden.detach())
        if output_attentions:
            return SimpleNamespace(last_hidden_state=hidden, attentions=tuple(maps))
        return hidden


def score_layerwise(
    streamed: StreamedModel,
    batches: Sequence[dict[str, Any]] | None,
    config: Any,
    stats: LayerwiseStats,
    spill_dir: Path | None,
    progress: Callable[[int, int], None] | None = None,
    means: dict[str, torch.Tensor] | None = None,
) -> Any:
    """Scores of every block (a :class:`headcut.scoring.HeadScores`), computed one layer at a time; ``means``
    (fluctuation only): filled with each block's mean output-projection input (FLAP's baseline, for the bias
    compensation), from the same forward. An attention-map scorer runs the whole pass (the capture's masks
    included) with eager attention."""
    scorer = get_scorer(config.scorer)
    if scorer.name not in LAYERWISE_SCORERS:
        raise HeadcutError(f"scorer {scorer.name} needs the whole model; layer-wise: {', '.join(LAYERWISE_SCORERS)}")
    start = time.perf_counter()
    by_layer: dict[int, list[Block]] = {}
    for block in streamed.blocks:
        by_layer.setdefault(streamed.layer_of[block.name], []).append(block)
    if spill_dir is not None:
        check_spill_room(spill_dir, stats.activation_bytes)
    with eager_attention(streamed.model) if scorer.name in MAP_SCORERS else contextlib.nullcontext():
        try:
            raw, examples = _score_layers(streamed, scorer, batches, config, spill_dir, progress, means, by_layer)
        except OSError as exc:
            if spill_dir is None:
                raise
            raise spill_error(exc, spill_dir, stats.activation_bytes) from None
    stats.score_seconds = time.perf_counter() - start
    return finish_scores(scorer, streamed.blocks, RawScores(raw, examples), config, stats.score_seconds)


def _score_layers(
    streamed: StreamedModel,
    scorer: Any,
    batches: Sequence[dict[str, Any]] | None,
    config: Any,
    spill_dir: Path | None,
    progress: Callable[[int, int], None] | None,
    means: dict[str, torch.Tensor] | None,
    by_layer: dict[int, list[Block]],
) -> tuple[dict[str, torch.Tensor], int]:
    """The raw scores of :func:`score_layerwise`, layer after layer."""
    base = streamed.model.base_model
    raw: dict[str, torch.Tensor] = {}
    examples = 0
    n = len(streamed.layers)
    if scorer.needs_data:
        if not batches:
            raise HeadcutError(f"scorer {scorer.name} needs calibration data")
        indexed = [dict(b, _hc_index=i) for i, b in enumerate(batches)]
        current, calls = streamed.capture(batches, spill_dir)
    for i in range(n):
        streamed.materialize(streamed.layers[i], streamed.prefixes[i])
        try:
            blocks = by_layer.get(i, [])
            if scorer.needs_data:
                outputs = Activations(spill_dir)
                attention = [base.get_submodule(b.attn) for b in sorted(blocks, key=lambda b: b.layer)]
                view = _LayerView(
                    streamed.layers[i], base, streamed.model.config, calls[i], current, outputs, attention
                )
                if blocks and means is not None and scorer.name == "fluctuation":
                    moments, examples = input_moments(view, blocks, indexed, scorer.name)
                    raw.update(scores_from_moments(view, blocks, moments, examples).blocks)
                    means.update({name: m.mean() for name, m in moments.items()})
                elif blocks:
                    result = scorer.fn(view, blocks, indexed, config, None)
                    raw.update(result.blocks)
                    examples = result.examples
                with torch.no_grad():
                    for j in range(len(outputs), len(batches)):  # a layer without blocks still passes its outputs on
                        view(_hc_index=j)
                current.drop()
                current = outputs
                calls[i] = []
            elif blocks:
                raw.update(scorer.fn(streamed.model, blocks, None, config, None).blocks)
        finally:
            streamed.release(streamed.layers[i])
            trim_memory()
        if progress is not None:
            progress(i + 1, n)
    if scorer.needs_data:
        current.drop()
    return raw, examples


def spill_need(activation_bytes: int) -> int:
    """The disk a spilling run needs for its activations: one layer's inputs and outputs at once."""
    return 2 * activation_bytes


def _spill_hint() -> str:
    return (
        f"set TMPDIR to a folder with more room, give {label('max_memory')} room to keep the activations in "
        f"memory, or use fewer {label('max_examples')}"
    )


def check_spill_room(folder: Path, activation_bytes: int) -> None:
    """Refuse, before scoring, to spill activations to ``folder`` when its disk cannot hold them."""
    free, need = space.free_space(folder), spill_need(activation_bytes)
    if free is not None and free < need:
        raise space.space_error("spill activations to", folder.parent, folder.parent, need, _spill_hint())


def spill_error(exc: OSError, folder: Path, activation_bytes: int) -> HeadcutError:
    """The one-line error of activations that could not be spilled to ``folder`` (a full disk, most likely), naming
    the temporary folder the user chose (TMPDIR), not headcut's scratch folder in it."""
    where = folder.parent
    error = space.write_error(
        exc, "spill activations to", where, where, spill_need(activation_bytes) or None, _spill_hint()
    )
    return error if error is not None else HeadcutError(f"cannot spill activations to {where}: {exc}")


def spill_folder(parent: Path | None) -> Any:
    """A private temporary folder for spilled activations, ``headcut-activations-PID-*`` (removed afterwards; those a
    killed run left are removed first)."""
    return leftovers.scratch_folder("activations", parent)
