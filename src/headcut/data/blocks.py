"""Causal-LM blocks: a ``.txt`` file for a causal LM is one text cut into blocks of ``seq_len`` tokens.

The tokenizer's own special tokens (e.g. a BOS) are included in every block and the remainder (less than
one block) is dropped; the blocks are then shuffled and cut to ``max_examples`` like rows. Only files are
cut into blocks; every other source gives one example per row.

The text is never held whole: it is read and tokenized piece by piece (:meth:`TextFile.pieces
<headcut.data.text.TextFile.pieces>`), its token ids kept compactly; with ``max_examples`` it is read only
as far as the blocks need (at least :data:`~headcut.data.config.MIN_TOKENS_READ` tokens, so that a smaller
``max_examples`` still selects a prefix of a larger one's blocks).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any

from ..errors import HeadcutError
from .columns import Rows
from .config import MIN_TOKENS_READ

__all__ = ["affixes", "lm_blocks", "token_ids"]


def affixes(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text (e.g. BOS; CLS ... SEP)."""
    probe = "hello world"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return list(full[:start]), list(full[start + len(plain) :])
    return [], []


def token_ids(pieces: Iterable[str], tokenizer: Any, limit: int | None = None) -> tuple[array, bool]:
    """``(ids, stopped)``: the token ids of the text whose consecutive pieces are ``pieces`` (no special tokens),
    kept compactly; at most ``limit`` of them (``stopped``: the text was not read to its end)."""
    ids = array("q")
    for piece in pieces:
        ids.extend(tokenizer(piece, add_special_tokens=False, verbose=False)["input_ids"])
        if limit is not None and len(ids) >= limit:
            del ids[limit:]
            return ids, True
    return ids, False


def lm_blocks(r: Rows, tokenizer: Any, seq_len: int) -> list[dict[str, Any]]:
    """A text file for a causal LM (``r.ds``: a :class:`~headcut.data.text.TextFile`): one text, cut into
    blocks of ``seq_len`` tokens, selected."""
    prefix, suffix = affixes(tokenizer)
    body = seq_len - len(prefix) - len(suffix)
    if body < 1:
        raise HeadcutError(f"--seq-len {seq_len} leaves no room for text between the tokenizer's special tokens")
    limit = None if r.max_examples is None else max(r.max_examples * body, MIN_TOKENS_READ)
    ids, stopped = token_ids(r.ds.pieces(), tokenizer, limit)
    if stopped:
        r.notes.append(
            f"read the first {len(ids)} tokens of {r.source}: enough for --max-examples {r.max_examples} "
            "(the rest of the text was not read)"
        )
    n_blocks = len(ids) // body
    if n_blocks == 0:
        raise HeadcutError(
            f"{r.source} is shorter than one block of {seq_len} tokens ({len(ids)} tokens of text); "
            "lower --seq-len or use a longer text"
        )
    if len(ids) % body and not stopped:
        r.notes.append(f"dropped the last {len(ids) % body} tokens (less than one block)")
    examples = []
    for b in r.select(n_blocks):
        block = prefix + list(ids[b * body : (b + 1) * body]) + suffix
        examples.append({"input_ids": block, "attention_mask": [1] * len(block), "labels": list(block)})
    return examples
