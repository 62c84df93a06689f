"""Weight averaging in the main job's recovery (issue 33): does averaging weights lower the seed spread of the
default on small data and raise its mean?

The default is ``headcut prune MODEL --method fluctuation --keep K [--via 16] --refit --recover-steps 500
--recover-hidden-weight 1 --max-examples 4000 --batch-size 8 --seed S``; each variant changes only what its
recoveries (one per round) do:

- ``default``: as above.
- ``swa-F-constant``: ``--recover-average F``: the weights at the end of each recovery are the mean of the last
  F x 500 steps' weights (stochastic weight averaging, Izmailov et al. 2018), at a constant learning rate as SWA's
  paper runs it; ``swa-F``: the same averaging under the default's linear decay (``average_last`` alone).
- ``soup-N``: N recoveries of 500 / N steps each from the same refitted model, with seeds S, S + 1, ..., and the
  mean of their weights (a uniform "model soup", Wortsman et al. 2022): the same number of steps in all.
- ``soup-N-full``: N recoveries of 500 steps each (N x 500 steps per round; within the 1,000-step budget at
  16 heads only).

    python -m benchmarks.archive.averaging MODEL TRAIN.csv TEST.csv --keep 8 --via 16 --seed 0 --variant swa-0.5 \\
        --out REPORT.json

writes the prune report (the CLI's ``--json``) with ``variant`` added. ``swa-F-constant`` runs headcut's own
option; the other variants are candidates that are no option of headcut's, put in by replacing the job's recovery
step (``swa-F``: its fine-tuning configuration; ``soup-N``: the recovery itself).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

import headcut
import headcut.jobs.prune as job
from headcut.config import FinetuneConfig
from headcut.progress import Reporter

STEPS = 500


def _soup(recover: Any, ways: int, full: bool) -> Any:
    """``job._recover`` made into ``ways`` recoveries from the same start, their weights averaged."""

    def soup(model: torch.nn.Module, teacher: torch.nn.Module, cal: Any, eval_cal: Any, recovery: Any, seed: int,
             *args: Any, **kwargs: Any) -> Any:
        start = copy.deepcopy(model.state_dict())
        each = recovery.steps if full else recovery.steps // ways
        states, last = [], None
        for i in range(ways):
            model.load_state_dict(start)
            last = recover(model, teacher, cal, None, dataclasses.replace(recovery, steps=each), seed + i, *args,
                           **kwargs)
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        mean = {k: (sum(s[k].double() for s in states) / ways).to(states[0][k].dtype)
                if states[0][k].is_floating_point() else states[0][k] for k in states[0]}
        model.load_state_dict(mean)
        if eval_cal is not None:  # the soup's metric, where the job reads the recovery's
            from headcut import model_blocks
            from headcut.model.masks import HeadMask
            from headcut.pruning import eval_metric

            job.move(model, args[2])  # the job's device (after progress, metric)
            last.metric_after = eval_metric(model, eval_cal).measure(HeadMask.full(model_blocks(model)))
            model.to("cpu")
        last.steps = each * ways
        return last

    return soup


def apply(variant: str) -> dict[str, Any]:
    """Put ``variant``'s recovery in place of the job's; returns more ``prune`` arguments (``swa-F-constant``:
    ``recover_average`` F, the command line's ``--recover-average F``)."""
    if variant == "default":
        return {}
    parts = variant.split("-")
    if parts[0] == "swa" and parts[2:] == ["constant"]:
        return {"recover_average": float(parts[1])}
    if parts[0] == "swa" and not parts[2:]:  # under the linear decay: no option of headcut's runs this
        job.FinetuneConfig = functools.partial(FinetuneConfig, average_last=float(parts[1]))  # type: ignore[misc]
    elif parts[0] == "soup":
        job._recover = _soup(job._recover, int(parts[1]), parts[2:] == ["full"])
    else:
        raise SystemExit(f"unknown variant {variant!r}")
    return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("train")
    ap.add_argument("test")
    ap.add_argument("--keep", type=int, required=True)
    ap.add_argument("--via", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", default="default")
    ap.add_argument("--steps", type=int, default=STEPS, help="recovery steps per round (a smoke test: fewer)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    extra = apply(a.variant)
    start = time.perf_counter()
    pruned = headcut.prune(a.model, "fluctuation", keep=a.keep, via=a.via, refit=True, recover_steps=a.steps,
                           recover_hidden_weight=1.0, data=a.train, eval_data=a.test, seed=a.seed,
                           data_options={"max_examples": 4000, "batch_size": 8},
                           progress=Reporter("lines"), **extra)
    report = dict(pruned.report, variant=a.variant, wall_seconds=time.perf_counter() - start,
                  device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    Path(a.out).write_text(json.dumps(report, indent=1, default=str))
    m = report["metric"]
    print(f"{a.variant} keep {a.keep} seed {a.seed}: {m}", file=sys.stderr)


if __name__ == "__main__":
    main()
