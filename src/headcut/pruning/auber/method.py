"""The ``auber`` method object (:mod:`headcut.pruning.auber`): its checks, the layers in turn (each: the split, the
agent's episodes and greedy policy under the upper bound, the cut, the fine-tune on mini-train, §5.1), and the final
fine-tune with early stopping (step 7)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ...config import PruneConfig, TrainConfig
from ...data import Calibration
from ...errors import HeadcutError, label
from ...learned.dqn import Agent
from ...model.evaluation import evaluate
from ...model.gating import HeadGates
from ...model.masks import HeadMask
from ...training.early_stopping import EarlyStopping
from ...training.engine import Trainer
from ...training.finetuning import DistillationLoss, unpruned_teacher
from ..base import PruneResult, TrajectoryPoint, seed_in_range
from ..method import MethodBase, Problem, Summary
from ..search import Budget, keep_from_sparsity
from ..units import BlockSet
from .agent import greedy_policy, train_agent
from .environment import LayerEnv
from .options import AuberOptions
from .report import AuberRun, LayerRecord, summary_items
from .split import reward_metric_for, split_examples
from .state import initial_state, unit_norms, units_of

#: evaluations per epoch of the final fine-tune (its early stopping)
EVALS_PER_EPOCH = 20


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


class AuberMethod(MethodBase):
    """AUBER (see the package's doc, :mod:`headcut.pruning.auber`)."""

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
        train_idx, dev_idx = split_examples(data.examples, seed_in_range(seed * 1_000_003 + j))
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


METHOD = AuberMethod()
