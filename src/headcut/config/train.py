"""How to train: :class:`TrainConfig`, the one training configuration of ``finetune``, the learned-gate methods
and every later training loop; :class:`DistillOptions` (a training method's distillation) and
:class:`FinetuneConfig` extend it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..catalog import ENGINES, MODES
from ..options import TRAINING_PANEL, OptionError, check_fields, option
from .checks import _seed

T = TRAINING_PANEL


@dataclass
class TrainConfig:
    """How to train: the one training configuration of ``finetune``, the learned-gate methods and the
    later training loops (each extends it with its own fields and resolves its own defaults).

    ``epochs`` / ``max_steps``: at most one (optimizer steps; neither: the caller's default, e.g.
    ``finetune``'s 3 epochs). ``lr``: model parameters (AdamW); ``gate_lr``: gate tensors (None: the
    method's paper value). ``warmup_steps`` or ``warmup_ratio`` (of the total steps; not both).
    ``schedule``: ``linear`` (warmup, then linear decay towards 0) or ``constant``. ``grad_accum``:
    batches per optimizer step. ``max_grad_norm``: clipping per parameter group (None: off).
    ``eval_every`` / ``checkpoint_every``: in optimizer steps. ``seed``: batch order, dropout and
    sampling. ``mode``: ``joint`` (model and gates trained) or ``pipelined`` (model frozen, gates
    only); None: the method's default. ``gates_first``: see the field."""

    epochs: int | None = option(
        None,
        low=1,
        panel=T,
        help="Passes over --data (default: finetune 3; learned gates 3 joint, 1 pipelined; auber at most 2).",
    )
    max_steps: int | None = option(
        None,
        low=1,
        panel=T,
        help="Optimizer steps in all (instead of --epochs; "
        "lottery: the most its convergence may take, default 15 x --prune-every).",
    )
    lr: float = option(
        5e-5,
        low=0,
        low_open=True,
        metavar="LR",
        panel=T,
        help="Peak learning rate of the model's weights (AdamW, linear decay).",
    )
    gate_lr: float | None = option(
        None, low=0, low_open=True, metavar="LR", help="Learned gates: the gates' learning rate (default: the paper's)."
    )
    weight_decay: float = option(0.0, low=0, cli=False, help="AdamW weight decay.")
    warmup_steps: int = option(0, low=0, panel=T, help="Linear warmup steps.")
    warmup_ratio: float | None = option(
        None,
        low=0,
        high=1,
        high_open=True,
        cli=False,
        help="Warmup as a fraction of the steps (instead of warmup_steps).",
    )
    schedule: str = option(
        "linear", choices=("linear", "constant"), cli=False, help="Learning-rate schedule after warmup."
    )
    grad_accum: int = option(1, low=1, panel=T, help="Batches per optimizer step.")
    #: stochastic weight averaging (Izmailov et al. 2018): the model's weights at the end are the mean of its
    #: weights after each of the last ``average_last`` x steps (0: off, the last step's weights)
    average_last: float = option(
        0.0, low=0, high=1, cli=False, help="Average the model's weights over the last fraction F of the steps; 0: off."
    )
    max_grad_norm: float | None = option(
        1.0, low=0, low_open=True, cli=False, help="Gradient clipping per parameter group (None: off)."
    )
    eval_every: int | None = option(
        None,
        low=1,
        panel=T,
        help="Evaluate --eval-data every N steps (lottery's convergence: default --prune-every / 2).",
    )
    checkpoint_every: int | None = option(
        100,
        low=1,
        panel=T,
        help="Write the resume checkpoint every N steps (lottery: after every iteration).",
    )
    seed: int = 0
    shuffle: bool = option(True, cli=False, help="Shuffle the batches every epoch.")
    mode: str | None = option(
        "joint",
        choices=MODES,
        help="Learned gates: joint (train the model with the gates) or pipelined (frozen model).",
    )
    #: ``joint`` training with gates: the model's weights stay fixed for the first N steps (the gates
    #: learn alone, as in ``pipelined``), then train with the gates (``--gates-first``; 0: joint from the start)
    gates_first: int = option(
        0,
        low=0,
        help="Learned gates, joint mode: the model's weights stay fixed for the "
        "first N steps (the gates learn alone); 0: joint from the start.",
    )

    engine: str = option(
        "auto",
        choices=ENGINES,
        panel=T,
        help="Several processes: ddp, or fsdp (weights, gradients, "
        "optimizer state sharded); auto: fsdp under accelerate --use_fsdp.",
    )

    def validate(self) -> None:
        if self.epochs is not None and self.max_steps is not None:
            raise OptionError("give {epochs} or {max_steps}, not both")
        check_fields(self)
        if self.warmup_ratio is not None and self.warmup_steps:
            raise OptionError("give {warmup_steps} or {warmup_ratio}, not both")
        _seed("seed", self.seed)

    def total_steps(self, num_batches: int) -> int:
        """Optimizer steps of the run over ``num_batches`` batches per epoch."""
        if self.max_steps is not None:
            return self.max_steps
        if self.epochs is None:
            raise OptionError("give {epochs} or {max_steps}")
        steps = self.epochs * num_batches // self.grad_accum
        if steps < 1:
            raise OptionError(
                "{epochs}=%d over %d batch(es) makes no optimizer step with {grad_accum}=%d"
                % (self.epochs, num_batches, self.grad_accum)
            )
        return steps

    def warmup(self, total: int) -> int:
        if self.warmup_ratio is not None:
            return math.ceil(self.warmup_ratio * total)
        return self.warmup_steps

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DistillOptions(TrainConfig):
    """The options of a pruning method that trains (learned gates, lottery, AUBER), with distillation from the
    unpruned model (``--alpha``, ``--temperature``): the loss is ``(1 - alpha) * task + alpha * T^2 *
    KL(teacher / T || model / T)`` (plus the method's own terms), the teacher a frozen copy of the model as the
    method received it (:func:`headcut.training.finetuning.unpruned_teacher`); ``alpha`` 0 (the default): the paper's
    task loss alone."""

    alpha: float = option(
        0.0,
        low=0,
        high=1,
        metavar="A",
        help="Weight in [0, 1] of distillation from the unpruned "
        "model (logit KL at --temperature) in every step; 0: the paper's task loss.",
    )
    temperature: float = option(2.0, low=0, low_open=True, metavar="T", help="Distillation temperature with --alpha.")


@dataclass
class FinetuneConfig(TrainConfig):
    """How ``finetune`` trains: a :class:`TrainConfig` (default: 3 epochs at lr 5e-5) plus distillation.

    ``alpha``: weight of the distillation term (0: task loss only, 1: distillation only);
    ``temperature``: softmax temperature of the distillation term; both need a teacher. ``alpha=0.5``
    and ``temperature=2.0`` are the usual distillation defaults (Hinton et al., 2015)."""

    alpha: float = option(
        0.5,
        low=0,
        high=1,
        metavar="A",
        help="Weight of the distillation loss (0: task loss only, 1: distillation only); needs --distill-from.",
    )
    temperature: float = option(
        2.0, low=0, low_open=True, metavar="T", help="Softmax temperature of the distillation loss."
    )
    #: weight of hidden-state matching to the teacher (:func:`headcut.training.finetuning.hidden_matching`); 0: off
    hidden_weight: float = option(
        0.0, low=0, metavar="W", help="Weight of hidden-state matching to the teacher (needs --distill-from); 0: off."
    )
    #: MixKD's Beta(a, a) mixing of pairs of examples' input embeddings, a distillation term on them
    #: (:meth:`headcut.training.finetuning.DistillationLoss.mixed_kl`); 0: off
    mixup: float = option(
        0.0,
        low=0,
        metavar="A",
        help="Also distil on pairs of the batch's examples mixed in the "
        "embedding space, weights from Beta(A, A) (MixKD; needs --distill-from, classifiers); 0: off.",
    )
    #: early stopping: stop after this many evaluations (every ``eval_every`` steps) without a better eval
    #: metric and keep the best weights; None: train to the end
    patience: int | None = option(
        None,
        low=1,
        help="Early stopping: stop after N evaluations without a better "
        "--eval-data metric and keep the best weights (needs --eval-every).",
    )

    HIDDEN = ("mode", "gate_lr", "gates_first")

    def validate(self) -> None:
        super().validate()
        if self.patience is not None and self.eval_every is None:
            raise OptionError("{patience} needs {eval_every} N (and {eval_data}): it counts evaluations")

    def resolved(self) -> FinetuneConfig:
        """The config with its defaults filled in (3 epochs when neither epochs nor max_steps is set)."""

        epochs = 3 if self.epochs is None and self.max_steps is None else self.epochs
        return replace(self, epochs=epochs, mode="joint")


@dataclass
class FinetuneInputs:
    """What ``finetune`` takes besides its data and :class:`FinetuneConfig` (:func:`headcut.finetune`'s
    keywords): ``teacher`` (``--distill-from``), the checkpoint to distil from; ``labels``, the classes of a new
    classification head (the command line: comma-separated; the API: a list)."""

    teacher: str | None = option(
        None,
        flag="--distill-from",
        metavar="TEACHER",
        panel="Options",
        complete="folders",
        help="Teacher checkpoint (same vocabulary or labels): distil its outputs.",
    )
    labels: str | None = option(
        None,
        metavar="NAME,NAME,...",
        panel="Options",
        help="The classes of a new classification head (with --task sequence-classification on a checkpoint "
        "without one): train a classifier from a base encoder.",
    )
