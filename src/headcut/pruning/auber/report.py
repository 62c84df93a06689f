"""AUBER's record (:mod:`headcut.pruning.auber`): the report's ``auber`` section (every layer, the final fine-tune)
and the end-of-run summary drawn from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...formatting import metric_text as _fmt
from .environment import REWARD_SCALE
from .split import SPLIT


@dataclass
class LayerRecord:
    """One processed layer: ``layer`` (its block names), the heads ``pruned`` (each block's numbering
    at the start), ``forced`` (heads the upper bound made the policy remove), the greedy ``path``
    (each action's heads, mini-dev metric and reward), the mini-dev metric ``before`` pruning,
    ``pruned_metric`` after it and ``tuned_metric`` after the fine-tune; the agent's ``episodes``,
    ``actions`` and distinct reward ``evaluations``; ``returns``: each episode's summed reward;
    ``replay``: layers replayed from the record (0: none; ``replay_note`` says why)."""

    layer: str
    blocks: list[str]
    units: int
    pruned: list[int]
    forced: int
    path: list[dict[str, Any]]
    before: float
    pruned_metric: float
    tuned_metric: float | None
    episodes: int
    actions: int
    evaluations: int
    returns: list[float]
    epsilon_end: float
    dqn_updates: int
    mini_train: int
    mini_dev: int
    reward_examples: int
    replay: int
    replay_note: str | None
    finetune_steps: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AuberRun:
    """AUBER's record (the report's ``auber`` section): the options used, the reward metric, every
    layer and the final fine-tune (steps, early stopping, examples)."""

    reward_metric: str
    higher_is_better: bool
    state: str
    episodes: int
    reverse: bool
    upper_bound: int | None
    reward_metric_why: str = ""
    layers: list[LayerRecord] = field(default_factory=list)
    final: dict[str, Any] | None = None
    seconds: float = 0.0
    #: distillation from the unpruned model (settings, teacher forwards, cache hits); None: the task loss
    distillation: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "distillation": self.distillation,
            "reward_metric": self.reward_metric,
            "reward_metric_why": self.reward_metric_why,
            "higher_is_better": self.higher_is_better,
            "state": self.state,
            "episodes": self.episodes,
            "reverse": self.reverse,
            "upper_bound": self.upper_bound,
            "reward_scale": REWARD_SCALE,
            "split": f"{SPLIT[0]}:{SPLIT[1]} (mini-train:mini-dev)",
            "layers": [layer.to_json() for layer in self.layers],
            "final": self.final,
            "seconds": self.seconds,
        }


def summary_items(auber: dict[str, Any]) -> list[Any]:
    """AUBER's layers (heads pruned, mini-dev metric before, pruned, fine-tuned) and its final fine-tune."""
    from rich import box
    from rich.table import Table

    name = auber["reward_metric"]
    table = Table(
        title=f"auber, layer by layer ({name} on mini-dev; {auber['episodes']} episodes per layer)", box=box.SIMPLE_HEAD
    )
    for col in ("layer", "pruned heads", "before", "pruned", "fine-tuned", "evaluations", "replayed", "seconds"):
        table.add_column(col, justify="left" if col in ("layer", "pruned heads") else "right")
    for layer in auber["layers"]:
        pruned = ",".join(map(str, layer["pruned"])) or "none"
        if layer["forced"]:
            pruned += f" ({layer['forced']} by the bound)"
        table.add_row(
            layer["layer"],
            pruned,
            _fmt(layer["before"]),
            _fmt(layer["pruned_metric"]),
            _fmt(layer["tuned_metric"]),
            str(layer["evaluations"]),
            f"{layer['replay']} layer{'s' if layer['replay'] != 1 else ''}" if layer["replay"] else "-",
            f"{layer['seconds']:.1f}",
        )
    out: list[Any] = [table]
    if auber.get("reward_metric_why"):
        out.append(f"reward: {name} ({auber['reward_metric_why']})")
    final = auber.get("final")
    if final is not None:
        stop = final["early_stopping"]
        how = (
            f"stopped early at step {stop['stopped_at']}"
            if stop["stopped_at"] is not None
            else f"ran all {final['steps']} steps"
        )
        out.append(
            f"final fine-tune on {final['examples']:,} examples: {how}; kept the weights of step "
            f"{stop['best_step']} ({name} {_fmt(stop['best'])} on {final['held_out']:,} held-out training "
            f"examples, {_fmt(final['start'])} before it)"
        )
    return out
