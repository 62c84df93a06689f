#!/usr/bin/env bash
# The README's main job, end to end on a real model (all-MiniLM-L6-v2, 6 x 12 = 72 heads):
# show its heads, cut it to 16 heads, check that plain transformers loads the result and gives the
# same outputs as the gated original, and time both on the CPU.
set -euo pipefail
work=${HEADCUT_DEMO_DIR:-headcut-demo}
mkdir -p "$work"
model=$(python -c "from headcut.offline import minilm_dir; print(minilm_dir())")

headcut info "$model"

# Keep 16 of 72 heads: 3 in each of layers 0-3 and 2 in layers 4-5. Until scoring lands, which
# heads is arbitrary; this shows the surgery, not head selection.
python - "$work/mask.json" <<'PY'
import json, sys
keep = {f"self.{i}": [0, 1, 2] if i < 4 else [0, 1] for i in range(6)}
json.dump({"keep": keep}, open(sys.argv[1], "w"), indent=1)
PY
headcut export "$model" --mask "$work/mask.json" --out "$work/minilm-16" --force

python - "$model" "$work/minilm-16" "$work/mask.json" <<'PY'
import json, sys, torch, transformers, headcut
transformers.utils.logging.disable_progress_bar()
src, out, mask = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
tok = transformers.AutoTokenizer.from_pretrained(out)
batch = tok(["headcut removes attention heads.", "The slimmed model loads with plain transformers."],
            padding=True, return_tensors="pt")
plain = transformers.AutoModel.from_pretrained(out, trust_remote_code=True).eval()
original = headcut.load(src)
with torch.no_grad():
    with headcut.gated(original, mask):
        expected = original(**batch).last_hidden_state
    got = plain(**batch).last_hidden_state
print(f"plain transformers loads {out}: max |slimmed - gated original| = {(got - expected).abs().max().item():.2e}")
PY

headcut bench "$model" "$work/minilm-16" --batch-size 8 --seq-len 128 --runs 10 --warmup 2
