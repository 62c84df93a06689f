"""The configurations' shared value checks, for what an ``option()`` declaration cannot say: a choice named by
its flag, a count up to a machine limit, a seed torch takes."""

from __future__ import annotations

import numbers
from typing import Any

from ..options import OptionError


def _field(flag: str) -> str:
    """The field an option is named by (``--max-steps`` -> ``max_steps``; a field name stays)."""
    return flag.removeprefix("--").replace("-", "_").split(" ")[0]


def check_choice(flag: str, value: Any, valid: tuple[str, ...] | list[str]) -> None:
    """Refuse a value that is not one of ``valid`` (one line naming the option and the choices)."""
    if value not in valid:
        raise OptionError(
            "unknown {%s} {v!r}; choose one of {c}" % _field(flag), v=value, c=", ".join(str(v) for v in valid)
        )


def _count(flag: str, value: Any, low: int, high: int = 2**63 - 1) -> None:
    """An integer in [low, high] (by default up to torch's largest, a C ``long long``)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise OptionError("{%s} must be an integer >= %d (got {v!r})" % (_field(flag), low), v=value)
    if value > high:
        raise OptionError(
            "{%s} must be at most {h} (got {v!r})" % _field(flag), v=value, h="2**63 - 1" if high == 2**63 - 1 else high
        )


def _seed(flag: str, value: Any) -> None:
    """A seed torch's generators take: an integer in [-2**63, 2**64)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not -(2**63) <= value < 2**64:
        raise OptionError("{%s} must be an integer in [-2**63, 2**64) (got {v!r})" % _field(flag), v=value)
