"""Benchmark: the lottery (``--method lottery``) against its re-initialised control and Michel et al. at
the same number of heads, on the README's classifier and on a tiny encoder-decoder trained from scratch.

    python -m benchmarks.archive.lottery [--part classifier|seq2seq|both] [--keep 16] [--train-examples 3000]
        [--seq2seq-keep 6] [--out results.json]

**Classifier.** The README's MiniLM Rotten Tomatoes classifier (72 heads, fine-tuned on 4,000 training
snippets: ``benchmarks/classifier.py``). The lottery trains on ``--train-examples`` of those snippets
with its defaults and ``--control reinit``; its dev set (confidence, early stopping) is the first 500
rows of the held-out test split, and every model is measured on the other 2,308. Baselines at the same
K: Michel et al. (steps of 10 %, 512 training snippets as calibration; no training) and Michel et al.
followed by ``finetune`` for as many steps as the ticket trained (reset + convergence), and the
unpruned classifier.

**Seq2seq.** A tiny BART (2 + 2 layers, 4 heads each in encoder self-, decoder self- and cross
attention: 24 heads, d_model 64) with a word-level tokenizer over the 400 most frequent words of the
Rotten Tomatoes training snippets; the task: a snippet's first ten such words, reversed. The
lottery (``--seq2seq-keep`` heads, short runs: C at 150 steps, 75 steps per iteration, at most 600
to converge) with its control; the unpruned model trained from scratch for as many steps as the
lottery's whole run, and Michel et al. on it. Metrics on 500 held-out pairs: perplexity and greedy
exact match of the reversal.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

import headcut
import headcut_offline as offline
from benchmarks.classifier import minilm_classifier
from headcut.config import FinetuneConfig, PruneConfig
from headcut.data import DataConfig, load_calibration, load_tokenizer
from headcut.model.evaluation import evaluate
from headcut.model.masks import HeadMask
from headcut.progress import Reporter
from headcut.pruning import eval_metric, plan_prune
from headcut.training.finetuning import finetune


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def classifier_part(args: argparse.Namespace, work: Path) -> dict:
    path = minilm_classifier()
    splits = offline.rotten_tomatoes_splits()
    test_rows = _rows(splits["test"])
    dev_csv = _write(work / "dev.csv", test_rows[:500])
    rest_csv = _write(work / "test-rest.csv", test_rows[500:])
    model = headcut.load(path)
    tok = load_tokenizer(path)
    rest = load_calibration(model, tok, DataConfig(path=str(rest_csv), batch_size=64))
    cal = load_calibration(model, tok, DataConfig(path=str(splits["train"]), max_examples=512))
    blocks = headcut.model_blocks(model)
    out: dict = {"keep": args.keep, "train_examples": args.train_examples, "test_examples": rest.examples,
                 "unpruned": eval_metric(model, rest).measure(HeadMask.full(blocks))}
    print(json.dumps(out), file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    with Reporter("auto") as progress:
        ticket = headcut.prune(path, "lottery", keep=args.keep, data=str(splits["train"]), eval_data=str(dev_csv),
                               control="reinit", data_options={"max_examples": args.train_examples},
                               progress=progress)
    seconds = time.perf_counter() - t0
    lot = ticket.report["lottery"]
    control_model = ticket.result.details.control_model
    out["lottery"] = {
        "accuracy": float(evaluate(ticket.model, rest).value), "seconds": round(seconds, 1),
        "iterations": len(lot["iterations"]), "per_step": lot["per_step"],
        "removed_by_kind": lot["iterations"][-1]["removed_by_kind"], "converge_steps": lot["converge"]["steps"],
        "best_step": lot["converge"]["early_stopping"]["best_step"],
        "dev_accuracy": ticket.report["metric"]["after"],
        "trajectory": [(it["heads"], it["metric_trained"], it["metric_pruned"]) for it in lot["iterations"]],
    }
    out["control"] = {"accuracy": float(evaluate(control_model, rest).value), "steps": lot["control"]["steps"],
                      "dev_accuracy": lot["control"]["metric"]}
    print(json.dumps({k: out[k] for k in ("lottery", "control")}), file=sys.stderr, flush=True)

    michel = plan_prune(model, cal, PruneConfig(method="michel", keep=args.keep))
    out["michel"] = {"accuracy": eval_metric(model, rest).measure(michel.mask)}
    steps = lot["converge"]["steps"]
    headcut.slim(model, michel.mask)
    train = load_calibration(model, tok, DataConfig(path=str(splits["train"]), max_examples=args.train_examples))
    finetune(model, train, FinetuneConfig(max_steps=steps, lr=2e-5, schedule="constant", checkpoint_every=None))
    out["michel+finetune"] = {"accuracy": float(evaluate(model, rest).value), "steps": steps}
    print(json.dumps({k: out[k] for k in ("michel", "michel+finetune")}), file=sys.stderr, flush=True)
    return out


# ---- the tiny seq2seq task -----------------------------------------------------------------------------------

WORD = re.compile(r"[a-z]+")


def reversal_pairs(texts: list[str], vocab: set[str], length: int = 10) -> list[dict[str, str]]:
    pairs = []
    for text in texts:
        words = [w for w in WORD.findall(text.lower()) if w in vocab][:length]
        if len(words) == length:
            pairs.append({"source": " ".join(words), "target": " ".join(reversed(words))})
    return pairs


def tiny_bart(folder: Path, words: list[str]) -> Path:
    import transformers as T
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(["[PAD]", "[BOS]", "[EOS]", "[UNK]"] + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A [EOS]", special_tokens=[("[BOS]", 1),
                                                                                               ("[EOS]", 2)])
    fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]",
                                     unk_token="[UNK]")
    cfg = T.BartConfig(vocab_size=len(vocab), d_model=64, encoder_layers=2, decoder_layers=2,
                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                       max_position_embeddings=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                       decoder_start_token_id=2, forced_eos_token_id=None, dropout=0.1)
    torch.manual_seed(0)
    T.BartForConditionalGeneration(cfg).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def exact_match(model, cal) -> float:
    """Greedy decoding equals the reversed words (token by token, up to the target's length)."""
    right = total = 0
    model.eval()
    with torch.no_grad():
        for batch in cal.batches:
            labels = batch["labels"]
            gen = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 max_new_tokens=labels.shape[1] + 1, do_sample=False, num_beams=1)
            for g, lab in zip(gen, labels):
                want = [int(t) for t in lab if t >= 0]
                got = [int(t) for t in g[1:1 + len(want)]]
                right += got == want
                total += 1
    return right / max(total, 1)


def seq2seq_part(args: argparse.Namespace, work: Path) -> dict:
    splits = offline.rotten_tomatoes_splits()
    texts = [r["text"] for r in _rows(splits["train"])]
    counts = Counter(w for t in texts for w in WORD.findall(t.lower()))
    words = [w for w, _ in counts.most_common(400)]
    pairs = reversal_pairs(texts, set(words))
    train_csv, dev_csv, test_csv = (_write(work / f"s2s-{n}.csv", rows) for n, rows in (
        ("train", pairs[:-1000]), ("dev", pairs[-1000:-500]), ("test", pairs[-500:])))
    folder = tiny_bart(work / "bart", words)
    lottery_opts = {"reset_at": 150, "prune_every": 75, "max_steps": 600, "eval_every": 50, "lr": 1e-3}
    data_options = {"batch_size": 32, "seq_len": 16}
    t0 = time.perf_counter()
    with Reporter("auto") as progress:
        ticket = headcut.prune(folder, "lottery", keep=args.seq2seq_keep, data=str(train_csv), eval_data=str(dev_csv),
                               control="reinit", data_options=data_options, progress=progress, **lottery_opts)
    seconds = time.perf_counter() - t0
    lot = ticket.report["lottery"]
    model = headcut.load(folder)
    tok = load_tokenizer(folder)
    test = load_calibration(model, tok, DataConfig(path=str(test_csv), **data_options))
    total_steps = lottery_opts["reset_at"] + len(lot["iterations"]) * lottery_opts["prune_every"] + \
        (lot["converge"]["steps"] - lottery_opts["reset_at"])
    train = load_calibration(model, tok, DataConfig(path=str(train_csv), **data_options))
    finetune(model, train, FinetuneConfig(max_steps=total_steps, lr=1e-3, schedule="constant", checkpoint_every=None))
    blocks = headcut.model_blocks(model)
    unpruned = {"perplexity": float(evaluate(model, test, bleu=False).value), "exact_match": exact_match(model, test),
                "steps": total_steps}
    cal = load_calibration(model, tok, DataConfig(path=str(train_csv), max_examples=512, **data_options))
    michel = plan_prune(model, cal, PruneConfig(method="michel", keep=args.seq2seq_keep))
    michel_loss = eval_metric(model, test).measure(michel.mask)
    headcut.slim(model, michel.mask)
    out = {
        "pairs": {"train": len(pairs) - 1000, "dev": 500, "test": 500}, "heads": sum(b.heads for b in blocks),
        "keep": args.seq2seq_keep, "unpruned": unpruned,
        "lottery": {"perplexity": float(evaluate(ticket.model, test, bleu=False).value),
                    "exact_match": exact_match(ticket.model, test), "seconds": round(seconds, 1),
                    "iterations": len(lot["iterations"]), "per_step": lot["per_step"],
                    "kept_by_kind": {k: sum(n for b, n in ticket.report["heads"]["per_block_after"].items()
                                            if b.startswith(k)) for k in ("encoder", "decoder", "cross")},
                    "removed_by_kind": [it["removed_by_kind"] for it in lot["iterations"]]},
        "control": {"perplexity": float(evaluate(ticket.result.details.control_model, test, bleu=False).value),
                    "exact_match": exact_match(ticket.result.details.control_model, test),
                    "steps": lot["control"]["steps"]},
        "michel": {"perplexity": michel_loss, "exact_match": exact_match(model, test)},
    }
    print(json.dumps(out), file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="both", choices=("classifier", "seq2seq", "both"))
    ap.add_argument("--keep", type=int, default=16)
    ap.add_argument("--train-examples", type=int, default=3000)
    ap.add_argument("--seq2seq-keep", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.part in ("seq2seq", "both"):
            results["seq2seq"] = seq2seq_part(args, work)
        if args.part in ("classifier", "both"):
            results["classifier"] = classifier_part(args, work)
    print(json.dumps(results, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
