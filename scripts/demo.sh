#!/usr/bin/env bash
# The README's main job, end to end on real data: a MiniLM sentiment classifier (all-MiniLM-L6-v2,
# 6 x 12 = 72 heads, fine-tuned by `headcut finetune` on 4,000 Rotten Tomatoes snippets once and
# cached), scored, pruned to 16 heads with the one-line default, `headcut prune MODEL --keep 16 --data train.csv
# --out ...`: the default recipe of a classifier, `encoder` (`headcut recipes encoder`: in two rounds, 72 -> 24 -> 16,
# each FLAP's fluctuation scores, a least-squares refit of the kept heads' output projections, then recovery
# fine-tuning distilled from the unpruned model, its hidden states matched too (weight 2), for one epoch of the
# snippets, its weights averaged over the last half), timed before and after; the slimmed model is reloaded with
# plain transformers. One evaluation set throughout: the 2,808 held-out snippets. Outputs go to $HEADCUT_DEMO_DIR
# (default ./headcut-demo); HEADCUT_DEMO_KEEP sets the heads kept (default 16; the recipe's schedule picks the
# rounds: below 24 heads two rounds of 500 recovery steps, below 12 250 steps in the first and 750 in the second);
# HEADCUT_DEMO_METHOD runs one paper's method instead (`--method`, with its defaults and the recovery below); step
# headings and progress go to stderr, results to stdout.
set -euo pipefail
work=${HEADCUT_DEMO_DIR:-headcut-demo}
keep=${HEADCUT_DEMO_KEEP:-16}
method=${HEADCUT_DEMO_METHOD:-}
case "$method" in
  # no method: the default recipe (its data options too: 4,000 examples, batch 8)
  "") how=(); what="the default recipe of a classifier, encoder (headcut recipes encoder)";;
  # a learned-gate method: 250 steps of gates distilled from the unpruned model (--alpha 0.9), then 250
  # distilled recovery steps: 500 steps of 8 = one epoch of the 4,000 training snippets in all
  pass|passconc|dsp|ste|voita|lag) how=(--method "$method" --max-steps 250 --alpha 0.9 --recover-steps 250
      --batch-size 8 --max-examples 4000)
    what="$method: 250 steps of gates distilled from the unpruned model, then 250 distilled recovery steps: one epoch of the 4,000 training snippets";;
  # any other method: its choice of heads, then 500 steps of 8 of distilled recovery = one epoch
  *) how=(--method "$method" --recover-steps 500 --batch-size 8 --max-examples 4000)
    what="$method's choice of heads, then 500 steps of recovery fine-tuning distilled from the unpruned model: one epoch";;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
# the repository's helpers (headcut_offline, at its root: no part of the installed package) for the Python below
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$work"
say() { printf '\n== %s\n' "$*" >&2; }

say "preparing the classifier (fine-tuned once, then cached in ${HEADCUT_CACHE:-~/.cache/headcut})"
model=$(python "$here/benchmarks/classifier.py")
read -r train test < <(python -c "from headcut_offline import rotten_tomatoes_splits as s; d = s(); print(d['train'], d['test'])")
headcut info "$model"

say "which heads matter? (Greedy-Gnorm scores on 512 training snippets)"
headcut score "$model" --data "$train" --max-examples 512 --scorer gnorm --json "$work/scores.json"

say "pruning 72 -> $keep heads with $what (accuracy on the 2,808 held-out snippets)"
headcut prune "$model" --keep "$keep" --data "$train" --eval-data "$test" ${how[@]+"${how[@]}"} \
  --out "$work/minilm-$keep" --force --json "$work/prune.json"

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
