"""AUBER's split of the training data (:mod:`headcut.pruning.auber`, step 1; §5.1): before each layer, at random
1:2 into mini-train and mini-dev; and the metric the rewards are the change of (:func:`reward_metric_for`)."""

from __future__ import annotations

import torch

#: mini-train : mini-dev (§5.1)
SPLIT = (1, 2)


def mini_dev_size(n: int) -> int:
    """Examples in mini-dev when ``n`` training examples are split 1:2."""
    return n - round(n * SPLIT[0] / sum(SPLIT))


def reward_metric_for(task: str, asked: str | None, reward_examples: int, examples: int) -> tuple[str, str]:
    """The reward's metric and why: ``asked`` if given; else, for a classifier, the paper's accuracy
    when the rewards see all of mini-dev (``reward_examples`` >= its size), and the loss when mini-dev
    is capped (an accuracy on a hundred examples moves in steps of about a point, and the agent keeps
    the sets of heads that gained those steps by chance: `docs/benchmarks.md#earlier-studies`); the loss for the
    other tasks."""
    if asked is not None:
        return asked, "--reward-metric"
    if task != "classification":
        return "loss", f"a {task} model: the reward is the decrease of the mini-dev loss"
    dev = mini_dev_size(examples)
    if reward_examples >= dev:
        return "accuracy", f"the rewards see all {dev} mini-dev examples, as in the paper: its accuracy reward"
    return "loss", (
        f"mini-dev capped at {reward_examples} of {dev} examples by --reward-examples, where an "
        f"accuracy moves in steps of {100 / reward_examples:.2g} points; --reward-metric accuracy "
        "gives the paper's reward"
    )


def split_examples(n: int, seed: int) -> tuple[list[int], list[int]]:
    """A random 1:2 split of ``n`` example indices into mini-train and mini-dev (seeded)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    cut = round(n * SPLIT[0] / sum(SPLIT))
    return order[:cut], order[cut:]
