"""AUBER's environment (:mod:`headcut.pruning.auber`, step 4): one layer of the model, and the reward of an action
(eq. 4: the change of the mini-dev metric it causes, in percentage points), measured in-process from the layer's
replayed input (:mod:`headcut.model.layer_cache`), each set of pruned heads once."""

from __future__ import annotations

import torch
from torch import nn

from ...data import Calibration
from ...model.evaluation import evaluate
from ...model.gating import HeadGates
from ...model.layer_cache import LayerReplay
from ..units import BlockSet

#: rewards reach the agent in percentage points (the authors' code: ``(current - previous) * 100``)
REWARD_SCALE = 100.0


class LayerEnv:
    """The model with the layer ``s`` to prune: ``measure(pruned units)`` gates those units' heads off
    (on top of the heads already removed) and evaluates mini-dev, from the replayed layer input when
    possible; each set is evaluated once."""

    def __init__(
        self,
        model: nn.Module,
        gates: HeadGates,
        s: BlockSet,
        units: list[list[int]],
        dev: Calibration,
        metric: str,
        higher: bool,
    ) -> None:
        self.model, self.gates, self.s, self.units = model, gates, s, units
        self.dev, self.metric, self.sign = dev, metric, 1.0 if higher else -1.0
        self.memo: dict[frozenset[int], float] = {}
        device = next(model.parameters()).device
        self.full = {b.name: torch.ones(b.heads, device=device) for b in s.blocks}
        self.replay = LayerReplay(model, s.blocks[0], dev.batches)
        self.replay.record()

    def set_gates(self, pruned: frozenset[int] | set[int]) -> None:
        for b in self.s.blocks:
            g = self.full[b.name].clone()
            for u in pruned:
                g[self.units[u]] = 0.0
            self.gates.gates[b.name] = g

    def measure(self, pruned: frozenset[int]) -> float:
        value = self.memo.get(pruned)
        if value is None:
            self.set_gates(pruned)
            if self.replay.ready:
                with self.replay.active():
                    result = evaluate(self.model, self.dev, bleu=False)
            else:
                result = evaluate(self.model, self.dev, bleu=False)
            value = self.memo[pruned] = float(result.metrics[self.metric])
        return value

    def reward(self, before: float, after: float) -> float:
        """eq. 4 in percentage points, positive when the metric improves."""
        return self.sign * (after - before) * REWARD_SCALE
