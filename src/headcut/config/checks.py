"""The configurations' value checks that an ``option()`` declaration cannot say: a seed torch takes."""

from __future__ import annotations

import numbers
from typing import Any

from ..options import OptionError


def _field(flag: str) -> str:
    """The field an option is named by (``--max-steps`` -> ``max_steps``; a field name stays)."""
    return flag.removeprefix("--").replace("-", "_").split(" ")[0]


def _seed(flag: str, value: Any) -> None:
    """A seed torch's generators take: an integer in [-2**63, 2**64)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not -(2**63) <= value < 2**64:
        raise OptionError("{%s} must be an integer in [-2**63, 2**64) (got {v!r})" % _field(flag), v=value)
