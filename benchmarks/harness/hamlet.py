"""The decoder studies' evaluation text and models: the first :data:`EVAL_TOKENS` tokens of hamlet.txt read in
windows of :data:`WINDOWS` tokens (``benchmarks/studies/decoder_recipe.py``, ``kv_budget.py``), and the real
checkpoints they cut (``headcut_offline``)."""

from __future__ import annotations

from pathlib import Path

import torch

WINDOWS = [128, 2048]
EVAL_TOKENS = 16384


def checkpoint(model: str) -> Path:
    from headcut_offline import gemma3_dir, smollm_dir

    return gemma3_dir() if model == "gemma3" else smollm_dir()


def eval_ids(src: Path) -> tuple[torch.Tensor, int | None]:
    """The first :data:`EVAL_TOKENS` tokens of hamlet.txt (no special tokens), and the BOS token every window is
    read after where the tokenizer starts every text with one (Gemma 3; SmolLM2's adds none)."""
    from transformers import AutoTokenizer

    from headcut.data.blocks import affixes
    from headcut_offline import hamlet_path

    tok = AutoTokenizer.from_pretrained(src)
    ids = tok(hamlet_path().read_text(), add_special_tokens=False)["input_ids"]
    if len(ids) < EVAL_TOKENS:
        raise SystemExit(f"hamlet.txt has {len(ids)} tokens, fewer than {EVAL_TOKENS}")
    prefix = affixes(tok)[0]  # the special tokens the tokenizer puts before every text, as headcut's blocks read
    bos = prefix[0] if len(prefix) == 1 else None
    return torch.tensor(ids[:EVAL_TOKENS], dtype=torch.long), bos
