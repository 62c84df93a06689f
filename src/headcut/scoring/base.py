"""Types and helpers shared by the head-importance scorers.

Every scorer is written against the adapter interface (:class:`headcut.adapters.Block`) and never
names a model family. A scorer makes at most one pass over the calibration batches: one forward
(attention scorers) or one forward and one backward (gradient scorers) per batch, with no per-head
loops; data-free scorers read weights only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..adapters import Block
from ..config import ScoreConfig
from ..errors import HeadcutError

#: ``progress(done, total)`` after every calibration batch; ``total`` is None for an iterable of
#: unknown length
Progress = Callable[[int, int | None], None]
Batch = Mapping[str, Any]


@dataclass
class HeadScores:
    """Per-head scores of every block, in the order of :func:`headcut.model_blocks`.

    ``blocks``: block name -> one float per head (after the config's normalisation).
    ``kv_groups``: block name -> one float per KV group for blocks with grouped-query attention
    (the mean of the group's query-head scores), None for the other blocks.
    ``higher_is_important``: the orientation of ``blocks`` (False for entropy);
    :meth:`importance` always returns higher = more important.
    """

    scorer: str
    blocks: dict[str, list[float]]
    kv_groups: dict[str, list[float] | None]
    higher_is_important: bool
    examples: int
    seconds: float
    config: ScoreConfig = field(default_factory=ScoreConfig)

    def importance(self) -> dict[str, list[float]]:
        """Scores oriented so that higher = more important (entropy negated), after normalisation."""
        sign = 1.0 if self.higher_is_important else -1.0
        return {name: [sign * v for v in values] for name, values in self.blocks.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "scorer": self.scorer,
            "blocks": {k: list(v) for k, v in self.blocks.items()},
            "kv_groups": {k: None if v is None else list(v) for k, v in self.kv_groups.items()},
            "examples": self.examples,
            "seconds": self.seconds,
            "higher_is_important": self.higher_is_important,
        }


@dataclass
class RawScores:
    """What a scorer function returns: one score tensor per block name, and examples seen."""

    blocks: dict[str, torch.Tensor]
    examples: int = 0


ScorerFn = Callable[[nn.Module, list[Block], Iterable[Batch] | None, ScoreConfig, Progress | None], RawScores]


@dataclass(frozen=True)
class Scorer:
    """A scorer: its function, whether it needs calibration data and its orientation (its summary for
    ``--help`` is in :data:`headcut.catalog.SCORERS`)."""

    name: str
    fn: ScorerFn
    needs_data: bool
    higher_is_important: bool
    #: the scores compare heads within a block only (standardised over the block): a prune unit that is a
    #: whole block (one KV group per layer under ``--gqa group``) scores the block's mean, 0, whatever it holds
    within_block: bool = False


# ---------------------------------------------------------------------------------------------
# helpers


def model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def to_device(batch: Batch, device: torch.device) -> dict[str, Any]:
    """A copy of ``batch`` with its tensors on ``device`` (the caller's dict is not changed)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def batch_size(batch: Batch) -> int:
    """The number of examples in a batch (the first dimension of its first tensor)."""
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    raise HeadcutError("a calibration batch must contain tensors (input_ids, attention_mask, labels, ...)")


def calibration(
    batches: Iterable[Batch] | None,
    scorer: str,
    device: torch.device,
    progress: Progress | None,
) -> Iterator[dict[str, Any]]:
    """Iterate ONCE over the calibration batches (moved to ``device``), reporting progress.

    Refuses a missing or empty calibration set."""
    if batches is None:
        raise HeadcutError(f"scorer {scorer!r} needs calibration batches; got none")
    total = len(batches) if hasattr(batches, "__len__") else None  # type: ignore[arg-type]
    done = 0
    for batch in batches:
        if not isinstance(batch, Mapping):
            raise HeadcutError("a calibration batch must be a dict of model inputs (model(**batch))")
        yield to_device(batch, device)
        done += 1
        if progress is not None:
            progress(done, total)
    if done == 0:
        raise HeadcutError(f"scorer {scorer!r} needs calibration batches; the calibration set is empty")


@contextmanager
def scoring_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) while scoring; every module's training flag is restored afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, flag in flags:
            module.training = flag


def output_logits(out: Any) -> torch.Tensor:
    """The model's main output: ``logits``, else ``last_hidden_state`` (base models)."""
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if isinstance(value, torch.Tensor):
            return value
    raise HeadcutError("the model's output has neither logits nor a last hidden state")


def task_loss(out: Any, scorer: str) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise HeadcutError(
            f"scorer {scorer!r} needs the task loss, but the model returned none: the batches need "
            "labels and the model a task head (or use a label-free scorer)"
        )
    return loss


def kv_group_scores(block: Block, scores: torch.Tensor) -> torch.Tensor | None:
    """Per-KV-group scores of a grouped-query block: the mean of each group's query-head scores
    (query head h reads KV head h // group_size); None without grouped-query attention."""
    if block.heads == 0 or block.kv_heads == 0 or block.group_size == 1:
        return None
    return scores.reshape(block.kv_heads, block.group_size).mean(dim=1)


def layer_norm_factor(scores: torch.Tensor) -> float:
    """Michel et al.'s per-layer normalisation: the block's L2 norm (1 for a zero or empty block)."""
    norm = float(torch.linalg.vector_norm(scores.double())) if scores.numel() else 0.0
    return norm if norm > 0 and math.isfinite(norm) else 1.0
