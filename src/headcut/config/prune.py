"""What a prune asks for besides its stages: the budget (:class:`Budget`), a schedule of rounds
(:class:`ScheduleOptions`), the recipe it runs (:class:`RecipeChoice`), how the checkpoint is read
(:class:`LayerwiseConfig`) and where the per-step metric goes (:class:`TrajectoryOptions`); and what a method's cut
is as the pruning layer reads it (:class:`PruneConfig`, with the one check of a budget's combinations,
:func:`check_budget_rules`, and of a cut in rounds, :func:`check_rounds`). Each stage's options are declared by the
stage (:mod:`headcut.jobs.prune.stages`), each method's by its options dataclass (``headcut.pruning.<method>``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..catalog import METHODS, STAGES, MethodEntry, method_entry
from ..options import OptionError, OptionSpec, check_fields, option, specs, static_specs

#: the --help section of the budget and cut options
B = "Budget and cut"


@dataclass
class Budget:
    """How much a cut leaves (``prune``'s budget; a recipe's ``budget``), declared once: exactly one of ``keep``
    (heads left) and ``sparsity`` (fraction removed: keep = floor((1 - s) * heads)), or ``max_drop`` (stop before
    the metric drops by more than this, in the metric's own units; score-based methods) with ``keep``/``sparsity``
    optional as a floor, or ``kv_budget`` (the fraction of the KV-cache bytes kept at ``context`` tokens, the
    heads placed by the cut's ``allocation``: :mod:`headcut.pruning.costs`), or ``target_speedup`` (the least such
    cut whose decoding at ``context`` tokens is that much faster, timed on the run's device:
    :mod:`headcut.jobs.prune.speed_target`). A method that decides the count itself (``auber``) needs none, and
    takes ``keep``/``sparsity`` as an upper bound on the heads kept. Their combinations are checked by
    :meth:`PruneConfig.validate`."""

    keep: int | None = option(None, low=0, metavar="K", panel=B, help="Heads to keep (exactly; auber: at most).")
    sparsity: float | None = option(
        None, low=0, high=1, metavar="S", panel=B, help="Fraction of heads to remove: K = floor((1 - S) x heads)."
    )
    max_drop: float | None = option(
        None,
        low=0,
        metavar="D",
        panel=B,
        methods="score",
        help="Score-based: remove heads while the --eval-data metric stays within D.",
    )
    kv_budget: float | None = option(
        None,
        low=0,
        high=1,
        low_open=True,
        metavar="F",
        panel=B,
        methods="score",
        help="Keep at most fraction F of the KV-cache bytes at --context tokens.",
    )
    context: int | None = option(
        None,
        low=1,
        metavar="N",
        panel=B,
        methods="score",
        help="Tokens --kv-budget/--target-speedup count at; default: the model's maximum.",
    )
    target_speedup: float | None = option(
        None,
        low=1,
        low_open=True,
        metavar="X",
        panel=B,
        methods="score",
        help="Cut until decoding at --context on --device is X times faster, timed.",
    )


@dataclass
class ScheduleOptions:
    """A cut in rounds, each scored on the model the round before left (score-based methods): ``via`` K (two
    rounds: to K heads, then to the budget) or ``schedule`` (``K1,K2,...``: to K1 heads, then K2, ..., then the
    budget; a recipe's ``schedule`` in one flag), and ``via_steps``: the recovery steps of every round before the
    last (None: the recovery's own). (``rounds`` is a score-based method's own option: the steps of one round.)"""

    via: int | None = option(
        None,
        low=1,
        metavar="K",
        panel=B,
        methods="score",
        help="Score-based: cut to K first (refit, recovery), then to the budget.",
    )
    schedule: str | None = option(
        None,
        metavar="K1,K2,...",
        panel=B,
        methods="score",
        help="Score-based: cut in rounds, to K1 heads, then K2, ..., then the budget (--via K: --schedule K).",
    )
    via_steps: int | None = option(
        None,
        low=0,
        metavar="M",
        panel="Options",
        methods="score",
        help="Recovery steps of each round before the last (--via, --schedule; default: --recover-steps).",
    )


@dataclass
class PruneConfig:
    """What a method's cut is, as the pruning layer reads it: ``method`` (a name in
    :data:`headcut.catalog.METHODS`), the budget (:class:`Budget`'s fields), the cut's options (``uniform``,
    ``min_heads_per_block``, ``gqa``, ``allocation``: the cut stage's, :mod:`headcut.jobs.prune.stages.cut`),
    ``via`` (:class:`ScheduleOptions`), ``seed`` (every random choice of the method) and ``trajectory`` (measure
    the metric after every step: score-based methods, with evaluation data). Every field is declared where it is
    offered; :meth:`validate` checks them by those declarations and their combinations."""

    method: str = "gradient"
    keep: int | None = None
    sparsity: float | None = None
    max_drop: float | None = None
    uniform: bool = False
    min_heads_per_block: int = 0
    gqa: str = "auto"
    via: int | None = None
    kv_budget: float | None = None
    context: int | None = None
    target_speedup: float | None = None
    allocation: str = "cost"
    seed: int = 0
    trajectory: bool = False

    def validate(self) -> None:
        """One-line errors for values that cannot work (the method name is checked by the registry): the budget's
        combinations (:func:`check_budget_rules`), ``via``'s, then every field by its declaration."""

        check_budget_rules(self, method_entry(self.method))
        if self.via is not None and (self.max_drop is not None or self.trajectory):
            raise OptionError(
                "{via} cuts to a number of heads in two rounds: give {keep} or {sparsity}, not "
                "{max_drop} or {trajectory}"
            )
        if self.via is not None and self.keep is None and self.sparsity is None:
            raise OptionError("{via} needs the final budget: {keep} or {sparsity}")
        declared = {s.name: s for s in [*specs(Budget), *specs(ScheduleOptions), *cut_specs()]}
        check_fields(self, by=[declared[f.name] for f in fields(self) if f.name in declared])

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def cut_specs() -> list[OptionSpec]:
    """The options of the cut stage (read from its module's source: no import)."""
    target = STAGES["cut"].target
    return static_specs(target) if isinstance(target, str) else specs(target)


def check_budget_rules(budget: Any, entry: MethodEntry, where: str = "", required: bool = True) -> None:
    """The budget's combinations, the one check of every budget (flags, keywords, a recipe's ``budget``): ``budget``
    has :class:`Budget`'s fields as attributes (a :class:`PruneConfig`, or a recipe's budget as a
    :class:`Budget`), ``entry`` the method's registry entry, ``where`` a prefix naming a recipe; ``required``: a
    method that needs a budget is refused without one (a recipe may leave the budget to the command)."""

    def no(message: str) -> OptionError:
        return OptionError(where + message)

    keep, sparsity, max_drop = budget.keep, budget.sparsity, budget.max_drop
    kv_budget, target_speedup, context = budget.kv_budget, budget.target_speedup, budget.context
    via, trajectory = getattr(budget, "via", None), getattr(budget, "trajectory", False)
    method = entry.name
    if keep is not None and sparsity is not None:
        raise no("give one budget: {keep} or {sparsity}, not both")
    if kv_budget is not None:
        if entry.kind != "score":
            raise no(
                "{kv_budget} places the heads by their scores (a score-based method: headcut methods lists "
                "them); %s keeps its own budget in heads ({keep} or {sparsity})" % method
            )
        if keep is not None or sparsity is not None or max_drop is not None:
            raise no("give one budget: {kv_budget} (bytes) or {keep}, {sparsity} or {max_drop} (heads)")
        if via is not None or trajectory:
            raise no("{kv_budget} cuts in one round: no {via} or {trajectory}")
    if target_speedup is not None:
        if entry.kind != "score":
            raise no(
                "{target_speedup} times cuts placed by their scores (a one-shot score-based method); %s keeps "
                "its own budget in heads ({keep} or {sparsity})" % method
            )
        if any(v is not None for v in (keep, sparsity, max_drop, kv_budget)):
            raise no("give one budget: {target_speedup} (speed) or {kv_budget}, {keep}, {sparsity} or {max_drop}")
        if via is not None or trajectory:
            raise no("{target_speedup} cuts in one round: no {via} or {trajectory}")
    if context is not None and kv_budget is None and target_speedup is None:
        raise no("{context} is the length {kv_budget} or {target_speedup} is counted at: give one of them too")
    budget_given = keep is not None or sparsity is not None or max_drop is not None
    budget_given = budget_given or kv_budget is not None or target_speedup is not None
    if not budget_given and entry.budget == "required" and required:
        raise no("no budget: give {keep}, {sparsity} or {max_drop}")


def check_rounds(entry: MethodEntry, what: str) -> None:
    """A cut in rounds (``what`` says which: ``via``, ``schedule``, a recipe's schedule) is made by the score-based
    methods only: each round is scored on the model the round before left."""
    if entry.kind != "score":
        scored = ", ".join(m.name for m in METHODS.values() if m.kind == "score")
        raise OptionError(
            f"{what}, each scored on the model the one before left: it applies to the score-based methods "
            f"({scored}), not to {entry.name}"
        )


#: the --help section the layer-wise and trajectory options share with the command's own
R = "Options"


@dataclass
class RecipeChoice:
    """The recipe ``prune`` runs without ``method`` (:func:`headcut.prune`'s keyword of the same name; the API
    also takes a mapping or a :class:`~headcut.recipes.Recipe`): a built-in recipe's name, or a file."""

    recipe: str | None = option(
        None,
        metavar="NAME|FILE",
        panel=B,
        help="A recipe instead of --method: a built-in one (headcut recipes lists them), a recipe .yaml/.json, or a "
        "pruned folder or its headcut-report.json to replay it. Default: the default recipe of the model's kind.",
    )


@dataclass
class LayerwiseConfig:
    """Whether ``prune`` reads the checkpoint one layer at a time (:mod:`headcut.model.streamed`): ``layerwise``
    asks for it; it is also chosen when the checkpoint would not fit ``max_memory`` (``12GB``, ``12GiB``, bytes;
    None: the machine's available memory)."""

    layerwise: bool = option(
        False, panel=R, methods="score", help="Score and cut one layer at a time; automatic past --max-memory."
    )
    max_memory: str | None = option(
        None,
        metavar="SIZE",
        panel=R,
        methods="score",
        help="Memory headcut may use, e.g. 12GB (default: what is available).",
    )


@dataclass
class TrajectoryOptions:
    """Where ``prune`` writes the metric after every step (:func:`headcut.prune`'s keyword of the same name; its
    job turns it into :attr:`PruneConfig.trajectory`): ``trajectory``, a ``.csv`` path (a PNG beside it)."""

    trajectory: str | None = option(
        None,
        metavar="FILE.csv",
        panel=R,
        help="Per-step metric: FILE.csv and a PNG (--eval-data).",
    )


@dataclass
class MaskSource:
    """The mask ``export`` cuts to (:func:`headcut.export`'s ``mask``; the API also takes a mapping or a
    :class:`~headcut.model.masks.HeadMask`): ``mask``, a mask JSON file."""

    mask: str | None = option(
        None,
        metavar="MASK.json",
        panel=R,
        help='Mask JSON: {"keep": {block: [heads]}} or {"drop": ...} (a prune report\'s "mask" entry works too).',
    )
