"""Child processes that leave nothing behind: a process started in a session of its own (``start_new_session``) is
the leader of a process group, and :func:`stop_group` ends the whole group, whatever the process started, within a
bounded time and without being cut short by a second interruption."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

from .interrupts import deferred_signals


def stop_group(proc: subprocess.Popen[Any], grace: float = 0.0, term_s: float = 3.0) -> None:
    """End ``proc`` (started with ``start_new_session=True``: the leader of a process group of its own) and every
    process of its group: ``grace`` seconds to exit by itself, then SIGTERM to the group and ``term_s`` seconds,
    then SIGKILL to the group (always: what the process started and left behind), then reap it. Never waits
    longer than ``grace + 2 * term_s`` seconds, and Ctrl-C, SIGTERM and SIGHUP are held meanwhile (then delivered,
    :func:`headcut.interrupts.deferred_signals`): a second interruption cannot leave the group running.

    A leader this function waits for is left unreaped (``waitid`` with ``WNOWAIT``) until its group is killed, so its
    process id, the group's, cannot be reused meanwhile; a group whose leader was reaped before (``communicate``)
    keeps its id reserved as long as any process is left in it."""
    with deferred_signals():
        if wait_exit(proc, grace):
            _signal_group(proc, signal.SIGKILL)  # the leader is gone: only what it left behind
        else:
            _signal_group(proc, signal.SIGTERM)
            wait_exit(proc, term_s)
            _signal_group(proc, signal.SIGKILL)
        try:
            proc.wait(timeout=term_s)
        except subprocess.TimeoutExpired:  # not even SIGKILL ends it (stuck in the kernel): nothing left to do
            pass


def wait_exit(proc: subprocess.Popen[Any], seconds: float = 0.0) -> bool:
    """Whether ``proc`` has exited within ``seconds`` (0: now), leaving it unreaped where the platform allows (see
    :func:`stop_group`)."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.returncode is not None:
            return True
        if hasattr(os, "waitid"):
            try:
                if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return True
            except ChildProcessError:  # reaped elsewhere
                return True
        elif proc.poll() is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _signal_group(proc: subprocess.Popen[Any], signum: int) -> None:
    if proc.returncode is not None and signum != signal.SIGKILL:
        return
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):  # the group is empty (or no longer ours)
        pass
