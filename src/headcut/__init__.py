"""headcut: remove attention heads from transformer checkpoints, exactly.

The Python API mirrors the command line (:mod:`headcut.api`)::

    import headcut
    res = headcut.prune("model/", keep=16, data="train.csv", eval_data="dev.csv")  # the default recipe
    res = headcut.prune("model/", method="pass", keep=16, data="train.csv", eval_data="dev.csv", seed=0)
    res.model, res.mask, res.report     # slimmed model, kept heads, the report `--json` writes
    res.save("slim/")                    # what `headcut prune --out slim/` writes
    scores = headcut.score("model/", scorer="gnorm", data="cal.csv")
    headcut.finetune("slim/", data="train.csv", teacher="model/", max_steps=500).save("slim-ft/")
    headcut.evaluate("slim/", data="dev.csv").value
    headcut.export("model/", {"drop": {"self.0": [1, 2]}}).save("cut/")
    headcut.bench(["model/", "slim/"], device="cpu").results

and the building blocks::

    model = headcut.load("model/")                       # safetensors only, unless allow_pickle
    with headcut.gated(model, {"drop": {"self.0": [1, 2]}}):
        ...                                             # heads masked, nothing removed
    headcut.slim(model, {"drop": {"self.0": [1, 2]}})    # heads physically removed
    headcut.save(model, "slim/", source="model/")       # loads back with headcut.load or transformers

Every refusal is a :class:`HeadcutError`; the API's argument checks raise its subclasses
:class:`HeadcutTypeError` (also a ``TypeError``) and :class:`HeadcutValueError` (also a ``ValueError``),
naming the keyword (see :mod:`headcut.arguments`).

Names are imported on first use, so ``import headcut`` (and the command line's ``--help`` and shell
completion) does not load torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # the commands
    "prune": "headcut.api",
    "score": "headcut.api",
    "finetune": "headcut.api",
    "evaluate": "headcut.api",
    "export": "headcut.api",
    "bench": "headcut.api",
    "info": "headcut.api",
    "recipe_for": "headcut.api",
    "Recipe": "headcut.recipes",
    "read_recipe": "headcut.recipes",
    "Pruned": "headcut.api",
    "Scores": "headcut.api",
    "Finetuned": "headcut.api",
    "Evaluation": "headcut.api",
    "Exported": "headcut.api",
    "Benchmark": "headcut.api",
    # building blocks
    "load": "headcut.api",
    "save": "headcut.api",
    "SavedModel": "headcut.model.saving",
    "gated": "headcut.model.gating",
    "HeadGates": "headcut.model.gating",
    "slim": "headcut.model.surgery",
    "SlimResult": "headcut.model.surgery",
    "count_params": "headcut.model.surgery",
    "model_blocks": "headcut.model.surgery",
    "HeadMask": "headcut.model.masks",
    "read_mask_file": "headcut.model.masks",
    "resolve_mask": "headcut.model.masks",
    "ModelInfo": "headcut.model.info",
    "BenchResult": "headcut.jobs.bench.results",
    "PruneResult": "headcut.pruning",
    # configurations
    "PruneConfig": "headcut.config",
    "ScoreConfig": "headcut.config",
    "TrainConfig": "headcut.config",
    "FinetuneConfig": "headcut.config",
    "BenchConfig": "headcut.config",
    "DataConfig": "headcut.data",
    "HeadcutError": "headcut.errors",
    "HeadcutValueError": "headcut.errors",
    "HeadcutTypeError": "headcut.errors",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'headcut' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
