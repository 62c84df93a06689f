"""Benchmark: a headcut output's model.onnx in onnxruntime against its safetensors model in PyTorch on
real data: accuracy in each runtime, predictions that differ, and the max abs difference of the logits,
in padded batches.

    python benchmarks/onnx_parity.py OUT_DIR DATA.csv [--batch-size 32] [--max-length 128]

OUT_DIR is written by ``headcut prune|export ... --format safetensors,onnx``; DATA.csv has ``text`` and
``label`` columns (labels as the model's label names or ids).
"""

from __future__ import annotations

import argparse
import csv
import json

import numpy as np
import onnxruntime
import torch
import transformers

import headcut


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("data")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=128)
    args = ap.parse_args()
    model = headcut.load(args.folder)
    tok = transformers.AutoTokenizer.from_pretrained(args.folder)
    session = onnxruntime.InferenceSession(f"{args.folder}/model.onnx", providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    rows = list(csv.DictReader(open(args.data, newline="")))
    label2id = {str(k): v for k, v in model.config.label2id.items()}
    gold = [label2id.get(r["label"], None) if r["label"] in label2id else int(r["label"]) for r in rows]
    torch_pred, ort_pred, worst = [], [], 0.0
    for start in range(0, len(rows), args.batch_size):
        batch = tok(
            [r["text"] for r in rows[start : start + args.batch_size]],
            padding=True,
            truncation=True,
            max_length=args.max_length,
            return_tensors="pt",
        )
        with torch.inference_mode():
            a = model(**batch).logits.numpy()
        b = session.run(["logits"], {k: v.numpy() for k, v in batch.items() if k in wanted})[0]
        worst = max(worst, float(np.abs(a - b).max()))
        torch_pred += a.argmax(-1).tolist()
        ort_pred += b.argmax(-1).tolist()
    n = len(rows)
    out = {
        "examples": n,
        "accuracy_torch": sum(p == g for p, g in zip(torch_pred, gold)) / n,
        "accuracy_onnxruntime": sum(p == g for p, g in zip(ort_pred, gold)) / n,
        "predictions_differ": sum(p != q for p, q in zip(torch_pred, ort_pred)),
        "max_abs_logit_diff": worst,
        "onnxruntime": onnxruntime.__version__,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
