"""``lottery``: iterative head pruning in early training with late resetting (Behnke & Heafield, "Losing
Heads in the Lottery", EMNLP 2020, §4 "Methodology", Figure 1, §7 "Experiments", Table 5).

The paper publishes no code; this module follows its text step by step (Figure 1's steps):

1. **Late-resetting checkpoint** (steps 1-2; §4.1: "First, we train a model for a set number of
   updates and keep it as a late resetting checkpoint"): ``reset_at`` optimizer steps of training on
   the training data; C is the model *and* the optimizer and LR-schedule state at that point. On an
   already fine-tuned checkpoint C is the model after those steps of continued training.
2. **Train** (step 3): ``prune_every`` steps from C. "In each iteration, we change a seed value to
   make a model see data in different order" (§7): iteration i draws its batch order and dropout
   from seed + i.
3. **Prune** (step 4) by attention confidence (§4.2): ``confidence = max attention(s)``, the largest
   weight of a head's attention distribution, "averaged over all times the head appears while
   translating a development corpus" (:mod:`headcut.scoring.confidence`: per real query token;
   decoder and cross heads per target token, encoder heads per source token; padding never counted).
   The ``per_step`` least confident heads go, encoder, decoder and cross attention ranked together
   (a global ranking, :func:`headcut.pruning.search.remove_step`, which also honours the units: KV
   groups, ALBERT's shared layers, ``--min-heads-per-block``). Default ``per_step``: "roughly a total
   number of layers containing attention divided by 2" (§7; at least 1). The last iteration removes
   only what reaches K exactly.
4. **Rewind** (step 5): every surviving parameter, the optimizer state and the LR schedule go back to
   C (the pruned heads stay gated off; the slimmed model drops them).
5. Steps 3-5 repeat until ``--keep K`` heads are left.
6. **Converge** (step 6) from C with the final structure, with early stopping on ``--eval-data``:
   the paper trains "until cross-entropy has stopped improving for 10 consecutive validations"
   (§6), so the run evaluates every ``eval_every`` steps and stops after ``patience`` (10) evaluations
   without a lower eval loss, keeping the weights of the best one (the paper then picks the
   checkpoint with the best BLEU; headcut keeps the one with the best loss, the metric it stopped on).
   Without ``--eval-data`` it trains the full ``max_steps``.
7. **Control** (``control="reinit"``, Table 5): the same pruned structure, re-initialised and trained
   from scratch for as many steps as the ticket had (``reset_at`` + its convergence steps); the
   report shows both metrics, so a user sees whether the ticket matters. The saved model is the ticket.

The learning rate is constant after warmup (``schedule`` constant; a rewind puts the schedule back to
C as well, so a decaying schedule would restart its decay at every iteration). Marian, the paper's
toolkit, decays by the inverse square root, which headcut's engine does not have.

Resumable: after C and after every iteration ``lottery.pt`` (C, the heads kept so far, the iteration
records, the run's identity) is written atomically into the checkpoint folder; ``--resume`` continues
with the next iteration (an interrupted iteration or convergence is run again from C).
"""

from __future__ import annotations

import copy
import time
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import DistillOptions, PruneConfig, ScoreConfig, TrainConfig
from ..data import Calibration
from ..errors import HeadcutError
from ..formatting import metric_text as _fmt
from ..model.evaluation import evaluate
from ..model.gating import HeadGates
from ..model.masks import HeadMask
from ..model.surgery import slim
from ..options import option
from ..training.checkpoint import atomic_save, check_optimizer, check_scheduler, check_weights, digest, read_state
from ..training.early_stopping import EarlyStopping
from ..training.engine import Trainer
from ..training.finetuning import DistillationLoss, unpruned_teacher
from ..training.finite import first_nonfinite
from ..training.steps import TrainingDiverged
from .base import PruneResult, TrajectoryPoint, score_masked, seed_in_range
from .method import MethodBase, Problem, Summary
from .search import Budget, remove_step
from .units import UnitState

#: the file of the run's state in the checkpoint folder
STATE_NAME = "lottery.pt"
STATE_FORMAT = 1


#: defaults (the module's doc says why): steps to the late-resetting checkpoint, steps per iteration,
#: evaluations without improvement that end the convergence, confidence examples
LOTTERY_RESET_AT = 80
LOTTERY_PRUNE_EVERY = 40
LOTTERY_PATIENCE = 10
LOTTERY_SCORE_EXAMPLES = 512
#: ``control`` values (Table 5's re-initialised structure)
LOTTERY_CONTROLS = ("reinit",)


@dataclass
class LotteryOptions(DistillOptions):
    """The lottery's options (see the module's doc). ``reset_at``: steps to the late-resetting
    checkpoint C. ``prune_every``: steps of training before each pruning decision. ``per_step``: heads
    removed per iteration (None: attention layers / 2). ``patience``: evaluations without a lower eval
    loss that end the convergence. ``score_examples``: examples the confidence is averaged over (of
    ``--eval-data``, else of the training data). ``control``: None or ``reinit``. The training fields:
    ``lr`` (2e-5), ``max_steps`` (the convergence's limit; None: 15 x ``prune_every``), ``eval_every``
    (None: ``prune_every`` / 2), ``warmup_steps``, ``weight_decay``, ``grad_accum``, ``max_grad_norm``.
    ``alpha``/``temperature``: every training phase (C, the iterations, the convergence, the control) distils
    from the unpruned model (:class:`headcut.config.DistillOptions`; 0: the paper's task loss)."""

    reset_at: int = option(
        LOTTERY_RESET_AT, low=1, metavar="STEPS", help="Training steps to the late-resetting checkpoint C."
    )
    prune_every: int = option(
        LOTTERY_PRUNE_EVERY,
        low=1,
        metavar="STEPS",
        help="Training steps from the checkpoint before each pruning decision.",
    )
    per_step: int | None = option(
        None, low=1, help="Heads removed per iteration (default: attention layers / 2, as the paper)."
    )
    patience: int = option(
        LOTTERY_PATIENCE, low=1, help="Evaluations without a lower --eval-data loss that end the convergence."
    )
    score_examples: int = option(
        LOTTERY_SCORE_EXAMPLES, low=1, help="Examples the attention confidence is averaged over."
    )
    control: str | None = option(
        None,
        choices=LOTTERY_CONTROLS,
        help="Also train the pruned structure "
        "re-initialised, as long as the ticket (the paper's control); the report shows both.",
    )
    lr: float = 2e-5
    schedule: str = "constant"

    #: fields the prune run sets itself, or that the lottery does not use
    HIDDEN = (
        "seed",
        "shuffle",
        "mode",
        "gate_lr",
        "epochs",
        "checkpoint_every",
        "schedule",
        "warmup_ratio",
        "gates_first",
    )

    def validate(self) -> None:
        super().validate()
        if self.schedule != "constant":
            raise HeadcutError(
                "the lottery rewinds its LR schedule with the weights: it trains at a constant rate after warmup"
            )

    def converge_steps(self) -> int:
        return self.max_steps if self.max_steps is not None else 15 * self.prune_every

    def every(self) -> int:
        return self.eval_every if self.eval_every is not None else max(1, self.prune_every // 2)


def default_per_step(attention_layers: int) -> int:
    """§7: "The number of heads removed is roughly a total number of layers containing attention
    divided by 2" (at least one)."""
    return max(1, attention_layers // 2)


# ---- the record ----------------------------------------------------------------------------------------


@dataclass
class Iteration:
    """One pruning iteration: the ``removed`` heads (``block:head``) and how many of each attention kind,
    the eval metric after its training (``metric_trained``, every head of the iteration still on) and
    with the heads removed, before the rewind (``metric_pruned``), the heads left, its seconds."""

    iteration: int
    seed: int
    steps: int
    removed: list[str]
    removed_by_kind: dict[str, int]
    heads: int
    train_loss: float | None
    metric_trained: float | None
    metric_pruned: float | None
    confidence: dict[str, list[float]]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LotteryRun:
    """The report's ``lottery`` section: the settings, C, every iteration, the convergence and the control."""

    reset_at: int
    prune_every: int
    per_step: int
    patience: int
    eval_every: int
    score_examples: int
    score_data: str
    stop_metric: str | None
    reset_loss: float | None = None
    iterations: list[Iteration] = field(default_factory=list)
    converge: dict[str, Any] | None = None
    control: dict[str, Any] | None = None
    resumed_at: int | None = None
    seconds: float = 0.0
    #: distillation from the unpruned model (settings, teacher forwards, cache hits); None: the task loss
    distillation: dict[str, Any] | None = None
    #: the control's trained model (gated to the ticket's heads; not in the report), for a caller who
    #: wants to measure it on other data
    control_model: Any = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("iterations", "control_model")}
        out["iterations"] = [it.to_json() for it in self.iterations]
        return out


# ---- pieces -------------------------------------------------------------------------------------------


def reinitialise(model: nn.Module, seed: int) -> None:
    """Draw every weight of ``model`` afresh with its family's initialisation (transformers'
    ``init_weights``), seeded; the control of Table 5."""
    init = getattr(model, "init_weights", None)
    if init is None:
        raise HeadcutError("--control reinit needs a transformers model (it re-runs the family's initialisation)")
    for module in model.modules():
        if getattr(module, "_is_hf_initialized", False):
            module._is_hf_initialized = False
        for t in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
            if getattr(t, "_is_hf_initialized", False):
                t._is_hf_initialized = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        init()


def removed_by_kind(names: list[str], kinds: dict[str, str]) -> dict[str, int]:
    """How many of ``names`` (``block:head``) are in each attention kind (self, encoder, decoder, cross)."""
    out: dict[str, int] = {}
    for name in names:
        kind = kinds[name.rsplit(":", 1)[0]]
        out[kind] = out.get(kind, 0) + 1
    return out


def _sample(cal: Calibration, n: int, seed: int) -> Calibration:
    if cal.examples <= n:
        return cal
    order = torch.randperm(cal.examples, generator=torch.Generator().manual_seed(seed)).tolist()
    return cal.select(sorted(order[:n]), by_length=True)


def _mean_loss(history: list[dict[str, Any]], last: int) -> float | None:
    losses = [e["loss"] for e in history[-last:] if "loss" in e]
    return sum(losses) / len(losses) if losses else None


# ---- the method ---------------------------------------------------------------------------------------


class LotteryMethod(MethodBase):
    """The lottery-ticket head pruning (see the module's doc)."""

    name = "lottery"
    Options = LotteryOptions

    def check(self, config: PruneConfig, options: LotteryOptions) -> None:
        if config.max_drop is not None:
            raise HeadcutError(
                "--max-drop applies to the score-based methods; lottery prunes to --keep/--sparsity "
                "(its iterations and their eval metric are in the report and --trajectory)"
            )
        if config.keep is None and config.sparsity is None:
            raise HeadcutError("lottery needs --keep K or --sparsity S")

    def step(self, total: int, config: PruneConfig, options: LotteryOptions) -> tuple[int, bool]:
        return options.per_step or 1, True

    def summary(self, report: dict[str, Any], result: PruneResult) -> Summary:
        metric = report["metric"]["name"] if report.get("metric") is not None else None
        return Summary(summary_items(report["lottery"], metric), trajectory=False)

    def run(self, problem: Problem, options: LotteryOptions) -> PruneResult:
        try:
            return self._run(problem, options)
        except TrainingDiverged as exc:
            ckpt = Path(problem.checkpoint_dir) if problem.checkpoint_dir is not None else None
            if ckpt is None or not (ckpt / STATE_NAME).is_file():
                raise
            # the state file is written only after a training that passed the engine's checks: it is good
            raise TrainingDiverged(
                f"{exc}; the last good state of the run is kept in {ckpt} (start over with --force)", exc.step, ckpt
            ) from None

    def _run(self, problem: Problem, options: LotteryOptions) -> PruneResult:
        start = time.perf_counter()
        model, blocks, sets, config = problem.model, problem.blocks, problem.sets, problem.config
        train = problem.data
        if not isinstance(train, Calibration) or not train.batches:
            raise HeadcutError("lottery trains on --data: labelled training data read by headcut")
        dev = problem.eval_data
        if dev is not None and dev.task != train.task:
            raise HeadcutError(f"the eval data is for {dev.task}, the training data for {train.task}")
        options.validate()
        seed = config.seed
        attention_layers = sum(1 for b in blocks if b.heads)
        per_step = options.per_step or default_per_step(attention_layers)
        budget: Budget = replace(problem.budget, step=per_step)
        score_cal = _sample(dev if dev is not None else train, options.score_examples, seed)
        run = LotteryRun(
            reset_at=options.reset_at,
            prune_every=options.prune_every,
            per_step=per_step,
            patience=options.patience,
            eval_every=options.every(),
            score_examples=score_cal.examples,
            score_data="--eval-data" if dev is not None else "--data",
            stop_metric="loss" if dev is not None else None,
        )
        kinds = {b.name: b.kind for b in blocks}
        state = UnitState.full(sets)
        metric = problem.metric
        before = metric.measure(state.mask(blocks)) if metric is not None else None
        trajectory = [TrajectoryPoint(step=0, heads=budget.total, metric=before)]
        teacher = unpruned_teacher(model, train.task, options)  # before any training or gating
        gates = HeadGates(model)
        progress = problem.progress
        train_progress = None if progress is None else (lambda d, t: progress("train", d, t))
        base_cfg = TrainConfig(
            max_steps=options.reset_at,
            lr=options.lr,
            weight_decay=options.weight_decay,
            warmup_steps=options.warmup_steps,
            schedule="constant",
            grad_accum=options.grad_accum,
            max_grad_norm=options.max_grad_norm,
            checkpoint_every=None,
            seed=seed,
            mode="joint",
            engine=options.engine,
        )
        ckpt = Path(problem.checkpoint_dir) if problem.checkpoint_dir is not None else None
        writes = ckpt if problem.dist is None or problem.dist.main else None  # one process writes the state
        identity = {
            "model": digest({k: (str(v.dtype), tuple(v.shape)) for k, v in model.state_dict().items()}),
            "data": digest(train.batches),
            "options": _plain_options(options),
            "prune": config.to_json(),
            "target": budget.target,
            **(problem.identity or {}),
        }

        def trainer(cfg: TrainConfig, **kw: Any) -> Trainer:
            return Trainer(
                model,
                None,
                train.batches,
                cfg,
                progress=train_progress,
                on_step=problem.on_step,
                loss_fn=teacher,
                dist=problem.dist,
                **kw,
            )

        # ---- step 1-2: the late-resetting checkpoint C (or the resumed run's)
        saved = _load_state(ckpt, identity, options.reset_at) if (problem.resume and ckpt is not None) else None
        if saved is not None:
            reset = saved["reset"]
            _check_reset(ckpt / STATE_NAME, reset, trainer(base_cfg))
            state.kept = [tuple(k) for k in saved["kept"]]
            run.iterations = [Iteration(**it) for it in saved["iterations"]]
            run.reset_loss = saved["reset_loss"]
            run.resumed_at = len(run.iterations)
            trajectory += [TrajectoryPoint(**p) for p in saved["trajectory"]]
        else:
            first = trainer(base_cfg)
            with gates.installed():
                gates.set_mask(state.mask(blocks))
                trained = first.train()
            reset = first.snapshot()
            run.reset_loss = _mean_loss(trained.history, options.prune_every)
            _save_state(writes, identity, reset, state, run, trajectory)

        # ---- steps 3-5 until K heads are left
        while state.total() > budget.target:
            t0 = time.perf_counter()
            i = len(run.iterations) + 1
            cfg = replace(base_cfg, max_steps=options.reset_at + options.prune_every, seed=seed_in_range(seed + i))
            t = trainer(cfg)
            t.rewind(reset)  # the surviving weights, optimizer state and schedule of C
            mask = state.mask(blocks)
            with gates.installed():
                gates.set_mask(mask)
                trained = t.train()
            model.eval()
            trained_metric = metric.measure(mask) if metric is not None else None
            scores = score_masked(model, mask, score_cal.batches, ScoreConfig(scorer="confidence", seed=seed), progress)
            importance = scores.importance()
            removed = remove_step(state, importance, budget, config.uniform)
            if not removed:
                raise HeadcutError(
                    f"lottery cannot remove another head at {state.total()} heads (units, "
                    "--min-heads-per-block); the budget was checked, so this is a bug"
                )
            pruned_metric = metric.measure(state.mask(blocks)) if metric is not None else None
            run.iterations.append(
                Iteration(
                    iteration=i,
                    seed=seed_in_range(seed + i),
                    steps=options.prune_every,
                    removed=removed,
                    removed_by_kind=removed_by_kind(removed, kinds),
                    heads=state.total(),
                    train_loss=_mean_loss(trained.history, options.prune_every),
                    metric_trained=trained_metric,
                    metric_pruned=pruned_metric,
                    confidence={b.name: [float(v) for v in importance[b.name]] for b in blocks},
                    seconds=time.perf_counter() - t0,
                )
            )
            trajectory.append(TrajectoryPoint(step=i, heads=state.total(), metric=pruned_metric, removed=removed))
            if progress is not None:
                progress("prune", budget.total - state.total(), budget.total - budget.target)
            if problem.on_step is not None:
                problem.on_step(
                    {
                        "phase": "prune",
                        "iteration": i,
                        "heads": state.total(),
                        **({} if pruned_metric is None or metric is None else {metric.name: pruned_metric}),
                    }
                )
            _save_state(writes, identity, reset, state, run, trajectory)

        # ---- step 6: converge from C with the final structure
        mask = state.mask(blocks)
        run.converge = self._converge(problem, options, trainer, gates, reset, mask, base_cfg, seed)
        model.eval()
        if options.control == "reinit":
            run.control, run.control_model = self._control(
                problem, options, mask, base_cfg, run.converge["steps"], seed, teacher
            )
        result = PruneResult(
            method=self.name,
            mask=mask,
            heads_before={b.name: b.heads for b in blocks},
            heads_after=state.per_block(),
            trajectory=trajectory,
            stopped="budget",
            scorings=len(run.iterations),
            seconds=0.0,
            config=config,
            target=budget.target,
            details=run,
        )
        if metric is not None:
            result.metric, result.higher_is_better = metric.name, metric.higher_is_better
            result.metric_before, result.metric_after = before, metric.measure(mask)
        if teacher is not None:
            run.distillation = teacher.stats()
            teacher.cache = None
        run.seconds = result.seconds = time.perf_counter() - start
        return result

    def _converge(
        self,
        problem: Problem,
        options: LotteryOptions,
        trainer: Any,
        gates: HeadGates,
        reset: dict[str, Any],
        mask: HeadMask,
        base_cfg: TrainConfig,
        seed: int,
    ) -> dict[str, Any]:
        """Step 6: from C, at most ``converge_steps`` steps, early-stopped on the eval loss."""
        model, dev = problem.model, problem.eval_data
        total = options.reset_at + options.converge_steps()
        cfg = replace(base_cfg, max_steps=total, seed=seed, eval_every=options.every() if dev is not None else None)
        early = EarlyStopping("loss", False, options.patience) if dev is not None else None

        def eval_fn(step: int) -> dict[str, Any]:
            assert dev is not None
            return dict(evaluate(model, dev, bleu=False).metrics)

        t = trainer(cfg, eval_fn=eval_fn if dev is not None else None, early_stopping=early)
        t.rewind(reset)
        with gates.installed():
            gates.set_mask(mask)
            if early is not None:
                early.update(model, t.step, eval_fn(t.step))  # C itself is a candidate
            trained = t.train()
        model.eval()
        out: dict[str, Any] = {
            "from_step": options.reset_at,
            "max_steps": total,
            "steps": trained.steps,
            "seconds": trained.seconds,
            "history": [{k: e[k] for k in ("step", "loss", "eval") if k in e} for e in trained.history],
        }
        if early is not None:
            out["early_stopping"] = early.to_json()
        else:
            out["note"] = "no --eval-data: trained every step, no early stopping"
        return out

    def _control(
        self,
        problem: Problem,
        options: LotteryOptions,
        mask: HeadMask,
        base_cfg: TrainConfig,
        ticket_steps: int,
        seed: int,
        teacher: DistillationLoss | None = None,
    ) -> tuple[dict[str, Any], nn.Module]:
        """Table 5's control: the pruned structure re-initialised and trained as long as the ticket; its
        record and the trained model (slimmed to ``mask``)."""

        model = copy.deepcopy(problem.model)
        reinitialise(model, seed_in_range(seed + 7919))
        gates = HeadGates(model)
        cfg = replace(base_cfg, max_steps=ticket_steps, seed=seed)
        progress = problem.progress
        t = Trainer(
            model,
            None,
            problem.data.batches,
            cfg,
            loss_fn=teacher,  # type: ignore[union-attr]
            progress=None if progress is None else (lambda d, tot: progress("train", d, tot)),
            dist=problem.dist,
        )
        with gates.installed():
            gates.set_mask(mask)
            trained = t.train()
            model.eval()
            value = (
                float(evaluate(model, problem.eval_data, bleu=False).value) if problem.eval_data is not None else None
            )
        out = {
            "kind": "reinit",
            "steps": trained.steps,
            "loss": _mean_loss(trained.history, options.prune_every),
            "metric": value,
            "seconds": trained.seconds,
        }
        slim(model, mask, gqa=problem.config.gqa)
        return out, model


# ---- resume ---------------------------------------------------------------------------------------------


def _plain_options(options: LotteryOptions) -> dict[str, Any]:
    return {k: v for k, v in asdict(options).items() if k not in ("max_steps", "eval_every", "patience", "control")}


def _save_state(
    ckpt: Path | None,
    identity: dict[str, Any],
    reset: dict[str, Any],
    state: UnitState,
    run: LotteryRun,
    trajectory: list[TrajectoryPoint],
) -> None:
    if ckpt is None:
        return
    atomic_save(
        {
            "format": STATE_FORMAT,
            "identity": identity,
            "reset": reset,
            "kept": [list(k) for k in state.kept],
            "iterations": [it.to_json() for it in run.iterations],
            "reset_loss": run.reset_loss,
            "trajectory": [asdict(p) for p in trajectory[1:]],
        },
        ckpt / STATE_NAME,
    )


def _load_state(ckpt: Path, identity: dict[str, Any], reset_at: int) -> dict[str, Any] | None:
    """The saved state of an interrupted run with this ``identity``; a one-line error for another run's
    state or a damaged one (a late-resetting checkpoint C with non-finite tensors or at another step)."""
    path = ckpt / STATE_NAME
    if not path.is_file():
        return None
    saved = read_state(path, STATE_FORMAT)
    if not isinstance(saved.get("identity"), dict):
        raise _damaged(path, "it holds no run identity")
    if saved["identity"] != identity:
        theirs, mine = saved["identity"], identity
        changed = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
        raise HeadcutError(
            f"{path} belongs to a run with other settings or data ({', '.join(changed)} differ); "
            "resume with the same settings, or start over without --resume"
        )
    reset = saved.get("reset")
    if not isinstance(reset, dict) or any(k not in reset for k in ("model", "gates", "optimizer", "scheduler", "step")):
        raise _damaged(path, "its late-resetting checkpoint is incomplete")
    step = reset["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step != reset_at:
        raise _damaged(path, f"its late-resetting checkpoint is at step {step!r}, not at --reset-at {reset_at}")
    bad = first_nonfinite({k: reset[k] for k in ("model", "gates", "optimizer")})
    if bad is not None:
        raise _damaged(path, f"its late-resetting checkpoint holds non-finite values (nan or inf) in {bad}")
    kept = saved.get("kept")
    if not isinstance(kept, list) or not all(isinstance(k, (list, tuple)) for k in kept):
        raise _damaged(path, "its list of kept heads is not a list")
    for key, kind in (("iterations", Iteration), ("trajectory", TrajectoryPoint)):
        if not isinstance(saved.get(key), list):
            raise _damaged(path, f"its {key} are not a list")
        names = {f.name for f in fields(kind)}
        needed = {f.name for f in fields(kind) if f.default is MISSING and f.default_factory is MISSING}
        for i, entry in enumerate(saved[key]):
            if not isinstance(entry, dict) or not needed <= set(entry) or not set(entry) <= names:
                raise _damaged(path, f"its {key} entry {i} is not one of the lottery's")
    return saved


def _check_reset(path: Path, reset: dict[str, Any], probe: Trainer) -> None:
    """The late-resetting checkpoint C fits this run's model, optimizer and LR schedule (``probe``: a trainer
    of this run, never trained): a rewind to it cannot fail, nor a training step after it."""

    def damaged(why: str) -> HeadcutError:
        return _damaged(path, f"its late-resetting checkpoint: {why}")

    check_weights(reset["model"], probe.model.state_dict(), damaged)
    if not isinstance(reset["gates"], list) or reset["gates"]:
        raise damaged("it holds gate tensors, which the lottery does not train")
    check_optimizer(reset["optimizer"], probe.optimizer, reset["step"], damaged)
    check_scheduler(reset["scheduler"], probe.scheduler, reset["step"], damaged)


def _damaged(path: Path, why: str) -> HeadcutError:
    return HeadcutError(
        f"--resume: the checkpoint in {path.parent} is damaged: {why}; start over without --resume (and with --force)"
    )


# ---- the end-of-run summary ------------------------------------------------------------------------------


def summary_items(lottery: dict[str, Any], metric: str | None) -> list[Any]:
    """The lottery's iterations (heads removed by kind, eval metric after training and after pruning),
    its convergence and the control."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"lottery, iteration by iteration ({lottery['prune_every']} steps from the checkpoint at "
        f"step {lottery['reset_at']}, then rewound)",
        box=box.SIMPLE_HEAD,
    )
    for col in ("iteration", "removed", "heads left", f"{metric or 'metric'} trained", "pruned", "seconds"):
        table.add_column(col, justify="left" if col == "removed" else "right")
    for it in lottery["iterations"]:
        kinds = ", ".join(f"{n} {kind}" for kind, n in it["removed_by_kind"].items())
        table.add_row(
            str(it["iteration"]),
            kinds,
            str(it["heads"]),
            _fmt(it["metric_trained"]),
            _fmt(it["metric_pruned"]),
            f"{it['seconds']:.1f}",
        )
    out: list[Any] = [table]
    if lottery.get("resumed_at") is not None:
        out.append(f"resumed after iteration {lottery['resumed_at']}")
    conv = lottery.get("converge")
    if conv is not None:
        stop = conv.get("early_stopping")
        if stop is not None:
            how = (
                f"stopped early at step {stop['stopped_at']}"
                if stop["stopped_at"] is not None
                else f"ran to step {conv['steps']}"
            )
            out.append(
                f"converged from step {conv['from_step']}: {how}; kept the weights of step {stop['best_step']} "
                f"(eval loss {_fmt(stop['best'])})"
            )
        else:
            out.append(f"converged from step {conv['from_step']} to step {conv['steps']} ({conv['note']})")
    control = lottery.get("control")
    if control is not None:
        shown = f"{metric} {_fmt(control['metric'])}" if control["metric"] is not None else "no --eval-data"
        out.append(f"control (the same heads, re-initialised, {control['steps']} steps): {shown}")
    return out


METHOD = LotteryMethod()
