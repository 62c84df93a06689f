"""Evaluate a model (original, gated or slimmed) on the batches of :func:`headcut.data.load_calibration`.

Metrics by task (all under ``torch.inference_mode`` with the model in eval mode; its mode is restored):

* **classification**: ``accuracy``; ``macro_f1``, the mean over classes of ``2 TP / (2 TP + FP + FN)``
  for every class that occurs in the labels or the predictions (scikit-learn's default); ``mcc``,
  Matthews' correlation coefficient (Gorodkin's multi-class form, scikit-learn's; 0 when a marginal is
  constant; CoLA's metric); ``loss``, the mean cross-entropy per example. Primary: accuracy (higher is better).
* **causal-lm**: ``loss``, the mean negative log-likelihood of every scored next token (token-weighted
  over the whole data, not a mean of batch means); ``perplexity`` = exp(loss); ``tokens`` scored.
  Primary: perplexity (lower is better).
* **seq2seq**: ``loss`` and ``perplexity`` of the target tokens, token-weighted as above; ``bleu``
  (sacreBLEU's corpus BLEU of greedy generations, at most as many new tokens as the longest target
  of the batch) when the optional ``sacrebleu`` package is installed, else left out with a note.
  Primary: perplexity.
* **masked-lm**: ``loss`` and ``perplexity`` over the masked tokens only. Primary: perplexity.

Positions whose label is -100 (padding, unmasked tokens) are never scored.

Progress: ``progress(done, total)`` after every batch (the caller's task; without it, silent).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..data import Calibration
from ..errors import HeadcutError
from ..extras import imported, installed

#: a progress callback: (batches done, batches in all)
EvalProgress = Callable[[int, int], None]

#: task -> (primary metric, higher is better)
PRIMARY: dict[str, tuple[str, bool]] = {
    "classification": ("accuracy", True),
    "causal-lm": ("perplexity", False),
    "seq2seq": ("perplexity", False),
    "masked-lm": ("perplexity", False),
}


@dataclass
class EvalResult:
    """Metrics of one evaluation (see the module's doc); ``seconds`` is the wall time of the forwards
    (and generations), ``examples_per_s`` = examples / seconds."""

    task: str
    metrics: dict[str, float]
    primary: str
    higher_is_better: bool
    examples: int
    seconds: float
    examples_per_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def value(self) -> float:
        """The primary metric."""
        return self.metrics[self.primary]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def macro_f1(labels: list[int], predictions: list[int]) -> float:
    """Macro-averaged F1 over the classes present in ``labels`` or ``predictions``."""
    classes = sorted(set(labels) | set(predictions))
    if not classes:
        return 0.0
    scores = []
    for c in classes:
        tp = sum(1 for y, p in zip(labels, predictions) if y == c and p == c)
        fp = sum(1 for y, p in zip(labels, predictions) if y != c and p == c)
        fn = sum(1 for y, p in zip(labels, predictions) if y == c and p != c)
        scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores)


def mcc(labels: list[int], predictions: list[int]) -> float:
    """Matthews' correlation coefficient of ``predictions`` (any number of classes):
    (c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2)(s^2 - sum_k t_k^2)), with c correct, s examples,
    p_k / t_k the predicted / true count of class k; 0 where the denominator is 0."""

    s, c = len(labels), sum(1 for y, p in zip(labels, predictions) if y == p)
    true, pred = Counter(labels), Counter(predictions)
    num = c * s - sum(pred[k] * true[k] for k in set(true) | set(pred))
    den = (s * s - sum(v * v for v in pred.values())) * (s * s - sum(v * v for v in true.values()))
    return num / math.sqrt(den) if den > 0 else 0.0


def _device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    """Summed negative log-likelihood and count of the positions whose label is not -100."""
    keep = labels != -100
    count = int(keep.sum())
    if count == 0:
        return 0.0, 0
    loss = F.cross_entropy(logits[keep].float(), labels[keep], reduction="sum")
    return float(loss), count


def _bleu_available() -> bool:
    return installed("sacrebleu")


def _bleu_broken() -> str | None:
    """Why an installed sacrebleu cannot compute BLEU (it fails on import, in one line), or None."""
    try:
        imported("sacrebleu", "BLEU", "pip install --force-reinstall sacrebleu")
    except HeadcutError as exc:
        return str(exc)
    return None


def evaluate(
    model: nn.Module, calibration: Calibration, progress: EvalProgress | None = None, *, bleu: bool = True
) -> EvalResult:
    """Evaluate ``model`` on ``calibration`` (see the module's doc). ``bleu=False`` skips generation
    for seq2seq models. ``progress``: see the module's doc."""
    task = calibration.task
    if task not in PRIMARY:
        raise HeadcutError(f"cannot evaluate task {task!r}; known tasks: {', '.join(PRIMARY)}")
    device = _device(model)
    total = len(calibration.batches)
    notes: list[str] = []
    want_bleu = task == "seq2seq" and bleu
    if want_bleu and not _bleu_available():
        notes.append("BLEU not computed: the optional sacrebleu package is not installed (pip install sacrebleu)")
        want_bleu = False
    broken = _bleu_broken() if want_bleu else None
    if broken is not None:
        notes.append(f"BLEU not computed: {broken}")
        want_bleu = False
    if want_bleu and (calibration.tokenizer is None or calibration.references is None):
        notes.append("BLEU not computed: the calibration data has no tokenizer or references")
        want_bleu = False
    nll, count = 0.0, 0
    labels_all: list[int] = []
    preds_all: list[int] = []
    hypotheses: list[str] = []
    was_training = model.training
    model.eval()
    if progress is not None:
        progress(0, total)
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            for i, batch in enumerate(calibration.batches):
                batch = {k: v.to(device) for k, v in batch.items()}
                logits = model(**batch).logits
                labels = batch["labels"]
                if task == "classification":
                    if calibration.label_names and logits.shape[-1] != len(calibration.label_names):
                        raise HeadcutError(
                            f"the model predicts {logits.shape[-1]} classes but the data was prepared for "
                            f"{len(calibration.label_names)}"
                        )
                    nll += float(F.cross_entropy(logits.float(), labels, reduction="sum"))
                    count += labels.numel()
                    labels_all += labels.tolist()
                    preds_all += logits.argmax(-1).tolist()
                else:
                    if task == "causal-lm":  # token t predicts token t + 1
                        logits, labels = logits[:, :-1], labels[:, 1:]
                    s, n = _nll(logits, labels)
                    nll += s
                    count += n
                    if want_bleu:
                        hypotheses += _generate(model, batch, calibration.tokenizer)
                if progress is not None:
                    progress(i + 1, total)
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - start
    if count == 0:
        raise HeadcutError("the data has no tokens to score (every label is padding)")
    loss = nll / count
    metrics: dict[str, float]
    if task == "classification":
        correct = sum(1 for y, p in zip(labels_all, preds_all) if y == p)
        metrics = {
            "accuracy": correct / len(labels_all),
            "macro_f1": macro_f1(labels_all, preds_all),
            "mcc": mcc(labels_all, preds_all),
            "loss": loss,
        }
    else:
        metrics = {"loss": loss, "perplexity": math.exp(loss) if loss < 700 else math.inf, "tokens": float(count)}
        if want_bleu:
            import sacrebleu

            metrics["bleu"] = float(sacrebleu.corpus_bleu(hypotheses, [list(calibration.references or [])]).score)
    primary, higher = PRIMARY[task]
    examples = calibration.examples
    return EvalResult(
        task=task,
        metrics=metrics,
        primary=primary,
        higher_is_better=higher,
        examples=examples,
        seconds=seconds,
        examples_per_s=examples / seconds if seconds > 0 else math.inf,
        notes=notes,
    )


def _generate(model: nn.Module, batch: dict[str, torch.Tensor], tokenizer: Any) -> list[str]:
    """Greedy generations for a seq2seq batch, decoded without special tokens."""
    labels = batch["labels"]
    longest = int((labels != -100).sum(dim=1).max())
    out = model.generate(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        max_new_tokens=max(longest, 1),
        do_sample=False,
        num_beams=1,
    )
    return [text.strip() for text in tokenizer.batch_decode(out, skip_special_tokens=True)]
