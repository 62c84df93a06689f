"""AUBER's options (the method: :mod:`headcut.pruning.auber`); ``--help`` and completion read them from this source
without importing it."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import DistillOptions
from ...options import option

#: the state features (``state``): the paper's value-matrix L1 norm and its ablations
AUBER_STATES = ("value-l1", "query", "key", "value-l2")
#: metrics a reward may watch (``reward_metric``; accuracy, macro_f1 and mcc: classification)
REWARD_METRICS = ("accuracy", "macro_f1", "mcc", "loss")
#: mini-dev examples each reward is measured on, by default (the package's doc says why)
AUBER_REWARD_EXAMPLES = 128


@dataclass
class AuberOptions(DistillOptions):
    """AUBER's options (see the package's doc, :mod:`headcut.pruning.auber`). ``episodes``: per layer (150).
    ``reverse``: last layer first. ``state``: ``value-l1``, ``query``, ``key`` or ``value-l2``.
    ``reward_examples``: mini-dev examples the rewards are measured on (and held out for the final early
    stopping). ``reward_metric``: None (:func:`.split.reward_metric_for`: a classifier's accuracy on a whole
    mini-dev, else the loss), ``accuracy``, ``macro_f1``, ``mcc`` or ``loss``.
    ``allow_empty_layers``: the agent may prune a layer's last head. ``layer_epochs``: fine-tuning
    epochs on mini-train after each layer. ``patience``: evaluations without improvement that stop the
    final fine-tune. The training fields: ``lr`` (2e-6) for both fine-tunes; ``epochs``/``max_steps``
    bound the final fine-tune (default 2 epochs); ``warmup_steps``, ``grad_accum``. ``alpha``/``temperature``:
    both fine-tunes distil from the unpruned model (:class:`headcut.config.DistillOptions`; 0: the paper's
    task loss)."""

    episodes: int = option(150, low=1, help="DQN episodes per layer (the paper's 150).")
    reverse: bool = option(False, help="Process the last layer first (the paper's AUBER-Reverse ablation).")
    state: str = option(
        "value-l1",
        choices=AUBER_STATES,
        help="The state feature: the L1 norm of each head's value "
        "matrix (the paper's), or the query, key or value L2 ablations.",
    )
    reward_examples: int = option(AUBER_REWARD_EXAMPLES, low=2, help="Mini-dev examples each reward is measured on.")
    reward_metric: str | None = option(
        None,
        choices=REWARD_METRICS,
        help="The metric the reward is the change of "
        "(default: a classifier's accuracy when the rewards see all of mini-dev, as in "
        "the paper, else its loss; the loss for language models).",
    )
    allow_empty_layers: bool = option(False, help="Let the agent prune a layer's last head (by default one stays).")
    layer_epochs: int = option(1, low=0, help="Fine-tuning epochs on mini-train after each layer (0: none).")
    patience: int = option(20, low=1, help="Evaluations without improvement that stop the final fine-tune.")
    lr: float = 2e-6

    #: fields the prune run sets itself, or that AUBER does not use
    HIDDEN = ("seed", "shuffle", "mode", "gate_lr", "eval_every", "checkpoint_every", "gates_first")
