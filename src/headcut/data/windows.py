"""Perplexity windows: a causal LM's perplexity as the pruning papers measure it (``headcut eval --windows``).

The papers (FLAP and LLM-Pruner at 128 tokens, SliceGPT and Wanda at 2,048) read wikitext-2's test split as one
text, its rows joined by ``"\\n\\n"``, tokenize it once and cut the tokens into non-overlapping windows of N
tokens, the rest dropped; each window is a forward of its own. :func:`load_windows` does the same for any data:

* **The text**: a ``.txt`` file (or pipe) as it is; the text column of a table file, a ``datasets`` split or
  rows given in memory, its rows in order (never shuffled) joined by a blank line, empty rows kept as the
  papers keep them (a row without a value is skipped, with a note).
* **Tokens**: the text tokenized piece by piece (:func:`headcut.data.text.pieces_of`: never one huge tokenizer
  call), without special tokens.
* **Windows** of N tokens of the text: tokens ``[k N, (k + 1) N)`` for ``k = 0 .. tokens // N - 1``, each read as
  the model reads a text (:func:`window_tensors`): after the special tokens its tokenizer puts before every text
  (Gemma's and Llama's BOS: without it Gemma 3 270M's perplexity over the first 32 windows of 128 tokens of
  hamlet.txt is 506.8 instead of 83.7), so every
  one of the window's N tokens is predicted, the first from the BOS alone; a tokenizer that puts nothing before a
  text (GPT-2's, SmolLM2's) leaves the window's first token as context only, N - 1 predicted. Perplexity =
  exp(mean negative log-likelihood of every predicted token). The benchmark page's rows read their windows with
  the same function (``benchmarks/harness/perplexity.py``).
* ``max_examples``: the first ``max_examples`` windows of each length (the text is read only as far as the
  longest needs). ``seq_len`` and ``batch_size`` only size the batches: a forward holds
  max(1, ``batch_size`` x ``seq_len`` // N) windows, the tokens of ``batch_size`` blocks of ``seq_len`` (no
  padding: the metric does not depend on it).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import HeadcutError, label
from .blocks import affixes, token_ids
from .columns import pick
from .config import TEXT_COLUMNS, DataConfig
from .tasks import Calibration, _pad_id, detect_task, max_positions, open_rows
from .text import pieces_of

__all__ = ["TextStream", "load_windows", "window_tensors"]

#: what joins the rows of a table into one text (the papers' wikitext-2 reading)
ROW_SEPARATOR = "\n\n"
#: rows read from a table at a time
ROWS_AT_ONCE = 1000


def window_tensors(ids: torch.Tensor, window: int, prefix: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, labels)`` of the non-overlapping windows of ``window`` tokens of ``ids`` (1-D, the text's
    tokens without special tokens; the rest after the last whole window dropped), each window read after
    ``prefix`` (the tokens the model's tokenizer puts before every text: Gemma's, Llama's BOS): the labels are
    -100 on the prefix, so with a prefix every token of the window is predicted (its first from the prefix), and
    without one all but the first. One rule for ``headcut eval --windows``, :func:`headcut.evaluate` and the
    benchmark page (torch only, so the page's peers' environments import it too)."""
    count = ids.numel() // window
    text = ids[: count * window].reshape(count, window)
    if not prefix:
        return text, text.clone()
    head = torch.tensor(list(prefix), dtype=ids.dtype).expand(count, len(prefix))
    inputs = torch.cat([head, text], dim=1)
    labels = inputs.clone()
    labels[:, : len(prefix)] = -100
    return inputs, labels


def scored_per_window(window: int, prefix: Sequence[int]) -> int:
    """The tokens a window of ``window`` text tokens predicts (:func:`window_tensors`)."""
    return window if prefix else window - 1


@dataclass
class TextStream:
    """The token ids of the whole text (``ids``: without special tokens), the tokens every window is read after
    (``prefix``: the tokenizer's, e.g. BOS), where they came from (``source``, ``columns``), how many rows were
    joined (``rows``; None for a text file), whether the text was read to its end (``complete``: False when
    ``max_examples`` stopped it early), and ``notes``."""

    ids: array
    source: str
    columns: dict[str, str]
    rows: int | None
    complete: bool
    notes: list[str] = field(default_factory=list)
    prefix: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """What a report records of the text."""
        return {
            "source": self.source,
            "columns": dict(self.columns),
            "text_tokens": len(self.ids),
            "rows_joined": self.rows,
            "joined_with": ROW_SEPARATOR if self.rows is not None else None,
            "complete": self.complete,
            "window_prefix": list(self.prefix),
            "layout": "windows",
            "notes": list(self.notes),
        }


def _row_chunks(ds: Any, column: str, source: str, counts: dict[str, int]) -> Iterator[str]:
    """The texts of ``column`` in row order, joined by :data:`ROW_SEPARATOR` (``counts``: rows joined and
    skipped)."""
    for start in range(0, ds.num_rows, ROWS_AT_ONCE):
        values = ds[start : start + ROWS_AT_ONCE][column]
        for offset, value in enumerate(values):
            if value is None:
                counts["skipped"] += 1
                continue
            if not isinstance(value, str):
                raise HeadcutError(
                    f"{source}: column {column!r} holds {type(value).__name__} values, not text "
                    f"(row {start + offset + 1})"
                )
            yield value if counts["joined"] == 0 else ROW_SEPARATOR + value
            counts["joined"] += 1


def _stream(ds: Any, source: str, is_txt: bool, tokenizer: Any, config: DataConfig, longest: int) -> TextStream:
    notes: list[str] = []
    counts = {"joined": 0, "skipped": 0}
    if is_txt:
        columns, pieces = {"text": "text"}, ds.pieces()
    else:
        column = pick(list(ds.column_names), config.text_col, TEXT_COLUMNS, "text", "--text-col", source)
        assert column is not None
        columns, pieces = {"text": column}, pieces_of(_row_chunks(ds, column, source, counts))
    prefix = affixes(tokenizer)[0]
    limit = None if config.max_examples is None else config.max_examples * longest
    ids, stopped = token_ids(pieces, tokenizer, limit)
    if not is_txt and counts["joined"] == 0:
        raise HeadcutError(f"{source} has no text: every row misses a value in {columns['text']!r}")
    if counts["skipped"]:
        notes.append(
            f"skipped {counts['skipped']} row{'s' if counts['skipped'] != 1 else ''} without a value in "
            f"{columns['text']!r}"
        )
    if stopped:
        notes.append(
            f"read the first {len(ids)} tokens of {source}: enough for --max-examples "
            f"{config.max_examples} windows of {longest} tokens (the rest of the text was not read)"
        )
    return TextStream(ids, source, columns, None if is_txt else counts["joined"], not stopped, notes, list(prefix))


def _window_calibration(
    stream: TextStream, window: int, config: DataConfig, pad_id: int, tokenizer: Any
) -> Calibration:
    available = len(stream.ids) // window
    count = available if config.max_examples is None else min(available, config.max_examples)
    notes = []
    if stream.complete and len(stream.ids) % window:
        notes.append(f"window {window}: dropped the last {len(stream.ids) % window} tokens (less than one window)")
    per_batch = max(1, config.batch_size * config.seq_len // window)
    text = torch.frombuffer(stream.ids, dtype=torch.int64)[: count * window]
    inputs, labels = window_tensors(text, window, stream.prefix)
    batches = []
    for start in range(0, count, per_batch):
        part = inputs[start : start + per_batch].clone()
        batches.append(
            {"input_ids": part, "attention_mask": torch.ones_like(part), "labels": labels[start : start + per_batch]}
        )
    return Calibration(
        task="causal-lm",
        batches=batches,
        examples=count,
        source=stream.source,
        columns=dict(stream.columns),
        seq_len=window,
        batch_size=per_batch,
        seed=config.seed,
        tokens=count * (window + len(stream.prefix)),
        scored_tokens=count * scored_per_window(window, stream.prefix),
        notes=notes,
        layout="windows",
        tokenizer=tokenizer,
        pad_id=pad_id,
    )


def load_windows(
    model: nn.Module, tokenizer: Any, config: DataConfig, windows: Sequence[int], dataset: Any = None
) -> tuple[TextStream, list[Calibration]]:
    """The text of ``config.path`` (or of ``dataset``, rows given in memory) as one token stream, and one
    :class:`Calibration` of its non-overlapping windows per length in ``windows`` (see the module's doc)."""
    config.validate(need_path=dataset is None)
    sizes = [int(w) for w in windows]
    if not sizes:
        raise HeadcutError(f"{label('windows')} names no window length")
    task = detect_task(model)
    if task != "causal-lm":
        raise HeadcutError(
            f"{label('windows')} measures the perplexity of a causal LM; this model has a {task} head "
            "(its metric needs no --windows)"
        )
    limit = max_positions(model.config)
    for size in sizes:
        if size < 2:
            raise HeadcutError(f"{label('windows')} {size}: a window needs at least 2 tokens")
        if limit is not None and size > limit:
            raise HeadcutError(f"{label('windows')} {size} is longer than the model's {limit} positions")
    prefix = affixes(tokenizer)[0]
    for size in sizes:
        if limit is not None and size + len(prefix) > limit:
            raise HeadcutError(
                f"{label('windows')} {size}: each window is read after the {len(prefix)} token"
                f"{'s' if len(prefix) != 1 else ''} the tokenizer puts before a text (its BOS), "
                f"{size + len(prefix)} positions, longer than the model's {limit}; give at most {limit - len(prefix)}"
            )
    with open_rows(config, dataset) as (ds, source, is_txt):
        stream = _stream(ds, source, is_txt, tokenizer, config, max(sizes))
    if not stream.ids:
        raise HeadcutError(f"{source} has no text to score (no tokens)")
    too_long = [s for s in sizes if len(stream.ids) < s]
    if too_long:
        raise HeadcutError(
            f"{source} has {len(stream.ids)} tokens, shorter than one window of {too_long[0]} "
            f"({label('windows')}); give a longer text or a shorter window"
        )
    try:
        rows = model.get_input_embeddings().num_embeddings
    except (AttributeError, NotImplementedError):
        rows = None
    top = max(max(stream.ids), max(stream.prefix, default=0))
    if rows is not None and top >= rows:
        raise HeadcutError(
            f"the tokenizer gives token id {top} but the model has {rows} token embeddings: the "
            "tokenizer does not belong to this model"
        )
    pad_id = _pad_id(model, tokenizer)
    return stream, [_window_calibration(stream, size, config, pad_id, tokenizer) for size in sizes]
