"""What to read and how to batch it: :class:`DataConfig` and the plain constants of the data package.

Standard library only (plus :mod:`headcut.errors` and :mod:`headcut.sources`): the CLI builds its options and
help from this module without importing torch, transformers or datasets.

* **Tasks** (:func:`headcut.data.detect_task`, from the model's head): :data:`TASK_NAMES`.
* **Columns**: the explicit ones first, else the first of the usual names that the data has
  (:data:`TEXT_COLUMNS` ...).
* **Files**: :data:`FILE_FORMATS` by suffix, optionally compressed (:data:`COMPRESSIONS`); a path whose name
  does not tell its format (a pipe, ``/dev/stdin``, a file without a known suffix) takes
  ``DataConfig.data_format`` (:func:`parse_format`).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Any

from ..errors import HeadcutError, shown
from ..options import check_fields, option
from ..sources import COMPRESSIONS

__all__ = [
    "COMPRESSIONS",
    "FILE_FORMATS",
    "LABEL_COLUMNS",
    "PAIR_COLUMNS",
    "SOURCE_COLUMNS",
    "SUPPORTED_HEADS",
    "TARGET_COLUMNS",
    "TASK_NAMES",
    "TEXT_COLUMNS",
    "TOKENIZER_FILES",
    "DataConfig",
    "parse_format",
]

#: the tasks :func:`headcut.data.detect_task` returns
TASK_NAMES = ("classification", "causal-lm", "seq2seq", "masked-lm")

#: the task heads data commands can feed (for error messages)
SUPPORTED_HEADS = "sequence classification, causal LM, seq2seq LM or masked LM"

#: column names tried, in order, when no column is given
TEXT_COLUMNS = ("text", "sentence", "sentence1", "premise", "question", "review", "content", "document")
PAIR_COLUMNS = ("sentence2", "hypothesis", "text_pair")
LABEL_COLUMNS = ("label", "labels", "category", "class", "target")
SOURCE_COLUMNS = ("source", "src", "input", "document", "article")
TARGET_COLUMNS = ("target", "tgt", "output", "summary", "highlights", "translation")

#: file suffix -> (``datasets`` builder, its options); its keys are :data:`headcut.sources.DATA_SUFFIXES`
FILE_FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
    ".txt": ("text", {}),
}

#: with ``max_examples``, a ``.txt`` file is read only as far as it needs, but at least this many lines
#: (one example per line) or tokens (causal-LM blocks), so that a smaller ``max_examples`` still selects
#: a prefix of a larger one's examples (see :class:`headcut.data.columns.Rows`)
MIN_LINES_READ = 100_000
MIN_TOKENS_READ = 1 << 18
#: a text is cut to ``seq_len`` times this many characters before tokenizing (the tokenizer keeps
#: ``seq_len`` tokens of it anyway): a huge line or cell never reaches the tokenizer whole
CHARS_PER_TOKEN = 32

#: the ``--help`` section of the data options
DATA_PANEL = "Data options"

#: what ``--data-format`` takes (for messages)
FORMAT_NAMES = "csv, tsv, json, jsonl, parquet or txt"


def check_encoding(name: Any) -> None:
    """Refuse (one line) an encoding name that cannot decode text: not a string, unknown to Python, with a NUL
    or a lone surrogate in it (``codecs.lookup`` raises ValueError or UnicodeEncodeError for those), a codec
    that is not a text encoding (rot13, hex, base64) or one that decodes nothing (``undefined``)."""
    if isinstance(name, str):
        try:
            codec = codecs.lookup(name)
            # not rot13, hex ...; an incremental decoder (how the text is read) that decodes at all
            known = getattr(codec, "_is_text_encoding", True)
            if known:
                codecs.getincrementaldecoder(name)("strict").decode(b"", final=True)
        except (LookupError, ValueError, TypeError):  # ValueError: a NUL, a surrogate, "undefined" (UnicodeError)
            known = False
    else:
        known = False
    if not known:
        raise HeadcutError(
            f"--encoding {shown(name)} is not a text encoding Python knows; use e.g. utf-8, latin-1, cp1252 or utf-16"
        )


def parse_format(text: str) -> tuple[str, str | None]:
    """``(suffix, compression)`` of a ``--data-format`` value such as ``csv``, ``.jsonl`` or ``txt.gz``."""
    parts = [p for p in str(text).strip().lower().split(".") if p]
    compression = None
    if len(parts) == 2 and "." + parts[1] in COMPRESSIONS:
        compression = "." + parts.pop()
    suffix = "." + parts[0] if len(parts) == 1 else ""
    if suffix not in FILE_FORMATS or (compression and suffix == ".parquet"):
        raise HeadcutError(
            f"--data-format {text!r} is not a data format; use {FORMAT_NAMES}, optionally compressed "
            f"({', '.join(c.lstrip('.') for c in COMPRESSIONS)}; not parquet), e.g. --data-format csv.gz"
        )
    return suffix, compression


#: names of tokenizer files; a local checkpoint folder needs one of them
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "tokenizer.model",
    "sentencepiece.bpe.model",
    "source.spm",
    "target.spm",
    "spm.model",
)


#: the fields :meth:`DataConfig.validate` checks by their declarations (the encoding: by
#: :func:`check_encoding`, whose message says more)
CHECKED = (
    "split",
    "text_col",
    "text_pair_col",
    "label_col",
    "source_col",
    "target_col",
    "max_examples",
    "seq_len",
    "batch_size",
    "mlm_probability",
    "data_format",
)


@dataclass
class DataConfig:
    """Where the data is and how to batch it (see :mod:`headcut.data`).

    ``path``: a data file, or a ``datasets`` name ``NAME[:CONFIG]`` (``config_name``, when given,
    overrides the ``:CONFIG`` part); ``split`` is used for ``datasets`` names only (a local file is a
    single split), and to pick the split of an in-memory ``DatasetDict``. Column names ``None``: detected
    from the usual names. ``data_format``: the format of a path whose name does not tell it (a pipe,
    ``/dev/stdin``, a file without a known suffix), e.g. ``"csv"`` or ``"txt.gz"``; a name with a known
    suffix is read by its suffix. ``encoding``: of the text formats (csv, tsv, json, jsonl, txt).
    """

    path: str
    split: str = option(
        "train", metavar="SPLIT", panel=DATA_PANEL, help="Split of a datasets name (a local file is one split)."
    )
    config_name: str | None = None
    text_col: str | None = option(
        None, metavar="COLUMN", panel=DATA_PANEL, help=f"Text column; default: the first of {', '.join(TEXT_COLUMNS)}."
    )
    text_pair_col: str | None = option(
        None,
        metavar="COLUMN",
        panel=DATA_PANEL,
        help=f"Second text of sentence pairs; default: {', '.join(PAIR_COLUMNS)} if any.",
    )
    label_col: str | None = option(
        None,
        metavar="COLUMN",
        panel=DATA_PANEL,
        help=f"Label column (ids, or names from the model's label2id); default: the first of "
        f"{', '.join(LABEL_COLUMNS)}.",
    )
    source_col: str | None = option(
        None,
        metavar="COLUMN",
        panel=DATA_PANEL,
        help=f"Seq2seq source column; default: the first of {', '.join(SOURCE_COLUMNS)} (then the text columns).",
    )
    target_col: str | None = option(
        None,
        metavar="COLUMN",
        panel=DATA_PANEL,
        help=f"Seq2seq target column; default: the first of {', '.join(TARGET_COLUMNS)}.",
    )
    max_examples: int | None = option(
        None,
        low=1,
        metavar="N",
        panel=DATA_PANEL,
        recipe=True,
        help="Use at most this many examples (after shuffling with --seed); default: all.",
    )
    seq_len: int = option(
        128,
        low=2,
        metavar="N",
        panel=DATA_PANEL,
        recipe=True,
        help="Tokens per example: truncation length, or causal-LM block size.",
    )
    batch_size: int = option(16, low=1, metavar="N", panel=DATA_PANEL, recipe=True, help="Examples per forward.")
    seed: int = 0
    mlm_probability: float = option(
        0.15,
        low=0,
        low_open=True,
        high=1,
        cli=False,
        recipe=True,
        help="Masked LM: the share of tokens masked (BERT masking).",
    )
    data_format: str | None = option(
        None,
        metavar="FORMAT",
        panel=DATA_PANEL,
        help="Format of data whose name does not say it (a pipe, /dev/stdin): csv, tsv, json, jsonl, parquet or "
        "txt, optionally compressed (csv.gz).",
    )
    encoding: str = option(
        "utf-8",
        metavar="ENCODING",
        panel=DATA_PANEL,
        help="Text encoding of csv, tsv, json, jsonl and txt data, e.g. latin-1, cp1252, utf-16.",
    )

    def validate(self, need_path: bool = True) -> None:
        """One-line errors for values that cannot work (``need_path=False``: the rows are given in memory): the
        declared rules of every field (type, range; :func:`headcut.options.check_fields`), then what a declaration
        cannot say (a path, the format's name, an encoding Python knows)."""
        if need_path and not str(self.path).strip():
            raise HeadcutError("no data given: pass a data file or a datasets name")
        check_fields(self, CHECKED)
        if self.data_format is not None:
            parse_format(self.data_format)
        check_encoding(self.encoding)
