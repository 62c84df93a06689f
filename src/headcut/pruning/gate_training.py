"""What the learned-gate methods share: gate slots, the training run, and the exact-K final mask.

Each method (``dsp``, ``ste``, ``voita``, ``lag``, ``pass``, ``passconc``; one module each) is a
:class:`GateLearner`: it owns its gate parameters (one value per *slot*), gives the gate values of a
training step and its regulariser, may adjust the gates after each optimizer step, and ranks the
slots at the end. This module runs the rest, the same for every method:

* **Slots** (:class:`Slots`), read off the prune units of :mod:`headcut.pruning.units`, never off a
  model family: one slot per head of a block set (ALBERT's sharing layers share one slot per head
  index, so "one mask position affects every sharing layer"), or one per KV group where ``--gqa``
  group/auto removes whole groups. Each slot stands for ``weight`` heads. The method's target is
  ``K / weight`` slots (exact when every slot has the same weight, which the budget check makes sure
  for the usual models; otherwise the nearest count, and the final mask is exact anyway).
* **Training** (:func:`train_gates`): the shared engine (:mod:`headcut.training.engine`) with the gates
  installed on the output projections (:class:`headcut.model.gating.HeadGates`). Each step the method draws
  the slot gates, every block's heads get their slot's value, and the loss is the model's task loss
  plus the method's regulariser. ``joint`` trains the model's weights with the gates; ``pipelined``
  freezes the model. Evaluation every ``eval_every`` steps measures the model with the *final* mask
  of that moment (top-K by the method's ranking, gates 0/1), i.e. what pruning would give if training
  stopped there.
* **Final mask**: the method's ranking (opening probability, ``w_h``, gate value) goes through the
  same exact-budget search as every other method (:func:`headcut.pruning.search.run_search`), so the
  result has exactly K heads and honours ``--gqa``, ALBERT sharing, ``--uniform`` and
  ``--min-heads-per-block``. The kept heads are kept with gate 1 (the papers evaluate the top-K
  heads with a hard 0/1 mask: PASS §4.1.1, DSP §4.3).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ..adapters import Block
from ..config import DistillOptions, PruneConfig
from ..data import Calibration
from ..errors import HeadcutError
from ..learned import HardConcrete
from ..model.evaluation import evaluate
from ..model.gating import HeadGates
from ..model.masks import HeadMask
from ..training.distributed import Dist
from ..training.engine import Trainer
from ..training.finetuning import DistillationLoss, unpruned_teacher
from .base import PruneProgress, PruneResult
from .method import MethodBase, Problem
from .search import Budget, run_search
from .units import BlockSet


@dataclass
class GateOptions(DistillOptions):
    """Options of the learned-gate methods: the shared :class:`headcut.config.TrainConfig` with the
    papers' defaults for gate training. ``mode`` None: the method's default (joint); ``epochs`` and
    ``max_steps`` both None: 3 epochs joint, 1 epoch pipelined (DSP §4.3, PASS §4.1.1); ``lr``: the
    model's learning rate (2e-5, the papers' BERT runs); ``gate_lr`` None: the method's paper value.
    Each method's options extend these with its own fields. ``seed`` is the prune run's seed."""

    lr: float = 2e-5
    mode: str | None = None

    #: fields the prune run sets itself (not an option a user passes to the method)
    HIDDEN = ("seed", "shuffle")

    def resolved(self, learner: type[GateLearner], task: str, seed: int) -> GateOptions:
        """These options with the method's defaults filled in (mode, epochs, gate learning rate, seed)."""
        mode = self.mode or learner.default_mode
        epochs = self.epochs
        if epochs is None and self.max_steps is None:
            epochs = 3 if mode == "joint" else 1
        gate_lr = self.gate_lr if self.gate_lr is not None else learner.default_gate_lr(task)
        return replace(self, mode=mode, epochs=epochs, gate_lr=gate_lr, seed=seed, shuffle=True)


@dataclass
class Slots:
    """The gated units: ``index[block]`` gives each head of the block its slot; ``weight[i]``: heads
    slot i stands for; ``layer[i]``: the block set (the "layer" of PASSCONC's concentrator) of slot i;
    ``layers``: the slots of each block set."""

    index: dict[str, torch.Tensor]
    weight: torch.Tensor
    layer: torch.Tensor
    layers: list[torch.Tensor]
    heads_per_layer: list[int]

    @property
    def n(self) -> int:
        return int(self.weight.numel())

    @classmethod
    def from_sets(cls, sets: list[BlockSet]) -> Slots:
        index: dict[str, torch.Tensor] = {}
        weight: list[float] = []
        layer: list[int] = []
        layers: list[torch.Tensor] = []
        heads_per_layer: list[int] = []
        for s in sets:
            if s.heads == 0:
                for b in s.blocks:
                    index[b.name] = torch.zeros(0, dtype=torch.long)
                continue
            per_group = s.mode == "group"
            count = s.heads // s.group_size if per_group else s.heads
            first = len(weight)
            local = torch.arange(s.heads) // s.group_size if per_group else torch.arange(s.heads)
            for b in s.blocks:
                index[b.name] = local + first
            size = s.group_size if per_group else 1
            weight += [float(size * s.width)] * count
            layer += [len(layers)] * count
            layers.append(torch.arange(first, first + count))
            heads_per_layer.append(count)
        if not weight:
            raise HeadcutError("the model has no heads left to learn gates for")
        return cls(
            index=index,
            weight=torch.tensor(weight, dtype=torch.float64),
            layer=torch.tensor(layer),
            layers=layers,
            heads_per_layer=heads_per_layer,
        )

    def target(self, keep_heads: int) -> int:
        """Slots to keep for ``keep_heads`` heads (exact for equal slot weights; at least 1)."""
        k = round(keep_heads / float(self.weight.mean()))
        return min(max(k, 1), self.n)

    def heads(self, slot_mask: torch.Tensor) -> float:
        """Heads covered by the slots where ``slot_mask`` is true."""
        return float((self.weight * slot_mask.to(torch.float64)).sum())

    def per_block(self, values: torch.Tensor, blocks: list[Block]) -> dict[str, list[float]]:
        """Slot values spread to every head of every block (the final search's importance)."""
        flat = values.detach().to("cpu", torch.float64)
        return {b.name: [float(v) for v in flat[self.index[b.name]]] for b in blocks}


@dataclass
class Context:
    """What a learner may need besides its own parameters: the model, the training batches, the task,
    the run's optimizer steps and the seed."""

    model: nn.Module
    batches: list[dict[str, Any]]
    task: str
    total_steps: int
    seed: int


class GateLearner:
    """One learned-gate method (subclasses in ``dsp.py``, ``ste.py``, ``voita.py``, ``lag.py``,
    ``pass_gates.py``, ``passconc.py``). ``slots``: the gated units; ``k``: slots to keep;
    ``options``: the run's options; ``ctx``: see :class:`Context`."""

    name = ""
    default_mode = "joint"
    #: what the final top-K ranks by (for reports)
    ranking = ""

    def __init__(self, slots: Slots, k: int, options: GateOptions, ctx: Context) -> None:
        self.slots = slots
        self.k = k
        self.options = options
        self.ctx = ctx

    @staticmethod
    def default_gate_lr(task: str) -> float:
        raise NotImplementedError

    # -- what every method defines ----------------------------------------------------------------
    def parameters(self) -> list[torch.Tensor]:
        """The tensors the optimizer trains (leaf, requires_grad)."""
        raise NotImplementedError

    def gates(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
        """Training step ``step`` (0-based): the slot gates (S,), the regulariser added to the task loss
        (or None), and log values."""
        raise NotImplementedError

    def importance(self) -> torch.Tensor:
        """The final ranking of the slots (higher = keep)."""
        raise NotImplementedError

    def open_slots(self) -> torch.Tensor:
        """Which slots are open now (bool, S): the progress bar's "open heads"."""
        raise NotImplementedError

    # -- optional ---------------------------------------------------------------------------------
    def after_step(self, step: int) -> dict[str, Any]:
        """After optimizer step ``step`` (1-based), under no_grad: adjust the gates; log values."""
        return {}

    def own_keep(self) -> torch.Tensor | None:
        """The slots the method keeps by its own rule when it cannot target K (Voita), else None."""
        return None

    def hyperparameters(self) -> dict[str, Any]:
        """The resolved hyper-parameters (for the report)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """State besides the parameters that a resumed run needs (tensors and plain values)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


def xavier_bound(fan_in: int, fan_out: int) -> float:
    """The bound of ``torch.nn.init.xavier_uniform_``: sqrt(6 / (fan_in + fan_out)) (the reference
    implementations initialise the gate logits this way)."""
    return math.sqrt(6.0 / (fan_in + fan_out))


def uniform_init(n: int, bound: float, seed: int) -> torch.Tensor:
    """``n`` values from U(-bound, bound), seeded (a leaf tensor with requires_grad)."""
    g = torch.Generator().manual_seed(seed)
    values = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * bound
    return values.to(torch.float32).requires_grad_(True)


def fitted(paper_steps: int, paper_run: int, total_steps: int) -> int:
    """A step count of a paper's schedule (``paper_steps`` in a run of ``paper_run`` steps) for a run
    of ``total_steps``: unchanged when the run is at least as long as the paper's, else shrunk in
    proportion (at least 1), so a short run goes through the whole schedule."""
    if total_steps >= paper_run:
        return paper_steps
    return max(1, round(paper_steps * total_steps / paper_run))


class _Ranked:
    """A fixed importance for the exact-budget search (the learned ranking)."""

    rescoring = False

    def __init__(self, importance: dict[str, list[float]]) -> None:
        self._importance = importance
        self.scorings = 0

    def importance(self, model: nn.Module, mask: HeadMask, progress: PruneProgress | None) -> dict[str, list[float]]:
        return self._importance


def final_mask(
    model: nn.Module,
    blocks: list[Block],
    sets: list[BlockSet],
    budget: Budget,
    values: torch.Tensor,
    slots: Slots,
    config: PruneConfig,
) -> PruneResult:
    """The exact-K mask of a slot ranking (the shared search, no metric)."""
    return run_search(model, blocks, sets, budget, _Ranked(slots.per_block(values, blocks)), config, None)


@dataclass
class GateRun:
    """What :func:`train_gates` did: the engine's ``history``, ``steps``, the resolved mode and
    hyper-parameters, training seconds, and ``resumed_from`` (the step a resumed run restarted at)."""

    method: str
    mode: str
    steps: int
    history: list[dict[str, Any]]
    hyperparameters: dict[str, Any]
    options: GateOptions
    slots: int
    target_slots: int
    ranking: str
    seconds: float
    resumed_from: int | None = None
    moved: int | None = None
    own_kept: float | None = None
    distributed: dict[str, Any] | None = None
    distillation: dict[str, Any] | None = None

    def curve(self) -> list[dict[str, Any]]:
        """The training curve: per step loss, open heads, temperature/lambda, and eval entries."""
        keys = ("step", "loss", "task_loss", "kl", "reg", "open", "tau", "lambda", "lambda_c", "reopened", "eval")
        return [{k: e[k] for k in keys if k in e} for e in self.history]

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "mode": self.mode,
            "steps": self.steps,
            "resumed_from": self.resumed_from,
            "slots": self.slots,
            "target_slots": self.target_slots,
            "ranking": self.ranking,
            "hyperparameters": self.hyperparameters,
            "options": self.options.to_json(),
            "moved_by_adjustment": self.moved,
            "own_kept_heads": self.own_kept,
            "distributed": self.distributed,
            "distillation": self.distillation,
            "seconds": self.seconds,
            "curve": self.curve(),
        }


StepLog = Callable[[dict[str, Any]], None]


def train_gates(problem: Problem, learner_cls: type[GateLearner], options: GateOptions) -> tuple[PruneResult, GateRun]:
    """Train ``learner_cls``'s gates on ``problem.model`` (in place: ``joint`` mode changes its weights)
    with ``problem.data`` and return the exact-K result (mask, heads per block) and the run. The model
    is left in eval mode, without hooks. ``options`` must be resolved (:meth:`GateOptions.resolved`); the
    training engine validates them (:class:`headcut.training.engine.Trainer`)."""
    model, blocks, sets, budget, config = problem.model, problem.blocks, problem.sets, problem.budget, problem.config
    train, eval_calibration = problem.data, problem.eval_data
    dist = problem.dist or Dist()
    if not isinstance(train, Calibration):
        raise HeadcutError(f"{learner_cls.name} trains on a Calibration (training data with labels)")
    if not train.batches:
        raise HeadcutError("no training batches in --data")
    if eval_calibration is not None and eval_calibration.task != train.task:
        raise HeadcutError(f"the eval data is for {eval_calibration.task}, the training data for {train.task}")
    mode = options.mode or learner_cls.default_mode
    slots = Slots.from_sets(sets)
    k = slots.target(budget.target)
    if k >= slots.n:
        raise HeadcutError(f"--keep {budget.target} keeps every head: nothing to learn")
    shard = len(train.batches) // dist.world if dist.active else len(train.batches)
    total = options.total_steps(max(shard, 1))
    ctx = Context(model=model, batches=train.batches, task=train.task, total_steps=total, seed=config.seed)
    learner = learner_cls(slots, k, options, ctx)
    device = next(model.parameters()).device
    objective = unpruned_teacher(model, train.task, options) or DistillationLoss(train.task, None, 0.0, 1.0)
    if problem.device is not None and objective.cache is not None:
        objective.cache.teacher.to(problem.device)  # FSDP: the student stays in CPU memory, the teacher runs there
    gates = HeadGates(model)
    index = {name: idx.to(device) for name, idx in slots.index.items()}

    def loss_fn(m: nn.Module, batch: dict[str, Any], step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        z, reg, logs = learner.gates(step)
        z = z.to(device)
        for name, idx in index.items():
            gates.gates[name] = z[idx]
        value, extra = objective(m, batch, step)
        value = value if reg is None else value + reg
        return value, {**extra, **({} if reg is None else {"reg": reg.detach()}), **logs}

    def current_mask() -> HeadMask:
        return final_mask(model, blocks, sets, budget, learner.importance(), slots, config).mask

    eval_fn = None
    if eval_calibration is not None and options.eval_every is not None:

        def eval_fn(step: int) -> dict[str, Any]:
            gates.set_mask(current_mask())
            return dict(evaluate(model, eval_calibration, bleu=False).metrics)

    def after_step(step: int) -> dict[str, Any]:
        logs = learner.after_step(step)
        logs["open"] = slots.heads(learner.open_slots().cpu())
        return logs

    progress = None if problem.progress is None else (lambda d, t: problem.progress("train", d, t))
    trainer = Trainer(
        model,
        learner.parameters(),
        train.batches,
        options,
        loss_fn=loss_fn,
        eval_fn=eval_fn,
        checkpoint_dir=problem.checkpoint_dir,
        progress=progress,
        after_step=after_step,
        dist=dist,
        extra_state=learner,
        on_step=problem.on_step,
        device=problem.device,
        identity=dict(
            problem.identity or {},
            method=learner.name,
            target=k,
            prune=config.to_json(),
        ),
    )
    resumed_from = None
    if problem.resume:
        trainer.resume()
        resumed_from = trainer.step
    start = time.perf_counter()
    with gates.installed():
        trained = trainer.train()
    model.eval()
    run_teacher = objective.stats()
    objective.cache = None  # the teacher's copy of the model is not needed any more
    result = final_mask(model, blocks, sets, budget, learner.importance(), slots, config)
    run = GateRun(
        method=learner.name,
        mode=mode,
        steps=trained.steps,
        history=trained.history,
        hyperparameters=learner.hyperparameters(),
        options=options,
        slots=slots.n,
        target_slots=k,
        ranking=learner.ranking,
        seconds=time.perf_counter() - start,
        resumed_from=resumed_from,
    )
    if run_teacher:
        run.distillation = {k: v for k, v in run_teacher.items() if k != "hidden_weight"}
    own = learner.own_keep()
    if own is not None:
        kept = torch.zeros(slots.n, dtype=torch.bool)
        final_slots = slots.per_block(torch.arange(slots.n, dtype=torch.float64), blocks)
        for b in blocks:
            for h in result.mask.keep[b.name]:
                kept[int(final_slots[b.name][h])] = True
        run.own_kept = slots.heads(own.cpu())
        run.moved = int(round(slots.heads(own.cpu() ^ kept)))
    if dist.active:
        run.distributed = {
            "processes": dist.world,
            "engine": trainer.engine_name,
            "gate_max_difference": dist.max_difference(learner.parameters()),
            "model_max_difference": dist.max_difference([p.detach() for p in model.parameters()]),
        }
    return result, run


class GateMethod(MethodBase):
    """A learned-gate method: trains ``learner``'s gates (and, jointly, the model) on the training data,
    then keeps exactly K heads by the learned ranking. The metric (if any) is measured before training
    and with the final mask after it; ``result.training`` is the :class:`GateRun`."""

    def __init__(self, learner: type[GateLearner], options: type[GateOptions] = GateOptions) -> None:
        self.learner = learner
        self.name = learner.name
        self.Options = options

    def __repr__(self) -> str:
        return f"GateMethod({self.name!r})"

    def check(self, config: PruneConfig, options: GateOptions) -> None:
        for flag, given in (("--max-drop", config.max_drop is not None), ("--trajectory", config.trajectory)):
            if given:
                raise HeadcutError(
                    f"{flag} applies to the score-based methods; {config.method} learns gates for exactly "
                    "--keep/--sparsity heads (its training curve is in the report)"
                )
        if config.keep is None and config.sparsity is None:
            raise HeadcutError(f"{config.method} needs --keep K or --sparsity S")

    def step(self, total: int, config: PruneConfig, options: GateOptions) -> tuple[int, bool]:
        return 1, False

    def run(self, problem: Problem, options: GateOptions) -> PruneResult:
        task = problem.data.task if isinstance(problem.data, Calibration) else ""
        options = options.resolved(self.learner, task, problem.config.seed)
        before = metric_before(problem)
        start = time.perf_counter()
        result, run = train_gates(problem, self.learner, options)
        return finish(problem, result, run, before, start)


def metric_before(problem: Problem) -> float | None:
    """The metric of the model with every head, before training changes it (None without a metric)."""
    return problem.metric.measure(HeadMask.full(problem.blocks)) if problem.metric is not None else None


def finish(problem: Problem, result: PruneResult, run: GateRun, before: float | None, start: float) -> PruneResult:
    """A learned method's result: the training run, the time since ``start``, the metric before and with
    the final mask."""
    result.training = run
    result.scorings = 0
    result.seconds = time.perf_counter() - start
    if problem.metric is not None:
        result.metric, result.higher_is_better = problem.metric.name, problem.metric.higher_is_better
        result.metric_before = before
        result.metric_after = problem.metric.measure(result.mask)
    return result


class ConcreteLearner(GateLearner):
    """The Hard Concrete gates shared by ``voita``, ``lag``, ``pass`` and ``passconc``: log-alpha
    ``phi`` per slot, from U(-b, b) with Xavier's bound of a (heads, 1) gate vector per layer (the
    reference code's init; b = 0.68 for 12 heads); one reparameterised sample per step shared by the
    batch (PASS §3.2: "at each training iteration, gates are sampled ... and then applied"). Ranking:
    the opening probability q1(phi) (PASS §4.1.1), which orders the gates as phi does. "Open": the
    deterministic gate min(1, max(0, sigmoid(phi) (zeta - gamma) + gamma)) above 0.5 (the
    reference code's rule when no K is given)."""

    ranking = "q1 (gate opening probability)"

    def __init__(self, slots: Slots, k: int, options: GateOptions, ctx: Context) -> None:
        super().__init__(slots, k, options, ctx)

        self.hc = HardConcrete()
        self.phi = uniform_init(slots.n, xavier_bound(max(slots.heads_per_layer), 1), ctx.seed)
        #: the target sparsity s of the slots (PASS: K = floor((1 - s)|H|))
        self.sparsity = 1.0 - k / slots.n

    def parameters(self) -> list[torch.Tensor]:
        return [self.phi]

    def sample(self) -> torch.Tensor:
        return self.hc.sample(self.phi)

    def importance(self) -> torch.Tensor:
        return self.hc.prob_open(self.phi.detach().to(torch.float64))

    def open_slots(self) -> torch.Tensor:
        return self.hc.deterministic(self.phi.detach()) > 0.5
