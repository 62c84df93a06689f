"""AUBER's agent on one layer (:mod:`headcut.pruning.auber`, steps 3, 5 and 6; Algorithm 1): the valid actions (a
pruned head never again; END only once the layer's floor is reached), the DQN's epsilon-greedy episodes (eq. 3,
:mod:`headcut.learned.dqn`) and the trained agent's greedy policy."""

from __future__ import annotations

from typing import Any

import torch

from ...learned.dqn import Agent, Transition
from .environment import LayerEnv


def _valid(n_units: int, pruned: list[int], floor: int, end_allowed: bool = True) -> torch.Tensor:
    valid = torch.ones(n_units + 1, dtype=torch.bool)
    valid[pruned] = False
    if n_units - len(pruned) <= floor:
        valid[:n_units] = False  # the floor is reached: END only
    valid[n_units] = end_allowed or not bool(valid[:n_units].any())
    return valid


def train_agent(
    env: LayerEnv, state0: torch.Tensor, episodes: int, floor: int, seed: int, on_episode: Any = None
) -> tuple[Agent, list[float]]:
    """Algorithm 1, lines 3-28: ``episodes`` epsilon-greedy episodes from ``state0``; the agent learns
    after each. Returns the agent and each episode's summed reward."""
    n = len(env.units)
    agent = Agent(n, seed=seed)
    base = env.measure(frozenset())
    returns: list[float] = []
    for episode in range(episodes):
        state, pruned, previous, total = state0.clone(), [], base, 0.0
        while True:
            valid = _valid(n, pruned, floor)
            action = agent.act(state, valid)
            if action == n:  # END: terminal, reward 0
                agent.remember(Transition(state, action, 0.0, None, None))
                break
            pruned.append(action)
            current = env.measure(frozenset(pruned))
            reward = env.reward(previous, current)
            nxt = state.clone()
            nxt[action] = 0.0  # "the value of ith index of s_l ... is set to 0"
            agent.remember(Transition(state, action, reward, nxt, _valid(n, pruned, floor)))
            state, previous, total = nxt, current, total + reward
        agent.end_episode()
        returns.append(total)
        if on_episode is not None:
            on_episode(episode + 1, agent, returns)
    return agent, returns


def greedy_policy(
    agent: Agent, env: LayerEnv, state0: torch.Tensor, floor: int, must: int, heads_per_unit: int
) -> tuple[list[int], list[dict[str, Any]], int]:
    """Algorithm 1, line 29: the trained agent's greedy actions from the initial state until END; while
    fewer than ``must`` heads are removed, END is not allowed (the upper bound). Returns the pruned
    units, the path and the heads removed only because of the bound."""
    n = len(env.units)
    state, pruned, path = state0.clone(), [], []
    previous = env.measure(frozenset())
    forced = 0
    while True:
        removed = len(pruned) * heads_per_unit
        valid = _valid(n, pruned, floor, end_allowed=removed >= must)
        free_choice = agent.greedy(state, _valid(n, pruned, floor))
        action = agent.greedy(state, valid)
        if action == n:
            break
        if free_choice == n:
            forced += heads_per_unit
        pruned.append(action)
        current = env.measure(frozenset(pruned))
        path.append(
            {
                "remove": list(env.units[action]),
                "metric": current,
                "reward": env.reward(previous, current),
                "forced": free_choice == n,
            }
        )
        state = state.clone()
        state[action] = 0.0
        previous = current
    return pruned, path, forced
