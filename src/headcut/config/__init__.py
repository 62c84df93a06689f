"""The configurations of headcut's jobs, as plain dataclasses with defaults and validation, one module each.

They import nothing heavy (torch is imported only inside the checks that need it), so the command
line reads its defaults from here without loading torch. Every ``validate`` raises a one-line
:class:`~headcut.errors.HeadcutError` naming the flag and the valid values.

* :class:`ScoreConfig`: how ``headcut score`` (and the score-based methods) score heads (:class:`PlotOptions`:
  its heatmap).
* :class:`Budget` (a prune's budget), :class:`ScheduleOptions` (its rounds) and :class:`PruneConfig` (a method's cut
  as the pruning layer reads it). Each method's own options are a dataclass in its module
  (``headcut.pruning.<method>``), each stage's are its class's (:mod:`headcut.jobs.prune.stages`).
* :class:`TrainConfig`: the one training configuration of ``finetune``, the learned-gate methods and
  every later training loop (:class:`FinetuneConfig` and the gate methods' options extend it;
  :class:`FinetuneInputs`: ``finetune``'s teacher and new labels).
* :class:`BenchConfig`: how ``headcut bench`` times models (:class:`CardOptions`: what it writes besides).
* What several commands share (:mod:`headcut.config.run`): :class:`ModelSource` (``--task``, ``--allow-pickle``,
  ``--trust-remote-code``), :class:`DataSources` (``--data``, ``--eval-data``, ``--eval-split``),
  :class:`OutputSettings` (``--out``, ``--force``, ``--format``, ``--gguf-type``) and :class:`RunSettings`
  (``--seed``, ``--device``, ``--resume``).
"""

from __future__ import annotations

from .bench import BENCH_RUNTIMES, BenchConfig, CardOptions
from .evaluation import LM_EVAL_DEFAULT, EvalOptions, eval_options
from .prune import (
    Budget,
    LayerwiseConfig,
    MaskSource,
    PruneConfig,
    RecipeChoice,
    ScheduleOptions,
    TrajectoryOptions,
)
from .run import DataSources, ModelSource, OutputSettings, RunSettings
from .score import DEFAULT_EPSILON, PlotOptions, ScoreConfig
from .train import DistillOptions, FinetuneConfig, FinetuneInputs, TrainConfig

__all__ = [
    "BENCH_RUNTIMES",
    "BenchConfig",
    "Budget",
    "CardOptions",
    "DEFAULT_EPSILON",
    "DataSources",
    "DistillOptions",
    "EvalOptions",
    "FinetuneConfig",
    "FinetuneInputs",
    "LM_EVAL_DEFAULT",
    "LayerwiseConfig",
    "RecipeChoice",
    "MaskSource",
    "ModelSource",
    "OutputSettings",
    "PlotOptions",
    "PruneConfig",
    "RunSettings",
    "ScheduleOptions",
    "ScoreConfig",
    "TrainConfig",
    "TrajectoryOptions",
    "eval_options",
]
