"""Calibration and evaluation data: read a data file (or a ``datasets`` name), tokenize it for the
model's task head and cut it into batches ready for ``model(**batch)``.

* **Sources.** Local files ``.csv``, ``.tsv``, ``.json`` (records, or one field holding them),
  ``.jsonl``, ``.parquet`` and ``.txt`` (one example per line), also compressed ``.gz``/``.bz2``/
  ``.xz``/``.zst`` (not parquet), read with ``datasets`` with its cache in a temporary folder (nothing
  is written beside the data). Any other name that does not look like a local path is a ``datasets``
  name ``NAME[:CONFIG]`` loaded with ``split`` (needs the Hugging Face Hub or its cache).
* **Tasks** (:func:`detect_task`, from the model's head): ``classification``, ``causal-lm``,
  ``seq2seq`` and ``masked-lm``.
* **Columns**: the explicit ones first, else the first of the usual names that the data has
  (:data:`TEXT_COLUMNS` ...).
* **Examples**: rows are shuffled with ``seed`` (``torch.randperm``), then the first ``max_examples``
  are kept, so a smaller ``max_examples`` gives a prefix of a larger one. A ``.txt`` file for a causal
  LM is one text cut into blocks of ``seq_len`` tokens (the tokenizer's own special tokens, e.g. a BOS,
  included; the remainder dropped); the blocks are then shuffled like rows. Everything else is
  truncated to ``seq_len`` tokens.
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
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import HeadcutError
from .io import looks_like_path

#: the tasks :func:`detect_task` returns
TASK_NAMES = ("classification", "causal-lm", "seq2seq", "masked-lm")

#: column names tried, in order, when no column is given
TEXT_COLUMNS = ("text", "sentence", "sentence1", "premise", "question", "review", "content", "document")
PAIR_COLUMNS = ("sentence2", "hypothesis", "text_pair")
LABEL_COLUMNS = ("label", "labels", "category", "class", "target")
SOURCE_COLUMNS = ("source", "src", "input", "document", "article")
TARGET_COLUMNS = ("target", "tgt", "output", "summary", "highlights", "translation")

#: file suffix -> (``datasets`` builder, its options)
FILE_FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
    ".txt": ("text", {}),
}
#: compression suffixes ``datasets`` decompresses on the fly (text formats only)
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")

#: names of tokenizer files; a local checkpoint folder needs one of them
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt", "spiece.model",
    "tokenizer.model", "sentencepiece.bpe.model", "source.spm", "target.spm", "spm.model",
)


@dataclass
class DataConfig:
    """Where the data is and how to batch it (see the module's doc).

    ``path``: a data file, or a ``datasets`` name ``NAME[:CONFIG]`` (``config_name``, when given,
    overrides the ``:CONFIG`` part); ``split`` is used for ``datasets`` names only (a local file is a
    single split). Column names ``None``: detected from the usual names.
    """

    path: str
    split: str = "train"
    config_name: str | None = None
    text_col: str | None = None
    text_pair_col: str | None = None
    label_col: str | None = None
    source_col: str | None = None
    target_col: str | None = None
    max_examples: int | None = None
    seq_len: int = 128
    batch_size: int = 16
    seed: int = 0
    mlm_probability: float = 0.15

    def validate(self) -> None:
        """One-line errors for values that cannot work."""
        if not str(self.path).strip():
            raise HeadcutError("no data given: pass a data file or a datasets name")
        if self.seq_len < 2:
            raise HeadcutError(f"--seq-len must be at least 2 (got {self.seq_len})")
        if self.batch_size < 1:
            raise HeadcutError(f"--batch-size must be at least 1 (got {self.batch_size})")
        if self.max_examples is not None and self.max_examples < 1:
            raise HeadcutError(f"--max-examples must be at least 1 (got {self.max_examples})")
        if not 0.0 < self.mlm_probability <= 1.0:
            raise HeadcutError(f"mlm_probability must be in (0, 1] (got {self.mlm_probability})")


@dataclass
class Calibration:
    """Tokenized, batched data for one model.

    ``batches``: dicts for ``model(**batch)`` (see the module's doc); ``examples``: examples in them
    (blocks for a causal LM read from ``.txt``); ``source``: the file or ``datasets`` name read;
    ``columns``: role (``text``, ``text_pair``, ``label``, ``source``, ``target``) -> column used;
    ``label_names``: the model's class names by id (classification); ``references``: the target texts
    in batch order (seq2seq); ``tokens``: real (non-padding) input tokens; ``scored_tokens``: label
    positions that count in the loss (tokens whose label is not -100; classification: examples);
    ``tokenizer``: the tokenizer used (to decode generated text); ``notes``: what was skipped or
    assumed.
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
    tokenizer: Any = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task, "source": self.source, "examples": self.examples, "batches": len(self.batches),
            "columns": dict(self.columns), "seq_len": self.seq_len, "batch_size": self.batch_size,
            "seed": self.seed, "tokens": self.tokens, "scored_tokens": self.scored_tokens,
            "label_names": self.label_names, "notes": list(self.notes),
        }


# --------------------------------------------------------------------------------------------- task


def _mapping_names(attr: str) -> set[str]:
    from transformers.models.auto import modeling_auto

    names: set[str] = set()
    for value in getattr(modeling_auto, attr, {}).values():
        names.update([value] if isinstance(value, str) else value)
    return names


def _class_names(model: nn.Module) -> list[str]:
    # headcut's loader subclasses the transformers class: look through the whole hierarchy
    return [cls.__name__ for cls in type(model).__mro__]


SUPPORTED_HEADS = "sequence classification, causal LM, seq2seq LM or masked LM"


def detect_task(model: nn.Module) -> str:
    """The data task of ``model``'s head: one of :data:`TASK_NAMES` (from transformers' Auto mappings)."""
    classes = _class_names(model)
    name = type(model).__name__
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        raise HeadcutError(
            f"{name} is an image model: headcut reads text data only (image data is not supported); "
            f"data commands need a {SUPPORTED_HEADS} head"
        )
    heads = [(_mapping_names(attr), task) for attr, task in (
        # seq2seq first: transformers also lists encoder-decoder generators as masked LMs
        ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "seq2seq"),
        ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "causal-lm"),
        ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "masked-lm"),
        ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "classification"),
    )]
    for cls_name in classes:  # the most specific class that transformers maps to a head
        for names, task in heads:
            if cls_name in names:
                return task
    raise HeadcutError(
        f"{name} has no task head that headcut can feed data to; data commands need a {SUPPORTED_HEADS} head "
        "(load it with --task sequence-classification, causal-lm, seq2seq-lm or masked-lm)"
    )


# --------------------------------------------------------------------------------------- tokenizer


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
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(p) if p.is_dir() else str(path),
                                                               trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises OSError, ValueError, TypeError, ImportError ...
        raise HeadcutError(f"cannot load the tokenizer of {path}: {_first_line(exc)}") from None
    if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
        raise HeadcutError(f"the tokenizer of {path} has an empty vocabulary; its tokenizer files are missing")
    return tokenizer


# ------------------------------------------------------------------------------------------ reading


def _first_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def _root_message(exc: BaseException) -> str:
    """The most specific message of an exception chain (datasets wraps the parser's error)."""
    messages = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        messages.append(_first_line(cur))
        cur = cur.__cause__ or cur.__context__
    generic = ("An error occurred while generating the dataset",)
    specific = [m for m in messages if m not in generic]
    return specific[0] if specific else messages[0]


def _file_format(path: Path) -> tuple[str, dict[str, Any], str]:
    """(builder, options, suffix) of a data file, from its name."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes = suffixes[:-1]
        compressed = True
    else:
        compressed = False
    suffix = suffixes[-1] if suffixes else ""
    if suffix not in FILE_FORMATS or (compressed and suffix == ".parquet"):
        raise HeadcutError(
            f"{path} is not a supported data file; use .csv, .tsv, .json, .jsonl, .parquet or .txt "
            f"(text formats may be compressed: {', '.join(COMPRESSIONS)})"
        )
    builder, options = FILE_FORMATS[suffix]
    return builder, dict(options), suffix


def looks_local(path: str) -> bool:
    """Whether ``path`` names a local file (existing, path-like, or with a data file suffix) rather
    than a ``datasets`` name."""
    p = Path(path).expanduser()
    if p.exists() or looks_like_path(path):
        return True
    suffixes = [s.lower() for s in Path(path.partition(":")[0]).suffixes]
    return any(s in FILE_FORMATS or s in COMPRESSIONS for s in suffixes)


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[Any]:
    import datasets
    from datasets.utils import logging as ds_logging
    from huggingface_hub.utils import logging as hub_logging

    bars_were_off = datasets.are_progress_bars_disabled()
    verbosity, hub_verbosity = ds_logging.get_verbosity(), hub_logging.get_verbosity()
    datasets.disable_progress_bars()
    ds_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()  # no retry messages: a failure becomes one HeadcutError
    try:
        yield datasets
    finally:
        ds_logging.set_verbosity(verbosity)
        hub_logging.set_verbosity(hub_verbosity)
        if not bars_were_off:
            datasets.enable_progress_bars()


@contextlib.contextmanager
def open_data(config: DataConfig) -> Iterator[tuple[Any, str, bool]]:
    """Yield ``(dataset, source, is_txt)`` for ``config.path``: a ``datasets.Dataset`` of a local file
    (cached in a temporary folder, removed on exit) or of a ``datasets`` name and split."""
    path = str(config.path)
    if looks_local(path):
        p = Path(path).expanduser()
        if not p.exists():
            raise HeadcutError(f"data file not found: {path}")
        if p.is_dir():
            raise HeadcutError(f"{path} is a folder; pass a data file (.csv, .tsv, .json, .jsonl, .parquet, .txt)")
        builder, options, suffix = _file_format(p)
        try:
            size = p.stat().st_size
            with p.open("rb"):
                pass
        except OSError as exc:
            raise HeadcutError(f"cannot read {path}: {exc.strerror or _first_line(exc)}") from None
        if size == 0:
            raise HeadcutError(f"{path} is empty")
        with tempfile.TemporaryDirectory(prefix="headcut-data-") as cache, _quiet_datasets() as datasets:
            try:
                ds = datasets.load_dataset(builder, data_files=str(p), split="train", cache_dir=cache, **options)
                if suffix == ".json" and len(ds.column_names) == 1 and _holds_records(ds[ds.column_names[0]][:1]):
                    # {"data": [{...}, ...]}: the records are in one field
                    ds = datasets.load_dataset(builder, data_files=str(p), split="train", cache_dir=cache,
                                               field=ds.column_names[0])
            except Exception as exc:  # pandas, pyarrow and json parsers raise many kinds
                message = _root_message(exc)
                if "corresponds to no data" in message or "at least one example" in message:
                    raise HeadcutError(f"{path} has no examples") from None
                raise HeadcutError(f"cannot read {path}: {message}") from None
            if ds.num_rows == 0:
                raise HeadcutError(f"{path} has no examples")
            yield ds, str(p), builder == "text"
        return
    name, _, cfg = path.partition(":")
    cfg_name = config.config_name or cfg or None
    with _quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(name, cfg_name, split=config.split)
        except Exception as exc:  # network, missing dataset/config/split: all one-line errors
            shown = name + (f":{cfg_name}" if cfg_name else "")
            hint = "" if ":" in path else f" (a local file needs an existing path, e.g. ./{path})"
            raise HeadcutError(
                f"cannot load the datasets dataset {shown!r} (split {config.split!r}): {_root_message(exc)}{hint}"
            ) from None
    if ds.num_rows == 0:
        raise HeadcutError(f"{path} split {config.split!r} has no examples")
    yield ds, f"{name}{':' + cfg_name if cfg_name else ''}[{config.split}]", False


def _holds_records(values: Sequence[Any]) -> bool:
    return bool(values) and isinstance(values[0], list) and bool(values[0]) and isinstance(values[0][0], dict)


# ------------------------------------------------------------------------------------------ columns


def _pick(columns: Sequence[str], explicit: str | None, candidates: Sequence[str], role: str, flag: str,
          source: str, required: bool = True, taken: str | None = None) -> str | None:
    """The explicit column (which must exist), else the first candidate the data has (other than
    ``taken``); errors list every column of the data."""
    if explicit is not None:
        if explicit not in columns:
            raise HeadcutError(
                f"{source} has no column {explicit!r} ({flag}); its columns: {', '.join(columns)}"
            )
        return explicit
    for name in candidates:
        if name in columns and name != taken:
            return name
    if not required:
        return None
    raise HeadcutError(
        f"{source} has no {role} column (tried {', '.join(candidates)}; pass {flag}); its columns: {', '.join(columns)}"
    )


def _texts(values: Sequence[Any], rows: Sequence[int], column: str, source: str) -> list[str]:
    out = []
    for value, row in zip(values, rows):
        if value is None:
            raise HeadcutError(f"{source}: row {row + 1} has no value in column {column!r}")
        if not isinstance(value, str):
            raise HeadcutError(
                f"{source}: column {column!r} holds {type(value).__name__} values, not text (row {row + 1})"
            )
        out.append(value)
    return out


def _label_ids(values: Sequence[Any], rows: Sequence[int], column: str, source: str, config: Any) -> list[int]:
    n = int(config.num_labels)
    id2label = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    names = [id2label.get(i, str(i)) for i in range(n)]
    label2id = {str(k): int(v) for k, v in (getattr(config, "label2id", None) or {}).items()}
    lower: dict[str, int | None] = {}
    for k, v in label2id.items():
        lower[k.lower()] = v if lower.get(k.lower(), v) == v else None  # None: ambiguous ignoring case
    out: list[int] = []
    unknown: list[str] = []
    for value, row in zip(values, rows):
        if value is None:
            raise HeadcutError(f"{source}: row {row + 1} has no label in column {column!r}")
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            if value in label2id:
                out.append(label2id[value])
                continue
            if lower.get(value.lower()) is not None:
                out.append(lower[value.lower()])  # type: ignore[arg-type]
                continue
            if value.strip().lstrip("-").isdigit():
                value = int(value)
            else:
                if value not in unknown:
                    unknown.append(value)
                out.append(-1)
                continue
        if not isinstance(value, int):
            raise HeadcutError(f"{source}: column {column!r} holds {type(value).__name__} labels (row {row + 1})")
        if not 0 <= value < n:
            raise HeadcutError(
                f"{source}: label {value} (row {row + 1}) is out of range: the model has {n} labels "
                f"(0..{n - 1}: {', '.join(names)})"
            )
        out.append(value)
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise HeadcutError(
            f"{source}: label{'s' if len(unknown) > 1 else ''} {shown} in column {column!r} "
            f"{'are' if len(unknown) > 1 else 'is'} not among the model's labels ({', '.join(names)}); "
            "give the model a matching label2id in config.json, or use integer labels"
        )
    return out


# ---------------------------------------------------------------------------------------- batching


def _max_positions(config: Any) -> int | None:
    for attr in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _pad_id(model: nn.Module, tokenizer: Any) -> int:
    # the model's own pad id first: some models find padding (or positions) by comparing ids with it
    for value in (getattr(model.config, "pad_token_id", None), getattr(tokenizer, "pad_token_id", None),
                  getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            return value
    return 0


def _accepts(model: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False


def _affixes(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text (e.g. BOS; CLS ... SEP)."""
    probe = "hello world"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return list(full[:start]), list(full[start + len(plain):])
    return [], []


def _pad(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
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


def _mask_tokens(ids: list[int], special: list[int], mask_id: int, vocab: int, p: float,
                 g: torch.Generator) -> tuple[list[int], list[int]]:
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


class _Rows:
    """Row selection of one dataset: shuffled with the seed, missing values skipped, at most
    ``max_examples``."""

    def __init__(self, ds: Any, source: str, config: DataConfig, g: torch.Generator, notes: list[str]) -> None:
        self.ds, self.source, self.max_examples, self.g, self.notes = ds, source, config.max_examples, g, notes
        self.names = list(ds.column_names)

    def select(self, n: int) -> list[int]:
        """A seeded permutation of ``range(n)``, cut to ``max_examples``."""
        order = torch.randperm(n, generator=self.g).tolist()
        return order[:self.max_examples] if self.max_examples is not None else order

    def usable(self, *cols: str | None) -> list[int]:
        """Selected rows among those with a value in every used column (the others are skipped)."""
        used = [c for c in cols if c is not None]
        present = [True] * self.ds.num_rows
        for col in used:
            present = [ok and v is not None for ok, v in zip(present, list(self.ds[col]))]
        valid = [i for i, ok in enumerate(present) if ok]
        missing = self.ds.num_rows - len(valid)
        shown = ", ".join(repr(c) for c in used)
        if not valid:
            raise HeadcutError(f"{self.source} has no usable examples: every row misses a value in {shown}")
        if missing:
            self.notes.append(f"skipped {missing} row{'s' if missing != 1 else ''} with a missing value in {shown}")
        return [valid[i] for i in self.select(len(valid))]

    def column(self, col: str, rows: list[int]) -> list[Any]:
        return list(self.ds.select(rows)[col]) if rows else []

    def texts(self, col: str, rows: list[int]) -> list[str]:
        return _texts(self.column(col, rows), rows, col, self.source)

    def lines(self) -> list[str]:
        """The non-blank lines of a text file, selected."""
        values = list(self.ds["text"])
        keep = [i for i, v in enumerate(values) if v is not None and v.strip()]
        if not keep:
            raise HeadcutError(f"{self.source} has no usable examples: every line is blank")
        return [values[keep[i]] for i in self.select(len(keep))]


Examples = list[dict[str, Any]]


def _lm_blocks(r: _Rows, tokenizer: Any, seq_len: int) -> Examples:
    """A text file for a causal LM: one text, cut into blocks of ``seq_len`` tokens, selected."""
    text = "\n".join(v for v in list(r.ds["text"]) if v is not None)
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    prefix, suffix = _affixes(tokenizer)
    body = seq_len - len(prefix) - len(suffix)
    if body < 1:
        raise HeadcutError(f"--seq-len {seq_len} leaves no room for text between the tokenizer's special tokens")
    n_blocks = len(ids) // body
    if n_blocks == 0:
        raise HeadcutError(
            f"{r.source} is shorter than one block of {seq_len} tokens ({len(ids)} tokens of text); "
            "lower --seq-len or use a longer text"
        )
    if len(ids) % body:
        r.notes.append(f"dropped the last {len(ids) % body} tokens (less than one block)")
    examples = []
    for b in r.select(n_blocks):
        block = prefix + list(ids[b * body:(b + 1) * body]) + suffix
        examples.append({"input_ids": block, "attention_mask": [1] * len(block), "labels": list(block)})
    return examples


def _classification(r: _Rows, model: nn.Module, tokenizer: Any, config: DataConfig,
                    columns: dict[str, str]) -> Examples:
    names, source = r.names, r.source
    text_col = _pick(names, config.text_col, TEXT_COLUMNS, "text", "--text-col", source)
    pair_col = _pick(names, config.text_pair_col, PAIR_COLUMNS, "text pair", "--text-pair-col", source,
                     required=False, taken=text_col)
    label_col = _pick(names, config.label_col, LABEL_COLUMNS, "label", "--label-col", source)
    assert text_col is not None and label_col is not None
    columns.update({"text": text_col, "label": label_col})
    if pair_col is not None:
        columns["text_pair"] = pair_col
    rows = r.usable(text_col, pair_col, label_col)
    texts = r.texts(text_col, rows)
    labels = _label_ids(r.column(label_col, rows), rows, label_col, source, model.config)
    options: dict[str, Any] = {"truncation": True, "max_length": config.seq_len, "verbose": False}
    if pair_col is not None:
        enc = tokenizer(texts, r.texts(pair_col, rows), **options)
    else:
        enc = tokenizer(texts, **options)
    types = "token_type_ids" in enc and _accepts(model, "token_type_ids")
    examples = []
    for i, ids in enumerate(enc["input_ids"]):
        ex: dict[str, Any] = {"input_ids": list(ids), "attention_mask": [1] * len(ids)}
        if types:
            ex["token_type_ids"] = list(enc["token_type_ids"][i])
        ex["labels"] = labels[i]
        examples.append(ex)
    return examples


def _seq2seq(r: _Rows, tokenizer: Any, config: DataConfig, columns: dict[str, str],
             references: list[str]) -> Examples:
    names, source = r.names, r.source
    src_col = _pick(names, config.source_col or config.text_col, SOURCE_COLUMNS + TEXT_COLUMNS, "source",
                    "--source-col", source)
    tgt_col = _pick(names, config.target_col, TARGET_COLUMNS, "target", "--target-col", source, taken=src_col)
    assert src_col is not None and tgt_col is not None
    columns.update({"source": src_col, "target": tgt_col})
    rows = r.usable(src_col, tgt_col)
    targets = r.texts(tgt_col, rows)
    enc = tokenizer(r.texts(src_col, rows), truncation=True, max_length=config.seq_len, verbose=False)
    tgt = tokenizer(text_target=targets, truncation=True, max_length=config.seq_len, verbose=False)
    examples = []
    for ids, target_ids, target in zip(enc["input_ids"], tgt["input_ids"], targets):
        if ids and target_ids:
            examples.append({"input_ids": list(ids), "attention_mask": [1] * len(ids), "labels": list(target_ids)})
            references.append(target)
    if len(examples) < len(rows):
        dropped = len(rows) - len(examples)
        r.notes.append(f"skipped {dropped} example{'s' if dropped != 1 else ''} with an empty source or target")
    return examples


def _texts_per_row(r: _Rows, task: str, model: nn.Module, tokenizer: Any, config: DataConfig, is_txt: bool,
                   columns: dict[str, str]) -> Examples:
    """One example per row (or non-blank line): masked LM, or causal LM from a table."""
    if is_txt:
        columns["text"] = "text"
        texts = r.lines()
    else:
        text_col = _pick(r.names, config.text_col, TEXT_COLUMNS, "text", "--text-col", r.source)
        assert text_col is not None
        columns["text"] = text_col
        rows = r.usable(text_col)
        texts = r.texts(text_col, rows)
    enc = tokenizer(texts, truncation=True, max_length=config.seq_len, verbose=False,
                    return_special_tokens_mask=task == "masked-lm")
    examples = []
    if task == "masked-lm":
        vocab = min(len(tokenizer), model.get_input_embeddings().num_embeddings)
        for ids, special in zip(enc["input_ids"], enc["special_tokens_mask"]):
            if all(special):  # nothing to mask (e.g. an empty text)
                examples.append({"input_ids": [], "attention_mask": [], "labels": []})
                continue
            inputs, labels = _mask_tokens(list(ids), list(special), tokenizer.mask_token_id, vocab,
                                          config.mlm_probability, r.g)
            examples.append({"input_ids": inputs, "attention_mask": [1] * len(ids), "labels": labels})
    else:
        for ids in enc["input_ids"]:
            examples.append({"input_ids": list(ids), "attention_mask": [1] * len(ids), "labels": list(ids)})
    return examples


def _check_model(model: nn.Module, tokenizer: Any, task: str, config: DataConfig) -> None:
    mconf = model.config
    limit = _max_positions(mconf)
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


def load_calibration(model: nn.Module, tokenizer: Any, config: DataConfig) -> Calibration:
    """Read ``config.path`` and turn it into batches for ``model``'s task (see the module's doc)."""
    config.validate()
    task = detect_task(model)
    _check_model(model, tokenizer, task, config)
    notes: list[str] = []
    columns: dict[str, str] = {}
    references: list[str] = []
    g = torch.Generator().manual_seed(config.seed)
    with open_data(config) as (ds, source, is_txt):
        r = _Rows(ds, source, config, g, notes)
        if task == "causal-lm" and is_txt:
            columns["text"] = "text"
            examples = _lm_blocks(r, tokenizer, config.seq_len)
        elif is_txt and task in ("classification", "seq2seq"):
            needs = "labels" if task == "classification" else "source and target columns"
            raise HeadcutError(
                f"{source}: a .txt file has texts only; a {task} model needs {needs} (use csv, tsv, json, jsonl or "
                "parquet)"
            )
        elif task == "classification":
            examples = _classification(r, model, tokenizer, config, columns)
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
    batches = [_collate(examples[i:i + size], pad_id) for i in range(0, len(examples), size)]
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    if task == "classification":
        scored = len(examples)
    elif task == "causal-lm":
        scored = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    else:
        scored = sum(int((b["labels"] != -100).sum()) for b in batches)
    id2label = {int(k): str(v) for k, v in (getattr(model.config, "id2label", None) or {}).items()}
    return Calibration(
        task=task, batches=batches, examples=len(examples), source=source, columns=columns, seq_len=config.seq_len,
        batch_size=size, seed=config.seed,
        label_names=[id2label.get(i, str(i)) for i in range(int(model.config.num_labels))]
        if task == "classification" else None,
        references=references if task == "seq2seq" else None,
        tokens=tokens, scored_tokens=scored, notes=notes, tokenizer=tokenizer,
    )


def _decoder_only(model: nn.Module) -> bool:
    """A classifier on a decoder-only model (finds the last token by its pad id): the model type has a
    causal-LM class but no masked-LM class and is not encoder-decoder."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return False
    from transformers.models.auto import modeling_auto

    model_type = getattr(config, "model_type", None)
    return (model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and model_type not in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)


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
