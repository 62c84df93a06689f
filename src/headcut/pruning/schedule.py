"""A cut as a schedule of rounds: each round cuts the model the round before left to a number of heads, scored
on that model, and its recovery runs for its own number of steps (``prune``'s ``via``).

Today's ``via K`` is the two-round schedule ``[K, budget]``, the first round recovering for ``via_steps`` steps
(default: ``recover_steps``) and the last for ``recover_steps``. A schedule of more rounds is one more stop in
:func:`schedule`'s list; the job runs whatever list it gets (:mod:`headcut.jobs.prune`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from ..config import PruneConfig
from ..errors import HeadcutError, label
from . import check_budget


@dataclass(frozen=True)
class Round:
    """One round of a schedule: ``config`` the cut (its ``keep`` the heads this round leaves; no ``via``) and
    ``recover_steps`` the steps of the recovery that follows it (0: none)."""

    config: PruneConfig
    recover_steps: int


def schedule(
    model: nn.Module,
    config: PruneConfig,
    options: Any,
    recover_steps: int,
    via_steps: int | None,
    *,
    checked: bool = False,
) -> list[Round]:
    """The rounds of ``config`` on ``model``: one round of ``config`` itself without ``via``; with it, a cut to
    ``via`` heads and then to the budget. Every round's budget is refused as :func:`check_budget` refuses one,
    before any data is read (the budget first, then ``via``'s bounds, then the first round's). ``checked``:
    ``config`` and ``options`` are a checked request's (:func:`check_budget`), and so are the rounds' cuts of it."""
    _, budget, _, _ = check_budget(
        model, config, options, checked=checked
    )  # refuse an unreachable budget before reading data
    if config.via is None:
        return [Round(config, recover_steps)]
    via = config.via
    if not budget.target < via < budget.total:
        raise HeadcutError(
            f"{label('via')} {via} must lie between the heads kept in the end ({budget.target}) "
            f"and the model's {budget.total}"
        )
    stops = [via, budget.target]  # heads left after each round: a longer schedule lists more stops here
    early_steps = recover_steps if via_steps is None else via_steps
    rounds = []
    for i, keep in enumerate(stops):
        last = i == len(stops) - 1
        cut = replace(config, keep=keep, sparsity=None, via=None)
        if not last:  # the final budget was checked above
            check_budget(model, cut, options, checked=checked)
        rounds.append(Round(cut, recover_steps if last else early_steps))
    return rounds
