"""Which rows and columns of the data are used, and their values as texts and label ids.

* **Columns** (:func:`pick`): the explicit ones first, else the first of the usual names that the data has
  (:data:`~headcut.data.config.TEXT_COLUMNS` ...); errors list every column of the data.
* **Rows** (:class:`Rows`): shuffled with ``seed`` (``torch.randperm``), then the first ``max_examples``
  are kept, so a smaller ``max_examples`` gives a prefix of a larger one. Rows missing a value in a used
  column are skipped (with a note).
* **Labels** (:func:`label_ids`): class ids, or names mapped through the model's ``label2id`` (also
  ignoring case), checked against its ``num_labels``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import HeadcutError, ascii_whole
from ..errors import shown as shown_value
from .config import MIN_LINES_READ, DataConfig

__all__ = ["Rows", "label_ids", "pick"]

#: the most digits of a label id written as text (more is no class of any model)
LABEL_DIGITS = 18


def pick(
    columns: Sequence[str],
    explicit: str | None,
    candidates: Sequence[str],
    role: str,
    flag: str,
    source: str,
    required: bool = True,
    taken: str | None = None,
) -> str | None:
    """The explicit column (which must exist), else the first candidate the data has (other than
    ``taken``); errors list every column of the data."""
    if explicit is not None:
        if explicit not in columns:
            raise HeadcutError(f"{source} has no column {explicit!r} ({flag}); its columns: {', '.join(columns)}")
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
    """The values of a text column, checked to be strings (``rows``: their row numbers, for errors)."""
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


def label_ids(values: Sequence[Any], rows: Sequence[int], column: str, source: str, config: Any) -> list[int]:
    """The class ids of a label column for a model ``config`` (ints, or names through its ``label2id``)."""
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
            number = ascii_whole(value.strip(), LABEL_DIGITS)  # not "²" (isdigit) nor 5000 digits (int fails)
            if number is not None:
                value = number
            else:
                if value not in unknown:
                    unknown.append(value)
                out.append(-1)
                continue
        if not isinstance(value, int):
            raise HeadcutError(f"{source}: column {column!r} holds {type(value).__name__} labels (row {row + 1})")
        if not 0 <= value < n:
            raise HeadcutError(
                f"{source}: label {shown_value(value)} (row {row + 1}) is out of range: the model has {n} labels "
                f"(0..{n - 1}: {', '.join(names)})"
            )
        out.append(value)
    if unknown:
        shown = ", ".join(shown_value(u, 40) for u in unknown[:5]) + (
            f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        )
        raise HeadcutError(
            f"{source}: label{'s' if len(unknown) > 1 else ''} {shown} in column {column!r} "
            f"{'are' if len(unknown) > 1 else 'is'} not among the model's labels ({', '.join(names)}); "
            "give the model a matching label2id in config.json, or use integer labels"
        )
    return out


class Rows:
    """Row selection of one dataset: shuffled with the seed, missing values skipped, at most
    ``max_examples``."""

    def __init__(self, ds: Any, source: str, config: DataConfig, g: torch.Generator, notes: list[str]) -> None:
        self.ds, self.source, self.max_examples, self.g, self.notes = ds, source, config.max_examples, g, notes
        self.names = list(ds.column_names)

    def select(self, n: int) -> list[int]:
        """A seeded permutation of ``range(n)``, cut to ``max_examples``."""
        order = torch.randperm(n, generator=self.g).tolist()
        return order[: self.max_examples] if self.max_examples is not None else order

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
        """The values of column ``col`` in ``rows``, in that order."""
        return list(self.ds.select(rows)[col]) if rows else []

    def texts(self, col: str, rows: list[int]) -> list[str]:
        """The texts of column ``col`` in ``rows``, checked to be strings."""
        return _texts(self.column(col, rows), rows, col, self.source)

    def lines(self, max_chars: int) -> list[str]:
        """The non-blank lines of a text file (``ds``: a :class:`~headcut.data.text.TextFile`), each cut to
        ``max_chars`` characters, selected; with ``max_examples`` the file is read only as far as that needs
        (at least :data:`~headcut.data.config.MIN_LINES_READ` lines, so a smaller ``max_examples`` still
        gives a prefix of a larger one)."""
        limit = None if self.max_examples is None else max(self.max_examples, MIN_LINES_READ)
        values, stopped = self.ds.lines(max_chars, limit)
        if not values:
            raise HeadcutError(f"{self.source} has no usable examples: every line is blank")
        if stopped:
            self.notes.append(
                f"read the first {len(values)} non-blank lines of {self.source}: enough for "
                f"--max-examples {self.max_examples} (the rest was not read)"
            )
        return [values[i] for i in self.select(len(values))]
