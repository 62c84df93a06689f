#!/usr/bin/env bash
# The README's main job, end to end on real data: a MiniLM sentiment classifier (all-MiniLM-L6-v2,
# 6 x 12 = 72 heads, fine-tuned by `headcut finetune` on 4,000 Rotten Tomatoes snippets once and
# cached), scored, pruned to 16 heads in two rounds, 72 -> 24 -> 16 (each: FLAP's fluctuation scores, a least-squares
# refit of the kept heads' output projections, then recovery fine-tuning distilled from the unpruned model, its
# hidden states matched too (weight 2), for one epoch of those snippets, its weights averaged over the last half), timed before
# and after; the slimmed model is
# reloaded with plain transformers. One evaluation set throughout: the 2,808 held-out snippets. Outputs
# go to $HEADCUT_DEMO_DIR (default ./headcut-demo); HEADCUT_DEMO_KEEP sets the heads kept (default 16; below 24 the
# cut runs in two rounds, --via 24, each with its refit and 500 recovery steps; below 12, 250 steps in the first
# round and 750 in the second); step headings and progress go to
# stderr, results to stdout.
set -euo pipefail
work=${HEADCUT_DEMO_DIR:-headcut-demo}
# fluctuation + refit + distilled recovery with hidden-state matching and weight averaging, in two rounds: the recipe
# measured on every task of the benchmark page, small data included (docs/benchmarks.md, "Targets on every task");
# HEADCUT_DEMO_METHOD picks another method
method=${HEADCUT_DEMO_METHOD:-fluctuation}
keep=${HEADCUT_DEMO_KEEP:-16}
case "$method" in
  # a learned-gate method: 250 steps of gates distilled from the unpruned model (--alpha 0.9), then 250
  # distilled recovery steps: 500 steps of 8 = one epoch of the 4,000 training snippets in all
  pass|passconc|dsp|ste|voita|lag) how=(--max-steps 250 --alpha 0.9 --recover-steps 250 --batch-size 8
      --max-examples 4000)
    what="250 steps of gates distilled from the unpruned model, then 250 distilled recovery steps: one epoch of the 4,000 training snippets";;
  # any other method: its choice of heads, the refit, then 500 steps of 8 of distilled recovery = one epoch, at a
  # constant rate with the weights averaged over the last 250 steps; below 24 heads in two rounds
  # (below 12 heads the first round recovers for 250 steps and the second for 750: 1,000 in all)
  *) steps=500; [ "$keep" -lt 12 ] && steps=750
    how=(--refit --recover-steps $steps --recover-hidden-weight 2 --recover-average 0.5 --batch-size 8 --max-examples 4000)
    what="scores of the 4,000 training snippets, a least-squares refit, then $steps steps of recovery fine-tuning distilled from the unpruned model with its hidden states matched (weight 2), the weights averaged over the last $((steps / 2))"
    if [ "$keep" -lt 12 ]; then how+=(--via 24 --via-steps 250)
      what="two rounds (72 -> 24 -> $keep heads; the first recovers for 250 steps) of: $what"
    elif [ "$keep" -lt 24 ]; then how+=(--via 24); what="two rounds (72 -> 24 -> $keep heads) of: $what: one epoch"
    else what="$what: one epoch"; fi;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
say() { printf '\n== %s\n' "$*" >&2; }

say "preparing the classifier (fine-tuned once, then cached in ${HEADCUT_CACHE:-~/.cache/headcut})"
model=$(python "$here/benchmarks/classifier.py")
read -r train test < <(python -c "from headcut_offline import rotten_tomatoes_splits as s; d = s(); print(d['train'], d['test'])")
headcut info "$model"

say "which heads matter? (Greedy-Gnorm scores on 512 training snippets)"
headcut score "$model" --data "$train" --max-examples 512 --scorer gnorm --json "$work/scores.json"

say "pruning 72 -> $keep heads with $method ($what; accuracy on the 2,808 held-out snippets)"
headcut prune "$model" --method "$method" --keep "$keep" --data "$train" --eval-data "$test" \
  "${how[@]}" --out "$work/minilm-$keep" --force --json "$work/prune.json"

say "timing both, interleaved (CPU, batch 8 x 128 tokens, 10 rounds)"
headcut bench "$model" "$work/minilm-$keep" --batch-size 8 --seq-len 128 --runs 10 --warmup 2 --update-card \
  --json "$work/bench.json"

say "before and after"
python - "$work" "minilm-$keep" <<'PY'
import json, sys
from pathlib import Path
import torch, transformers
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()
work = Path(sys.argv[1])
slim = work / sys.argv[2]
report = json.loads((work / "prune.json").read_text())
bench = json.loads((work / "bench.json").read_text())["models"]
metric = report["metric"]
rows = [
    (f"accuracy ({report['eval_data']['examples']:,} held-out)", f"{metric['before']:.4f}", f"{metric['after']:.4f}"),
    ("heads", str(report["heads"]["before"]), str(report["heads"]["after"])),
    ("parameters", f"{report['params']['before']:,}", f"{report['params']['after']:,}"),
    ("median latency, ms", f"{bench[0]['median_ms']:.1f}", f"{bench[1]['median_ms']:.1f}"),
    ("speed-up (median)", "1.00x", f"{bench[1]['speedup']:.2f}x"),
    ("per-round speed-ups, p25-p75", "", f"{bench[1]['speedup_p25']:.2f}-{bench[1]['speedup_p75']:.2f}x"),
]
print(f"{'':32}{'before':>14}{'after':>14}")
for name, a, b in rows:
    print(f"{name:32}{a:>14}{b:>14}")
# plain transformers loads the slimmed model (trust_remote_code) and agrees with headcut's loader
tok = transformers.AutoTokenizer.from_pretrained(slim)
plain = transformers.AutoModelForSequenceClassification.from_pretrained(slim, trust_remote_code=True)
batch = tok(["A gripping, beautifully acted film.", "Dull and far too long."], padding=True, return_tensors="pt")
with torch.no_grad():
    labels = [plain.config.id2label[i] for i in plain(**batch).logits.argmax(-1).tolist()]
print(f"\nplain transformers reloads {slim}: predictions {labels}")
PY
