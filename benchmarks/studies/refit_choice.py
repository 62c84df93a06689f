"""Would choosing the heads by the refit's own error help (issue 33)? On one task (``review-plot`` by default), the
fluctuation cut to K heads is compared, right after ``--refit`` (nothing trained), with two other choices made from
the unpruned model's inputs of each output projection ``o`` (``z``: the heads' outputs, with a column of ones):

* per layer: fluctuation's number of heads in each layer, the heads chosen by backward elimination minimising
  ``||z_S W_S - z W||^2`` after the least-squares refit of ``W_S`` (ridge 1e-2 as in ``headcut.pruning.refit``),
  computed from ``G = z^T z`` alone since the unpruned output ``z W`` is linear in ``z``;
* global: the same elimination over every layer at once, the head whose removal raises its layer's relative error
  least going first.

    python -m benchmarks.studies.refit_choice [--task review-plot] [--ks 16,8]

Rows go to ``benchmarks/results/refit_choice.json`` (accuracy after the refit on the held-out split, the heads kept).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import torch
from torch import nn

import headcut
from benchmarks.harness.store import RESULTS as STORE
from benchmarks.harness.tasks import TASKS
from headcut.adapters.base import Block
from headcut.config import PruneConfig
from headcut.data import Calibration, DataConfig, load_calibration, load_tokenizer
from headcut.model.masks import HeadMask
from headcut.model.projections import weight_out_in
from headcut.model.surgery import slim
from headcut.pruning import eval_metric, plan_prune
from headcut.pruning.refit import RIDGE, refit_outputs
from headcut.scoring.attention_maps import real_queries
from headcut.training.finetuning import frozen_teacher

RESULTS = STORE / "refit_choice.json"


def grams(model: nn.Module, cal: Calibration) -> dict[str, torch.Tensor]:
    """Per block, ``G = z^T z`` (float64) of its output projection's input on the real tokens, with a ones column."""
    base, out, hooks, current = model.base_model, {}, [], {}
    for block in headcut.model_blocks(model):

        def pre(m: nn.Module, args: tuple, block: Block = block) -> None:
            z = args[0].detach()
            z = z[real_queries(current["batch"], block.kind, z.shape[0], z.shape[1], z.device)].double()
            z = torch.cat([z, z.new_ones(len(z), 1)], 1)
            out[block.name] = out.get(block.name, 0) + z.T @ z

        hooks.append(base.get_submodule(block.o).register_forward_pre_hook(pre))
    model.eval()
    try:
        with torch.no_grad():
            for batch in cal.batches:
                current["batch"] = batch
                model(**{k: v for k, v in batch.items() if k != "labels"})
    finally:
        for h in hooks:
            h.remove()
    return out


def theta(model: nn.Module, block: Block) -> torch.Tensor:
    """The projection's ``[W^T; b]`` (in features + 1, out features; b = 0 without a bias), float64."""
    mod = model.base_model.get_submodule(block.o)
    w = weight_out_in(mod).detach().double()
    bias = mod.bias.detach().double() if getattr(mod, "bias", None) is not None else w.new_zeros(w.shape[0])
    return torch.cat([w.T, bias[None]], 0)


def error(block: Block, kept: list[int], gram: torch.Tensor, th: torch.Tensor) -> float:
    """The relative squared error of the unpruned output ``z th`` refitted (ridge) from the ``kept`` heads."""
    cols = [h * block.head_dim + i for h in kept for i in range(block.head_dim)] + [gram.shape[0] - 1]
    g = gram[cols][:, cols]
    cross = gram[cols] @ th
    sol = torch.linalg.solve(g + RIDGE * float(g.diagonal().mean()) * torch.eye(len(cols), dtype=g.dtype), cross)
    energy = (th * (gram @ th)).sum()
    return float((energy - 2 * (sol * cross).sum() + (sol * (g @ sol)).sum()) / energy)


def per_layer(model: nn.Module, g: dict[str, torch.Tensor], mask: HeadMask) -> HeadMask:
    """``mask``'s number of heads in each layer, the heads chosen by backward elimination on :func:`error`."""
    keep = {}
    for b in headcut.model_blocks(model):
        kept, th = list(range(b.heads)), theta(model, b)
        while len(kept) > len(mask.keep[b.name]):
            kept.remove(min(kept, key=lambda h: error(b, [x for x in kept if x != h], g[b.name], th)))
        keep[b.name] = kept
    return HeadMask(keep)


def global_choice(model: nn.Module, g: dict[str, torch.Tensor], k: int) -> HeadMask:
    """Backward elimination over every layer to ``k`` heads: the head whose removal raises its layer's error least."""
    blocks = headcut.model_blocks(model)
    kept = {b.name: list(range(b.heads)) for b in blocks}
    th = {b.name: theta(model, b) for b in blocks}
    now = {b.name: 0.0 for b in blocks}
    while sum(map(len, kept.values())) > k:
        best = None
        for b in blocks:
            for h in kept[b.name]:
                rest = [x for x in kept[b.name] if x != h]
                e = error(b, rest, g[b.name], th[b.name]) if rest else 1.0
                if best is None or e - now[b.name] < best[0]:
                    best = (e - now[b.name], b.name, h, e)
        _, name, h, e = best
        kept[name].remove(h)
        now[name] = e
    return HeadMask(kept)


def after_refit(model: nn.Module, mask: HeadMask, cal: Calibration, dev: Calibration) -> float:
    """Held-out accuracy (%) of ``model`` slimmed to ``mask`` and refitted (nothing trained)."""
    cut = copy.deepcopy(model)
    slim(cut, mask)
    refit_outputs(cut, frozen_teacher(model), cal)
    return 100 * eval_metric(cut, dev).measure(HeadMask.full(headcut.model_blocks(cut)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="review-plot", choices=list(TASKS))
    ap.add_argument("--ks", default="16,8")
    args = ap.parse_args()
    path, splits = TASKS[args.task]()
    model, tok = headcut.load(path), load_tokenizer(path)
    cal = load_calibration(model, tok, DataConfig(path=str(splits["train"]), max_examples=4000, batch_size=8))
    dev = load_calibration(model, tok, DataConfig(path=str(splits["test"]), batch_size=64))
    g = grams(model, cal)
    rows = json.loads(RESULTS.read_text())["rows"] if RESULTS.is_file() else []
    for k in map(int, args.ks.split(",")):
        start = time.time()
        cut = plan_prune(model, cal, PruneConfig(method="fluctuation", keep=k)).mask
        for name, mask in (
            ("fluctuation", cut),
            ("per layer", per_layer(model, g, cut)),
            ("global", global_choice(model, g, k)),
        ):
            row = {
                "task": args.task,
                "k": k,
                "choice": name,
                "keep": dict(mask.keep),
                "after_refit": after_refit(model, mask, cal, dev),
                "seconds": round(time.time() - start, 1),
            }
            rows = [r for r in rows if (r["task"], r["k"], r["choice"]) != (args.task, k, name)] + [row]
            print(json.dumps(row), file=sys.stderr, flush=True)
            RESULTS.write_text(json.dumps({"study": "refit_choice", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
