"""The progress bars of a pruning or training job: ``progress(phase, done, total)`` as reporter tasks, with
the loss, temperature and metric of the training steps (:class:`Bars`)."""

from __future__ import annotations

from typing import Any

from ..progress import Reporter, Task


class Bars:
    """``progress(phase, done, total)`` of :func:`headcut.pruning.plan_prune` (and training steps) as
    reporter tasks; ``train``: the label of the training phase."""

    UNITS = {
        "prune": "heads",
        "score": "batches",
        "eval": "batches",
        "refit": "batches",
        "merge": "blocks",
        "protect": "blocks",
        "allocate": "actions",
        "train": "steps",
        "agent": "episodes",
    }

    def __init__(self, reporter: Reporter, method: str, metric: str | None, train: str | None = None) -> None:
        self.reporter = reporter
        self.labels = {
            "prune": f"pruning ({method}, heads removed)",
            "score": "scoring",
            "eval": "evaluating",
            "refit": "refitting the output projections (least squares)",
            "merge": "merging KV heads (each block's cost alone)",
            "protect": "measuring each block's cut alone",
            "allocate": "measuring each action alone (keep, merge, remove)",
            "train": train or f"training gates ({method})",
            "agent": f"training the {method} agent",
        }
        self.metric = metric
        self.tasks: dict[str, Task] = {}
        self.last_metric: Any = None

    def __call__(self, phase: str, done: int, total: int | None) -> None:
        task = self.tasks.get(phase)
        if task is None or task.finished or done < task.done:
            if task is not None and not task.finished:
                task.finish()
            label = self.labels.get(phase, phase)
            task = self.tasks[phase] = self.reporter.task(label, total, self.UNITS.get(phase, ""))
        task.update(done, total)

    def on_step(self, entry: dict[str, Any]) -> None:
        """A training step's history entry: its loss, temperature/lambda, open heads and the last metric; or
        an agent's episode (``phase`` ``agent``): its layer, epsilon, mean reward and heads pruned."""
        phase = entry.get("phase", "train")
        task = self.tasks.get(phase)
        if task is None:
            return
        if phase != "train":
            task.fields.update({k: v for k, v in entry.items() if k != "phase"})
            return
        fields_: dict[str, Any] = {"loss": entry.get("task_loss", entry.get("loss"))}
        for key, shown in (("kl", "KL"), ("tau", "tau"), ("lambda", "lambda"), ("open", "open heads")):
            if key in entry:
                fields_[shown] = entry[key]
        if self.metric is not None and isinstance(entry.get("eval"), dict) and self.metric in entry["eval"]:
            self.last_metric = entry["eval"][self.metric]
        if self.last_metric is not None and self.metric is not None:
            fields_[self.metric] = self.last_metric
        task.fields.update(fields_)

    def close(self) -> None:
        for task in self.tasks.values():
            task.finish()
