"""How values appear in the methods' summaries and the command line's tables (stdlib only: the tables render
without torch)."""

from __future__ import annotations

import re


def metric_text(value: float | None) -> str:
    """A metric as the summaries show it (4 decimals; ``-`` for none)."""
    return "-" if value is None else f"{value:.4f}"


def visible(text: str) -> str:
    """``text`` read from a file (a recipe's name, description or measurements) as a terminal shows it: every
    character that is not printable (escape sequences' ESC, other control characters, line ends) written as its
    Python escape (``\\x1b``, ``\\n``), so text from a file is shown as text and never acts on the terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


#: ANSI escape sequences (CSI, OSC and two-character ones): taken out of a foreign program's text before it is quoted
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")


def printable(text: str, limit: int = 300) -> str:
    """``text`` (what another program printed: vLLM's worker, its log, a probe) as one line that is safe to show on a
    terminal: escape sequences removed, every other control or non-printable character (line ends too) a space,
    runs of spaces as one, at most ``limit`` characters (cut with ``...``)."""
    text = _ESCAPES.sub("", text)
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(limit - 3, 0)].rstrip() + "..."
