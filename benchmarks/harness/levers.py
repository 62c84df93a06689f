"""The levers study's rows, shared by ``measure.py`` (which measures them, in this order) and ``render.py`` (which
renders them and names those not measured yet): plain data, no imports of either."""

from __future__ import annotations

from typing import Any

#: issue 16's levers, each measured alone at 16 heads (seed 0, unless ``keep``/``seed`` say otherwise): name ->
#: (``headcut.prune`` arguments, and for a recovery run by ``headcut.finetune`` on the cut model, distilled from
#: the unpruned one unless ``teacher`` is None, its arguments)
LEVERS: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "pass, 500 steps, the papers' loss": ({"method": "pass", "max_steps": 500, "alpha": 0.0}, None),
    "pass, 500 steps, gates distilled (alpha 0.5)": ({"method": "pass", "max_steps": 500, "alpha": 0.5}, None),
    "pass, 500 steps, gates distilled (alpha 0.9)": ({"method": "pass", "max_steps": 500, "alpha": 0.9}, None),
    "pass, alpha 0.9 as above, weights' lr 5e-5 instead of 2e-5 (gates' lr 0.5 as before)": (
        {"method": "pass", "max_steps": 500, "alpha": 0.9, "lr": 5e-5},
        None,
    ),
    "pass, as above, gates first (100 steps on the fixed model), then joint": (
        {"method": "pass", "max_steps": 500, "alpha": 0.9, "gates_first": 100},
        None,
    ),
    "lag, 500 steps, gates distilled (alpha 0.9)": ({"method": "lag", "max_steps": 500, "alpha": 0.9}, None),
    "lag, as above, sparsity target warmed up over 250 steps": (
        {"method": "lag", "max_steps": 500, "alpha": 0.9, "sparsity_warmup": 250},
        None,
    ),
    "pass 250 steps (alpha 0.9) + recovery 250 (the previous main job)": (
        {"method": "pass", "max_steps": 250, "alpha": 0.9, "recover_steps": 250},
        None,
    ),
    "pass 100 steps (alpha 0.9) + recovery 400": (
        {"method": "pass", "max_steps": 100, "alpha": 0.9, "recover_steps": 400},
        None,
    ),
    "gradient + recovery 500 (the recipe)": ({"method": "gradient", "recover_steps": 500}, None),
    "gradient + finetune 500, task loss only (no distillation)": (
        {"method": "gradient"},
        {"max_steps": 500, "teacher": None},
    ),
    "gradient + finetune 500, distilled, lr 1e-4, alpha 0.9": (
        {"method": "gradient"},
        {"max_steps": 500, "lr": 1e-4, "alpha": 0.9},
    ),
    "gradient + finetune 500, distilled + hidden-state matching (weight 1)": (
        {"method": "gradient"},
        {"max_steps": 500, "hidden_weight": 1.0},
    ),
    "gradient + finetune 500 on 4,000 fixed snippets, distilled": (
        {"method": "gradient"},
        {"max_steps": 500, "fixed": True},
    ),
    "as above, early stopping on 500 other training snippets (every 50 steps, patience 3)": (
        {"method": "gradient"},
        {"max_steps": 500, "fixed": True, "eval_every": 50, "patience": 3},
    ),
    # hidden-state matching and distillation itself in recovery: the rows again on the targets' other seeds
    # (and at 8 heads, 1,000 steps), beside the recipe study's distilled figures
    "gradient + finetune 500, distilled + hidden-state matching (weight 1), seed 1": (
        {"method": "gradient", "seed": 1},
        {"max_steps": 500, "hidden_weight": 1.0},
    ),
    "gradient + finetune 500, distilled + hidden-state matching (weight 1), seed 2": (
        {"method": "gradient", "seed": 2},
        {"max_steps": 500, "hidden_weight": 1.0},
    ),
    "gradient + finetune 500, task loss only, seed 1": (
        {"method": "gradient", "seed": 1},
        {"max_steps": 500, "teacher": None},
    ),
    "gradient + finetune 500, task loss only, seed 2": (
        {"method": "gradient", "seed": 2},
        {"max_steps": 500, "teacher": None},
    ),
    "8 heads: gradient + finetune 1,000, task loss only": (
        {"method": "gradient", "keep": 8},
        {"max_steps": 1000, "teacher": None},
    ),
    "8 heads: gradient + finetune 1,000, distilled + hidden-state matching (weight 1)": (
        {"method": "gradient", "keep": 8},
        {"max_steps": 1000, "hidden_weight": 1.0},
    ),
    # last, the slowest: Michel et al.'s 8 rescorings of the 4,000 snippets with per-example gradients (16 min)
    "michel + recovery 500": ({"method": "michel", "recover_steps": 500}, None),
}


#: the recovery losses compared on the targets' seeds: loss -> the lever rows at 16 heads (500 steps) and at 8
#: heads (1,000 steps), each for seeds 0, 1, 2 (None: not measured); the distilled recovery's are the recipe study's
RECOVERY_LOSSES: dict[str, tuple[list[str | None], list[str | None]]] = {
    "task loss only (no distillation)": (
        [
            "gradient + finetune 500, task loss only (no distillation)",
            "gradient + finetune 500, task loss only, seed 1",
            "gradient + finetune 500, task loss only, seed 2",
        ],
        ["8 heads: gradient + finetune 1,000, task loss only", None, None],
    ),
    "distilled + hidden-state matching (weight 1)": (
        [
            "gradient + finetune 500, distilled + hidden-state matching (weight 1)",
            "gradient + finetune 500, distilled + hidden-state matching (weight 1), seed 1",
            "gradient + finetune 500, distilled + hidden-state matching (weight 1), seed 2",
        ],
        ["8 heads: gradient + finetune 1,000, distilled + hidden-state matching (weight 1)", None, None],
    ),
}
