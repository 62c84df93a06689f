"""A cut as a schedule of rounds: each round cuts the model the round before left to a number of heads, scored
on that model, and its recovery runs with its own options (``prune``'s ``via``, or a recipe's ``schedule``).

``via K`` is the two-round schedule ``[K, budget]``, the first round recovering for ``via_steps`` steps (default:
``recover_steps``) and the last for ``recover_steps``. A recipe's schedule (:class:`headcut.recipes.Case`) lists
the rounds of a budget: each round's heads (a count, a share of the model's heads, the budget) and its own
recovery options; the job runs whatever list :func:`schedule` gives (:mod:`headcut.jobs.prune`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from torch import nn

from ..config import PruneConfig
from ..errors import HeadcutError, label
from ..recipes import Case, RoundPlan
from . import check_budget


@dataclass(frozen=True)
class Round:
    """One round of a schedule: ``config`` the cut (its ``keep`` the heads this round leaves; no ``via``) and the
    stage ``options`` this round sets for itself (e.g. its own ``recover_steps``; the others are the stages')."""

    config: PruneConfig
    options: Mapping[str, Any] = field(default_factory=dict)


def schedule(
    model: nn.Module,
    config: PruneConfig,
    options: Any,
    plan: Sequence[Case] = (),
    *,
    rounds: Sequence[int] | None = None,
    via_steps: int | None = None,
    checked: bool = False,
) -> list[Round]:
    """The rounds of ``config`` on ``model``: with ``via``, a cut to ``via`` heads and then to the budget; with
    ``rounds`` (``K1, K2, ...``), cuts to K1, K2, ... heads and then to the budget (a last count equal to the budget
    is that round); else the rounds of ``plan``'s case for the budget (a recipe's schedule; no case, or a
    ``max_drop`` or ``kv_budget`` budget: one round of ``config`` itself). ``via_steps``: the recovery steps of every
    round before the last (``via`` and ``rounds``). Every round's budget is refused as :func:`check_budget` refuses
    one, before any data is read (the budget first, then the rounds' bounds, then each earlier round's).
    ``checked``: ``config`` and ``options`` are a checked request's (:func:`check_budget`), and so are the rounds'
    cuts of it."""
    _, budget, _, _ = check_budget(
        model, config, options, checked=checked
    )  # refuse an unreachable budget before reading data
    early: dict[str, Any] = {} if via_steps is None else {"recover_steps": via_steps}
    if config.via is not None:
        via = config.via
        if not budget.target < via < budget.total:
            raise HeadcutError(
                f"{label('via')} {via} must lie between the heads kept in the end ({budget.target}) "
                f"and the model's {budget.total}"
            )
        plans: Sequence[RoundPlan] = (RoundPlan(via, early), RoundPlan(None))
    elif rounds:
        counts = list(rounds)
        if budget.target is not None and counts[-1] == budget.target:
            counts = counts[:-1]  # the last count given is the budget: that round is the last
        plans = (*(RoundPlan(k, early) for k in counts), RoundPlan(None))
    else:
        case = None
        if plan and config.max_drop is None and config.kv_budget is None and budget.target is not None:
            case = next((c for c in plan if c.below is None or budget.target < c.below * budget.total), None)
        if case is None:
            return [Round(config)]
        plans = case.rounds
    out: list[Round] = []
    before = budget.total
    for i, planned in enumerate(plans):
        last = i == len(plans) - 1
        keep = budget.target if last else _heads(model, config, options, planned.keep, budget.total, checked)
        if not last and not budget.target < keep < before:
            raise HeadcutError(
                f"round {i + 1} of the schedule keeps {keep} heads: a round before the last must keep fewer "
                f"heads than the one before it ({before}) and more than the budget ({budget.target})"
            )
        cut = replace(config, keep=keep, sparsity=None, via=None)
        if not last:  # the final budget was checked above
            check_budget(model, cut, options, checked=checked)
        out.append(Round(cut, dict(planned.options)))
        before = keep
    return out


def _heads(
    model: nn.Module, config: PruneConfig, options: Any, keep: int | Fraction | None, total: int, checked: bool
) -> int:
    """A round's heads: a count as it is; a share of the model's ``total`` heads: the nearest count at or above
    it that the model can keep (whole units; none: ``total``, which the bounds then refuse)."""
    assert keep is not None  # only the last round keeps the budget
    if not isinstance(keep, Fraction):
        return keep
    wanted = -(-total * keep.numerator // keep.denominator)  # ceil
    for heads in range(wanted, total):
        try:
            check_budget(model, replace(config, keep=heads, sparsity=None, via=None), options, checked=checked)
        except HeadcutError:
            continue
        return heads
    return total
