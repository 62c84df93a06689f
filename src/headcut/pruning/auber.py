"""``auber``: AUBER, automated BERT regularisation by layer-wise DQN head pruning (Lee, Lee & Kang,
PLOS ONE 2021, arXiv:2009.14409, §4 "Proposed method" and §5.1 "Experimental settings").

For small training sets (the paper: fewer than 10,000 examples), where pruning heads regularises
the model: the paper reports accuracy *above* the fine-tuned model's. The method decides by itself
how many heads each layer loses. Layer by layer (Algorithm 1):

1. **Split.** Before each layer the training data is split at random 1:2 into mini-train and
   mini-dev (§5.1: "randomly split into 1:2 to yield a mini-training dataset and a mini-dev
   dataset"; the authors' code puts 25 % in its dev part). The rewards are measured on mini-dev, at
   most ``reward_examples`` of it (default 128; the report states the count), and the layer is
   fine-tuned on mini-train. The paper evaluates all of mini-dev; the cap keeps a run of the 6 x 12
   MiniLM near 20 minutes on 2 CPU cores, at a price: an accuracy on 128 examples moves in steps of
   0.78 points, and `docs/benchmarks.md#earlier-studies` shows the agent chasing that noise. So the default reward
   of a classifier is the paper's accuracy only when the rewards see all of mini-dev, and the
   mini-dev loss, a steadier signal, when it is capped (:func:`reward_metric_for`).
2. **State** ("State representation", Theorem 1, eqs. 5-19): for each head h of the layer, the L1 norm
   of its value matrix ||W_V^h||_1, which bounds the head's output ||O_h||_1 <= C ||W_V^h||_1;
   standardised over the layer (mean 0, standard deviation 1) and passed through a softmax, so
   s_l sums to 1. ``state``: ``value-l1`` (the paper's), or the ablations of Table 3: ``query``,
   ``key`` (the L1 norm of those matrices) and ``value-l2`` (the L2 norm; the authors' code computes
   this one although the text says L1).
3. **Actions**: prune head i (i = 1..H) or END. After head i is pruned, entry i of the state is set
   to 0 and the result is the next state; END ends the episode ("Action").
4. **Reward** (eq. 4): ``reward = current_performance - previous_performance``, the change of the
   mini-dev metric caused by the action (the previous one is the unpruned layer's for the first
   action); END's reward is 0 ("it is set to 0 to encourage the DQN agent to prune only when the
   expected change in performance is positive"). Rewards are given to the agent in percentage points
   (the authors' code multiplies by 100). The metric is the task's (accuracy on a whole mini-dev, the
   loss on a capped one, see 1.; the loss for language models, whose reward is then the loss's
   decrease) or ``reward_metric`` (e.g. ``mcc`` for CoLA-like data).
5. **Agent**: the DQN of :mod:`headcut.learned.dqn` (4-layer MLP, 512 hidden, LeakyReLU; replay
   memory 5,000; batch 128; gamma 1; epsilon-greedy 1 -> 0.05 with decay 256, eq. 3; one
   optimisation per episode), trained for ``episodes`` episodes (150), a new agent per layer.
6. **Policy**: the trained agent acts greedily from the layer's initial state until END; those heads
   are pruned, then the model is fine-tuned on mini-train with learning rate 2e-6 (§5.1) for
   ``layer_epochs`` epochs (the paper gives no length; 1).
7. **End**: after the last layer, the model is fine-tuned on the training data with early stopping
   (patience 20 evaluations, §5.1). The paper names no data to stop on; headcut holds out
   ``reward_examples`` random training examples, fine-tunes on the rest and stops on those (never
   on ``--eval-data``, which measures the result), evaluating 20 times per epoch, for at most
   ``epochs`` (default 2) epochs or ``max_steps`` steps at ``lr`` (2e-6, the authors' single
   fine-tuning rate), and keeps the best evaluation's weights (the pruned model before this
   fine-tune counts as a candidate).

Rules the paper's text leaves implicit, as headcut applies them:

* **The last head stays.** An episode is forced to END when one head (unit) of the layer is left,
  as the authors' code does ("if episode_pruned_num != 11"): AUBER never empties a layer unless
  ``allow_empty_layers``; ``--min-heads-per-block`` raises that floor.
* **Removed heads are not actions**: the agent never picks a head it already pruned (the authors'
  code gives such actions a Q-value of -5).
* **Layer order**: bottom-up, the first layer first; ``reverse`` gives the paper's AUBER-Reverse
  ablation (Table 3). A "layer" is a prune unit set of :mod:`headcut.pruning.units`: one attention
  block, or every block sharing weights (ALBERT); encoder-decoder models are processed block by
  block in the model's order (encoder, then decoder self- and cross-attention). Under grouped-query
  attention with ``--gqa group``/``auto`` an action removes a whole KV group, and the state has one
  entry per group (the norm of its heads).
* **Upper bound**: with ``--keep K``/``--sparsity S`` (optional) the kept heads are held to at most
  K: when the agent's own choices would keep more, each remaining layer's greedy policy must first
  remove its share of the excess (ceil(excess / layers left), or more if the later layers cannot
  take the rest), choosing by its Q-values; the report counts the heads so forced.

Practical, and exact: the rewards are computed in-process. The layers below the current one do not
change during its episodes, so their output on mini-dev is recorded once per layer and replayed
(:mod:`headcut.model.layer_cache`; checked against a full forward, else the full model runs), and the
metric of each set of pruned heads is computed once (the authors' ``transitions`` dictionary).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import DistillOptions, PruneConfig, TrainConfig
from ..data import Calibration
from ..errors import HeadcutError, label
from ..formatting import metric_text as _fmt
from ..learned.dqn import Agent, Transition
from ..model.evaluation import evaluate
from ..model.gating import HeadGates
from ..model.layer_cache import LayerReplay
from ..model.masks import HeadMask
from ..options import option
from ..scoring.weights import block_rows
from ..training.engine import EarlyStopping, Trainer
from ..training.finetuning import DistillationLoss, unpruned_teacher
from .base import PruneResult, TrajectoryPoint, seed_in_range
from .method import MethodBase, Problem, Summary
from .search import Budget, keep_from_sparsity
from .units import BlockSet

#: rewards reach the agent in percentage points (the authors' code: ``(current - previous) * 100``)
REWARD_SCALE = 100.0
#: mini-train : mini-dev (§5.1)
SPLIT = (1, 2)
#: evaluations per epoch of the final fine-tune (its early stopping)
EVALS_PER_EPOCH = 20


#: the state features (``state``): the paper's value-matrix L1 norm and its ablations
AUBER_STATES = ("value-l1", "query", "key", "value-l2")
#: metrics a reward may watch (``reward_metric``; accuracy, macro_f1 and mcc: classification)
REWARD_METRICS = ("accuracy", "macro_f1", "mcc", "loss")
#: mini-dev examples each reward is measured on, by default (the module's doc says why)
AUBER_REWARD_EXAMPLES = 128


@dataclass
class AuberOptions(DistillOptions):
    """AUBER's options (see the module's doc). ``episodes``: per layer (150). ``reverse``: last layer
    first. ``state``: ``value-l1``, ``query``, ``key`` or ``value-l2``. ``reward_examples``: mini-dev
    examples the rewards are measured on (and held out for the final early stopping). ``reward_metric``:
    None (:func:`reward_metric_for`: a classifier's accuracy on a whole mini-dev, else the loss),
    ``accuracy``, ``macro_f1``, ``mcc`` or ``loss``.
    ``allow_empty_layers``: the agent may prune a layer's last head. ``layer_epochs``: fine-tuning
    epochs on mini-train after each layer. ``patience``: evaluations without improvement that stop the
    final fine-tune. The training fields: ``lr`` (2e-6) for both fine-tunes; ``epochs``/``max_steps``
    bound the final fine-tune (default 2 epochs); ``warmup_steps``, ``grad_accum``. ``alpha``/``temperature``:
    both fine-tunes distil from the unpruned model (:class:`headcut.config.DistillOptions`; 0: the paper's
    task loss)."""

    episodes: int = option(150, low=1, help="DQN episodes per layer (the paper's 150).")
    reverse: bool = option(False, help="Process the last layer first (the paper's AUBER-Reverse ablation).")
    state: str = option(
        "value-l1",
        choices=AUBER_STATES,
        help="The state feature: the L1 norm of each head's value "
        "matrix (the paper's), or the query, key or value L2 ablations.",
    )
    reward_examples: int = option(AUBER_REWARD_EXAMPLES, low=2, help="Mini-dev examples each reward is measured on.")
    reward_metric: str | None = option(
        None,
        choices=REWARD_METRICS,
        help="The metric the reward is the change of "
        "(default: a classifier's accuracy when the rewards see all of mini-dev, as in "
        "the paper, else its loss; the loss for language models).",
    )
    allow_empty_layers: bool = option(False, help="Let the agent prune a layer's last head (by default one stays).")
    layer_epochs: int = option(1, low=0, help="Fine-tuning epochs on mini-train after each layer (0: none).")
    patience: int = option(20, low=1, help="Evaluations without improvement that stop the final fine-tune.")
    lr: float = 2e-6

    #: fields the prune run sets itself, or that AUBER does not use
    HIDDEN = ("seed", "shuffle", "mode", "gate_lr", "eval_every", "checkpoint_every", "gates_first")


# ---- the layer's units and state -----------------------------------------------------------------------


def units_of(s: BlockSet) -> list[list[int]]:
    """The heads each action removes (in every block of the set): one head, or a whole KV group."""
    if s.mode == "group":
        return [list(range(j * s.group_size, (j + 1) * s.group_size)) for j in range(s.heads // s.group_size)]
    if s.mode != "head":
        raise HeadcutError(f"auber prunes single heads or whole KV groups, not --gqa {s.mode}")
    return [[h] for h in range(s.heads)]


def unit_norms(model: nn.Module, s: BlockSet, units: list[list[int]], state: str) -> torch.Tensor:
    """The norm of each unit's ``state`` matrix (value, query or key; L1, or L2 for ``value-l2``), read
    off the set's first block (blocks of a set share their weights)."""
    block = s.blocks[0]
    part = {"value-l1": "v", "value-l2": "v", "query": "q", "key": "k"}[state]
    with torch.no_grad():
        rows = block_rows(model.base_model, block, part).float()  # (heads in that projection, head_dim * in)
        squares = state == "value-l2"
        per = rows.pow(2).sum(dim=1) if squares else rows.abs().sum(dim=1)
        # a query head h owns q row h; a KV projection's row g serves query heads g*gs .. (g+1)*gs - 1
        owner = (lambda h: h) if part == "q" else (lambda h: h // block.group_size)
        out = []
        for unit in units:
            rows_of_unit = sorted({owner(h) for h in unit})
            total = float(per[rows_of_unit].sum())
            out.append(math.sqrt(total) if squares else total)
    return torch.tensor(out, dtype=torch.float32)


def initial_state(norms: torch.Tensor) -> torch.Tensor:
    """Standardise the norms over the layer (population std, as scikit-learn's StandardScaler; a
    constant layer gives zeros), then softmax ("State representation")."""
    std = norms.std(unbiased=False)
    z = (norms - norms.mean()) / std if float(std) > 0 else torch.zeros_like(norms)
    return torch.softmax(z, dim=0)


# ---- the report ---------------------------------------------------------------------------------------


@dataclass
class LayerRecord:
    """One processed layer: ``layer`` (its block names), the heads ``pruned`` (each block's numbering
    at the start), ``forced`` (heads the upper bound made the policy remove), the greedy ``path``
    (each action's heads, mini-dev metric and reward), the mini-dev metric ``before`` pruning,
    ``pruned_metric`` after it and ``tuned_metric`` after the fine-tune; the agent's ``episodes``,
    ``actions`` and distinct reward ``evaluations``; ``returns``: each episode's summed reward;
    ``replay``: layers replayed from the record (0: none; ``replay_note`` says why)."""

    layer: str
    blocks: list[str]
    units: int
    pruned: list[int]
    forced: int
    path: list[dict[str, Any]]
    before: float
    pruned_metric: float
    tuned_metric: float | None
    episodes: int
    actions: int
    evaluations: int
    returns: list[float]
    epsilon_end: float
    dqn_updates: int
    mini_train: int
    mini_dev: int
    reward_examples: int
    replay: int
    replay_note: str | None
    finetune_steps: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AuberRun:
    """AUBER's record (the report's ``auber`` section): the options used, the reward metric, every
    layer and the final fine-tune (steps, early stopping, examples)."""

    reward_metric: str
    higher_is_better: bool
    state: str
    episodes: int
    reverse: bool
    upper_bound: int | None
    reward_metric_why: str = ""
    layers: list[LayerRecord] = field(default_factory=list)
    final: dict[str, Any] | None = None
    seconds: float = 0.0
    #: distillation from the unpruned model (settings, teacher forwards, cache hits); None: the task loss
    distillation: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "distillation": self.distillation,
            "reward_metric": self.reward_metric,
            "reward_metric_why": self.reward_metric_why,
            "higher_is_better": self.higher_is_better,
            "state": self.state,
            "episodes": self.episodes,
            "reverse": self.reverse,
            "upper_bound": self.upper_bound,
            "reward_scale": REWARD_SCALE,
            "split": f"{SPLIT[0]}:{SPLIT[1]} (mini-train:mini-dev)",
            "layers": [layer.to_json() for layer in self.layers],
            "final": self.final,
            "seconds": self.seconds,
        }


# ---- the environment of one layer -----------------------------------------------------------------------


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


# ---- the method -----------------------------------------------------------------------------------------


def _floor_units(s: BlockSet, config: PruneConfig, allow_empty: bool) -> int:
    size = s.group_size if s.mode == "group" else 1
    floor = math.ceil(config.min_heads_per_block / size)
    return floor if allow_empty else max(1, floor)


def _upper_bound(config: PruneConfig, total: int) -> int | None:
    if config.keep is not None:
        return config.keep
    if config.sparsity is not None:
        return keep_from_sparsity(config.sparsity, total)
    return None


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


def _split(n: int, seed: int) -> tuple[list[int], list[int]]:
    """A random 1:2 split of ``n`` example indices into mini-train and mini-dev (seeded)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    cut = round(n * SPLIT[0] / sum(SPLIT))
    return order[:cut], order[cut:]


class AuberMethod(MethodBase):
    """AUBER (see the module's doc)."""

    name = "auber"
    Options = AuberOptions

    def check(self, config: PruneConfig, options: AuberOptions) -> None:
        if config.max_drop is not None:
            raise HeadcutError(
                "--max-drop applies to the score-based methods; auber decides how many heads go by "
                "its reward (give --keep K as an upper bound if you need a size)"
            )
        if config.uniform:
            raise HeadcutError("--uniform does not apply to auber: it decides each layer's heads on its own")
        if config.gqa == "uniform":
            raise HeadcutError("auber removes single heads or whole KV groups: use --gqa auto, group or duplicate")

    def step(self, total: int, config: PruneConfig, options: AuberOptions) -> tuple[int, bool]:
        return 1, True

    def check_units(self, sets: list[BlockSet], budget: Budget, config: PruneConfig, options: AuberOptions) -> None:
        total = sum(s.heads * s.width for s in sets)
        upper = _upper_bound(config, total)
        if upper is None:
            return
        if upper > total:
            raise HeadcutError(f"{label('keep')} {upper} is more than the model's {total} heads")
        least = sum(
            _floor_units(s, config, options.allow_empty_layers) * (s.group_size if s.mode == "group" else 1) * s.width
            for s in sets
            if s.heads
        )
        if upper < least:
            why = "at least one head per layer" if not options.allow_empty_layers else "--min-heads-per-block"
            raise HeadcutError(
                f"auber keeps {why} ({least} heads in all), more than the upper bound {upper}; "
                "raise --keep" + ("" if options.allow_empty_layers else " or pass --allow-empty-layers")
            )

    def summary(self, report: dict[str, Any], result: PruneResult) -> Summary:
        n = result.scorings
        return Summary(summary_items(report["auber"]), lead=f"{n} reward evaluation{'s' if n != 1 else ''}, ")

    def run(self, problem: Problem, options: AuberOptions) -> PruneResult:
        start = time.perf_counter()
        data = problem.data
        if not isinstance(data, Calibration) or data.items is None:
            raise HeadcutError("auber needs labelled training data (--data) read by headcut")
        if data.examples < 6:
            raise HeadcutError(f"auber needs at least 6 training examples to split 1:2 (got {data.examples})")
        task = data.task
        metric_name, why = reward_metric_for(task, options.reward_metric, options.reward_examples, data.examples)
        if metric_name in ("accuracy", "macro_f1", "mcc") and task != "classification":
            raise HeadcutError(f"--reward-metric {metric_name} needs a classifier; this is a {task} model (use loss)")
        higher = metric_name != "loss"
        model, config = problem.model, problem.config
        seed = config.seed
        sets = [s for s in problem.sets if s.heads]
        order = list(reversed(sets)) if options.reverse else sets
        total = sum(s.heads * s.width for s in problem.sets)
        upper = _upper_bound(config, total)
        run = AuberRun(
            reward_metric=metric_name,
            higher_is_better=higher,
            state=options.state,
            episodes=options.episodes,
            reverse=options.reverse,
            upper_bound=upper,
            reward_metric_why=why,
        )
        keep = HeadMask.full(problem.blocks).keep
        metric = problem.metric
        before = metric.measure(HeadMask.full(problem.blocks)) if metric is not None else None
        trajectory = [TrajectoryPoint(step=0, heads=total, metric=before)]
        model.eval()
        teacher = unpruned_teacher(model, task, options)  # before any layer is pruned or tuned
        gates = HeadGates(model)
        evaluations = 0
        with gates.installed():
            gates.set_mask(HeadMask(keep))
            for j, s in enumerate(order):
                record = self._layer(problem, options, gates, keep, s, j, order, upper, metric_name, higher, teacher)
                evaluations += record.evaluations
                run.layers.append(record)
                kept_now = sum(len(v) for v in keep.values())
                point = TrajectoryPoint(
                    step=j + 1,
                    heads=kept_now,
                    metric=None,
                    rescored=False,
                    removed=[f"{b}:{h}" for b in record.blocks for h in record.pruned],
                )
                if config.trajectory and metric is not None:
                    point.metric = metric.measure(HeadMask(keep))
                trajectory.append(point)
            run.final = self._final_finetune(problem, options, metric_name, higher, seed, teacher)
        model.eval()
        if teacher is not None:
            run.distillation = teacher.stats()
            teacher.cache = None
        mask = HeadMask({name: list(v) for name, v in keep.items()})
        heads_before = {b.name: b.heads for b in problem.blocks}
        heads_after = {name: len(v) for name, v in mask.keep.items()}
        forced = sum(r.forced for r in run.layers)
        result = PruneResult(
            method=self.name,
            mask=mask,
            heads_before=heads_before,
            heads_after=heads_after,
            trajectory=trajectory,
            stopped="bound" if forced else "policy",
            scorings=evaluations,
            seconds=0.0,
            config=config,
            target=upper,
            details=run,
        )
        if metric is not None:
            result.metric, result.higher_is_better = metric.name, metric.higher_is_better
            result.metric_before, result.metric_after = before, metric.measure(mask)
        run.seconds = result.seconds = time.perf_counter() - start
        return result

    # -- one layer ------------------------------------------------------------------------------------
    def _layer(
        self,
        problem: Problem,
        options: AuberOptions,
        gates: HeadGates,
        keep: dict[str, list[int]],
        s: BlockSet,
        j: int,
        order: list[BlockSet],
        upper: int | None,
        metric_name: str,
        higher: bool,
        teacher: DistillationLoss | None = None,
    ) -> LayerRecord:
        started = time.perf_counter()
        model, config, data = problem.model, problem.config, problem.data
        assert isinstance(data, Calibration)
        seed = config.seed
        units = units_of(s)
        size = len(units[0])
        floor = _floor_units(s, config, options.allow_empty_layers)
        train_idx, dev_idx = _split(data.examples, seed_in_range(seed * 1_000_003 + j))
        reward_idx = dev_idx[: options.reward_examples]
        dev = data.select(reward_idx, by_length=True)
        env = LayerEnv(model, gates, s, units, dev, metric_name, higher)
        norms = unit_norms(model, s, units, options.state)
        state0 = initial_state(norms)
        progress = problem.progress
        label = "+".join(s.names) if len(s.names) <= 2 else f"{s.names[0]}+{len(s.names) - 1} shared"

        def on_episode(done: int, agent: Agent, returns: list[float]) -> None:
            if progress is not None:
                progress("agent", done, options.episodes)
            if problem.on_step is not None:
                recent = returns[-10:]
                problem.on_step(
                    {
                        "phase": "agent",
                        "layer": label,
                        "epsilon": agent.epsilon,
                        "mean reward": sum(recent) / len(recent),
                        "heads pruned": sum(b.heads for b in problem.blocks) - sum(map(len, keep.values())),
                    }
                )

        n_units = len(units)
        if n_units <= floor:  # nothing the agent may remove
            agent, returns = None, []
            pruned, path, forced = [], [], 0
            base = env.measure(frozenset())
        else:
            agent, returns = train_agent(
                env, state0, options.episodes, floor, seed_in_range(seed * 1000 + j), on_episode
            )
            base = env.measure(frozenset())
            must = 0
            if upper is not None:
                kept_total = sum(len(v) for v in keep.values())
                excess = kept_total - upper
                if excess > 0:
                    later = order[j + 1 :]
                    capacity = sum(
                        (len(units_of(t)) - _floor_units(t, config, options.allow_empty_layers))
                        * len(units_of(t)[0])
                        * t.width
                        for t in later
                    )
                    must = max(math.ceil(excess / (len(later) + 1)), excess - capacity)
            pruned, path, forced_heads = greedy_policy(agent, env, state0, floor, math.ceil(must / s.width), size)
            forced = forced_heads * s.width
        pruned_heads = sorted(h for u in pruned for h in units[u])
        pruned_metric = env.measure(frozenset(pruned))
        for b in s.blocks:
            keep[b.name] = [h for h in keep[b.name] if h not in set(pruned_heads)]
        gates.set_mask(HeadMask(keep))
        # fine-tune on mini-train with the layer pruned (§5.1: lr 2e-6)
        steps = 0
        tuned: float | None = None
        if pruned and options.layer_epochs > 0:
            train = data.select(train_idx)
            cfg = TrainConfig(
                epochs=options.layer_epochs,
                lr=options.lr,
                weight_decay=options.weight_decay,
                grad_accum=options.grad_accum,
                max_grad_norm=options.max_grad_norm,
                checkpoint_every=None,
                seed=seed_in_range(seed + j),
                mode="joint",
                engine=options.engine,
            )
            train_progress = None if progress is None else (lambda d, t: progress("train", d, t))
            trained = Trainer(
                model, None, train.batches, cfg, progress=train_progress, loss_fn=teacher, dist=problem.dist
            ).train()
            model.eval()
            steps = trained.steps
            tuned = float(evaluate(model, dev, bleu=False).metrics[metric_name])
        record = LayerRecord(
            layer=label,
            blocks=list(s.names),
            units=n_units,
            pruned=pruned_heads,
            forced=forced,
            path=path,
            before=base,
            pruned_metric=pruned_metric,
            tuned_metric=tuned,
            episodes=options.episodes if agent else 0,
            actions=agent.n_action if agent else 0,
            evaluations=len(env.memo),
            returns=returns,
            epsilon_end=agent.epsilon if agent else 1.0,
            dqn_updates=agent.updates if agent else 0,
            mini_train=len(train_idx),
            mini_dev=len(dev_idx),
            reward_examples=len(reward_idx),
            replay=env.replay.layers_skipped,
            replay_note=env.replay.why,
            finetune_steps=steps,
            seconds=time.perf_counter() - started,
        )
        del env
        return record

    # -- the end --------------------------------------------------------------------------------------
    def _final_finetune(
        self,
        problem: Problem,
        options: AuberOptions,
        metric_name: str,
        higher: bool,
        seed: int,
        teacher: DistillationLoss | None = None,
    ) -> dict[str, Any]:
        """§5.1: "the final model is fine-tuned with the entire training dataset with early stopping"
        (patience 20): on every example but ``reward_examples`` held-out ones, which it stops on."""
        model, data = problem.model, problem.data
        assert isinstance(data, Calibration)
        generator = torch.Generator().manual_seed(seed_in_range(seed * 1_000_003 - 1))
        order = torch.randperm(data.examples, generator=generator).tolist()
        held = min(options.reward_examples, data.examples // 3)
        stop_set = data.select(order[:held], by_length=True)
        train = data.select(order[held:])
        per_epoch = max(1, len(train.batches) // options.grad_accum)
        every = max(1, math.ceil(per_epoch / EVALS_PER_EPOCH))
        epochs = options.epochs if options.epochs is not None or options.max_steps is not None else 2
        cfg = TrainConfig(
            epochs=epochs,
            max_steps=options.max_steps,
            lr=options.lr,
            weight_decay=options.weight_decay,
            warmup_steps=options.warmup_steps,
            warmup_ratio=options.warmup_ratio,
            schedule=options.schedule,
            grad_accum=options.grad_accum,
            max_grad_norm=options.max_grad_norm,
            eval_every=every,
            checkpoint_every=None,
            seed=seed,
            mode="joint",
            engine=options.engine,
        )
        early = EarlyStopping(metric_name, higher, options.patience)
        start_metrics = dict(evaluate(model, stop_set, bleu=False).metrics)
        early.update(model, 0, start_metrics)
        progress = problem.progress
        train_progress = None if progress is None else (lambda d, t: progress("train", d, t))

        def eval_fn(step: int) -> dict[str, Any]:
            return dict(evaluate(model, stop_set, bleu=False).metrics)

        on_step = problem.on_step
        shown = None if on_step is None else (lambda e: on_step({k: v for k, v in e.items() if k != "eval"}))
        trainer = Trainer(
            model,
            None,
            train.batches,
            cfg,
            eval_fn=eval_fn,
            progress=train_progress,
            loss_fn=teacher,
            on_step=shown,
            early_stopping=early,
            dist=problem.dist,
        )
        trained = trainer.train()
        model.eval()
        return {
            "examples": train.examples,
            "held_out": stop_set.examples,
            "eval_every": every,
            "max_steps": trainer.total_steps,
            "steps": trained.steps,
            "start": start_metrics[metric_name],
            "early_stopping": early.to_json(),
            "history": [{k: e[k] for k in ("step", "loss", "eval") if k in e} for e in trained.history],
            "seconds": trained.seconds,
            "config": cfg.to_json(),
        }


# ---- the end-of-run summary ------------------------------------------------------------------------------


def summary_items(auber: dict[str, Any]) -> list[Any]:
    """AUBER's layers (heads pruned, mini-dev metric before, pruned, fine-tuned) and its final fine-tune."""
    from rich import box
    from rich.table import Table

    name = auber["reward_metric"]
    table = Table(
        title=f"auber, layer by layer ({name} on mini-dev; {auber['episodes']} episodes per layer)", box=box.SIMPLE_HEAD
    )
    for col in ("layer", "pruned heads", "before", "pruned", "fine-tuned", "evaluations", "replayed", "seconds"):
        table.add_column(col, justify="left" if col in ("layer", "pruned heads") else "right")
    for layer in auber["layers"]:
        pruned = ",".join(map(str, layer["pruned"])) or "none"
        if layer["forced"]:
            pruned += f" ({layer['forced']} by the bound)"
        table.add_row(
            layer["layer"],
            pruned,
            _fmt(layer["before"]),
            _fmt(layer["pruned_metric"]),
            _fmt(layer["tuned_metric"]),
            str(layer["evaluations"]),
            f"{layer['replay']} layer{'s' if layer['replay'] != 1 else ''}" if layer["replay"] else "-",
            f"{layer['seconds']:.1f}",
        )
    out: list[Any] = [table]
    if auber.get("reward_metric_why"):
        out.append(f"reward: {name} ({auber['reward_metric_why']})")
    final = auber.get("final")
    if final is not None:
        stop = final["early_stopping"]
        how = (
            f"stopped early at step {stop['stopped_at']}"
            if stop["stopped_at"] is not None
            else f"ran all {final['steps']} steps"
        )
        out.append(
            f"final fine-tune on {final['examples']:,} examples: {how}; kept the weights of step "
            f"{stop['best_step']} ({name} {_fmt(stop['best'])} on {final['held_out']:,} held-out training "
            f"examples, {_fmt(final['start'])} before it)"
        )
    return out


METHOD = AuberMethod()
