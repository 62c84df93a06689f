"""headcut's Python API: every command as a function, with the command's defaults and report.

```python
import headcut

res = headcut.prune("model/", keep=16, data="train.csv", eval_data="dev.csv")   # the default recipe
res = headcut.prune("model/", method="pass", keep=16, data="train.csv", eval_data="dev.csv", seed=0)
res.model, res.mask, res.report          # slimmed model, kept heads, the report `--json` writes
res.save("slim/")                        # what `headcut prune --out slim/` writes
scores = headcut.score("model/", scorer="gnorm", data="cal.csv")
tuned = headcut.finetune("slim/", data="train.csv", teacher="model/", max_steps=500)
headcut.evaluate("slim/", data="dev.csv").value
headcut.export("model/", {"drop": {"self.0": [1, 2]}}).save("cut/")
headcut.bench(["model/", "slim/"], device="cpu")
```

* **Models**: a checkpoint folder, a Hugging Face Hub id, or a loaded model (``torch.nn.Module`` of a
  supported family; it is changed in place by ``prune``, ``export`` and ``finetune``).
* **Data**: a file or a ``datasets`` name (read with ``split``/``eval_split`` and ``data_options``:
  the fields of :class:`headcut.data.DataConfig` such as ``text_col``, ``max_examples``, ``seq_len``,
  ``batch_size``), a :class:`~headcut.data.DataConfig`, a ``datasets.Dataset`` or a list of dict rows,
  or a ready :class:`~headcut.data.Calibration`. The tokenizer comes from the checkpoint folder (or
  ``tokenizer=``).
* **Results** carry ``report``: the dict the command's ``--json`` writes. Those of commands that write a
  model have ``save(out, force=False)``: atomic, with the command line's checks (see
  :mod:`headcut.files`); ``force`` replaces only a folder headcut wrote.
* **Recipes**: ``prune`` without ``method`` runs a recipe (:mod:`headcut.recipes`), by default the default recipe
  of the model's kind; ``recipe_for(model, recipe)`` is the one it would run.
* ``progress``: a :class:`headcut.progress.Reporter` (default: silent).
* **Errors**: every refusal is a :class:`~headcut.errors.HeadcutError`. Each function checks its arguments
  first (:mod:`headcut.arguments`), before anything is loaded, read or written: a wrong kind of value is a
  ``HeadcutTypeError`` (also a ``TypeError``), a value that cannot work a ``HeadcutValueError`` (also a
  ``ValueError``), and the message names the keyword. ``headcut.load`` and ``headcut.save`` are
  :func:`headcut.model.loading.load` and :func:`headcut.model.saving.save` with the same checks.

The command line is a thin layer over these functions: it parses, calls one of them and renders the
result, so the same arguments give the same result (and report) either way.
"""

from __future__ import annotations

from .jobs.base import ModelLike, load, same_data, save
from .jobs.bench import Benchmark, bench
from .jobs.evaluate import Evaluation, evaluate
from .jobs.export import Exported, export
from .jobs.finetune import Finetuned, finetune
from .jobs.info import info
from .jobs.prune import prune, recipe_for
from .jobs.results import Pruned, Written
from .jobs.score import Scores, score

__all__ = [
    "Benchmark",
    "Evaluation",
    "Exported",
    "Finetuned",
    "ModelLike",
    "Pruned",
    "Scores",
    "Written",
    "bench",
    "evaluate",
    "export",
    "finetune",
    "info",
    "load",
    "prune",
    "recipe_for",
    "same_data",
    "save",
    "score",
]
