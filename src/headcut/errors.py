"""headcut's user-facing errors: the CLI prints their message on one line and exits with code 2.

:class:`HeadcutError` is the base every refusal derives from (the CLI catches it). The Python API's
argument checks (:mod:`headcut.arguments`) raise the subclasses that are also Python's own kinds, so
``except ValueError`` / ``except TypeError`` work as they would for any library:

* :class:`HeadcutTypeError` (also a ``TypeError``): an argument of the wrong kind (a string where a
  number is needed, a list where a mask is, a module that is not a transformers model);
* :class:`HeadcutValueError` (also a ``ValueError``): an argument of the right kind with a value that
  cannot work (a fraction outside [0, 1], an unknown choice, a checkpoint folder inside a file).
"""

import math
from collections.abc import Callable
from typing import Any


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message (its type name when it has none)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


#: integers longer than this many bits are shown by their length (Python refuses to print more than 4300 digits)
LONGEST_SHOWN_INT = 256


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a one-line message: at most ``limit`` characters, and an integer too long to print
    whole (or at all: Python refuses more than 4300 digits) as its length in bits."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > LONGEST_SHOWN_INT:
        return f"{'-' if value < 0 else ''}<an integer of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except ValueError:  # a container holding such an integer
        text = f"<a {type(value).__name__}>"
    text = " ".join(text.splitlines())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Shown:
    """A value as :func:`shown` writes it, for a message template (``{v!r}``, ``{v}`` and ``{v:g}`` all give that
    text): a template never fails on the value it reports."""

    def __init__(self, value: Any, limit: int = 60) -> None:
        self.text = shown(value, limit)

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return self.text


def is_finite(value: Any) -> bool:
    """Whether a real number is finite as a float: an integer too large for a float is not (``math.isfinite``
    raises OverflowError for it)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def ascii_whole(text: str, digits: int) -> int | None:
    """The whole number that ``text`` writes in at most ``digits`` ASCII digits (after an optional minus sign),
    else None: ``int()`` also reads other scripts' digits and fails on superscripts (``"²".isdigit()`` holds)
    and on more than 4300 digits."""
    body = text[1:] if text.startswith("-") else text
    if not body or not body.isascii() or not body.isdigit() or len(body.lstrip("0")) > digits:
        return None
    return int(text)


#: marks an option's name inside a message (see :func:`label`)
MARK = "\x00"


def label(name: str) -> str:
    """An option named inside a message by its Python keyword (``keep``): ``str(error)`` shows the keyword,
    the command line shows the flag (``--keep``) or argument (``MODEL``) it parsed into that keyword
    (:meth:`HeadcutError.render`). One refusal, worded for whoever made the request."""
    return f"{MARK}{name}{MARK}"


class HeadcutError(Exception):
    """A problem with the user's input (path, mask, budget, flag) that headcut refuses to work with. Options
    named in the message with :func:`label` read as Python keywords in ``str(error)``."""

    def render(self, name_of: Callable[[str], str] = str) -> str:
        """The message with each labelled option named by ``name_of(keyword)``."""
        parts = Exception.__str__(self).split(MARK)
        return "".join(name_of(p) if i % 2 else p for i, p in enumerate(parts))

    def __str__(self) -> str:
        return self.render()


class SharedError(HeadcutError):
    """A refusal that every process of a multi-process run raises alike (their agreement before training):
    ``echo`` is False in all but the main process, whose line is the one a command prints."""

    def __init__(self, message: str, echo: bool = True) -> None:
        super().__init__(message)
        self.echo = echo


class HeadcutValueError(HeadcutError, ValueError):
    """An argument of the right type whose value headcut refuses (out of range, unknown choice, ...)."""


class HeadcutTypeError(HeadcutError, TypeError):
    """An argument of a type headcut does not accept (named by its keyword, with what it accepts)."""
