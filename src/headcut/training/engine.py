"""The training loop shared by the learned-gate methods and fine-tuning (:class:`Trainer`); what it calls and
gives back (the hooks' signatures, the default loss, the LR factor of a step, a run's result, the divergence error)
is in :mod:`.steps`, early stopping in :mod:`.early_stopping`.

* **Steps.** ``step`` counts optimizer steps. Each step runs ``grad_accum`` micro-batches (one
  element of ``train_batches`` each); each micro-batch's loss is divided by ``grad_accum`` before
  ``backward``, so ``grad_accum=2`` with batches of B gives the gradient of one batch of 2B (for a
  mean-reduced loss and equal batch sizes). Micro-batches form one stream across epochs, so an
  accumulation may span an epoch boundary. With ``epochs`` the run has
  ``epochs * len(train_batches) // grad_accum`` steps (a remainder of fewer than ``grad_accum``
  micro-batches is not run); with ``max_steps`` it has exactly that many.
* **Order.** Every epoch visits each batch once, in the order ``torch.randperm`` draws from a
  ``torch.Generator`` seeded with ``seed`` (``shuffle=False``: the given order).
* **Modes.** ``joint``: model parameters (those with ``requires_grad``) and gates are trained, the
  model is in train mode (dropout on). ``pipelined``: the model's weights are frozen
  (``requires_grad`` off, not in the optimizer) and the model is in eval mode (dropout off), only the
  gates learn. Both flags are restored when :meth:`Trainer.train` returns.
* **Optimizer.** AdamW with two parameter groups: model parameters at ``lr`` with ``weight_decay``,
  gate tensors at ``gate_lr`` (None: ``lr``) with no weight decay (decay would pull gates towards closed). The LR
  schedule (:func:`.steps.lr_factor`) scales both groups; with ``gates_first`` N the model's group has LR 0 for the
  first N steps (the gates learn on the fixed model; dropout stays on), then follows the same schedule. The gradients of each group are clipped to
  ``max_grad_norm`` on their own (the gates' regulariser may be large, e.g. PASS's escalating lambda,
  and must not shrink the model's step).
* **Randomness.** The loop runs under ``torch.random.fork_rng``: the torch RNG (dropout, gate
  sampling in ``loss_fn``) is seeded with ``seed`` at the start and restored from the checkpoint on
  resume; the caller's RNG state is untouched.
* **Checkpoints.** Every ``checkpoint_every`` steps, and at the end of the run, ``checkpoint.pt``
  under ``checkpoint_dir`` is replaced atomically (written to a temporary file in the same folder,
  then ``os.replace``): a crash never leaves a partial file. It holds the model's ``state_dict``, the
  gate tensors, optimizer and scheduler state, step, epoch and position in the epoch's order, the
  order-generator and torch RNG states, the history and the config. :meth:`Trainer.resume` restores
  all of it, so a resumed run ends exactly where an uninterrupted one ends (bit for bit on CPU).
  Checkpoints are read with ``torch.load(weights_only=True)``: they only hold tensors and plain
  Python values (log values are converted to numbers, strings or lists), so no pickle code runs even
  though these are our own files. A checkpoint also holds the run's identity (every config field but
  the run's length and the eval/checkpoint cadence, a digest of the training batches and of the
  model's parameter names and shapes, and the caller's ``identity``: method, teacher, model path);
  :meth:`Trainer.resume` refuses a checkpoint whose identity differs and lists the differences, and a
  damaged checkpoint file. While :meth:`Trainer.train` runs it holds a lock on ``checkpoint_dir``
  (:class:`headcut.files.lock.RunLock`), so a second trainer on the same folder is refused.
* **After each step.** ``after_step(step)`` (1-based, called under ``torch.no_grad`` after the
  optimizer step, inside the seeded RNG) may change the gates in place (PASS clips and re-opens them)
  and returns log values for the step's history entry.
* **Early stopping** (``early_stopping``, :class:`.early_stopping.EarlyStopping`): after each evaluation the run stops
  once the watched metric has not improved for ``patience`` evaluations in a row, and the weights of
  the best evaluation are put back when :meth:`Trainer.train` returns. Such a run writes no
  checkpoints (the best weights would have to be saved with them).
* **Divergence.** A step whose loss (averaged over its micro-batches and processes) or gradient norm
  (with ``max_grad_norm``) is not finite stops the run before the optimizer step, and so does a step that
  leaves a non-finite weight (one fused max-abs reduction over the trained tensors per step):
  :meth:`Trainer.train` raises :class:`.steps.TrainingDiverged` (a one-line :class:`HeadcutError` naming the step,
  the cause and the learning rates), so nothing downstream saves a model. Every checkpoint is written after
  that check, so the one left in ``checkpoint_dir`` holds the last good (finite) state;
  :meth:`Trainer.resume` refuses a checkpoint holding non-finite tensors or an impossible step.
* **Engines** (``config.engine``, :mod:`headcut.training.parallel`): every forward and backward runs through one.
  In one process the loss function on the model; with several (``dist``, :mod:`headcut.training.distributed`)
  each process trains on its shard of the batches and PyTorch's DistributedDataParallel (``ddp``) or FSDP2
  (``fsdp``: the optimizer then trains the shards of a copy of the model, and the whole weights are gathered
  back before every evaluation and checkpoint and at the end) averages the gradients, so all processes stay
  identical. Checkpoints hold whole tensors under every engine (one layout); only the main process writes them.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import TrainConfig
from ..errors import HeadcutError
from ..files.leftovers import remove_stale
from ..files.lock import RunLock
from .checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    RESUME_MAY_CHANGE,
    atomic_save,
    check_resumable,
    digest,
    plain,
    read_state,
)
from .distributed import Dist
from .early_stopping import EarlyStopping
from .finite import all_finite, first_nonfinite
from .parallel import Engine, rebuilt, start, whole
from .steps import (
    AfterStepFn,
    EvalFn,
    LossFn,
    ProgressFn,
    StepFn,
    TrainingDiverged,
    TrainResult,
    default_loss,
    lr_factor,
    merge_logs,
)


class Trainer:
    """Train ``model`` (and/or the ``gate_params`` tensors) on ``train_batches``; see the module doc.

    ``gate_params``: leaf tensors with ``requires_grad`` (e.g. :meth:`HeadGates.parameters`); they are
    updated in place. ``loss_fn(model, batch, step) -> (loss, logs)``: ``step`` is the 0-based index of
    the optimizer step in progress; ``logs`` (numbers, tensors, strings) go into the history.
    ``eval_fn(step) -> dict``: called with the model in eval mode after every ``eval_every``-th step;
    its result is the step's ``eval`` entry. ``progress(done, total)``: called after every step.
    ``after_step(step)``: see the module's doc. ``dist``: this process's place in a data-parallel run.
    ``extra_state``: an object with ``state_dict()`` / ``load_state_dict(state)`` (tensors and plain
    values) saved in and restored from checkpoints with the rest (a method's own state).
    ``on_step(entry)``: called after ``progress`` with the step's history entry.
    """

    def __init__(
        self,
        model: nn.Module,
        gate_params: list[torch.Tensor] | None,
        train_batches: list[dict[str, Any]],
        config: TrainConfig,
        loss_fn: LossFn | None = None,
        eval_fn: EvalFn | None = None,
        checkpoint_dir: str | Path | None = None,
        progress: ProgressFn | None = None,
        after_step: AfterStepFn | None = None,
        dist: Dist | None = None,
        extra_state: Any = None,
        on_step: StepFn | None = None,
        identity: dict[str, Any] | None = None,
        early_stopping: EarlyStopping | None = None,
        device: torch.device | None = None,
    ) -> None:
        config.validate()
        if early_stopping is not None and (eval_fn is None or config.eval_every is None):
            raise HeadcutError("early stopping needs an eval_fn and eval_every")
        if early_stopping is not None and checkpoint_dir is not None:
            raise HeadcutError("a run with early stopping writes no checkpoints: give no checkpoint_dir")
        self.early_stopping = early_stopping
        if config.average_last and (early_stopping is not None or checkpoint_dir is not None):
            raise HeadcutError(
                "a run that averages its weights (average_last) keeps no resume checkpoints and no "
                "early stopping: give neither a checkpoint_dir nor early stopping"
            )
        if config.epochs is None and config.max_steps is None:
            raise HeadcutError("give epochs or max_steps")
        if config.mode is None:
            config = replace(config, mode="joint")
        if config.gate_lr is None:
            config = replace(config, gate_lr=config.lr)
        if not train_batches:
            raise HeadcutError("no training batches")
        self.dist = dist or Dist()
        data_identity = {"batches": len(train_batches), "digest": digest(train_batches)}
        if self.dist.active:
            shard = len(train_batches) // self.dist.world
            if shard < 1:
                raise HeadcutError(f"{len(train_batches)} batch(es) cannot be shared by {self.dist.world} processes")
            train_batches = list(train_batches[self.dist.rank :: self.dist.world])[:shard]
        self.after_step = after_step
        self.extra_state = extra_state
        self.model = model
        self.gates: list[torch.Tensor] = list(gate_params or [])
        for g in self.gates:
            if not g.is_leaf or not g.requires_grad:
                raise HeadcutError("gate tensors must be leaf tensors with requires_grad=True")
        self.batches = train_batches
        self.config = config
        self.loss_fn: LossFn = loss_fn or default_loss
        self.eval_fn = eval_fn
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.progress = progress
        self.on_step = on_step
        self.total_steps = config.total_steps(len(train_batches))
        self.warmup_steps = config.warmup(self.total_steps)

        gate_ids = {id(g) for g in self.gates}
        if config.mode == "joint":
            self.model_params = [p for p in model.parameters() if p.requires_grad and id(p) not in gate_ids]
        else:
            self.model_params = []
            if not self.gates:
                raise HeadcutError("pipelined mode trains the gates only, but no gate tensors were given")
        if not self.model_params and not self.gates:
            raise HeadcutError("nothing to train: no model parameter requires grad and no gates were given")
        groups = [
            {"params": self.model_params, "lr": config.lr, "weight_decay": config.weight_decay, "name": "model"},
            {"params": self.gates, "lr": config.gate_lr, "weight_decay": 0.0, "name": "gates"},
        ]
        self.optimizer = torch.optim.AdamW(groups, lr=config.lr)
        total, warmup, schedule, first = self.total_steps, self.warmup_steps, config.schedule, config.gates_first
        if first and not self.gates:
            raise HeadcutError("--gates-first needs gates to train")
        if first >= total:
            raise HeadcutError(f"--gates-first {first} leaves no joint step in a run of {total} steps")
        # LambdaLR's counter is the number of scheduler.step() calls so far = 0-based index of the next step;
        # the model's group gets no step while the gates learn first
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            [
                lambda i: 0.0 if i < first else lr_factor(i + 1, total, warmup, schedule),
                lambda i: lr_factor(i + 1, total, warmup, schedule),
            ],
        )

        self.step = 0
        self.epoch = 0
        self.position = 0
        self.order: torch.Tensor | None = None
        self.generator = torch.Generator().manual_seed(config.seed)
        self.history: list[dict[str, Any]] = []
        self._rng_cpu: torch.Tensor | None = None
        self._rng_cuda: torch.Tensor | None = None
        self._in_loop = False
        #: the step of the checkpoint this run wrote or resumed from (the last good one), None: none yet
        self._saved_step: int | None = None
        #: where the steps run: ``device``, else where the model is (FSDP: the model may stay in CPU memory, whole,
        #: while its shards train on ``device``)
        self._device = torch.device(device) if device is not None else next(iter(model.parameters())).device
        shapes = {k: (str(v.dtype), tuple(v.shape)) for k, v in model.state_dict().items()}
        self.identity: dict[str, Any] = {
            "config": {k: v for k, v in asdict(config).items() if k not in RESUME_MAY_CHANGE},
            "data": data_identity,
            "model": digest(shapes),
            "gates": [list(g.shape) for g in self.gates],
            **({"processes": self.dist.world} if self.dist.active else {}),
            **plain(identity or {}),
        }
        #: the engine of the run in progress (:mod:`headcut.training.parallel`); None outside :meth:`train`
        self._engine: Engine | None = None
        #: the engine the last :meth:`train` ran on: single, ddp or fsdp
        self.engine_name: str | None = None

    # -- data order -------------------------------------------------------------------------------
    def _draw_order(self) -> torch.Tensor:
        n = len(self.batches)
        return torch.randperm(n, generator=self.generator) if self.config.shuffle else torch.arange(n)

    def _next_batch(self) -> dict[str, Any]:
        if self.order is None:
            self.order = self._draw_order()
            self.position = 0
        elif self.position >= len(self.batches):
            self.epoch += 1
            self.order = self._draw_order()
            self.position = 0
        batch = self.batches[int(self.order[self.position])]
        self.position += 1
        return {k: v.to(self._device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    # -- checkpoints ------------------------------------------------------------------------------
    def _cuda_devices(self) -> list[int]:
        return [self._device.index or 0] if self._device.type == "cuda" else []

    def state(self) -> dict[str, Any]:
        """Everything :meth:`resume` needs (tensors and plain values only)."""
        state: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT,
            "model": self.model.state_dict(),
            "gates": [g.detach().clone() for g in self.gates],
            "optimizer": (
                self._engine.gather_optimizer(self.optimizer)
                if self._engine is not None
                else self.optimizer.state_dict()
            ),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "position": self.position,
            "order": self.order,
            "generator": self.generator.get_state(),
            "rng_cpu": torch.get_rng_state() if self._in_loop else self._rng_cpu,
            "rng_cuda": (
                torch.cuda.get_rng_state(self._device)
                if self._in_loop and self._device.type == "cuda"
                else self._rng_cuda
            ),
            "history": self.history,
            "config": asdict(self.config),
            "num_batches": len(self.batches),
            "identity": self.identity,
            "extra": self.extra_state.state_dict() if self.extra_state is not None else None,
        }
        return state

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint.pt`` under ``checkpoint_dir`` atomically; returns its path."""
        if self.checkpoint_dir is None:
            raise HeadcutError("no checkpoint_dir was given")
        dest = self.checkpoint_dir / CHECKPOINT_NAME
        if self._engine is not None:
            self._engine.gather()  # FSDP: the whole weights into the model (every process takes part)
        # the loop checks the trained tensors every step; this also covers buffers and anything set from
        # outside. Every process checks (their weights are the same), so none waits alone at the barrier.
        if not all_finite(list(self.model.state_dict().values()) + self.gates):
            raise self._diverged(self.step, "the weights are not finite", update=False)
        state = self.state()  # every process: FSDP gathers the optimizer state
        if not self.dist.main:
            self.dist.barrier()
            self._saved_step = self.step
            return dest
        atomic_save(state, dest)
        self.dist.barrier()
        self._saved_step = self.step
        return dest

    def snapshot(self) -> dict[str, Any]:
        """A copy of the model's weights, the optimizer and LR-schedule state and the step, for
        :meth:`rewind` (the lottery's late-resetting checkpoint)."""
        return copy.deepcopy(
            {
                "model": self.model.state_dict(),
                "gates": [g.detach() for g in self.gates],
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "step": self.step,
            }
        )

    def rewind(self, snapshot: dict[str, Any]) -> None:
        """Put the weights, gates, optimizer state, LR schedule and step back to ``snapshot`` (from
        :meth:`snapshot`, of this run or of one with the same parameters). This trainer's data order
        and random state stay its own. The snapshot is copied, never shared: training after a rewind
        does not change it."""
        state = copy.deepcopy(snapshot)
        self._restore_training(state)
        self.step = int(state["step"])

    def _restore_training(self, state: dict[str, Any]) -> None:
        """Weights, gates, optimizer and LR-schedule state from ``state``; the LRs of the next step from
        this run's schedule (its length may differ from the state's)."""
        self.model.load_state_dict(state["model"])
        with torch.no_grad():
            for g, saved in zip(self.gates, state["gates"]):
                g.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for group, base, fn in zip(self.optimizer.param_groups, self.scheduler.base_lrs, self.scheduler.lr_lambdas):
            group["lr"] = base * fn(self.scheduler.last_epoch)

    def resume(self, path: str | Path | None = None) -> None:
        """Restore a checkpoint (a file, or a folder holding ``checkpoint.pt``; default: ``checkpoint_dir``)
        so that :meth:`train` continues where it stopped. The schedule's length comes from this
        trainer's config, so a run may be resumed with another ``max_steps``/``epochs`` (and eval and
        checkpoint cadence); everything else in the run's identity (see the module doc) must match,
        or a one-line error lists what differs."""
        if self.config.average_last:
            raise HeadcutError(
                "a run that averages its weights (average_last) cannot resume: its checkpoints hold no running mean"
            )
        if path is None:
            if self.checkpoint_dir is None:
                raise HeadcutError("resume needs a path or a checkpoint_dir")
            path = self.checkpoint_dir
        path = Path(path)
        if path.is_dir():
            path = path / CHECKPOINT_NAME
        if not path.is_file():
            raise HeadcutError(f"no checkpoint at {path}")
        state = read_state(path, CHECKPOINT_FORMAT)
        check_resumable(
            path,
            state,
            identity=self.identity,
            total_steps=self.total_steps,
            batches=len(self.batches),
            model=self.model.state_dict(),
            gates=self.gates,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
        )
        step = state["step"]
        try:
            self._restore_training(state)
            self.step = state["step"]
            self.epoch = state["epoch"]
            self.position = state["position"]
            self.order = state["order"]
            self.generator.set_state(state["generator"])
            self._rng_cpu = state["rng_cpu"]
            self._rng_cuda = state["rng_cuda"]
            self.history = list(state["history"])
            if self._rng_cpu is not None:
                torch.Generator().set_state(self._rng_cpu)  # a damaged RNG state fails here, not in the loop
            if self.extra_state is not None:
                if state.get("extra") is None:
                    raise HeadcutError(f"{path}: the checkpoint holds no state for this run's method")
                self.extra_state.load_state_dict(state["extra"])
        except HeadcutError:
            raise
        except (KeyError, RuntimeError, ValueError, TypeError, IndexError) as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise HeadcutError(
                f"{path} is damaged and cannot be resumed ({why[:120]}); start over without --resume"
            ) from None
        self._saved_step = step

    def _diverged(self, step: int, what: str, update: bool = True) -> TrainingDiverged:
        """The one-line error of a run that became non-finite at ``step``; ``update``: whether an update
        (a learning rate) may be the cause."""
        cfg = self.config
        kept = self.checkpoint_dir if self._saved_step is not None else None
        if update:
            lrs = [(f"lr {cfg.lr:g}", "--lr")] if self.model_params else []
            lrs += [(f"gate lr {cfg.gate_lr:g}", "--gate-lr")] if self.gates else []
            cause = f" ({', '.join(v for v, _ in lrs)}); lower {' or '.join(f for _, f in lrs)} and start over"
        else:
            cause = "; start over"
        where = (
            f"; the last good checkpoint (step {self._saved_step}) is kept in {kept} (start over with --force)"
            if kept is not None
            else ""
        )
        return TrainingDiverged(
            f"training diverged at step {step}: {what}{cause}; no model was written{where}", step, kept
        )

    # -- the loop ---------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Run (or continue) training up to the configured number of steps."""
        if self.checkpoint_dir is not None and self.dist.main:
            with RunLock(self.checkpoint_dir, "training into"):
                remove_stale(self.checkpoint_dir / CHECKPOINT_NAME)
                return self._train()
        return self._train()

    def _train(self) -> TrainResult:
        start = time.perf_counter()
        was_training = self.model.training
        flags = [(p, p.requires_grad) for p in self.model.parameters()]
        try:
            if self.config.mode == "pipelined":
                gate_ids = {id(g) for g in self.gates}
                for p, _ in flags:
                    if id(p) not in gate_ids:
                        p.requires_grad_(False)
            with torch.random.fork_rng(devices=self._cuda_devices()):
                if self._rng_cpu is None:
                    torch.default_generator.manual_seed(self.config.seed)
                    if self._device.type == "cuda":
                        torch.cuda.manual_seed(self.config.seed)
                else:
                    torch.set_rng_state(self._rng_cpu)
                    if self._rng_cuda is not None and self._device.type == "cuda":
                        torch.cuda.set_rng_state(self._rng_cuda, self._device)
                self._in_loop = True
                try:
                    self._start_engine()
                    self._loop()
                    self._stop_engine(finished=True)
                finally:
                    self._stop_engine(finished=False)
                    self._in_loop = False
                if self.early_stopping is not None:
                    self.early_stopping.restore(self.model)
                self._rng_cpu = torch.get_rng_state()
                if self._device.type == "cuda":
                    self._rng_cuda = torch.cuda.get_rng_state(self._device)
        finally:
            for p, flag in flags:
                p.requires_grad_(flag)
            self.model.train(was_training)
            self.optimizer.zero_grad(set_to_none=True)
        return TrainResult(steps=self.step, history=list(self.history), seconds=time.perf_counter() - start)

    def _train_mode(self) -> None:
        self.model.train(self.config.mode == "joint")
        if self._engine is not None:
            self._engine.trained().train(self.config.mode == "joint")

    # -- the engine (one process, DDP or FSDP: headcut.training.parallel) -------------------------
    def _start_engine(self) -> None:
        engine = start(self.config.engine, self.model, self.gates, self.loss_fn, self.dist, self._device)
        self._engine, self.engine_name = engine, engine.name
        trained = engine.trained()
        if trained is not self.model:  # FSDP trains a sharded copy: the optimizer follows its parameters
            names = {id(p): n for n, p in self.model.named_parameters()}
            theirs = dict(trained.named_parameters())
            self._swap_optimizer(engine.shard_optimizer, [theirs[names[id(p)]] for p in self.model_params])

    def _stop_engine(self, finished: bool) -> None:
        """Close the engine; ``finished``: the run ended normally, so FSDP's weights and optimizer state are
        gathered back (every process takes part); after an error they are not (a collective could hang)."""
        engine = self._engine
        if engine is None:
            return
        if finished and engine.trained() is not self.model:
            engine.gather()
            state = engine.gather_optimizer(self.optimizer)
            self._swap_optimizer(lambda opt, groups: rebuilt(opt, groups, state), self.model_params)
        self._engine = None
        engine.close()

    def _swap_optimizer(
        self,
        make: Callable[[torch.optim.Optimizer, list[dict[str, Any]]], torch.optim.Optimizer],
        model_params: list[torch.Tensor],
    ) -> None:
        """A new optimizer (``make(old, groups)``) over ``model_params`` and the gates, with the old one's state
        and learning-rate schedule."""
        groups = [
            {**{k: v for k, v in g.items() if k != "params"}, "params": params}
            for g, params in zip(self.optimizer.param_groups, (model_params, self.gates))
        ]
        schedule = self.scheduler.state_dict()
        self.optimizer = make(self.optimizer, groups)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.scheduler.lr_lambdas)
        self.scheduler.load_state_dict(schedule)
        for group, base, fn in zip(self.optimizer.param_groups, self.scheduler.base_lrs, self.scheduler.lr_lambdas):
            group["lr"] = base * fn(self.scheduler.last_epoch)

    def _loop(self) -> None:
        cfg = self.config
        engine = self._engine
        assert engine is not None
        model_params = [p for g in self.optimizer.param_groups[:1] for p in g["params"]]  # FSDP: the shards
        trained = model_params + self.gates
        if not all_finite(trained):  # the model given (every step after this one is checked)
            named = {**dict(self.model.named_parameters()), **{f"gates.{i}": g for i, g in enumerate(self.gates)}}
            raise HeadcutError(
                f"the weights hold non-finite values (nan or inf) before training, in "
                f"{first_nonfinite(named)}: the model is damaged; nothing was trained or written"
            )
        last_saved = self.step if self._rng_cpu is not None else -1
        # average_last: the running mean of the model's weights after each of the last steps (float32), put in
        # place of the weights at the end (stochastic weight averaging; the gates are not averaged)
        averaged_from = self.total_steps - round(cfg.average_last * self.total_steps) if cfg.average_last else None
        mean: list[torch.Tensor] | None = None
        self._train_mode()
        self.optimizer.zero_grad(set_to_none=True)
        while self.step < self.total_steps:
            lrs = [group["lr"] for group in self.optimizer.param_groups]
            loss_sum = 0.0
            logs: list[dict[str, Any]] = []
            for _ in range(cfg.grad_accum):
                batch = self._next_batch()
                # the engine averages the gradients over the processes
                loss, extra = engine.backward(batch, self.step, 1 / cfg.grad_accum)
                loss_sum += float(loss.detach())
                logs.append({k: plain(v) for k, v in (extra or {}).items()})
            loss_sum = self.dist.average(loss_sum)
            # every process has the same averaged loss, so all of them stop at the same step
            if not math.isfinite(loss_sum):
                raise self._diverged(self.step + 1, f"the loss is {loss_sum / cfg.grad_accum}")
            entry: dict[str, Any] = {"step": self.step + 1, "epoch": self.epoch, "loss": loss_sum / cfg.grad_accum}
            entry["lr"] = lrs[0]
            if self.gates:
                entry["gate_lr"] = lrs[1]
            if cfg.max_grad_norm is not None:
                # each group on its own: a large regulariser on the gates (PASS's escalating lambda) must
                # not scale the model's gradient down to nothing
                if model_params:
                    entry["grad_norm"] = float(whole(torch.nn.utils.clip_grad_norm_(model_params, cfg.max_grad_norm)))
                if self.gates:
                    entry["gate_grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.gates, cfg.max_grad_norm))
                norms = [v for k, v in entry.items() if k.endswith("grad_norm")]
                if not all(math.isfinite(v) for v in norms):
                    raise self._diverged(
                        self.step + 1, f"the gradient norm is {next(v for v in norms if not math.isfinite(v))}"
                    )
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            if averaged_from is not None and self.step > averaged_from and model_params:
                with torch.no_grad():
                    if mean is None:
                        mean = [p.detach().float().clone() for p in model_params]
                    else:
                        for m, p in zip(mean, model_params):
                            m.add_(p.detach().float() - m, alpha=1.0 / (self.step - averaged_from))
            entry.update(merge_logs(logs))
            if self.after_step is not None:
                with torch.no_grad():
                    entry.update({k: plain(v) for k, v in (self.after_step(self.step) or {}).items()})
            if not all_finite(trained):
                raise self._diverged(self.step, "the weights are not finite after the update")
            stop = False
            if cfg.eval_every is not None and self.step % cfg.eval_every == 0 and self.eval_fn is not None:
                engine.gather()  # FSDP: the trained weights into the model the evaluation runs
                self.model.eval()
                entry["eval"] = plain(dict(self.eval_fn(self.step)))
                if self.early_stopping is not None:
                    stop = self.early_stopping.update(self.model, self.step, entry["eval"])
                self._train_mode()
            self.history.append(entry)
            if self.progress is not None:
                self.progress(self.step, self.total_steps)
            if self.on_step is not None:
                self.on_step(entry)
            if (
                self.checkpoint_dir is not None
                and cfg.checkpoint_every is not None
                and self.step % cfg.checkpoint_every == 0
            ):
                self.save_checkpoint()
                last_saved = self.step
            if stop:
                break
        if mean is not None:
            with torch.no_grad():
                for m, p in zip(mean, model_params):
                    p.copy_(m)
        if self.checkpoint_dir is not None and last_saved != self.step:
            self.save_checkpoint()
