"""headcut's user-facing errors: the CLI prints their message on one line and exits with code 2.

:class:`HeadcutError` is the base every refusal derives from (the CLI catches it). The Python API's
argument checks (:mod:`headcut.arguments`) raise the subclasses that are also Python's own kinds, so
``except ValueError`` / ``except TypeError`` work as they would for any library:

* :class:`HeadcutTypeError` (also a ``TypeError``): an argument of the wrong kind (a string where a
  number is needed, a list where a mask is, a module that is not a transformers model);
* :class:`HeadcutValueError` (also a ``ValueError``): an argument of the right kind with a value that
  cannot work (a fraction outside [0, 1], an unknown choice, a checkpoint folder inside a file).
"""

from collections.abc import Callable



def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message (its type name when it has none)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


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


class HeadcutValueError(HeadcutError, ValueError):
    """An argument of the right type whose value headcut refuses (out of range, unknown choice, ...)."""


class HeadcutTypeError(HeadcutError, TypeError):
    """An argument of a type headcut does not accept (named by its keyword, with what it accepts)."""
