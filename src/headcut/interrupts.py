"""Signals held back while a file is put in place.

Ctrl-C, SIGTERM and SIGHUP stop a run at once, with temporary outputs removed and resume checkpoints
kept. A few short steps must not be cut in two: writing a checkpoint (temporary file, then rename),
swapping a replaced output folder for the new one, creating a temporary file before the code that
removes it on failure is in force. Inside :func:`deferred_signals` those signals are recorded
instead of handled; when the step is over the previous handlers are back and the first recorded
signal is raised again, so it acts exactly as it would have a moment earlier.

Only the main thread can change signal handlers; elsewhere the block runs unshielded.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: the signals a headcut run treats as "stop now"
STOP_SIGNALS: tuple[str, ...] = ("SIGINT", "SIGTERM", "SIGHUP")


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, then deliver the first one that came."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        pending.append(signum)

    previous: dict[int, object] = {}
    try:
        for name in STOP_SIGNALS:
            number = getattr(signal, name, None)
            handler = None if number is None else signal.getsignal(number)
            if handler is None:  # not a signal here, or a handler set outside Python: leave it
                continue
            previous[number] = handler
            signal.signal(number, hold)
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]
        if pending:
            signal.raise_signal(pending[0])


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, or SIGTERM/SIGHUP turned into the same clean stop (``signum``: the signal's number)."""

    def __init__(self, signum: int = signal.SIGINT, hint: str | None = None) -> None:
        super().__init__(signum)
        self.signum = signum
        self.hint = hint
