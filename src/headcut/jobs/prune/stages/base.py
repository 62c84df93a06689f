"""What a stage of a prune is: a :class:`PruneStage` object, its options the dataclass's fields (declared with
:func:`headcut.options.option`, so they are flags, keywords, recipe keys, ``--help`` and docs at once), with its own
:meth:`~PruneStage.check` of a request and :meth:`~PruneStage.run` of a round; and what the stages of a round share
(:class:`PruneState`: the model being cut, the data, the run's notes) and leave (:class:`RoundRun`).

A recipe lists the stages every round runs, in its order; the prune job makes one object of each
(:func:`make_stage`, the kind found in the registry, :data:`headcut.catalog.STAGES`) and runs their hooks for every
round of the schedule: :meth:`~PruneStage.prepare` of every stage, then :meth:`~PruneStage.run` of each in turn;
after the last round :meth:`~PruneStage.report` of each writes the report's entries, and an earlier round's record
takes :meth:`~PruneStage.record`'s. A round of a schedule may set any stage's options for itself
(:meth:`~PruneStage.in_round`).

A new kind of stage is one module with a subclass of :class:`PruneStage` and its registration: a line in
:data:`headcut.catalog.STAGES` for a built-in kind, or :func:`register` for one defined elsewhere (a test, a
user's own module) at run time."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import nn

from ....catalog import STAGES, StageEntry, resolve, stage_entry
from ....config import PruneConfig
from ....data import Calibration
from ....errors import HeadcutError
from ....options import check_fields, specs
from ....progress import Reporter
from ....pruning.schedule import Round


@dataclass
class PruneState:
    """What the stages share: the ``model`` being cut (in place, on the CPU between stages), the request's
    ``config`` and method ``options``, the data (``cal``, ``eval_cal``, ``extra``: the recovery's unlabelled
    inputs), the ``unpruned`` model's frozen copy (None when no stage keeps it), where to run, and the run's
    ``notes``."""

    model: nn.Module
    config: PruneConfig
    options: Any
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
    """One round as the stages run it: its ``round`` of the schedule, where it stands, and what each stage left:
    ``result`` (the method's :class:`~headcut.pruning.PruneResult`), ``slimmed`` (the cut), ``pruned_metric`` (the
    eval metric of the cut model), ``metric`` (the eval metric after the last stage that measured it), ``teacher`` (the model this round cuts, for a stage that fits
    to it), ``outputs`` (each stage kind's own record, by kind) and ``planned_cuts``."""

    round: Round
    index: int
    rounds: int
    result: Any = None
    slimmed: Any = None
    pruned_metric: float | None = None
    metric: float | None = None
    teacher: nn.Module | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    #: cuts of blocks the chosen heads keep whole, planned by a stage before the cut (a merge of KV heads, by
    #: block): the ``cut`` stage realises them with the chosen heads
    planned_cuts: dict[str, Any] = field(default_factory=dict)

    @property
    def last(self) -> bool:
        return self.index == self.rounds - 1


@dataclass
class PruneStage:
    """A kind of stage (subclass it; see the module's doc). ``kind``: its name in a recipe; ``summary``: one line
    for ``headcut recipes``; ``after``: the kinds it runs after when a recipe has them; ``switch``: the option
    that, given false or 0, drops the stage from a recipe. The fields are its options."""

    kind: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    after: ClassVar[tuple[str, ...]] = ()
    switch: ClassVar[str | None] = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> PruneStage:
        """The stage with a recipe's ``options`` (declared names only: the recipe was checked)."""
        return cls(**options)

    def options(self) -> dict[str, Any]:
        """Every option with its value, as a resolved recipe writes it."""
        return {spec.name: getattr(self, spec.name) for spec in specs(type(self))}

    def in_round(self, options: Mapping[str, Any]) -> PruneStage:
        """The stage as a round runs it: its options that the round sets (a schedule's round) replaced."""
        own = {k: v for k, v in options.items() if k in {s.name for s in specs(type(self))}}
        return dataclasses.replace(self, **own) if own else self

    def active(self) -> bool:
        """Whether the stage runs (its ``switch`` option, in this round, is not false or 0)."""
        return self.switch is None or bool(getattr(self, self.switch))

    def check(self, request: Any) -> None:
        """Refuse a request this stage cannot run (before any work): a :class:`HeadcutError` naming the keyword.
        By default, each option by its declaration (``request.sources``: the data given)."""
        check_fields(self)

    def keeps_unpruned(self, rounds: Sequence[Round]) -> bool:
        """Whether the job must keep a frozen copy of the unpruned model for this stage over ``rounds``."""
        return False

    def prepare(self, state: PruneState, run: RoundRun) -> None:
        """Before any stage of the round runs (the model as the round finds it)."""

    def run(self, state: PruneState, run: RoundRun) -> None:
        """The stage's work in one round."""
        raise NotImplementedError(f"stage {self.kind} has no run()")

    def record(self, run: RoundRun, record: dict[str, Any]) -> None:
        """An earlier round's record (the report's ``rounds``): this stage's entries."""

    def report(self, state: PruneState, run: RoundRun, report: dict[str, Any]) -> None:
        """The report's entries of this stage after the last round (``run``)."""


def stage_class(name: str) -> type[PruneStage]:
    """The class of stage kind ``name`` (imported from its module for a built-in kind)."""
    target = stage_entry(name).target
    found = resolve(target) if isinstance(target, str) else target
    assert isinstance(found, type) and issubclass(found, PruneStage)
    return found


def make_stage(name: str, options: Mapping[str, Any]) -> PruneStage:
    """The stage object of a recipe's stage ``name`` with its ``options``."""
    return stage_class(name).from_options(options)


def register(cls: type[PruneStage]) -> type[PruneStage]:
    """Register a kind of stage defined outside headcut (returns it: usable as a class decorator): recipes may
    list it, ``headcut recipes`` shows it, ``headcut prune`` takes its options as flags and runs it. Refused: a
    kind already registered, an option another kind or the budget already has."""
    if not (isinstance(cls, type) and issubclass(cls, PruneStage)) or not cls.kind:
        raise HeadcutError("a stage kind is a subclass of headcut.jobs.prune.stages.PruneStage with a kind name")
    if cls.kind in STAGES:
        raise HeadcutError(f"stage {cls.kind!r} is registered already")
    taken = {spec.name: name for name in STAGES for spec in stage_specs(name)}
    clash = next((s.name for s in specs(cls) if s.name in taken), None)
    if clash is not None:
        raise HeadcutError(f"stage {cls.kind}: option {clash!r} belongs to stage {taken[clash]} already")
    STAGES[cls.kind] = StageEntry(cls.kind, cls, cls.summary, tuple(cls.after), cls.switch)
    return cls


def unregister(kind: str) -> None:
    """Remove a kind :func:`register` added (the built-in kinds stay)."""
    entry = STAGES.get(kind)
    if entry is not None and not isinstance(entry.target, str):
        del STAGES[kind]


def stage_specs(name: str) -> list[Any]:
    """The declared options of stage kind ``name`` (read from a built-in kind's source, without importing it)."""
    from ....recipes.recipe import stage_options

    return stage_options(name)
