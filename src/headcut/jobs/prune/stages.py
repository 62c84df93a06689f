"""The prune job's stages: every round of a schedule (:mod:`headcut.pruning.schedule`) runs :data:`STAGES` in
order, each a function of the job's shared :class:`PruneState` and the round's :class:`RoundRun`:

* :func:`choose`: the method chooses the heads (scoring or training);
* :func:`cut`: the surgery (and FLAP's bias compensation, when asked);
* :func:`refit`: the kept heads' output projections refitted to the outputs of the model the round cut;
* :func:`recover`: the round's recovery fine-tuning, distilled from the unpruned model, with the round's own
  recovery options (:attr:`headcut.pruning.schedule.Round.recovery`).

A new stage is one function here and one entry in :data:`STAGES`; what it leaves for the report goes on
:class:`RoundRun` (the last round's) or into :func:`round_record` (the earlier rounds')."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from ...adapters import adapter_for
from ...config import FinetuneConfig, PruneConfig, RecoveryConfig
from ...data import Calibration
from ...errors import HeadcutError, label
from ...model import compensation
from ...model.masks import HeadMask
from ...model.surgery import model_blocks, slim
from ...progress import Reporter
from ...pruning import eval_metric, plan_prune
from ...pruning.refit import refit_outputs
from ...pruning.schedule import Round
from ...pruning.search import uniform_budgets
from ...pruning.units import block_sets, nearest
from ...scoring.fluctuation import input_moments
from ...training import finetuning  # finetuning.finetune looked up when called (tests stand in for it)
from ...training.finetuning import frozen_teacher
from ..bars import Bars
from ..base import move


@dataclass
class PruneState:
    """What the stages share: the ``model`` being cut (in place, on the CPU between stages), the request's
    ``config``, method ``options`` and ``recovery``, the data, the ``unpruned`` model's frozen copy (None without
    refit or recovery), where to run, and the run's ``notes``."""

    model: nn.Module
    config: PruneConfig
    options: Any
    recovery: RecoveryConfig
    cal: Calibration | None
    eval_cal: Calibration | None
    extra: Calibration | None
    progress: Reporter
    metric: str | None
    device: Any
    dist: Any
    unpruned: nn.Module | None
    notes: list[str]
    #: plan_prune's keywords of a training run (checkpoint, resume, identity, device)
    training: dict[str, Any] = field(default_factory=dict)
    #: the label of a learned method's training bar
    train_label: str | None = None


@dataclass
class RoundRun:
    """One round as the stages run it: its ``round`` of the schedule, where it stands, and what each stage left
    (``result``: the method's :class:`~headcut.pruning.PruneResult`; ``slimmed``; ``compensated``: the report's
    ``bias_compensation``; ``refitted``/``refit_metric``; ``recovered``: the recovery's fine-tuning result)."""

    round: Round
    index: int
    rounds: int
    refit_teacher: nn.Module | None = None
    result: Any = None
    slimmed: Any = None
    near_uniform: list[int] | None = None
    compensated: dict[str, Any] | None = None
    refitted: Any = None
    refit_metric: float | None = None
    recovered: Any = None

    @property
    def last(self) -> bool:
        return self.index == self.rounds - 1


def choose(state: PruneState, run: RoundRun) -> None:
    """The method's choice of heads on the model as the round finds it (the model itself unchanged)."""

    method = state.config.method
    if run.index:  # the earlier round left the model on the CPU
        move(state.model, state.device)
    if state.recovery.refit:  # the refit fits the outputs of the model this round cuts
        run.refit_teacher = state.unpruned if run.index == 0 else frozen_teacher(state.model)
    name = method if run.rounds == 1 else f"{method}, round {run.index + 1}"
    bars = Bars(state.progress, name, state.metric, train=state.train_label)
    try:
        result = plan_prune(
            state.model,
            state.cal,
            run.round.config,
            state.options,
            eval_calibration=state.eval_cal,
            progress=bars,
            on_step=bars.on_step,
            dist=state.dist,
            checked=True,  # the request's config and options (jobs/prune/request.py), checked there
            **state.training,
        )
    finally:
        bars.close()
    state.model.to("cpu")
    run.result = result
    training = result.training
    if training is not None:
        last_open = training.history[-1].get("open") if training.history else None
        if training.moved is None and last_open is not None and last_open != result.target:
            state.notes.append(
                f"training ended with {last_open:g} heads open, not {result.target}: the gates had "
                "not converged, so keeping the top heads changed the trained model; more steps "
                "(--epochs, --max-steps) let them settle"
            )
        if training.moved is not None:
            state.notes.append(
                f"{method} kept {training.own_kept:g} heads by its own rule (gate > 0.5); the "
                f"adjustment to --keep {result.target} moved {training.moved} head(s)"
            )
    if run.rounds == 1:
        run.near_uniform = _uniform_alternatives(state.model, state.config, result.target)


def cut(state: PruneState, run: RoundRun) -> None:
    """Remove the heads the round chose; with ``bias_compensation``, fold the removed heads' mean output into the
    output projections' biases (measured on the uncut model) and measure the compensated model."""

    result = run.result
    compensate = bool(getattr(state.options, "bias_compensation", False))
    if compensate:
        bias_field = compensation.bias_field(state.model, model_blocks(state.model))
        added = _compensation(state.model, result.mask, state.cal, state.progress, state.device)
    slimmed = slim(state.model, result.mask, gqa=state.config.gqa)
    result.slim = run.slimmed = slimmed
    state.notes += slimmed.notes
    if compensate:
        compensation.apply(state.model, model_blocks(state.model), added, bias_field)
        compensation.check_names(state.model, bias_field)
        state.notes.append(_compensation_note(len(added), bias_field))
        run.compensated = {"blocks": sorted(added), "field": bias_field, "metric_uncompensated": result.metric_after}
        if state.eval_cal is not None:
            move(state.model, state.device)
            result.metric_after = eval_metric(state.model, state.eval_cal).measure(
                HeadMask.full(model_blocks(state.model))
            )
            state.model.to("cpu")


def refit(state: PruneState, run: RoundRun) -> None:
    """:func:`headcut.pruning.refit.refit_outputs` of the cut model on ``--data`` against the model the round cut
    (with ``refit``), and the refitted model's metric on the eval data (None without)."""
    teacher, run.refit_teacher = run.refit_teacher, None
    if teacher is None:
        return

    model, eval_cal = state.model, state.eval_cal
    if state.cal is None:
        raise HeadcutError(f"{label('refit')} needs data ({label('data')})")
    bars = Bars(state.progress, "refit", state.metric)
    move(model, state.device)
    move(teacher, state.device)
    try:
        run.refitted = refit_outputs(model, teacher, state.cal, progress=lambda d, t: bars("refit", d, t))
        run.refit_metric = (
            eval_metric(model, eval_cal, bars).measure(HeadMask.full(model_blocks(model))) if eval_cal else None
        )
    finally:
        bars.close()
        teacher.to("cpu")
    model.to("cpu")


def recover(state: PruneState, run: RoundRun) -> None:
    """The round's ``recover_steps`` of recovery fine-tuning of the cut model, distilled from the unpruned model:
    :func:`headcut.training.finetuning.finetune` with :func:`recovery_config`; with ``recover_data`` (unlabelled
    inputs) on ``--data``'s batches and those, from the teacher alone (alpha 1). Data-parallel over the run's
    processes (engine ``auto``: FSDP under ``accelerate launch --use_fsdp``, else DDP)."""
    steps = run.round.recover_steps
    if not steps:
        return

    model, teacher, cal, extra = state.model, state.unpruned, state.cal, state.extra
    assert teacher is not None  # kept whenever a round recovers
    if cal is None:
        raise HeadcutError(f"{label('recover_steps')} needs training data with labels ({label('data')})")
    config = recovery_config(run.round.recovery, steps, state.config.seed)
    if extra is not None:
        cal = dataclasses.replace(cal, batches=cal.batches + extra.batches, examples=cal.examples + extra.examples)
        config = dataclasses.replace(config, alpha=1.0)
    bars = Bars(state.progress, "recovery", state.metric, train=f"recovery fine-tuning (distilled, {steps} steps)")
    move(model, state.device)
    move(teacher, state.device)
    try:
        run.recovered = finetuning.finetune(
            model,
            cal,
            config,
            teacher=teacher,
            eval_calibration=state.eval_cal,
            progress=lambda d, t: bars("train", d, t),
            eval_progress=lambda d, t: bars("eval", d, t),
            on_step=bars.on_step,
            dist=state.dist,
        )
    finally:
        bars.close()
    model.to("cpu")


#: every round's stages, in order
STAGES: tuple[Callable[[PruneState, RoundRun], None], ...] = (choose, cut, refit, recover)


def recovery_config(recovery: RecoveryConfig, steps: int, seed: int) -> FinetuneConfig:
    """A recovery's :class:`FinetuneConfig`: ``finetune``'s defaults (lr 5e-5, alpha 0.5, temperature 2) with
    ``steps`` and ``recovery``'s hidden-state weight and averaging (> 0: a constant learning rate, and the
    weights at the end the mean over that fraction of the last steps); no resume checkpoints."""
    average = float(recovery.recover_average)
    averaged: dict[str, Any] = {"average_last": average, "schedule": "constant"} if average else {}
    return FinetuneConfig(
        max_steps=steps,
        seed=seed,
        checkpoint_every=None,
        hidden_weight=float(recovery.recover_hidden_weight),
        **averaged,
    )


def round_record(run: RoundRun, mask: HeadMask) -> dict[str, Any]:
    """An earlier round's record for the report's ``rounds``: its head count, its ``mask`` (the input model's
    numbering), its metric after each stage, its refit and recovery."""
    result = run.result
    record: dict[str, Any] = {
        "keep": run.round.config.keep,
        "mask": mask.to_json(),
        "metric": {"after_pruning": result.metric_after},
    }
    if run.refitted is not None:
        record["metric"]["after_refit"] = run.refit_metric
        record["refit"] = run.refitted.to_json()
    if run.recovered is not None:
        record["metric"]["after"] = run.recovered.metric_after
        record["recovery"] = {
            "steps": run.recovered.steps,
            "seconds": run.recovered.seconds,
            "history_summary": run.recovered.summary(),
        }
    return record


def in_input_numbering(earlier: HeadMask | None, mask: HeadMask) -> HeadMask:
    """``mask`` (kept heads in the numbering of the model a round cut) in the input model's numbering, given the
    rounds before as ``earlier`` (None: the first round)."""
    if earlier is None:
        return mask
    return HeadMask({b: [earlier.keep[b][i] for i in kept] for b, kept in mask.keep.items()})


def as_one_cut(runs: list[RoundRun], mask: HeadMask, config: PruneConfig) -> tuple[Any, Any]:
    """The last round's result and slimming made the rounds' one cut of the input model: the composed ``mask``,
    the first round's heads, parameters and metric before, every round's scorings and seconds."""
    first, last = runs[0], runs[-1]
    result = last.result
    if len(runs) == 1:
        return result, last.slimmed
    result.mask = mask
    result.heads_before, result.metric_before = first.result.heads_before, first.result.metric_before
    result.config = config
    for run in runs[:-1]:
        result.scorings += run.result.scorings
        result.seconds += run.result.seconds
    slimmed = result.slim = replace(
        last.slimmed, heads_before=first.slimmed.heads_before, params_before=first.slimmed.params_before
    )
    return result, slimmed


def _uniform_alternatives(model: nn.Module, config: PruneConfig, target: int | None) -> list[int]:
    """The ``--uniform`` budgets nearest ``target`` for a run without ``--uniform`` on a family whose stock config
    could hold a uniform cut (an empty list otherwise): what the summary offers for a stock checkpoint."""

    if config.uniform or adapter_for(model).stock_spec(str(model.config.model_type)) is None or target is None:
        return []
    sets = block_sets(model_blocks(model), config.gqa)
    total = sum(s.heads * s.width for s in sets)  # the uncut model: not a cut to offer
    valid = [k for k in uniform_budgets(sets, config.min_heads_per_block) if 0 < k < total]
    return [target] if target in valid else nearest(valid, target)


def _compensation(model: nn.Module, mask: HeadMask, cal: Calibration | None, progress: Reporter, device: Any) -> Any:
    """FLAP's bias compensation for ``mask`` (:mod:`headcut.model.compensation`): the output projections' mean
    inputs over ``cal`` on the unpruned ``model`` (one more forward pass), and each block's bias increment."""

    if cal is None:
        raise HeadcutError(f"{label('bias_compensation')} needs calibration data ({label('data')})")
    blocks = model_blocks(model)
    bars = Bars(progress, "bias compensation", None)
    move(model, device)
    try:
        moments, _ = input_moments(model, blocks, cal.batches, "bias compensation", lambda d, t: bars("score", d, t))
    finally:
        bars.close()
    model.to("cpu")
    return compensation.deltas(model, blocks, mask.keep, {name: m.mean() for name, m in moments.items()})


def _compensation_note(blocks: int, field: str | None) -> str:
    turned = f"; {field} turned on (zero biases on the other projections)" if field else ""
    return (
        f"bias compensation (FLAP §3.4): the removed heads' mean output folded into the output projection's "
        f"bias of {blocks} block{'s' if blocks != 1 else ''}{turned}"
    )
