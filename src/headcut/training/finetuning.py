"""Recovery fine-tuning of a (possibly slimmed) model, optionally distilled from a teacher.

The model keeps its structure (heads are neither added nor removed); it is trained with the shared
engine (:class:`headcut.training.engine.Trainer`, ``joint`` mode, no gates), so steps, gradient
accumulation, warmup, evaluation every N steps, checkpoints and exact resume work as documented there.

**Loss.** Without a teacher: the model's own task loss (``model(**batch).loss``). With a teacher
(knowledge distillation, Hinton et al. 2015)::

    loss = alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * task loss

The KL is averaged over the positions that carry labels: for token-level tasks every position whose
label is not -100 (for a causal LM, the logits that predict those labels, i.e. shifted by one); for
classification, every example. The ``T^2`` factor keeps the gradient scale of the soft term
independent of ``T``. ``alpha=0.5`` and ``temperature=2.0`` are the usual distillation defaults.
The teacher runs in eval mode under ``torch.no_grad`` and must have the same output size (vocabulary
or labels) as the student.
"""

from __future__ import annotations

import copy
import hashlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..config import FinetuneConfig
from ..data import Calibration
from ..errors import HeadcutError
from ..model.evaluation import PRIMARY, evaluate
from .distributed import Dist
from .early_stopping import EarlyStopping
from .engine import Trainer
from .steps import ProgressFn


@dataclass
class FinetuneResult:
    """``history``: one dict per optimizer step (``loss``, ``task_loss``, ``kl`` with a teacher, ``lr``,
    ``grad_norm``, ``eval`` every ``eval_every`` steps); ``metric``: the primary metric of the eval data
    (None without it); ``metric_before`` / ``metric_after``: its value before and after training;
    ``steps``: optimizer steps in all (a resumed run counts the steps before the resume);
    ``seconds``: wall time of this call."""

    config: FinetuneConfig
    task: str
    steps: int
    history: list[dict[str, Any]] = field(default_factory=list)
    distilled: bool = False
    metric: str | None = None
    higher_is_better: bool | None = None
    metric_before: float | None = None
    metric_after: float | None = None
    eval_before: dict[str, float] | None = None
    eval_after: dict[str, float] | None = None
    resumed_from: int | None = None
    seconds: float = 0.0
    distributed: dict[str, Any] | None = None
    #: with ``patience``: the best evaluation, its step, and where the run stopped
    early_stopping: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """The first and last steps' losses (a short view of the history)."""
        if not self.history:
            return {"steps": self.steps}
        keys = ("loss", "task_loss", "kl")
        first, last = self.history[0], self.history[-1]
        return {
            "steps": self.steps,
            "first": {k: first[k] for k in keys if k in first},
            "last": {k: last[k] for k in keys if k in last},
            "evals": [{"step": e["step"], **e["eval"]} for e in self.history if "eval" in e],
        }

    def to_json(self) -> dict[str, Any]:
        change = None
        if self.metric_before is not None and self.metric_after is not None:
            change = self.metric_after - self.metric_before
        return {
            "task": self.task,
            "steps": self.steps,
            "distilled": self.distilled,
            "resumed_from": self.resumed_from,
            "metric": None
            if self.metric is None
            else {
                "name": self.metric,
                "higher_is_better": self.higher_is_better,
                "before": self.metric_before,
                "after": self.metric_after,
                "change": change,
            },
            "eval_before": self.eval_before,
            "eval_after": self.eval_after,
            "config": self.config.to_json(),
            "summary": self.summary(),
            "history": self.history,
            "seconds": self.seconds,
            "distributed": self.distributed,
            "early_stopping": self.early_stopping,
        }


def _scored(task: str, logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
    """The logits of the positions that carry labels, as rows ``(N, C)``."""
    if task == "classification" or logits.dim() == 2:
        return logits.reshape(-1, logits.shape[-1])
    if labels is None:
        return logits.reshape(-1, logits.shape[-1])
    if task == "causal-lm":
        logits, labels = logits[:, :-1], labels[:, 1:]
    return logits[labels != -100]


def distillation_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    task: str,
    labels: torch.Tensor | None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``KL(softmax(teacher / T) || softmax(student / T))`` averaged over the positions that carry
    labels (classification: examples). Not multiplied by ``T^2``."""
    if student_logits.shape[-1] != teacher_logits.shape[-1]:
        raise HeadcutError(
            f"the teacher's outputs have {teacher_logits.shape[-1]} classes/tokens, the model's {student_logits.shape[-1]}: "
            "the teacher needs the same vocabulary or labels"
        )
    s = _scored(task, student_logits, labels).float() / temperature
    t = _scored(task, teacher_logits, labels).float() / temperature
    if s.shape[0] == 0:
        return student_logits.sum() * 0.0
    return F.kl_div(F.log_softmax(s, dim=-1), F.log_softmax(t, dim=-1), log_target=True, reduction="batchmean")


def _device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _on(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _teacher_inputs(batch: dict[str, Any], task: str, device: torch.device) -> dict[str, Any]:
    """The teacher's inputs: the batch without labels (seq2seq keeps them: they give the decoder inputs)."""
    return _on({k: v for k, v in batch.items() if task == "seq2seq" or k != "labels"}, device)


def check_teacher(model: nn.Module, teacher: nn.Module, calibration: Calibration) -> None:
    """Refuse a teacher whose output size differs from the model's (one forward of the first batch)."""
    batch = calibration.batches[0]
    was = model.training, teacher.training
    model.eval()
    teacher.eval()
    try:
        with torch.no_grad():
            s = model(**_on(batch, _device(model))).logits
            t = teacher(**_teacher_inputs(batch, calibration.task, _device(teacher))).logits
    finally:
        model.train(was[0])
        teacher.train(was[1])
    if s.shape[-1] != t.shape[-1]:
        what = "labels" if calibration.task == "classification" else "vocabulary entries"
        raise HeadcutError(
            f"the teacher has {t.shape[-1]} {what}, the model {s.shape[-1]}: the teacher needs the same "
            f"{'labels' if calibration.task == 'classification' else 'vocabulary'}"
        )
    if s.shape[:-1] != t.shape[:-1]:
        raise HeadcutError(f"the teacher's outputs have shape {tuple(t.shape)}, the model's {tuple(s.shape)}")


def kl_to_teacher(model: nn.Module, teacher: nn.Module, calibration: Calibration, temperature: float = 1.0) -> float:
    """Mean (over scored positions, token-weighted over the data) of ``KL(teacher || model)`` on
    ``calibration``'s batches, both models in eval mode under ``torch.no_grad``."""
    was = model.training, teacher.training
    model.eval()
    teacher.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            for batch in calibration.batches:
                s = model(**_on(batch, _device(model))).logits
                t = teacher(**_teacher_inputs(batch, calibration.task, _device(teacher))).logits.to(s.device)
                labels = batch.get("labels")
                labels = labels.to(s.device) if isinstance(labels, torch.Tensor) else None
                n = _scored(calibration.task, s, labels).shape[0]
                total += float(distillation_kl(s, t, calibration.task, labels, temperature)) * n
                count += n
    finally:
        model.train(was[0])
        teacher.train(was[1])
    return total / max(count, 1)


def frozen_teacher(model: nn.Module) -> nn.Module:
    """A frozen copy of ``model`` as it is now (the unpruned teacher of a distillation term)."""
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


class TeacherCache:
    """A frozen teacher's logits per batch, computed once per distinct batch and kept while they fit in
    ``budget_bytes`` (a classifier's logits always do; a language model's are recomputed once the budget
    is spent), so data seen again (a second epoch) costs no second teacher forward. Batches are told
    apart by the bytes of their inputs."""

    def __init__(self, teacher: nn.Module, task: str, budget_bytes: int = 256 << 20) -> None:
        self.teacher, self.task, self.budget = teacher, task, budget_bytes
        self.cache: dict[bytes, torch.Tensor] = {}
        self.bytes = 0
        self.forwards = 0
        self.hits = 0

    @staticmethod
    def key(batch: dict[str, Any]) -> bytes:
        digest = hashlib.blake2b(digest_size=16)
        for name in sorted(batch):
            value = batch[name]
            if isinstance(value, torch.Tensor):
                digest.update(name.encode())
                digest.update(str(tuple(value.shape)).encode())
                digest.update(value.detach().cpu().contiguous().numpy().tobytes())
        return digest.digest()

    def logits(self, batch: dict[str, Any]) -> torch.Tensor:
        key = self.key(batch)
        hit = self.cache.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        with torch.no_grad():
            out = self.teacher(**_teacher_inputs(batch, self.task, _device(self.teacher))).logits.detach()
        self.forwards += 1
        size = out.numel() * out.element_size()
        if self.bytes + size <= self.budget:
            self.cache[key] = out
            self.bytes += size
        return out

    def with_hidden(self, batch: dict[str, Any]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The teacher's logits and hidden states of ``batch`` (one forward, not cached: hidden states are
        too large to keep for a whole epoch)."""
        with torch.no_grad():
            out = self.teacher(**_teacher_inputs(batch, self.task, _device(self.teacher)), output_hidden_states=True)
        self.forwards += 1
        return out.logits.detach(), [h.detach() for h in _hidden_states(out)]

    def stats(self) -> dict[str, int]:
        """Teacher forwards, cache hits and cached bytes (the report's ``distillation`` entry)."""
        return {"teacher_forwards": self.forwards, "cache_hits": self.hits, "cached_bytes": self.bytes}


def _hidden_states(out: Any) -> list[torch.Tensor]:
    """Every hidden state a forward with ``output_hidden_states=True`` returned (encoder, then decoder)."""
    states: list[torch.Tensor] = []
    for name in ("hidden_states", "encoder_hidden_states", "decoder_hidden_states"):
        value = getattr(out, name, None)
        if value is not None:
            states += list(value)
    if not states:
        raise HeadcutError("the model returns no hidden states: hidden-state matching needs output_hidden_states")
    return states


def hidden_matching(
    student: list[torch.Tensor], teacher: list[torch.Tensor], mask: torch.Tensor | None
) -> torch.Tensor:
    """Hidden-state matching (the layer distillation of TinyBERT, Jiao et al. 2020, eq. 7, made relative):
    the mean over layers of ``||h_s - h_t||^2 / ||h_t||^2`` over the real (unpadded) positions, so the term is
    1 when the student's states are 0 and does not depend on the hidden size or the states' scale.
    Removing heads keeps every layer and its width, so the student's layer l matches the teacher's."""
    if len(student) != len(teacher):
        raise HeadcutError(f"the teacher has {len(teacher)} hidden states, the model {len(student)}")
    terms = []
    for s, t in zip(student, teacher, strict=True):
        s, t = s.float(), t.to(s.device).float()
        if mask is not None and mask.shape == s.shape[:2]:
            keep = mask.to(s.device).bool()
            s, t = s[keep], t[keep]
        terms.append((s - t).pow(2).sum() / t.pow(2).sum().clamp_min(1e-12))
    return torch.stack(terms).mean()


class DistillationLoss:
    """The Trainer ``loss_fn`` of every training loop that learns from a teacher (``finetune``, recovery, the
    lottery's and AUBER's fine-tuning): with no teacher the task loss; with one, the distillation loss of the
    module's doc, the teacher's logits through one :class:`TeacherCache` for the whole run (data seen again,
    e.g. the lottery's rewound iterations, costs no second teacher forward). ``hidden_weight`` > 0 adds that
    weight times :func:`hidden_matching` (the teacher then runs on every step: its hidden states are not
    cached). A batch without ``labels`` (unlabelled inputs, :func:`headcut.data.load_calibration`'s
    ``unlabelled``) is learnt from the teacher alone: ``T^2 KL`` (+ the hidden term), whatever ``alpha``."""

    def __init__(
        self,
        task: str,
        teacher: nn.Module | None,
        alpha: float,
        temperature: float,
        hidden_weight: float = 0.0,
        mixup: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.task, self.alpha, self.temperature, self.hidden_weight = task, alpha, temperature, hidden_weight
        self.mixup, self.seed = mixup, seed
        if mixup and task != "classification":
            raise HeadcutError(f"mixup distillation mixes whole examples: it needs a sequence classifier, not {task}")
        self.cache = TeacherCache(teacher, task) if teacher is not None else None

    def __call__(self, model: nn.Module, batch: dict[str, Any], step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        hidden_weight = self.hidden_weight if self.cache is not None else 0.0
        out = model(**batch, **({"output_hidden_states": True} if hidden_weight else {}))
        task_loss = getattr(out, "loss", None)
        if task_loss is None and (self.cache is None or "labels" in batch):
            raise HeadcutError(
                "the model returned no loss: the training data needs labels (inputs without labels "
                "can only be distilled from a teacher)"
            )
        logs: dict[str, Any] = {"task_loss": task_loss.detach()} if task_loss is not None else {}
        if self.cache is None:
            return task_loss, logs
        if hidden_weight:
            t_logits, t_hidden = self.cache.with_hidden(batch)
        else:
            t_logits, t_hidden = self.cache.logits(batch), None
        kl = distillation_kl(
            out.logits, t_logits.to(out.logits.device), self.task, batch.get("labels"), self.temperature
        )
        if task_loss is None:  # inputs without labels: eq. of the module's doc with alpha = 1
            loss = self.temperature**2 * kl
        else:
            loss = self.alpha * self.temperature**2 * kl + (1.0 - self.alpha) * task_loss
        logs["kl"] = kl.detach()
        if t_hidden is not None:
            hidden = hidden_matching(_hidden_states(out), t_hidden, batch.get("attention_mask"))
            loss = loss + hidden_weight * hidden
            logs["hidden"] = hidden.detach()
        if self.mixup and "input_ids" not in batch:
            raise HeadcutError("mixup distillation mixes token embeddings: it needs text inputs (input_ids)")
        if self.mixup and batch["input_ids"].shape[0] > 1:
            mixed = self.mixed_kl(model, batch, step)
            loss = loss + (self.alpha if task_loss is not None else 1.0) * self.temperature**2 * mixed
            logs["kl_mixed"] = mixed.detach()
        return loss, logs

    def mixed_kl(self, model: nn.Module, batch: dict[str, Any], step: int) -> torch.Tensor:
        """MixKD (Liang et al., ICLR 2021): the batch's examples mixed pairwise in the input-embedding space,
        ``e' = lam * e(x_i) + (1 - lam) * e(x_perm(i))`` with ``lam ~ Beta(mixup, mixup)`` per pair (each model
        mixes its own embeddings, the attention mask is the union), and the KL of the student to the teacher on
        those inputs: more inputs to match the teacher on than the training rows alone give,
        at no cost in labels. Deterministic: the pairs and ``lam`` come from ``seed`` and ``step``."""
        ids = batch["input_ids"]
        n = ids.shape[0]
        rng = random.Random(self.seed * 1_000_003 + step)
        order = list(range(n))
        rng.shuffle(order)
        perm = torch.tensor(order)
        lam = torch.tensor([rng.betavariate(self.mixup, self.mixup) for _ in range(n)])
        rest = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}
        if "attention_mask" in rest:
            rest["attention_mask"] = torch.maximum(rest["attention_mask"], rest["attention_mask"][perm])

        def forward(m: nn.Module) -> torch.Tensor:
            device = _device(m)
            embeds = m.get_input_embeddings()(ids.to(device))
            w = lam.to(device, embeds.dtype).view(-1, *([1] * (embeds.dim() - 1)))
            return m(inputs_embeds=w * embeds + (1 - w) * embeds[perm.to(device)], **_on(rest, device)).logits

        student = forward(model)
        with torch.no_grad():
            teacher = forward(self.cache.teacher).detach()
        return distillation_kl(student, teacher.to(student.device), self.task, None, self.temperature)

    def stats(self) -> dict[str, Any]:
        """The report's ``distillation`` entry: the settings, teacher forwards and cache hits."""
        if self.cache is None:
            return {}
        return {
            "alpha": self.alpha,
            "temperature": self.temperature,
            "hidden_weight": self.hidden_weight,
            **self.cache.stats(),
        }


def unpruned_teacher(model: nn.Module, task: str, options: Any) -> DistillationLoss | None:
    """A pruning method's distillation (its options' ``alpha``/``temperature``): a frozen copy of ``model``
    as it is now (call it before the method changes the model or installs gates) as the teacher, or None
    when ``alpha`` is 0 (the paper's task loss)."""
    if not getattr(options, "alpha", 0.0):
        return None
    return DistillationLoss(task, frozen_teacher(model), options.alpha, options.temperature)


def finetune(
    model: nn.Module,
    train: Calibration,
    config: FinetuneConfig,
    teacher: nn.Module | None = None,
    eval_calibration: Calibration | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    progress: ProgressFn | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    dist: Dist | None = None,
    identity: dict[str, Any] | None = None,
    eval_progress: ProgressFn | None = None,
    device: torch.device | None = None,
) -> FinetuneResult:
    """Fine-tune ``model`` in place on ``train`` (see the module's doc); returns the history and the
    eval metric before and after. ``checkpoint_dir``: where the engine writes ``checkpoint.pt`` (every
    ``checkpoint_every`` steps and at the end); ``resume=True`` continues from it (``model`` must be the
    model the interrupted run started from, with the same data and config). The model is left in
    eval mode. ``progress(done, total)`` is called after every step (``eval_progress(done, total)`` after every
    evaluation batch), then ``on_step`` with the step's
    history entry (its ``loss``, ...). ``dist``: this process's place in a data-parallel run
    (:mod:`headcut.training.distributed`); ``result.distributed`` then says how far the processes' weights
    differ at the end (0.0: identical); ``device``: where the steps run (default: where ``model`` is; with
    ``config.engine`` fsdp ``model`` may stay whole in CPU memory while its shards train there). ``identity``: more of the run's identity for its checkpoints
    (e.g. the model's and teacher's paths): a checkpoint whose identity or settings differ is refused.
    A run whose loss, gradients or weights become non-finite raises
    :class:`headcut.training.TrainingDiverged` (a :class:`HeadcutError`); ``model`` is then left as it was
    after the last good step or with the non-finite weights of the failed one, and must not be saved."""
    start = time.perf_counter()
    config.validate()
    config = config.resolved()
    if eval_calibration is not None and eval_calibration.task != train.task:
        raise HeadcutError(f"the eval data is for {eval_calibration.task}, the training data for {train.task}")
    if not train.batches:
        raise HeadcutError("no training batches")
    if resume and checkpoint_dir is None:
        raise HeadcutError("resume needs a checkpoint_dir")
    if teacher is not None:
        check_teacher(model, teacher, train)
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
    result = FinetuneResult(config=config, task=train.task, steps=0, distilled=teacher is not None)
    if eval_calibration is not None:
        result.metric, result.higher_is_better = PRIMARY[eval_calibration.task]
        before = evaluate(model, eval_calibration, eval_progress, bleu=False)
        result.eval_before, result.metric_before = dict(before.metrics), before.value

    eval_fn = None
    if eval_calibration is not None and config.eval_every is not None:

        def eval_fn(step: int) -> dict[str, Any]:
            return dict(evaluate(model, eval_calibration, eval_progress, bleu=False).metrics)

    early = None
    if config.patience is not None:
        if eval_calibration is None or result.eval_before is None:
            raise HeadcutError("--patience needs --eval-data (the metric it watches)")
        if checkpoint_dir is not None:
            raise HeadcutError("a run with --patience keeps no resume checkpoints (it keeps the best weights)")
        metric, higher = PRIMARY[eval_calibration.task]
        early = EarlyStopping(metric, higher, config.patience)
        early.update(model, 0, result.eval_before)  # the starting point is a candidate too

    trainer = Trainer(
        model,
        None,
        train.batches,
        config,
        loss_fn=DistillationLoss(
            train.task, teacher, config.alpha, config.temperature, config.hidden_weight, config.mixup, config.seed
        ),
        eval_fn=eval_fn,
        checkpoint_dir=checkpoint_dir,
        progress=progress,
        dist=dist,
        on_step=on_step,
        identity=dict(identity or {}, distilled=teacher is not None),
        early_stopping=early,
        device=device,
    )
    if resume:
        trainer.resume()
        result.resumed_from = trainer.step
    trained = trainer.train()
    model.eval()
    result.steps, result.history = trained.steps, trained.history
    if early is not None:
        result.early_stopping = early.to_json()
    if dist is not None and dist.active:
        result.distributed = {
            "processes": dist.world,
            "engine": trainer.engine_name,
            "model_max_difference": dist.max_difference([p.detach() for p in model.parameters()]),
        }
    if eval_calibration is not None:
        after = evaluate(model, eval_calibration, eval_progress, bleu=False)
        result.eval_after, result.metric_after = dict(after.metrics), after.value
    result.seconds = time.perf_counter() - start
    return result
