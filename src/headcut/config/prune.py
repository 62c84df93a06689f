"""What every pruning method shares (:class:`PruneConfig`: the budget, units, GQA policy and seed) and what
follows each cut (:class:`RecoveryConfig`), how the checkpoint is read (:class:`LayerwiseConfig`) or where the
per-step metric goes (:class:`TrajectoryOptions`). Each
method's own options are a dataclass in its module (``headcut.pruning.<method>``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..catalog import ALLOCATIONS, GQA_POLICIES, method_entry
from ..options import OptionError, check_fields, option

#: the --help section of the budget and cut options
B = "Budget and cut"


@dataclass
class PruneConfig:
    """What every pruning method shares.

    ``method``: a name in :data:`headcut.catalog.METHODS`. Budget: exactly one of ``keep`` (heads
    left) and ``sparsity`` (fraction removed: keep = floor((1 - s) * heads)), or ``max_drop`` (stop
    before the metric drops by more than this, in the metric's own units; score-based methods) with
    ``keep``/``sparsity`` optional as a floor, or ``kv_budget`` (the fraction of the KV-cache bytes kept at
    ``context`` tokens, the heads placed by ``allocation``: :mod:`headcut.pruning.costs`), or ``target_speedup``
    (the least such cut whose decoding at ``context`` tokens is that much faster, timed on the run's device:
    :mod:`headcut.jobs.prune.speed_target`). A method that decides the count itself (``auber``)
    needs none, and takes ``keep``/``sparsity`` as an upper bound on the heads kept. ``uniform``: the same
    number of heads in every block. ``min_heads_per_block``: never take a block below this. ``gqa``: the
    grouped-query policy (units and slimming). ``via``: cut in two rounds, to ``via`` heads and then to the
    budget, each round scored on the model the one before left (score-based methods). ``seed``: every random
    choice of the method. ``trajectory``: measure the metric after every step (score-based methods; needs
    evaluation data)."""

    method: str = "gradient"
    keep: int | None = option(None, low=0, metavar="K", panel=B, help="Heads to keep (exactly; auber: at most).")
    sparsity: float | None = option(
        None, low=0, high=1, metavar="S", panel=B, help="Fraction of heads to remove: K = floor((1 - S) x heads)."
    )
    max_drop: float | None = option(
        None, low=0, metavar="D", panel=B, help="Score-based: remove heads while the --eval-data metric stays within D."
    )
    uniform: bool = option(
        False,
        panel=B,
        help="Keep the same number of heads in every block (most decoders: a stock "
        "transformers checkpoint, no remote code).",
    )
    min_heads_per_block: int = option(0, low=0, metavar="M", panel=B, help="Never take a block below M heads.")
    gqa: str = option(
        "auto",
        choices=GQA_POLICIES,
        metavar="POLICY",
        panel=B,
        help="Grouped-query attention: group/auto (remove whole KV groups), uniform (equal query heads in every "
        "remaining group), duplicate (any query head; KV heads copied).",
    )
    via: int | None = option(
        None, low=1, metavar="K", panel=B, help="Score-based: cut to K first (refit, recovery), then to the budget."
    )
    kv_budget: float | None = option(
        None,
        low=0,
        high=1,
        low_open=True,
        metavar="F",
        panel=B,
        help="Keep at most fraction F of the KV-cache bytes at --context tokens.",
    )
    context: int | None = option(
        None,
        low=1,
        metavar="N",
        panel=B,
        help="Tokens --kv-budget/--target-speedup count at; default: the model's maximum.",
    )
    target_speedup: float | None = option(
        None,
        low=1,
        low_open=True,
        metavar="X",
        panel=B,
        help="Cut until decoding at --context on --device is X times faster, timed.",
    )
    allocation: str = option(
        "cost",
        choices=ALLOCATIONS,
        panel=B,
        help="--kv-budget: by score per byte saved (cost) or by score (count).",
    )
    seed: int = 0
    trajectory: bool = False

    def validate(self) -> None:
        """One-line errors for values that cannot work (the method name is checked by the registry)."""

        entry = method_entry(self.method)
        if self.keep is not None and self.sparsity is not None:
            raise OptionError("give one budget: {keep} or {sparsity}, not both")
        if self.kv_budget is not None:
            if entry.kind != "score":
                raise OptionError(
                    "{kv_budget} places the heads by their scores (a score-based method: headcut methods lists "
                    "them); %s keeps its own budget in heads ({keep} or {sparsity})" % self.method
                )
            if self.keep is not None or self.sparsity is not None or self.max_drop is not None:
                raise OptionError("give one budget: {kv_budget} (bytes) or {keep}, {sparsity} or {max_drop} (heads)")
            if self.via is not None or self.trajectory:
                raise OptionError("{kv_budget} cuts in one round: no {via} or {trajectory}")
        if self.target_speedup is not None:
            if entry.kind != "score":
                raise OptionError(
                    "{target_speedup} times cuts placed by their scores (a one-shot score-based method); %s keeps "
                    "its own budget in heads ({keep} or {sparsity})" % self.method
                )
            if any(v is not None for v in (self.keep, self.sparsity, self.max_drop, self.kv_budget)):
                raise OptionError(
                    "give one budget: {target_speedup} (speed) or {kv_budget}, {keep}, {sparsity} or {max_drop}"
                )
            if self.via is not None or self.trajectory:
                raise OptionError("{target_speedup} cuts in one round: no {via} or {trajectory}")
        if self.context is not None and self.kv_budget is None and self.target_speedup is None:
            raise OptionError(
                "{context} is the length {kv_budget} or {target_speedup} is counted at: give one of them too"
            )
        budget_given = self.keep is not None or self.sparsity is not None or self.max_drop is not None
        budget_given = budget_given or self.kv_budget is not None or self.target_speedup is not None
        if not budget_given and entry.budget == "required":
            raise OptionError("no budget: give {keep}, {sparsity} or {max_drop}")
        if self.via is not None and (self.max_drop is not None or self.trajectory):
            raise OptionError(
                "{via} cuts to a number of heads in two rounds: give {keep} or {sparsity}, not "
                "{max_drop} or {trajectory}"
            )
        if self.via is not None and self.keep is None and self.sparsity is None:
            raise OptionError("{via} needs the final budget: {keep} or {sparsity}")
        check_fields(self)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: the --help section the recovery and layer-wise options share with the command's own
R = "Options"


@dataclass
class RecoveryConfig:
    """What follows each round's cut (``prune``'s keywords of the same names): ``refit`` the kept heads' output
    projections by least squares to the unpruned model's outputs, then ``recover_steps`` steps of recovery
    fine-tuning distilled from the unpruned model (``finetune``'s loss and defaults), with ``recover_data``
    (unlabelled inputs: alpha 1; the API also takes rows or a :class:`~headcut.data.DataConfig`),
    ``recover_hidden_weight`` (hidden-state matching) and ``recover_average`` (stochastic weight averaging over
    that fraction of the last steps, at a constant learning rate). ``via_steps``: the recovery steps of every
    round before the last of a ``via`` schedule (None: ``recover_steps``). Their checks, in the order their
    messages are given, are :func:`headcut.jobs.prune.request.prune_request`'s."""

    recover_steps: int = option(
        0, low=0, metavar="N", panel=R, help="N distilled recovery steps on --data after the cut."
    )
    refit: bool = option(False, panel=R, help="Refit the output projections on --data after the cut.")
    recover_data: str | None = option(
        None, metavar="FILE|NAME[:CONFIG]", panel=R, help="Unlabelled text for --recover-steps (alpha 1)."
    )
    recover_hidden_weight: float = option(
        0.0, low=0, metavar="W", panel=R, help="Hidden-state matching weight in --recover-steps (0: off)."
    )
    recover_average: float = option(
        0.0, low=0, high=1, metavar="F", panel=R, help="SWA in --recover-steps: last F averaged, constant LR; 0: off."
    )
    via_steps: int | None = option(
        None, low=0, metavar="M", panel=R, help="--via's first-round recovery steps (default: --recover-steps)."
    )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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

    layerwise: bool = option(False, panel=R, help="Score and cut one layer at a time; automatic past --max-memory.")
    max_memory: str | None = option(
        None, metavar="SIZE", panel=R, help="Memory headcut may use, e.g. 12GB (default: what is available)."
    )


@dataclass
class TrajectoryOptions:
    """Where ``prune`` writes the metric after every step (:func:`headcut.prune`'s keyword of the same name; its
    job turns it into :attr:`PruneConfig.trajectory`): ``trajectory``, a ``.csv`` path (a PNG beside it)."""

    trajectory: str | None = option(
        None,
        metavar="FILE.csv",
        panel=R,
        help="Per-step metric to FILE.csv and a PNG (needs --eval-data).",
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
