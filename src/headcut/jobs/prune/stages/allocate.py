"""The ``allocate`` stage: one allocation over every action (issue 70, point 4; :mod:`headcut.pruning.allocate`).
After the method scored the heads, each block is kept whole, has its KV heads merged into fewer (every query head
kept) or loses its least important KV groups, whichever the measured calibration loss per byte saved favours, until
the cache saves what the budget asks: ``--kv-budget F`` (at ``--context``), or with ``--keep`` the bytes the
method's own cut would save. Every action is measured alone, the combined cut is measured too (costs compound),
and with ``allocate_rounds`` R the bytes are reached in R steps, each measured on the model the steps before left.
The removals become the round's mask (the ``cut`` stage removes them) and the merges its planned cuts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ....errors import HeadcutError, label
from ....model.kv_cache import cache_account
from ....model.surgery import model_blocks
from ....options import option
from ....pruning import eval_metric
from ....pruning.allocate import Allocation, allocate, kept_after, merge_cuts
from ....pruning.layer_costs import PROBE_TOKENS, probe_of
from ...bars import Bars
from ...base import move
from .base import PruneStage, PruneState, RoundRun

#: the --help section of the budget and cut options
B = "Budget and cut"


@dataclass
class Allocate(PruneStage):
    """``allocate``: True runs the stage (``--allocate`` adds it to a recipe; a recipe lists it as
    ``- allocate: {}``); ``allocate_rounds``: in how many measured steps the bytes are reached; ``allocate_tokens``:
    the calibration tokens (the first blocks of ``--data`` holding them) each action is measured on."""

    kind: ClassVar[str] = "allocate"
    summary: ClassVar[str] = "per block, keep, merge KV heads or remove KV groups, by measured cost per byte saved"
    after: ClassVar[tuple[str, ...]] = ("choose", "protect")
    switch: ClassVar[str | None] = "allocate"

    allocate: bool = option(
        True, panel=B, methods="score", help="Choose keep, merge or remove per block by measured cost."
    )
    allocate_rounds: int = option(1, low=1, metavar="R", panel=B, methods="score", help="Allocate in R measured steps.")
    allocate_tokens: int = option(
        PROBE_TOKENS,
        low=1,
        metavar="N",
        panel=B,
        methods="score",
        help="Calibration tokens each action is measured on.",
    )

    def options(self) -> dict[str, Any]:  # a recipe lists the stage: that is its switch
        return {"allocate_rounds": self.allocate_rounds, "allocate_tokens": self.allocate_tokens}

    def check(self, request: Any) -> None:
        super().check(request)
        if not self.allocate:
            return
        what = label("allocate")
        if request.sources.data is None:
            raise HeadcutError(f"{what} measures every action on calibration data: it needs {label('data')}")
        if request.method_kind != "score":
            raise HeadcutError(
                f"{what} ranks each block's KV groups by the method's scores: it applies to score-based methods, not "
                f"{request.method} ({request.method_kind})"
            )
        given = request.options
        if request.scheduled:
            raise HeadcutError(f"{what} cuts in one round: not with {label('via')} or {label('schedule')}")
        for other in ("merge_layers", "protect"):
            if given.get(other):
                raise HeadcutError(
                    f"{what} measures and chooses every block's merge and removal: not with {label(other)}"
                )

    def run(self, state: PruneState, run: RoundRun) -> None:
        if run.rounds > 1:
            raise HeadcutError(f"{label('allocate')} cuts in one round; this recipe's schedule has {run.rounds}")
        if state.config.uniform:  # the default recipe's allocation, asked for a stock checkpoint
            state.notes.append(
                f"{label('uniform')} cuts every block alike: the allocation (keep, merge or remove per block) did not run"
            )
            return
        result, cal = run.result, state.cal
        if cal is None:
            raise HeadcutError(f"{label('allocate')} needs calibration data ({label('data')})")
        if result.importance is None:
            raise HeadcutError(
                f"{label('allocate')} needs the method's scores of every head: {result.method} gave none"
            )
        account = cache_account(state.model, state.config.context)
        if result.kv is not None:
            need = result.kv.before - result.kv.target
        else:
            need = account.bytes(account.current()) - account.bytes(account.kept(result.mask, state.config.gqa))
        blocks = model_blocks(state.model)
        bars = Bars(state.progress, state.config.method, state.metric)
        move(state.model, state.device)
        try:
            done = allocate(
                state.model,
                cal,
                probe_of(cal, self.allocate_tokens),
                result.importance,
                account,
                need,
                rounds=self.allocate_rounds,
                floor=state.config.min_heads_per_block,
                progress=bars,
            )
            mask = done.mask(blocks)
            metric = eval_metric(state.model, state.eval_cal, bars).measure(mask) if state.eval_cal else None
        finally:
            bars.close()
        state.model.to("cpu")
        result.mask = mask
        result.heads_after = {name: len(keep) for name, keep in mask.keep.items()}
        run.planned_cuts = merge_cuts(blocks, done)
        if result.kv is not None:
            result.kv.restate(account, kept_after(blocks, done), self.kind)
        result.metric_after = run.pruned_metric = run.metric = metric
        state.notes.append(_note(done))
        run.outputs[self.kind] = done

    def report(self, state: PruneState, run: RoundRun, report: dict[str, Any]) -> None:
        if self.kind in run.outputs:
            report["allocate"] = run.outputs[self.kind].to_json()


def _note(done: Allocation) -> str:
    kinds = [a.kind for a in done.chosen.values()]
    check = done.rounds[-1]
    return (
        f"allocation: {kinds.count('merge')} block(s) merged, {kinds.count('remove')} lose KV groups, "
        f"{done.bytes_before - done.bytes_after:,} of {done.bytes_before:,} KV bytes saved at {done.context:,} "
        f"tokens; calibration {done.metric} {check.measured:+.1%} measured (the actions alone summed "
        f"{check.predicted:+.1%})"
    )
