"""The configurations of headcut's jobs, as plain dataclasses with defaults and validation.

They import nothing heavy (torch is imported only inside the checks that need it), so the command
line reads its defaults from here without loading torch. Every ``validate`` raises a one-line
:class:`~headcut.errors.HeadcutError` naming the flag and the valid values.

* :class:`ScoreConfig`: how ``headcut score`` (and the score-based methods) score heads.
* :class:`PruneConfig`: what every pruning method shares: the budget, units, GQA policy and seed.
  Each method's own options are a dataclass in its module (``headcut.pruning.<method>``).
* :class:`TrainConfig`: the one training configuration of ``finetune``, the learned-gate methods and
  every later training loop (:class:`FinetuneConfig` and the gate methods' options extend it).
* :class:`BenchConfig`: how ``headcut bench`` times models.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .catalog import (
    ABS_PER,
    ATTN_IMPLEMENTATIONS,
    DTYPE_NAMES,
    ENGINES,
    GNORM_PER,
    GQA_POLICIES,
    MODES,
    NORMALIZE,
    OBJECTIVES,
)
from .errors import HeadcutError, HeadcutTypeError, HeadcutValueError, Shown, ascii_whole
from .options import TRAINING_PANEL, OptionError, check_fields, option

#: ``headcut bench --runtime`` values (comma-separated: ``torch,onnxruntime`` times both)
BENCH_RUNTIMES = ("torch", "onnxruntime")

#: the epsilon of Greedy-Gnorm's rectified attention entropy (reference code: ``e = 0.0000001``)
DEFAULT_EPSILON = 1e-7


def _field(flag: str) -> str:
    """The field an option is named by (``--max-steps`` -> ``max_steps``; a field name stays)."""
    return flag.removeprefix("--").replace("-", "_").split(" ")[0]


def check_choice(flag: str, value: Any, valid: tuple[str, ...] | list[str]) -> None:
    """Refuse a value that is not one of ``valid`` (one line naming the option and the choices)."""
    if value not in valid:
        raise OptionError(
            "unknown {%s} {v!r}; choose one of {c}" % _field(flag), v=value, c=", ".join(str(v) for v in valid)
        )


def _count(flag: str, value: Any, low: int, high: int = 2**63 - 1) -> None:
    """An integer in [low, high] (by default up to torch's largest, a C ``long long``)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise OptionError("{%s} must be an integer >= %d (got {v!r})" % (_field(flag), low), v=value)
    if value > high:
        raise OptionError(
            "{%s} must be at most {h} (got {v!r})" % _field(flag), v=value, h="2**63 - 1" if high == 2**63 - 1 else high
        )


def _seed(flag: str, value: Any) -> None:
    """A seed torch's generators take: an integer in [-2**63, 2**64)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not -(2**63) <= value < 2**64:
        raise OptionError("{%s} must be an integer in [-2**63, 2**64) (got {v!r})" % _field(flag), v=value)


@dataclass
class ScoreConfig:
    """How to score heads.

    ``scorer``: a name in :data:`headcut.catalog.SCORERS`. ``normalize``: ``none`` or ``layer``
    (Michel et al. §4.1: divide each block's scores by their L2 norm). ``abs_per`` (gradient):
    ``example`` (Michel et al.: mean over examples of |dL_i/dg|) or ``batch`` (TextPruner: mean over
    batches of |dL_batch/dg|). ``objective`` (gnorm): ``logits-norm`` (Greedy-Gnorm's: the gradient of
    the L2 norm of the output logits, label-free) or ``loss`` (the task loss). ``per`` (gnorm): the
    gradient norms of every ``batch`` (the authors' code) or of every ``example`` (the paper's
    per-sentence description, eq. 9-16), averaged. ``seed`` (random). ``epsilon`` (entropy): the
    rectification constant."""

    scorer: str = "gradient"
    normalize: str = option(
        "none",
        choices=NORMALIZE,
        panel="Options",
        help="layer: divide each block's scores by their L2 norm (Michel et al. 4.1).",
    )
    abs_per: str = option(
        "example",
        choices=ABS_PER,
        panel="Options",
        help="gradient: |dL/dg| per example (Michel et al.) or of each batch's mean loss (TextPruner).",
    )
    objective: str = option(
        "logits-norm",
        choices=OBJECTIVES,
        panel="Options",
        help="gnorm: the gradient of the logits' L2 norm (label-free; the paper's) or of the task loss.",
    )
    per: str = option(
        "batch",
        choices=GNORM_PER,
        panel="Options",
        help="gnorm: the gradient norms of every batch (the authors' code) or of every example, averaged.",
    )
    seed: int = 0
    epsilon: float = option(
        DEFAULT_EPSILON,
        low=0,
        high=1,
        low_open=True,
        high_open=True,
        cli=False,
        help="entropy: the rectification constant.",
    )

    def validate(self) -> None:
        from .catalog import scorer_entry

        scorer_entry(self.scorer)
        check_fields(self)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: the --help section of the budget and cut options
B = "Budget and cut"


@dataclass
class PruneConfig:
    """What every pruning method shares.

    ``method``: a name in :data:`headcut.catalog.METHODS`. Budget: exactly one of ``keep`` (heads
    left) and ``sparsity`` (fraction removed: keep = floor((1 - s) * heads)), or ``max_drop`` (stop
    before the metric drops by more than this, in the metric's own units; score-based methods) with
    ``keep``/``sparsity`` optional as a floor. A method that decides the count itself (``auber``)
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
    gqa: str = option("auto", choices=GQA_POLICIES, metavar="POLICY", panel=B, help="Grouped-query attention policy.")
    via: int | None = option(
        None, low=1, metavar="K", panel=B, help="Score-based: cut to K first (refit, recovery), then to the budget."
    )
    seed: int = 0
    trajectory: bool = False

    def validate(self) -> None:
        """One-line errors for values that cannot work (the method name is checked by the registry)."""
        from .catalog import method_entry

        entry = method_entry(self.method)
        if self.keep is not None and self.sparsity is not None:
            raise OptionError("give one budget: {keep} or {sparsity}, not both")
        budget_given = self.keep is not None or self.sparsity is not None or self.max_drop is not None
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
        help="Passes over --data (default: finetune 3; learned gates "
        "3 joint, 1 pipelined; auber's final fine-tune at most 2).",
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
        help="Write the resume checkpoint every N steps (lottery writes one after every iteration instead).",
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
        from dataclasses import replace

        epochs = 3 if self.epochs is None and self.max_steps is None else self.epochs
        return replace(self, epochs=epochs, mode="joint")


@dataclass
class BenchConfig:
    """How to benchmark. ``dtype``/``attn_implementation`` None: the checkpoint's own. ``runtime``:
    ``torch``, ``onnxruntime`` or both comma-separated (one row per model and runtime). ``interleave``:
    time the models in rounds (one forward of each per round, the order rotated), every model in memory
    at once; False: one after the other (see :mod:`headcut.jobs.bench_run`)."""

    device: str = "cpu"
    batch_size: int = 8
    seq_len: int = 128
    runs: int = 20
    warmup: int = 3
    threads: int | None = None
    dtype: str | None = None
    attn_implementation: str | None = None
    gen_tokens: int = 32
    gen_runs: int = 3
    seed: int = 0
    runtime: str = "torch"
    interleave: bool = option(
        True,
        flag="--interleave/--no-interleave",
        panel="Options",
        help="Time the MODELs "
        "in rounds of one forward (and generation) of each, the order rotated each round (the "
        "default); this holds every MODEL in memory at once. --no-interleave times one MODEL "
        "after the other, one in memory at a time: back to back, the speed-ups are not "
        "comparable under a changing load.",
    )

    def runtimes(self) -> tuple[str, ...]:
        """The runtimes of ``runtime`` in a stable order (torch first); one-line errors."""
        parts = [p.strip().lower() for p in str(self.runtime).split(",") if p.strip()]
        unknown = [p for p in parts if p not in BENCH_RUNTIMES]
        if not parts or unknown:
            raise HeadcutValueError(
                f"unknown --runtime {(unknown or [self.runtime])[0]!r}; choose "
                f"{', '.join(BENCH_RUNTIMES)} or both comma-separated (torch,onnxruntime)"
            )
        return tuple(r for r in BENCH_RUNTIMES if r in parts)

    def validate(self) -> list[str]:
        """Refuse impossible settings (one-line HeadcutError); return warnings for doubtful ones."""
        for name, low in (
            ("batch_size", 1),
            ("seq_len", 1),
            ("runs", 1),
            ("warmup", 0),
            ("gen_tokens", 0),
            ("gen_runs", 1),
        ):
            _count(f"--{name.replace('_', '-')}", getattr(self, name), low)
        if self.threads is not None:
            # more threads than CPUs only slows the timing down; many more make OpenMP abort the process
            _count("--threads", self.threads, 1, os.cpu_count() or 2**31 - 1)
        check_fields(self, ("interleave",))
        if self.dtype is not None:
            check_choice("--dtype", self.dtype, DTYPE_NAMES)
        if self.attn_implementation is not None:
            check_choice("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        from .devices import check_device

        check_device(self.device, auto=False)
        if "onnxruntime" in self.runtimes():
            self._check_onnxruntime()
        notes = []
        if self.device == "cpu" and self.dtype == "float16":
            notes.append("float16 on CPU is often much slower than float32 and some kernels lack it")
        return notes

    def _check_onnxruntime(self) -> None:
        from .extras import imported

        hint = "pip install 'headcut[onnx]' (onnx, onnxscript, onnxruntime)"
        try:
            onnxruntime = imported(
                "onnxruntime", "--runtime onnxruntime", hint, missing=f"--runtime onnxruntime needs onnxruntime: {hint}"
            )
        except HeadcutError as exc:
            raise HeadcutValueError(Exception.__str__(exc)) from None
        if self.device.startswith("cuda"):
            providers = onnxruntime.get_available_providers()
            if "CUDAExecutionProvider" not in providers:
                raise HeadcutValueError(
                    f"--runtime onnxruntime --device {self.device} needs onnxruntime's CUDAExecutionProvider; this "
                    f"onnxruntime {onnxruntime.__version__} has {', '.join(providers)}: pip install onnxruntime-gpu"
                )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: ``--lm-eval default``: the seven zero-shot tasks the pruning papers report (LLM-Pruner, FLAP, SliceGPT, Wanda ...)
LM_EVAL_DEFAULT = ("boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")
#: the most digits of a ``--windows`` length (longer than any model's positions)
WINDOW_DIGITS = 9
WINDOWS_RULE = (
    "{windows} takes window lengths of at least 2 tokens (and at most %d) in ASCII digits, "
    "comma-separated (e.g. 128,2048); got {v!r}" % (10**WINDOW_DIGITS - 1)
)
#: the --help sections of ``headcut eval``'s own options
PERPLEXITY_PANEL = "Perplexity"
LM_EVAL_PANEL = "lm-evaluation-harness (extra \\[lm-eval])"


@dataclass
class EvalOptions:
    """What ``headcut eval`` (:func:`headcut.evaluate`) measures besides the task metric of ``--data``.

    ``windows``: causal-LM perplexity as the pruning papers measure it, one result per window length
    (``"128,2048"``): the whole text of the data (a table's or a ``datasets`` split's text rows joined by blank
    lines, as wikitext-2 is read) tokenized once and cut into non-overlapping windows of that many tokens
    (:mod:`headcut.data.windows`). ``lm_eval``: lm-evaluation-harness tasks, comma-separated (``default``: the
    seven of :data:`LM_EVAL_DEFAULT`), run on the loaded model (:mod:`headcut.model.harness`), with
    ``lm_eval_include`` (a folder of custom task YAML files), ``lm_eval_fewshot``, ``lm_eval_limit`` and
    ``lm_eval_batch_size``. ``device``: where the evaluation runs (None: where the model is)."""

    windows: str | None = option(
        None,
        metavar="N[,N...]",
        panel=PERPLEXITY_PANEL,
        help="Causal LM: perplexity over "
        "non-overlapping N-token windows of the whole --data text (rows joined by blank "
        "lines), one result per N; 128,2048 gives both conventions of the pruning papers.",
    )
    lm_eval: str | None = option(
        None,
        metavar="TASKS",
        panel=LM_EVAL_PANEL,
        help="Run lm-evaluation-harness tasks "
        "(comma-separated) on the model; 'default': boolq, piqa, hellaswag, winogrande, "
        "arc_easy, arc_challenge, openbookqa, the pruning papers' zero-shot seven (their "
        "datasets come from the Hub).",
    )
    lm_eval_include: str | None = option(
        None,
        metavar="DIR",
        panel=LM_EVAL_PANEL,
        help="A folder of custom task YAML files, found beside the harness's own tasks.",
    )
    lm_eval_fewshot: int | None = option(
        None,
        low=0,
        metavar="N",
        panel=LM_EVAL_PANEL,
        help="Few-shot examples per task; default: each task's own (0 for the seven).",
    )
    lm_eval_limit: int | None = option(
        None,
        low=1,
        metavar="N",
        panel=LM_EVAL_PANEL,
        help="At most N examples per task (a quick look: the papers use them all).",
    )
    lm_eval_batch_size: int = option(
        8, low=1, metavar="N", panel=LM_EVAL_PANEL, help="Requests per forward in the harness."
    )
    device: str | None = option(
        None,
        metavar="DEVICE",
        panel="Options",
        help="Evaluate on this device: auto (CUDA "
        "when available), cpu, cuda, cuda:N or mps; default: where the model is loaded (the "
        "CPU).",
    )

    def window_sizes(self) -> tuple[int, ...]:
        """The window lengths of ``windows`` in the order given, each once; one-line errors."""
        if self.windows is None:
            return ()
        sizes: list[int] = []
        for part in str(self.windows).split(","):
            size = ascii_whole(part.strip(), WINDOW_DIGITS)
            if size is None or size < 2:
                raise OptionError(WINDOWS_RULE, v=Shown(self.windows))
            if size not in sizes:
                sizes.append(size)
        return tuple(sizes)

    def task_names(self) -> tuple[str, ...]:
        """The harness tasks of ``lm_eval`` in the order given, ``default`` spelled out, each once."""
        if self.lm_eval is None:
            return ()
        names: list[str] = []
        for part in str(self.lm_eval).split(","):
            name = part.strip()
            for one in LM_EVAL_DEFAULT if name == "default" else (name,):
                if one and one not in names:
                    names.append(one)
        if not names:
            raise OptionError("{lm_eval} names no task; give task names, comma-separated, or 'default'")
        return tuple(names)

    def validate(self) -> None:
        """One-line errors (naming the options) for values that cannot work; reads nothing but the include folder."""
        check_fields(self)
        self.window_sizes()
        self.task_names()
        if self.lm_eval is None:
            alone = [
                name
                for name in ("lm_eval_include", "lm_eval_fewshot", "lm_eval_limit")
                if getattr(self, name) is not None
            ]
            if self.lm_eval_batch_size != EvalOptions.lm_eval_batch_size:
                alone.append("lm_eval_batch_size")
            if alone:
                raise OptionError("{%s} applies to {lm_eval} TASKS" % alone[0])
        if self.lm_eval_include is not None:
            folder = os.path.expanduser(self.lm_eval_include)
            if not os.path.isdir(folder):
                raise OptionError(
                    "{lm_eval_include} {p}: not a folder (give the folder of the task YAML files)",
                    p=self.lm_eval_include,
                )
        if self.device is not None:
            from .devices import check_device

            check_device(self.device)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def eval_options(given: Mapping[str, Any]) -> EvalOptions:
    """The :class:`EvalOptions` of :func:`headcut.evaluate`'s keyword options, validated: ``windows`` also as an
    int or a list of ints (``[128, 2048]``), ``lm_eval`` also as a list of task names; an unknown name is a
    :class:`~headcut.errors.HeadcutTypeError` listing the options."""
    known = [f.name for f in fields(EvalOptions)]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise HeadcutTypeError(f"evaluate() got an unknown option {unknown[0]!r}; its options: {', '.join(known)}")
    values = dict(given)
    windows = values.get("windows")
    whole = [windows] if isinstance(windows, numbers.Integral) else windows
    if (
        isinstance(whole, (list, tuple))
        and whole
        and all(isinstance(w, numbers.Integral) and not isinstance(w, bool) for w in whole)
    ):
        for w in whole:
            if abs(int(w)) >= 10**WINDOW_DIGITS:  # window_sizes refuses the rest; str() of a long one fails
                raise OptionError(WINDOWS_RULE, v=Shown(w))
        values["windows"] = ",".join(str(int(w)) for w in whole)
    tasks = values.get("lm_eval")
    if isinstance(tasks, (list, tuple)) and all(isinstance(t, str) for t in tasks):
        values["lm_eval"] = ",".join(tasks)
    options = EvalOptions(**values)
    options.validate()
    return options


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
    messages are given, are :func:`headcut.jobs.request.prune_request`'s."""

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
class LayerwiseConfig:
    """Whether ``prune`` reads the checkpoint one layer at a time (:mod:`headcut.model.streamed`): ``layerwise``
    asks for it; it is also chosen when the checkpoint would not fit ``max_memory`` (``12GB``, ``12GiB``, bytes;
    None: the machine's available memory)."""

    layerwise: bool = option(False, panel=R, help="Score and cut one layer at a time; automatic past --max-memory.")
    max_memory: str | None = option(
        None, metavar="SIZE", panel=R, help="Memory headcut may use, e.g. 12GB (default: what is available)."
    )
