"""The deep Q-network agent of AUBER (Lee, Lee & Kang, PLOS ONE 2021, arXiv:2009.14409), after DQN
(Mnih et al., 2013): a policy network, a target network and a replay memory.

Environment-free: :class:`Agent` sees states (one float per unit, 0 for a removed unit), picks
actions (unit ``i``, or ``END`` = the last index) and learns from ``(s, a, r, s', done)``
transitions; :mod:`headcut.pruning.auber.environment` is the environment.

What the paper fixes ("Reinforcement learning", §5.1) and this module follows:

* the network: 4 fully connected layers, H inputs, H + 1 outputs (H heads and END), 512 hidden
  units, LeakyReLU after every layer but the last;
* epsilon-greedy actions with (eq. 3)::

      eps = eps_final + (eps_initial - eps_final) * exp(-n_action / eps_decay),   1 -> 0.05, decay 256

  where ``n_action`` counts the actions taken so far (a new agent per layer starts at 0);
* a replay memory of 5,000 transitions, first in first out; mini-batches of 128; gamma = 1;
* one optimisation of the policy network per episode (Algorithm 1, line 27, after the episode ends);
* a target network whose parameters are copied from the policy network every tau steps.

What the paper leaves open, chosen here after the authors' code (and not exposed: nothing a user
would tune): SGD with learning rate 0.03 and momentum 0.9; the Huber (smooth L1) loss; every
gradient element clamped to [-1, 1]; the target network copied every 35 episodes (and before the
first); no update before the memory holds one mini-batch. Removed units are *invalid* actions: never
drawn at random, never chosen greedily, never in the max of the target (the authors' network
writes a constant -5 into their Q-values instead, and a constant 0.2 into END's; here END's value
is learned, as the paper's "H + 1 outputs" says, and its target is its reward, 0).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

#: the paper's hyper-parameters (§5.1, "Reinforcement learning")
HIDDEN = 512
EPS_INITIAL = 1.0
EPS_FINAL = 0.05
EPS_DECAY = 256.0
MEMORY = 5_000
BATCH = 128
GAMMA = 1.0
#: chosen after the authors' code (the paper leaves them open)
LEARNING_RATE = 0.03
MOMENTUM = 0.9
GRAD_CLAMP = 1.0
TARGET_EVERY = 35


def q_network(units: int, hidden: int = HIDDEN) -> nn.Sequential:
    """The 4-layer MLP: ``units`` inputs, ``units + 1`` Q-values (the last is END)."""
    return nn.Sequential(
        nn.Linear(units, hidden),
        nn.LeakyReLU(),
        nn.Linear(hidden, hidden),
        nn.LeakyReLU(),
        nn.Linear(hidden, hidden),
        nn.LeakyReLU(),
        nn.Linear(hidden, units + 1),
    )


def epsilon(n_action: int, initial: float = EPS_INITIAL, final: float = EPS_FINAL, decay: float = EPS_DECAY) -> float:
    """The exploration rate after ``n_action`` actions (eq. 3)."""
    return final + (initial - final) * math.exp(-n_action / decay)


@dataclass(frozen=True)
class Transition:
    """One step: ``state``, the ``action`` taken, its ``reward``, the ``next_state`` (None after END)
    and the actions valid in it (a bool per action, None after END)."""

    state: torch.Tensor
    action: int
    reward: float
    next_state: torch.Tensor | None
    next_valid: torch.Tensor | None


class Agent:
    """A DQN agent for states of ``units`` entries and ``units + 1`` actions (END last).

    ``valid``: a bool tensor of ``units + 1`` entries, the actions allowed in a state (END may be
    disallowed, e.g. while a size bound forces more removals). Deterministic for a ``seed``."""

    def __init__(self, units: int, seed: int = 0) -> None:
        if units < 1:
            raise ValueError("the agent needs at least one unit")
        self.units = units
        self.end = units
        self.generator = torch.Generator().manual_seed(seed)
        self.random = random.Random(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.policy = q_network(units)
            self.target = q_network(units)
        self.target.load_state_dict(self.policy.state_dict())
        self.target.eval()
        self.optimizer = torch.optim.SGD(self.policy.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
        self.memory: deque[Transition] = deque(maxlen=MEMORY)
        self.n_action = 0
        self.episodes = 0
        self.updates = 0
        self.losses: list[float] = []

    @property
    def epsilon(self) -> float:
        return epsilon(self.n_action)

    def q_values(self, state: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.policy(state.unsqueeze(0)).squeeze(0)

    def greedy(self, state: torch.Tensor, valid: torch.Tensor) -> int:
        """The valid action of the highest Q-value."""
        q = self.q_values(state).masked_fill(~valid, -math.inf)
        return int(q.argmax())

    def act(self, state: torch.Tensor, valid: torch.Tensor) -> int:
        """An epsilon-greedy action (a uniform draw among the valid actions with probability eps);
        counts towards ``n_action``."""
        eps = self.epsilon
        self.n_action += 1
        if self.random.random() < eps:
            choices = [int(i) for i in torch.nonzero(valid).flatten()]
            return self.random.choice(choices)
        return self.greedy(state, valid)

    def remember(self, transition: Transition) -> None:
        self.memory.append(transition)

    def end_episode(self) -> float | None:
        """Algorithm 1, line 27: one optimisation step on a random mini-batch of the memory (none while
        it holds fewer than one mini-batch), then the target network's copy every TARGET_EVERY
        episodes. Returns the loss (None without an update)."""
        loss = self.optimize()
        if self.episodes % TARGET_EVERY == 0:
            self.target.load_state_dict(self.policy.state_dict())
        self.episodes += 1
        return loss

    def optimize(self) -> float | None:
        if len(self.memory) < BATCH:
            return None
        batch = self.random.sample(list(self.memory), BATCH)
        states = torch.stack([t.state for t in batch])
        actions = torch.tensor([t.action for t in batch])
        rewards = torch.tensor([t.reward for t in batch], dtype=torch.float32)
        live = [i for i, t in enumerate(batch) if t.next_state is not None]
        future = torch.zeros(BATCH)
        if live:
            nxt = torch.stack([batch[i].next_state for i in live])  # type: ignore[misc]
            ok = torch.stack([batch[i].next_valid for i in live])  # type: ignore[misc]
            with torch.no_grad():
                best = self.target(nxt).masked_fill(~ok, -math.inf).max(dim=1).values
            future[live] = best
        expected = rewards + GAMMA * future  # the Bellman target; END and terminal steps: the reward alone
        predicted = self.policy(states).gather(1, actions.unsqueeze(1)).squeeze(1)
        loss = F.smooth_l1_loss(predicted, expected)
        self.optimizer.zero_grad()
        loss.backward()
        for p in self.policy.parameters():
            assert p.grad is not None
            p.grad.clamp_(-GRAD_CLAMP, GRAD_CLAMP)
        self.optimizer.step()
        self.updates += 1
        value = float(loss.detach())
        self.losses.append(value)
        return value
