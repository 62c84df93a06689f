#!/usr/bin/env bash
# The README's main job, end to end on real data: a MiniLM sentiment classifier (all-MiniLM-L6-v2,
# 6 x 12 = 72 heads, fine-tuned on Rotten Tomatoes once and cached), scored, pruned to 16 heads
# with PASS (gates learned jointly with the model for one epoch of the 4,000 training snippets),
# evaluated and timed before and after; the slimmed model is reloaded with plain transformers.
# Outputs go to $HEADCUT_DEMO_DIR (default ./headcut-demo).
set -euo pipefail
work=${HEADCUT_DEMO_DIR:-headcut-demo}
# pass: the design card's headline method (README, "Benchmarks": 76-78 % at 16 heads, michel 68.2 %)
method=${HEADCUT_DEMO_METHOD:-pass}
case "$method" in
  pass|passconc|dsp|ste|voita|lag) how=(--max-steps 500 --batch-size 8); what="training: 500 steps of 8 = one epoch of the 4,000 training snippets; evaluation: the 2,808 held-out ones";;
  *) how=(--max-examples 512); what="calibration: 512 training snippets; evaluation: 512 held-out ones";;
esac
mkdir -p "$work"

echo "== preparing the classifier (fine-tuned once, then cached in ${HEADCUT_CACHE:-~/.cache/headcut})"
model=$(python -c "from headcut.offline import minilm_classifier; print(minilm_classifier())")
read -r train test < <(python -c "from headcut.offline import rotten_tomatoes_splits as s; d = s(); print(d['train'], d['test'])")
headcut info "$model"

echo "== which heads matter? (Greedy-Gnorm scores on 512 training snippets)"
headcut score "$model" --data "$train" --max-examples 512 --scorer gnorm --json "$work/scores.json"

echo "== pruning 72 -> 16 heads with $method ($what)"
headcut prune "$model" --method "$method" --keep 16 --data "$train" --eval-data "$test" \
  "${how[@]}" --out "$work/minilm-16" --force --json "$work/prune.json"
headcut eval "$model" --data "$test" --max-examples 1000 --batch-size 64 --json "$work/eval-before.json"
headcut eval "$work/minilm-16" --data "$test" --max-examples 1000 --batch-size 64 --json "$work/eval-after.json"

echo "== timing both (CPU, batch 8 x 128 tokens)"
headcut bench "$model" "$work/minilm-16" --batch-size 8 --seq-len 128 --runs 10 --warmup 2 --json "$work/bench.json"

python - "$work" <<'PY'
import json, sys
from pathlib import Path
import torch, transformers
transformers.utils.logging.disable_progress_bar()
work = Path(sys.argv[1])
before, after = (json.loads((work / f"eval-{w}.json").read_text()) for w in ("before", "after"))
bench = json.loads((work / "bench.json").read_text())["models"]
rows = [
    ("accuracy (1,000 held-out)", f"{before['metrics']['accuracy']:.4f}", f"{after['metrics']['accuracy']:.4f}"),
    ("heads", str(bench[0]["heads"]), str(bench[1]["heads"])),
    ("parameters", f"{bench[0]['params']:,}", f"{bench[1]['params']:,}"),
    ("median latency, ms", f"{bench[0]['median_ms']:.1f}", f"{bench[1]['median_ms']:.1f}"),
    ("speed-up", "1.00x", f"{bench[1]['speedup']:.2f}x"),
]
print(f"\n{'':28}{'before':>14}{'after':>14}")
for name, a, b in rows:
    print(f"{name:28}{a:>14}{b:>14}")
# plain transformers loads the slimmed model (trust_remote_code) and agrees with headcut's loader
tok = transformers.AutoTokenizer.from_pretrained(work / "minilm-16")
plain = transformers.AutoModelForSequenceClassification.from_pretrained(work / "minilm-16", trust_remote_code=True)
batch = tok(["A gripping, beautifully acted film.", "Dull and far too long."], padding=True, return_tensors="pt")
with torch.no_grad():
    labels = [plain.config.id2label[i] for i in plain(**batch).logits.argmax(-1).tolist()]
print(f"\nplain transformers reloads {work / 'minilm-16'}: predictions {labels}")
PY
