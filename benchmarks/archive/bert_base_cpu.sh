#!/usr/bin/env bash
# Benchmark: a BERT-base-shaped random model (12 layers x 12 heads, hidden 768) slimmed to 72, 36
# and 16 heads; `headcut bench` at batch 8 x 128 tokens. The measured speed-up should reach at
# least 95 % of the FLOP-ratio speed-up.
#   bash benchmarks/archive/bert_base_cpu.sh [WORKDIR] [extra bench flags, e.g. --device cuda --dtype float16]
set -euo pipefail
work=${1:-/tmp/headcut-bert-base}
shift || true
mkdir -p "$work"
python - "$work" <<'PY'
import json, sys, random
from pathlib import Path
import torch, transformers
work = Path(sys.argv[1])
if not (work / "full" / "config.json").exists():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    transformers.BertModel(cfg).save_pretrained(work / "full")
rng = random.Random(0)
for keep in (72, 36, 16):
    # spread `keep` heads as evenly as possible over the 12 layers, random heads within a layer
    per = [keep // 12 + (1 if i < keep % 12 else 0) for i in range(12)]
    mask = {"keep": {f"self.{i}": sorted(rng.sample(range(12), n)) for i, n in enumerate(per)}}
    (work / f"mask{keep}.json").write_text(json.dumps(mask))
PY
for keep in 72 36 16; do
  headcut export "$work/full" --mask "$work/mask$keep.json" --out "$work/keep$keep" --force
done
headcut bench "$work/full" "$work/keep72" "$work/keep36" "$work/keep16" \
  --batch-size 8 --seq-len 128 --runs 20 --warmup 3 --json "$work/bench.json" "$@"
