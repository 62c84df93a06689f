"""Tokenize rows for the model's task head and cut them into batches ready for ``model(**batch)``.

* **Tasks** (:func:`detect_task`, from the model's head): ``classification``, ``causal-lm``,
  ``seq2seq`` and ``masked-lm``.
* **Examples**: one per usable row (see :mod:`headcut.data.columns`), truncated to ``seq_len`` tokens; a
  ``.txt`` file for a causal LM is cut into blocks instead (:mod:`headcut.data.blocks`). Texts are cut to
  ``seq_len`` x :data:`~headcut.data.config.CHARS_PER_TOKEN` characters before tokenizing, and tokenized a
  few hundred at a time: a huge text costs no more than a normal one, and Ctrl-C or SIGTERM stop promptly.
* **Batches** are padded on the right to their longest example (``attention_mask`` 0 on padding) and
  carry ``labels`` for the task's loss: class ids ``(B,)`` for classification; the input ids for a
  causal LM; the target ids for seq2seq; the original ids of the masked positions for a masked LM.
  Every label of a padding position, and of an unmasked position for a masked LM, is ``-100``, so
  padding is never scored.
* **Masked LM**: BERT's recipe. Each real, non-special token is chosen with ``mlm_probability``
  (at least one per example); a chosen token becomes the mask token with probability 0.8, a uniformly
  random token with 0.1, and stays with 0.1. Draws come from a ``torch.Generator`` seeded with
  ``seed``, so the same data, tokenizer and seed give the same batches.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import HeadcutError, first_line
from ..files.space import os_error
from .blocks import lm_blocks
from .columns import Rows, label_ids, pick
from .config import (
    CHARS_PER_TOKEN,
    LABEL_COLUMNS,
    PAIR_COLUMNS,
    SOURCE_COLUMNS,
    SUPPORTED_HEADS,
    TARGET_COLUMNS,
    TEXT_COLUMNS,
    TOKENIZER_FILES,
    DataConfig,
)
from .files import in_memory, open_data

__all__ = ["Calibration", "detect_task", "load_calibration", "load_tokenizer"]


@dataclass
class Calibration:
    """Tokenized, batched data for one model.

    ``batches``: dicts for ``model(**batch)`` (see the module's doc); ``examples``: examples in them
    (blocks for a causal LM read from ``.txt``); ``source``: the file or ``datasets`` name read (for a
    dataset given in memory, e.g. ``<datasets.Dataset of 100 rows>``);
    ``columns``: role (``text``, ``text_pair``, ``label``, ``source``, ``target``) -> column used;
    ``label_names``: the model's class names by id (classification); ``references``: the target texts
    in batch order (seq2seq); ``tokens``: real (non-padding) input tokens; ``scored_tokens``: label
    positions that count in the loss (tokens whose label is not -100; classification: examples);
    ``tokenizer``: the tokenizer used (to decode generated text); ``notes``: what was skipped or
    assumed; ``layout``: how the examples were cut: ``rows`` (one per row or line, truncated to ``seq_len``),
    ``blocks`` (a ``.txt`` file for a causal LM: blocks of ``seq_len`` tokens, the tokenizer's special tokens in
    each) or ``windows`` (non-overlapping windows of ``seq_len`` tokens of the whole text, see
    :mod:`headcut.data.windows`).
    """

    task: str
    batches: list[dict[str, torch.Tensor]]
    examples: int
    source: str
    columns: dict[str, str]
    seq_len: int = 128
    batch_size: int = 16
    seed: int = 0
    label_names: list[str] | None = None
    references: list[str] | None = None
    tokens: int = 0
    scored_tokens: int = 0
    notes: list[str] = field(default_factory=list)
    layout: str = "rows"
    tokenizer: Any = field(default=None, repr=False, compare=False)
    items: list[dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    pad_id: int | None = field(default=None, repr=False, compare=False)

    def select(self, indices: Sequence[int], batch_size: int | None = None, by_length: bool = False) -> Calibration:
        """A Calibration of the examples at ``indices`` (0-based, in the order of ``items``), batched
        again (``batch_size``: this one's by default); ``by_length``: sort them by length first, so that
        batches carry little padding (for evaluation: the metric does not depend on the order)."""
        if self.items is None or self.pad_id is None:
            raise HeadcutError("this data keeps no examples to select from (build it with load_calibration)")
        chosen = [int(i) for i in indices]
        if not chosen:
            raise HeadcutError("no examples selected")
        if min(chosen) < 0 or max(chosen) >= len(self.items):
            raise HeadcutError(f"example index out of range (the data has {len(self.items)} examples)")
        if by_length:
            chosen.sort(key=lambda i: (len(self.items[i]["input_ids"]), i))  # type: ignore[index]
        items = [self.items[i] for i in chosen]
        size = batch_size or self.batch_size
        batches = [_collate(items[i : i + size], self.pad_id) for i in range(0, len(items), size)]
        tokens, scored = _counts(self.task, batches)
        references = [self.references[i] for i in chosen] if self.references is not None else None
        return replace(
            self,
            batches=batches,
            examples=len(items),
            batch_size=size,
            tokens=tokens,
            scored_tokens=scored,
            references=references,
            items=items,
            notes=list(self.notes),
        )

    def majority(self) -> tuple[str, float] | None:
        """Classification: the most frequent label (its name where known) and its share of the examples, the
        accuracy of a model that ignores its input; None for other tasks or data without labels."""
        if self.task != "classification":
            return None
        counts: dict[int, int] = {}
        for batch in self.batches:
            for y in batch["labels"].view(-1).tolist() if "labels" in batch else []:
                counts[int(y)] = counts.get(int(y), 0) + 1
        if not counts:
            return None
        top = max(counts, key=lambda y: (counts[y], -y))
        names = self.label_names or []
        return (names[top] if 0 <= top < len(names) else str(top)), counts[top] / sum(counts.values())

    def to_json(self) -> dict[str, Any]:
        """What a report records of the data (everything but the batches and the tokenizer)."""
        return {
            "task": self.task,
            "source": self.source,
            "examples": self.examples,
            "batches": len(self.batches),
            "columns": dict(self.columns),
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "tokens": self.tokens,
            "scored_tokens": self.scored_tokens,
            "label_names": self.label_names,
            "layout": self.layout,
            "notes": list(self.notes),
        }


def _mapping_names(attr: str) -> set[str]:
    from transformers.models.auto import modeling_auto

    names: set[str] = set()
    for value in getattr(modeling_auto, attr, {}).values():
        names.update([value] if isinstance(value, str) else value)
    return names


def _class_names(model: nn.Module) -> list[str]:
    # headcut's loader subclasses the transformers class: look through the whole hierarchy
    return [cls.__name__ for cls in type(model).__mro__]


def detect_task(model: nn.Module) -> str:
    """The data task of ``model``'s head: one of :data:`TASK_NAMES` (from transformers' Auto mappings)."""
    classes = _class_names(model)
    name = type(model).__name__
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        raise HeadcutError(
            f"{name} is an image model: headcut reads text data only (image data is not supported); "
            f"data commands need a {SUPPORTED_HEADS} head"
        )
    heads = [
        (_mapping_names(attr), task)
        for attr, task in (
            # seq2seq first: transformers also lists encoder-decoder generators as masked LMs
            ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "seq2seq"),
            ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "causal-lm"),
            ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "masked-lm"),
            ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "classification"),
        )
    ]
    for cls_name in classes:  # the most specific class that transformers maps to a head
        for names, task in heads:
            if cls_name in names:
                return task
    raise HeadcutError(
        f"{name} has no task head that headcut can feed data to; data commands need a {SUPPORTED_HEADS} head "
        "(load it with --task sequence-classification, causal-lm, seq2seq-lm or masked-lm)"
    )


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> Any:
    """The tokenizer of a checkpoint folder (or Hub id), with one-line errors."""
    import transformers

    p = Path(path).expanduser()
    if p.is_dir():
        present = {f.name for f in p.iterdir() if f.is_file()}
        if not present.intersection(TOKENIZER_FILES):
            raise HeadcutError(
                f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES[:3])}, ...); copy the tokenizer "
                "files of the original model into it"
            )
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(p) if p.is_dir() else str(path), trust_remote_code=trust_remote_code
        )
    except PermissionError as exc:
        raise os_error("read", exc.filename or path, exc) from None
    except Exception as exc:  # transformers raises OSError, ValueError, TypeError, ImportError ...
        raise HeadcutError(f"cannot load the tokenizer of {path}: {first_line(exc)}") from None
    if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
        raise HeadcutError(f"the tokenizer of {path} has an empty vocabulary; its tokenizer files are missing")
    return tokenizer


def max_positions(config: Any) -> int | None:
    """The most positions a model of ``config`` reads (None: no limit in its config)."""
    for attr in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _pad_id(model: nn.Module, tokenizer: Any) -> int:
    # the model's own pad id first: some models find padding (or positions) by comparing ids with it
    for value in (
        getattr(model.config, "pad_token_id", None),
        getattr(tokenizer, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if isinstance(value, int):
            return value
    return 0


def _accepts(model: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False


def _pad(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out


def _collate(examples: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a batch on the right: ids with ``pad_id``, masks and token types with 0, labels with -100."""
    batch: dict[str, torch.Tensor] = {}
    for key in examples[0]:
        values = [e[key] for e in examples]
        if key == "labels" and isinstance(values[0], int):
            batch[key] = torch.tensor(values, dtype=torch.long)
        elif key in ("labels", "target_labels"):
            batch["labels"] = _pad(values, -100)
        elif key == "input_ids":
            batch[key] = _pad(values, pad_id)
        else:  # attention_mask, token_type_ids
            batch[key] = _pad(values, 0)
    return batch


def _mask_tokens(
    ids: list[int], special: list[int], mask_id: int, vocab: int, p: float, g: torch.Generator
) -> tuple[list[int], list[int]]:
    """BERT's masking of one example: (inputs, labels)."""
    x = torch.tensor(ids, dtype=torch.long)
    eligible = torch.tensor(special, dtype=torch.bool).logical_not()
    chosen = torch.bernoulli(torch.where(eligible, p, 0.0), generator=g).bool()
    if not chosen.any():
        candidates = eligible.nonzero().flatten()
        chosen[candidates[torch.randint(len(candidates), (1,), generator=g)]] = True
    labels = torch.where(chosen, x, torch.full_like(x, -100))
    r = torch.rand(len(ids), generator=g)
    random_ids = torch.randint(vocab, (len(ids),), generator=g)
    x = torch.where(chosen & (r < 0.8), torch.full_like(x, mask_id), x)
    x = torch.where(chosen & (r >= 0.8) & (r < 0.9), random_ids, x)
    return x.tolist(), labels.tolist()


Examples = list[dict[str, Any]]

#: texts per tokenizer call (one call is one uninterruptible stretch of native code)
ENCODE_BATCH = 256


def _cut(texts: Sequence[str], seq_len: int) -> list[str]:
    """The texts cut to what ``seq_len`` tokens can use (see :data:`~headcut.data.config.CHARS_PER_TOKEN`)."""
    limit = seq_len * CHARS_PER_TOKEN
    return [t[:limit] for t in texts]


def _encode(
    tokenizer: Any, texts: Sequence[str], pairs: Sequence[str] | None = None, target: bool = False, **options: Any
) -> dict[str, list[Any]]:
    """``tokenizer(texts[, pairs])`` (``target``: as target texts), :data:`ENCODE_BATCH` texts per call; its
    fields as lists."""
    out: dict[str, list[Any]] = {}
    for i in range(0, max(len(texts), 1), ENCODE_BATCH):
        part = list(texts[i : i + ENCODE_BATCH])
        if target:
            enc = tokenizer(text_target=part, **options)
        elif pairs is not None:
            enc = tokenizer(part, list(pairs[i : i + ENCODE_BATCH]), **options)
        else:
            enc = tokenizer(part, **options)
        for key, values in enc.items():
            out.setdefault(key, []).extend(values)
    return out


def _classification(
    r: Rows, model: nn.Module, tokenizer: Any, config: DataConfig, columns: dict[str, str], unlabelled: bool = False
) -> Examples:
    names, source = r.names, r.source
    text_col = pick(names, config.text_col, TEXT_COLUMNS, "text", "--text-col", source)
    pair_col = pick(
        names,
        config.text_pair_col,
        PAIR_COLUMNS,
        "text pair",
        "--text-pair-col",
        source,
        required=False,
        taken=text_col,
    )
    label_col = None if unlabelled else pick(names, config.label_col, LABEL_COLUMNS, "label", "--label-col", source)
    assert text_col is not None and (unlabelled or label_col is not None)
    columns["text"] = text_col
    if label_col is not None:
        columns["label"] = label_col
    if pair_col is not None:
        columns["text_pair"] = pair_col
    rows = r.usable(text_col, pair_col, label_col)
    texts = _cut(r.texts(text_col, rows), config.seq_len)
    labels = label_ids(r.column(label_col, rows), rows, label_col, source, model.config) if label_col else None
    options: dict[str, Any] = {"truncation": True, "max_length": config.seq_len, "verbose": False}
    pairs = _cut(r.texts(pair_col, rows), config.seq_len) if pair_col is not None else None
    enc = _encode(tokenizer, texts, pairs, **options)
    types = "token_type_ids" in enc and _accepts(model, "token_type_ids")
    examples = []
    for i, ids in enumerate(enc["input_ids"]):
        ex: dict[str, Any] = {"input_ids": list(ids), "attention_mask": [1] * len(ids)}
        if types:
            ex["token_type_ids"] = list(enc["token_type_ids"][i])
        if labels is not None:
            ex["labels"] = labels[i]
        examples.append(ex)
    return examples


def _seq2seq(r: Rows, tokenizer: Any, config: DataConfig, columns: dict[str, str], references: list[str]) -> Examples:
    names, source = r.names, r.source
    src_col = pick(
        names, config.source_col or config.text_col, SOURCE_COLUMNS + TEXT_COLUMNS, "source", "--source-col", source
    )
    tgt_col = pick(names, config.target_col, TARGET_COLUMNS, "target", "--target-col", source, taken=src_col)
    assert src_col is not None and tgt_col is not None
    columns.update({"source": src_col, "target": tgt_col})
    rows = r.usable(src_col, tgt_col)
    targets = r.texts(tgt_col, rows)
    enc = _encode(
        tokenizer,
        _cut(r.texts(src_col, rows), config.seq_len),
        truncation=True,
        max_length=config.seq_len,
        verbose=False,
    )
    tgt = _encode(
        tokenizer, _cut(targets, config.seq_len), target=True, truncation=True, max_length=config.seq_len, verbose=False
    )
    examples = []
    for ids, target_ids, target in zip(enc["input_ids"], tgt["input_ids"], targets):
        if ids and target_ids:
            examples.append({"input_ids": list(ids), "attention_mask": [1] * len(ids), "labels": list(target_ids)})
            references.append(target)
    if len(examples) < len(rows):
        dropped = len(rows) - len(examples)
        r.notes.append(f"skipped {dropped} example{'s' if dropped != 1 else ''} with an empty source or target")
    return examples


def _texts_per_row(
    r: Rows, task: str, model: nn.Module, tokenizer: Any, config: DataConfig, is_txt: bool, columns: dict[str, str]
) -> Examples:
    """One example per row (or non-blank line): masked LM, or causal LM from a table."""
    if is_txt:
        columns["text"] = "text"
        texts = r.lines(config.seq_len * CHARS_PER_TOKEN)
    else:
        text_col = pick(r.names, config.text_col, TEXT_COLUMNS, "text", "--text-col", r.source)
        assert text_col is not None
        columns["text"] = text_col
        rows = r.usable(text_col)
        texts = _cut(r.texts(text_col, rows), config.seq_len)
    enc = _encode(
        tokenizer,
        texts,
        truncation=True,
        max_length=config.seq_len,
        verbose=False,
        return_special_tokens_mask=task == "masked-lm",
    )
    examples = []
    if task == "masked-lm":
        vocab = min(len(tokenizer), model.get_input_embeddings().num_embeddings)
        for ids, special in zip(enc["input_ids"], enc["special_tokens_mask"]):
            if all(special):  # nothing to mask (e.g. an empty text)
                examples.append({"input_ids": [], "attention_mask": [], "labels": []})
                continue
            inputs, labels = _mask_tokens(
                list(ids), list(special), tokenizer.mask_token_id, vocab, config.mlm_probability, r.g
            )
            examples.append({"input_ids": inputs, "attention_mask": [1] * len(ids), "labels": labels})
    else:
        for ids in enc["input_ids"]:
            examples.append({"input_ids": list(ids), "attention_mask": [1] * len(ids), "labels": list(ids)})
    return examples


def _check_model(model: nn.Module, tokenizer: Any, task: str, config: DataConfig) -> None:
    mconf = model.config
    limit = max_positions(mconf)
    if limit is not None and config.seq_len > limit:
        raise HeadcutError(f"--seq-len {config.seq_len} is longer than the model's {limit} positions")
    if task == "classification":
        problem = getattr(mconf, "problem_type", None)
        if problem in ("regression", "multi_label_classification") or mconf.num_labels < 2:
            raise HeadcutError(
                f"the model's head is {problem or 'regression'}: only single-label classification is supported"
            )
        if getattr(mconf, "pad_token_id", None) is None and config.batch_size > 1 and _decoder_only(model):
            raise HeadcutError(
                "the model's config has no pad_token_id, so its classifier cannot find the last token of padded "
                "examples; set pad_token_id in its config.json or pass --batch-size 1"
            )
    if task == "masked-lm" and getattr(tokenizer, "mask_token_id", None) is None:
        raise HeadcutError("the tokenizer has no mask token, so it cannot feed a masked-LM head")


def open_rows(config: Any, dataset: Any = None) -> contextlib.AbstractContextManager[tuple[Any, str, bool]]:
    """The rows of ``config``'s file or ``datasets`` name, or of ``dataset`` held in memory: a context giving
    (rows, source name, whether it is a ``.txt`` file)."""
    if dataset is None:
        return open_data(config)
    return contextlib.nullcontext((*in_memory(dataset, config.split), False))


def load_calibration(
    model: nn.Module,
    tokenizer: Any,
    config: DataConfig,
    dataset: Any = None,
    unlabelled: bool = False,
    *,
    checked: bool = False,
) -> Calibration:
    """Read ``config.path`` and turn it into batches for ``model``'s task (see the module's doc).

    ``dataset``: rows given in memory instead of ``config.path`` (which is then ignored): a
    ``datasets.Dataset``, a ``datasets.DatasetDict`` (``config.split`` is used) or a list of dict rows.
    Columns, labels, shuffling and batches are as for a table file. ``unlabelled``: inputs only, for
    distillation (a classifier's rows need only their text column, any label column is not read, and the
    batches carry no ``labels``); refused for a seq2seq model, whose distillation needs target tokens.
    ``checked``: ``config`` was validated by the caller (a job checks its request once, at its edge).
    """
    if not checked:
        config.validate(need_path=dataset is None)
    task = detect_task(model)
    if unlabelled and task == "seq2seq":
        raise HeadcutError(
            "unlabelled inputs cannot be distilled into a seq2seq model: the teacher's outputs are "
            "read at the target tokens, which these rows do not have"
        )
    _check_model(model, tokenizer, task, config)
    notes: list[str] = []
    columns: dict[str, str] = {}
    references: list[str] = []
    g = torch.Generator().manual_seed(config.seed)
    with open_rows(config, dataset) as (ds, source, is_txt):
        r = Rows(ds, source, config, g, notes)
        layout = "rows"
        if task == "causal-lm" and is_txt:
            columns["text"] = "text"
            examples = lm_blocks(r, tokenizer, config.seq_len)
            layout = "blocks"
        elif is_txt and task in ("classification", "seq2seq"):
            needs = "labels" if task == "classification" else "source and target columns"
            raise HeadcutError(
                f"{source}: a .txt file has texts only; a {task} model needs {needs} (use csv, tsv, json, jsonl or "
                "parquet)"
            )
        elif task == "classification":
            examples = _classification(r, model, tokenizer, config, columns, unlabelled)
        elif task == "seq2seq":
            examples = _seq2seq(r, tokenizer, config, columns, references)
        else:
            examples = _texts_per_row(r, task, model, tokenizer, config, is_txt, columns)
    candidates = len(examples)
    examples = [e for e in examples if e["input_ids"]]
    dropped = candidates - len(examples)
    if dropped > 0:
        notes.append(f"skipped {dropped} example{'s' if dropped != 1 else ''} without tokens to score")
    if not examples:
        raise HeadcutError(f"{source} gave no usable examples (every text is empty after tokenization)")
    _check_vocab(model, examples)

    pad_id = _pad_id(model, tokenizer)
    size = config.batch_size
    batches = [_collate(examples[i : i + size], pad_id) for i in range(0, len(examples), size)]
    tokens, scored = _counts(task, batches)
    id2label = {int(k): str(v) for k, v in (getattr(model.config, "id2label", None) or {}).items()}
    return Calibration(
        task=task,
        batches=batches,
        examples=len(examples),
        source=source,
        columns=columns,
        seq_len=config.seq_len,
        batch_size=size,
        seed=config.seed,
        label_names=[id2label.get(i, str(i)) for i in range(int(model.config.num_labels))]
        if task == "classification"
        else None,
        references=references if task == "seq2seq" else None,
        tokens=tokens,
        scored_tokens=scored,
        notes=notes,
        layout=layout,
        tokenizer=tokenizer,
        items=examples,
        pad_id=pad_id,
    )


def _counts(task: str, batches: Sequence[dict[str, torch.Tensor]]) -> tuple[int, int]:
    """Real input tokens and scored label positions of ``batches`` (see :class:`Calibration`)."""
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    if task == "classification":
        scored = sum(int(b["input_ids"].shape[0]) for b in batches)
    elif task == "causal-lm":
        scored = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    else:
        scored = sum(int((b["labels"] != -100).sum()) for b in batches)
    return tokens, scored


def _decoder_only(model: nn.Module) -> bool:
    """A classifier on a decoder-only model (finds the last token by its pad id): the model type has a
    causal-LM class but no masked-LM class and is not encoder-decoder."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return False
    from transformers.models.auto import modeling_auto

    model_type = getattr(config, "model_type", None)
    return (
        model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )


def _check_vocab(model: nn.Module, examples: Sequence[dict[str, Any]]) -> None:
    try:
        rows = model.get_input_embeddings().num_embeddings
    except (AttributeError, NotImplementedError):
        return
    top = max((max(e["input_ids"]) for e in examples if e["input_ids"]), default=0)
    if top >= rows:
        raise HeadcutError(
            f"the tokenizer gives token id {top} but the model has {rows} token embeddings: the tokenizer does "
            "not belong to this model"
        )
