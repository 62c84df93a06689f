"""The peer: TextPruner's iterative head pruning (Yang et al., ACL 2022 demo; ``pip install textpruner``) on
the same classifier, the same calibration batches and the same evaluation batches as headcut's methods.

TextPruner needs transformers 4 (it calls ``prune_heads``), so this script runs in its own virtual
environment and never imports headcut; ``python -m benchmarks.harness --peer-python VENV/bin/python`` calls it:

    python3 -m venv peer && peer/bin/pip install torch==2.13.0 'transformers<5' 'numpy<2.3' \\
        sentencepiece protobuf tqdm && peer/bin/pip install --no-deps textpruner==1.1.post2
    peer/bin/python benchmarks/studies/peer_textpruner.py MODEL BATCHES.safetensors --ks 60,48,36,24,12,6 \\
        --out PEER.json [--n-iters 16] [--even]

``BATCHES.safetensors`` holds the tokenised batches the harness wrote (``cal.{i}.{field}`` and
``eval.{i}.{field}``), so both tools see the same ids. For each K (a multiple of the layer count: TextPruner
sets an average number of heads per layer) a fresh copy of MODEL is pruned with
``TransformerPruningConfig(pruning_method="iterative", n_iters, target_num_of_heads=K / layers,
head_even_masking=even)``, the FFN left whole (``target_ffn_size`` = the model's), and really pruned
(``keep_shape=False``: transformers 4's ``prune_heads``); the pruned model's accuracy on the evaluation
batches, its head mask (1 = kept) and the heads it kept (``kept``: TextPruner's last iteration can keep more
than asked: 13 for 12, 9 for 6 on the README's classifier) are written as one JSON object to ``--out`` after every K (anything TextPruner prints goes
to stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from collections import defaultdict

import torch
from safetensors.torch import load_file


def batches(tensors: dict[str, torch.Tensor], prefix: str) -> list[dict[str, torch.Tensor]]:
    """The batches stored under ``prefix`` ("cal" or "eval"), in order."""
    grouped: dict[int, dict[str, torch.Tensor]] = defaultdict(dict)
    for key, value in tensors.items():
        part, index, field = key.split(".", 2)
        if part == prefix:
            grouped[int(index)][field] = value
    return [grouped[i] for i in sorted(grouped)]


@torch.no_grad()
def accuracy(model: torch.nn.Module, eval_batches: list[dict[str, torch.Tensor]]) -> float:
    right = total = 0
    model.eval()
    for batch in eval_batches:
        labels = batch["labels"]
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        right += int((logits.argmax(-1) == labels).sum())
        total += int(labels.numel())
    return right / total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("batches")
    ap.add_argument("--ks", default="60,48,36,24,12,6")
    ap.add_argument("--n-iters", type=int, default=16)
    ap.add_argument("--even", action="store_true", help="the same number of heads in every layer")
    ap.add_argument("--out", required=True, help="the JSON file the results are written to")
    args = ap.parse_args()
    with contextlib.redirect_stdout(sys.stderr):  # TextPruner prints its progress on stdout
        run(args)


def run(args: argparse.Namespace) -> None:
    import textpruner
    import transformers
    from textpruner import GeneralConfig, TransformerPruner, TransformerPruningConfig
    from transformers import AutoModelForSequenceClassification

    logging.getLogger("textpruner").setLevel(logging.WARNING)
    torch.manual_seed(0)
    tensors = load_file(args.batches)
    cal, dev = batches(tensors, "cal"), batches(tensors, "eval")
    base = AutoModelForSequenceClassification.from_pretrained(args.model)
    layers, heads = base.config.num_hidden_layers, base.config.num_attention_heads
    out: dict = {
        "textpruner": textpruner.__version__,
        "transformers": transformers.__version__,
        "n_iters": args.n_iters,
        "even": args.even,
        "unpruned_accuracy": accuracy(base, dev),
        "ks": {},
    }
    for k in (int(x) for x in args.ks.split(",")):
        if k % layers:
            print(f"skipping K={k}: not a multiple of {layers} layers", file=sys.stderr)
            continue
        model = AutoModelForSequenceClassification.from_pretrained(args.model)
        config = TransformerPruningConfig(
            target_ffn_size=model.config.intermediate_size,
            target_num_of_heads=k // layers,
            pruning_method="iterative",
            n_iters=args.n_iters,
            head_even_masking=args.even,
        )
        pruner = TransformerPruner(
            model,
            transformer_pruning_config=config,
            general_config=GeneralConfig(use_device="cpu", output_dir="/tmp/textpruner-peer"),
        )
        start = time.perf_counter()
        pruner.prune(dataloader=cal, save_model=False, keep_shape=False)
        seconds = time.perf_counter() - start
        mask = pruner.head_mask.to(torch.int64).tolist()
        # TextPruner's last iteration may keep more heads than asked (seen: 13 for 12, 9 for 6): record them
        kept = (
            sum(model.config.num_attention_heads - len(model.config.pruned_heads.get(i, ())) for i in range(layers))
            if model.config.pruned_heads
            else heads * layers
        )
        out["ks"][k] = {
            "accuracy": accuracy(model, dev),
            "seconds": round(seconds, 2),
            "mask": mask,
            "kept": sum(map(sum, mask)),
            "heads_in_pruned_model": kept,
        }
        print(f"K={k}: {out['ks'][k]['accuracy']:.4f} ({seconds:.1f} s)", file=sys.stderr, flush=True)
        with open(args.out, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
