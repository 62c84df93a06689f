"""``headcut prune``: choose heads with a pruning method, remove them, save the slimmed model and a
report (``headcut-report.json`` inside it, written in the same atomic save)."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import torch
import transformers
import typer
from rich import box
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from .. import __version__, io
from ..data import DataConfig, looks_local
from ..distributed import from_env
from ..errors import HeadcutError
from ..evaluation import PRIMARY
from ..masks import GQA_POLICIES
from ..outputs import OutputDir, OutputFile, real_path
from ..pruning import (
    LEARNED,
    METHODS,
    LearnedOptions,
    PruneConfig,
    PruneResult,
    check_budget,
    get_method,
    is_learned,
    method_names,
    needs_data,
    plan_learned,
    plan_prune,
)
from ..pruning.base import NOT_YET_METHODS
from ..scoring.base import ABS_PER, NORMALIZE, OBJECTIVES
from ..surgery import SlimResult, slim
from . import app
from .common import (
    FORCE_HELP,
    AllowPickle,
    JsonOut,
    ModelArg,
    Task,
    TrustRemote,
    console,
    handle_errors,
    local_input,
    plan_outputs,
    write_json,
)
from .data_opts import (
    BatchSize,
    D,
    DataOptional,
    LabelCol,
    MaxExamples,
    SeqLen,
    SourceCol,
    Split,
    TargetCol,
    TextCol,
    TextPairCol,
    data_config,
    read_calibration,
)
from .train_opts import (
    CheckpointEvery,
    Device,
    Epochs,
    EvalEvery,
    GradAccum,
    MaxSteps,
    Resume,
    WarmupSteps,
    check_resume,
    checkpoint_dir_for,
    clear_stale,
    move_to,
    resumable,
    training_progress,
)

REPORT_NAME = "headcut-report.json"
REPORT_FORMAT = 1

PRUNE_HELP = "\n\n".join([
    "Remove attention heads of MODEL with a pruning method and save the slimmed model to --out, with "
    f"{REPORT_NAME} inside it (the mask, heads, parameters, sizes, metric before/after).",
    "\n".join(["Methods:"] + [f"{m.name}: {m.summary}" for m in METHODS.values()]
              + [f"{cls.name}: {cls.summary}" for cls in LEARNED.values()]),
    "Budget: --keep K heads, or --sparsity S (K = floor((1 - S) x heads)), met exactly in whole units "
    "(layers sharing weights lose a head together; --gqa group/auto removes whole KV groups) or refused "
    "with the nearest valid budgets; or --max-drop D: remove heads step by step while the --eval-data "
    "metric stays within D of the unpruned model (absolute, in the metric's units), --keep/--sparsity "
    "then being a floor.",
    f"Learned-gate methods ({', '.join(LEARNED)}) train gates on --data (labelled training data), with the "
    "model (--mode joint, default) or on the frozen model (--mode pipelined), for --epochs/--max-steps, then "
    "keep exactly K heads by the learned ranking; the report holds the training curve. Checkpoints go to "
    "OUT.headcut-checkpoint/; run the same command with --resume to continue an interrupted run. They run "
    "unchanged under accelerate launch / torchrun (data-parallel processes).",
    f"--data and --eval-data must differ. Not implemented yet: {', '.join(NOT_YET_METHODS)}.",
])

#: flags that only the learned-gate methods read
TRAINING_FLAGS = ("--mode", "--epochs", "--max-steps", "--lr", "--gate-lr", "--warmup-steps", "--grad-accum",
                  "--eval-every", "--checkpoint-every", "--resume", "--lambda", "--cooldown", "--lambda-step",
                  "--device")


def _method_help() -> str:
    return f"Pruning method: {', '.join(method_names())}."


def _applies(option: str, value: Any, method: str, scorer: str, wanted: str) -> None:
    """Refuse a scorer option given for a method whose scorer does not use it."""
    if value is not None and scorer != wanted:
        users = [m.name for m in METHODS.values() if m.scorer == wanted]
        raise HeadcutError(f"{option} applies to the {wanted} methods ({', '.join(users)}), not to {method}")


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def same_data(a: DataConfig, b: DataConfig) -> str | None:
    """Why two data configs are the same data (same file, identical bytes, or the same ``datasets``
    name, config and split), else None."""
    if looks_local(a.path) and looks_local(b.path):
        pa, pb = Path(a.path).expanduser(), Path(b.path).expanduser()
        if not (pa.is_file() and pb.is_file()):
            return None
        if os.path.samefile(pa, pb):
            return f"both are {a.path}"
        if pa.stat().st_size == pb.stat().st_size and _file_digest(pa) == _file_digest(pb):
            return f"{a.path} and {b.path} have identical contents"
        return None
    if a.path == b.path and a.split == b.split and a.config_name == b.config_name:
        return f"both are {a.path} split {a.split}"
    return None


def weights_bytes(folder: Path | None) -> int | None:
    """Bytes of the safetensors weights in a checkpoint folder (None for a Hub id)."""
    if folder is None or not folder.is_dir():
        return None
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file() and f.name.endswith(".safetensors"))


class PruneBars:
    """Transient rich progress bars on stderr: the pruning loop, and each scoring/evaluation pass."""

    LABELS = {"prune": "pruning", "score": "scoring", "eval": "evaluating"}

    def __init__(self, method: str) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), console=console, transient=True,
        )
        self.method = method
        self.tasks: dict[str, TaskID] = {}
        self.last: dict[str, int] = {}

    def __call__(self, phase: str, done: int, total: int | None) -> None:
        label = self.LABELS.get(phase, phase)
        if phase == "prune":
            label = f"{label} ({self.method}, heads removed)"
        task = self.tasks.get(phase)
        if task is None:
            task = self.tasks[phase] = self.progress.add_task(label, total=max(total or 1, 1))
        elif done == 0 or done < self.last.get(phase, 0):
            self.progress.reset(task, total=max(total or 1, 1))
        self.last[phase] = done
        self.progress.update(task, completed=done, total=max(total or done or 1, 1))


def _trajectory_csv(trajectory: str | None) -> Path | None:
    if trajectory is None:
        return None
    csv_path = Path(trajectory).expanduser()
    if csv_path.suffix.lower() != ".csv":
        raise HeadcutError(f"--trajectory must name a .csv file (a .png is written beside it), got {trajectory}")
    return csv_path


def write_trajectory_csv(path: Path, result: PruneResult) -> None:
    """One row per step: step, heads, metric, within --max-drop, re-scored, heads removed."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "heads", "metric", "within", "rescored", "removed"])
        for p in result.trajectory:
            w.writerow([
                p.step, p.heads, "" if p.metric is None else repr(p.metric),
                "" if p.within is None else str(p.within).lower(), str(p.rescored).lower(), " ".join(p.removed),
            ])


def write_trajectory_png(path: Path, result: PruneResult, title: str) -> None:
    """The metric against heads kept (the papers' accuracy-versus-heads curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    points = [p for p in result.trajectory if p.metric is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p.heads for p in points], [p.metric for p in points], marker="o", markersize=3)
    if result.metric_before is not None:
        ax.axhline(result.metric_before, color="grey", linestyle=":", linewidth=1, label="unpruned")
        if result.config.max_drop is not None:
            sign = -1 if result.higher_is_better else 1
            ax.axhline(result.metric_before + sign * result.config.max_drop, color="red", linestyle="--",
                       linewidth=1, label=f"max drop {result.config.max_drop:g}")
    ax.axvline(result.total_after, color="green", linewidth=1, label=f"kept {result.total_after}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.invert_xaxis()
    ax.set_xlabel("heads kept")
    ax.set_ylabel(result.metric or "metric")
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


STOPPED = {
    "budget": "reached the budget",
    "max-drop": "stopped: the next step dropped the metric by more than --max-drop",
    "floor": "reached the floor (--keep/--sparsity, or nothing more may go) within --max-drop",
}


def build_report(
    *, model: str, out: Path, arguments: dict[str, Any], result: PruneResult, slimmed: SlimResult,
    size_before: int | None, size_after: int | None, data: dict[str, Any] | None, eval_data: dict[str, Any] | None,
    seconds: float, notes: list[str],
) -> dict[str, Any]:
    """The report of one ``headcut prune`` run (``headcut-report.json`` and ``--json``)."""
    metric = None
    if result.metric is not None:
        change = None
        if result.metric_before is not None and result.metric_after is not None:
            change = result.metric_after - result.metric_before
        metric = {
            "name": result.metric, "higher_is_better": result.higher_is_better, "before": result.metric_before,
            "after": result.metric_after, "change": change, "max_drop": result.config.max_drop,
        }
    return {
        "report_format": REPORT_FORMAT,
        "command": "prune",
        "model": model,
        "out": str(out),
        "method": result.method,
        "arguments": arguments,
        "seed": result.config.seed,
        "versions": {
            "headcut": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "mask": result.mask.to_json(),
        "stopped": result.stopped,
        "target": result.target,
        "heads": {
            "before": slimmed.total_before, "after": slimmed.total_after,
            "per_block_before": dict(slimmed.heads_before), "per_block_after": dict(slimmed.heads_after),
        },
        "params": {"before": slimmed.params_before, "after": slimmed.params_after,
                   "unshared": slimmed.unshared_params},
        "size_bytes": {"before": size_before, "after": size_after},
        "metric": metric,
        "trajectory": [p.to_json() for p in result.trajectory],
        "scorings": result.scorings,
        "prune_seconds": result.seconds,
        "seconds": seconds,
        "config": result.config.to_json(),
        "score_config": None if result.score_config is None else result.score_config.to_json(),
        "data": data,
        "eval_data": eval_data,
        "training": None if result.training is None else result.training.to_json(),
        "notes": notes,
    }


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.2f} MiB"


def print_summary(report: dict[str, Any], result: PruneResult) -> None:
    heads, params, size, metric = report["heads"], report["params"], report["size_bytes"], report["metric"]
    console.print(
        f"{report['model']}: {report['method']} kept {heads['after']} of {heads['before']} heads "
        f"({STOPPED.get(report['stopped'], report['stopped'])})", highlight=False, markup=False, soft_wrap=True,
    )
    blocks = Table(title="heads per block", box=box.SIMPLE_HEAD)
    for col in ("block", "before", "after", "kept heads"):
        blocks.add_column(col, justify="left" if col in ("block", "kept heads") else "right")
    for name, n in heads["per_block_before"].items():
        kept = report["mask"]["keep"][name]
        shown = ",".join(map(str, kept)) if len(kept) < n else "all"
        blocks.add_row(name, str(n), str(heads["per_block_after"][name]), shown or "none")
    console.print(blocks)
    summary = Table(title="summary", box=box.SIMPLE_HEAD)
    for col in ("", "before", "after"):
        summary.add_column(col, justify="left" if not col else "right")
    summary.add_row("heads", f"{heads['before']:,}", f"{heads['after']:,}")
    summary.add_row("parameters", f"{params['before']:,}", f"{params['after']:,}")
    summary.add_row("weights", _mib(size["before"]), _mib(size["after"]))
    if metric is not None:
        arrow = "higher is better" if metric["higher_is_better"] else "lower is better"
        summary.add_row(f"{metric['name']} ({arrow})", _fmt(metric["before"]), _fmt(metric["after"]))
    console.print(summary)
    evaluated = [p for p in result.trajectory if p.metric is not None and p.step > 0]
    if evaluated:
        curve = Table(title="trajectory", box=box.SIMPLE_HEAD)
        for col in ("step", "heads", report["metric"]["name"], "within"):
            curve.add_column(col, justify="right")
        for p in result.trajectory:
            mark = "" if p.within is None else ("yes" if p.within else "no")
            curve.add_row(str(p.step), str(p.heads), _fmt(p.metric), mark)
        console.print(curve)
    if params["unshared"]:
        console.print(f"note: unsharing weights added {params['unshared']:,} parameters before the cut",
                      highlight=False)
    run = result.training
    if run is not None:
        evals = [e for e in run.history if isinstance(e.get("eval"), dict)]
        if evals and metric is not None:
            curve = Table(title=f"training ({run.mode}): {metric['name']} with the top-K mask of the moment",
                          box=box.SIMPLE_HEAD)
            for col in ("step", "task loss", "open heads", metric["name"]):
                curve.add_column(col, justify="right")
            for e in evals:
                curve.add_row(str(e["step"]), f"{e.get('task_loss', e['loss']):.4f}", f"{e.get('open', 0):g}",
                              _fmt(e["eval"].get(metric["name"])))
            console.print(curve)
        first, last = run.history[0], run.history[-1]
        resumed = f", resumed at step {run.resumed_from}" if run.resumed_from is not None else ""
        loss = "task_loss" if "task_loss" in last else "loss"
        console.print(
            f"trained {run.steps} steps ({run.mode}{resumed}), task loss {first[loss]:.4f} -> {last[loss]:.4f}, "
            f"{run.seconds:.1f} s; kept the top {result.target} heads by {run.ranking}; {report['seconds']:.1f} s "
            f"in all; saved to {report['out']} (with {REPORT_NAME})", highlight=False, markup=False, soft_wrap=True,
        )
        return
    console.print(
        f"{result.scorings} scoring pass{'es' if result.scorings != 1 else ''}, {report['seconds']:.1f} s; "
        f"saved to {report['out']} (with {REPORT_NAME})", highlight=False, markup=False, soft_wrap=True,
    )


@app.command(name="prune", help=PRUNE_HELP)
@handle_errors
def prune_cmd(
    model: ModelArg,
    method: Annotated[Optional[str], typer.Option("--method", help=_method_help(), show_default=False)] = None,
    keep: Annotated[Optional[int], typer.Option("--keep", help="Heads to keep (exactly).", metavar="K")] = None,
    sparsity: Annotated[
        Optional[float], typer.Option("--sparsity", help="Fraction of heads to remove: keep floor((1 - S) x heads).",
                                      metavar="S")
    ] = None,
    max_drop: Annotated[
        Optional[float], typer.Option("--max-drop", help="Remove heads while the --eval-data metric stays within D "
                                      "of the unpruned model (metric units; needs --eval-data).", metavar="D")
    ] = None,
    data: DataOptional = None,
    eval_data: Annotated[
        Optional[str], typer.Option("--eval-data", help="Evaluation data, in the formats of --data (and must "
                                    "differ from it): the metric before/after, for --max-drop and --trajectory.",
                                    metavar="FILE|NAME[:CONFIG]")
    ] = None,
    eval_split: Annotated[
        str, typer.Option("--eval-split", help="Split of an --eval-data datasets name.")
    ] = "validation",
    out: Annotated[
        Optional[Path], typer.Option("--out", help="Output folder (written atomically).", show_default=False)
    ] = None,
    step: Annotated[
        Optional[int], typer.Option("--step", help="Heads removed per step (whole units: at most N, at least one); "
                                    "default: 10 % of the heads, 1 for greedy-gnorm and inverse-gnorm.", metavar="N")
    ] = None,
    uniform: Annotated[bool, typer.Option("--uniform", help="Keep the same number of heads in every block.")] = False,
    min_heads_per_block: Annotated[
        int, typer.Option("--min-heads-per-block", help="Never take a block below M heads.", metavar="M")
    ] = 0,
    gqa: Annotated[
        str, typer.Option("--gqa", help="Grouped-query attention: group/auto (remove whole KV groups), uniform "
                          "(equal query heads in every remaining group), duplicate (any query head).")
    ] = "auto",
    normalize: Annotated[
        Optional[str], typer.Option("--normalize", help=f"{' | '.join(NORMALIZE)}: divide each block's scores by "
                                    "their L2 norm; default: layer for michel, none otherwise.")
    ] = None,
    abs_per: Annotated[
        Optional[str], typer.Option("--abs-per", help=f"Gradient methods: {' | '.join(ABS_PER)} (default example).")
    ] = None,
    objective: Annotated[
        Optional[str], typer.Option("--objective", help=f"Gnorm methods: {' | '.join(OBJECTIVES)} (default loss).")
    ] = None,
    trajectory: Annotated[
        Optional[str], typer.Option("--trajectory", help="Write the metric after every step to FILE.csv, and a PNG "
                                    "beside it when matplotlib is installed (needs --eval-data).", metavar="FILE.csv")
    ] = None,
    mode: Annotated[
        Optional[str], typer.Option("--mode", help="Learned gates: joint (train the model with the gates; "
                                    "default) or pipelined (frozen model, gates only).")
    ] = None,
    epochs: Epochs = None,
    max_steps: MaxSteps = None,
    lr: Annotated[
        Optional[float], typer.Option("--lr", help="Learned gates: the model's peak learning rate (AdamW, linear "
                                      "decay; default 2e-5).")
    ] = None,
    gate_lr: Annotated[
        Optional[float], typer.Option("--gate-lr", help="Learned gates: the gates' learning rate (default: the "
                                      "paper's, 0.5 for pass/passconc/dsp/ste/lag on encoders, 0.1 for voita).")
    ] = None,
    warmup_steps: WarmupSteps = None,
    grad_accum: GradAccum = None,
    eval_every: EvalEvery = None,
    checkpoint_every: CheckpointEvery = None,
    lam: Annotated[
        Optional[float], typer.Option("--lambda", help="voita: weight of the L0 penalty (default 0.0015).",
                                      metavar="L")
    ] = None,
    cooldown: Annotated[
        Optional[int], typer.Option("--cooldown", help="dsp: temperature cooldown steps N_cooldown (default "
                                    "25,000, or 68 % of a shorter run).", metavar="N")
    ] = None,
    lambda_step: Annotated[
        Optional[int], typer.Option("--lambda-step", help="pass/passconc: n_step of the lambda schedule (default "
                                    "1,000, or steps/6 for a run under 6,000 steps).", metavar="N")
    ] = None,
    resume: Resume = False,
    device: Device = None,
    force: Annotated[
        bool, typer.Option("--force", help=FORCE_HELP + " Also replaces trajectory files and starts over from a "
                           "stale checkpoint folder.")
    ] = False,
    split: Split = D.split,
    text_col: TextCol = None,
    text_pair_col: TextPairCol = None,
    label_col: LabelCol = None,
    source_col: SourceCol = None,
    target_col: TargetCol = None,
    max_examples: MaxExamples = None,
    seq_len: SeqLen = D.seq_len,
    batch_size: BatchSize = D.batch_size,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed: shuffling and masking of the data, and the random method's scores.")
    ] = D.seed,
    json_out: JsonOut = None,
    task: Task = None,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
) -> None:
    """Prune heads (see PRUNE_HELP)."""
    start = time.perf_counter()
    arguments = {k: (str(v) if isinstance(v, Path) else v) for k, v in locals().items() if k != "start"}
    # ---- every refusal before any work
    if method is None:
        raise HeadcutError(f"--method is required; choose one of: {', '.join(method_names())}")
    chosen = get_method(method)
    learned = is_learned(chosen)
    training_given = dict(zip(TRAINING_FLAGS, (
        mode, epochs, max_steps, lr, gate_lr, warmup_steps, grad_accum, eval_every, checkpoint_every,
        resume or None, lam, cooldown, lambda_step, device,
    )))
    if learned:
        for flag, value in (("--normalize", normalize), ("--abs-per", abs_per), ("--objective", objective)):
            if value is not None:
                raise HeadcutError(f"{flag} applies to the score-based methods, not to {method} (learned gates)")
        if lam is not None and method != "voita":
            raise HeadcutError(f"--lambda applies to voita, not to {method}")
        if cooldown is not None and method != "dsp":
            raise HeadcutError(f"--cooldown applies to dsp, not to {method}")
        if lambda_step is not None and method not in ("pass", "passconc"):
            raise HeadcutError(f"--lambda-step applies to pass and passconc, not to {method}")
        if eval_every is not None and eval_data is None:
            raise HeadcutError("--eval-every needs --eval-data")
    else:
        given = [flag for flag, value in training_given.items() if value is not None]
        if given:
            raise HeadcutError(f"{given[0]} applies to the learned-gate methods ({', '.join(LEARNED)}), not to {method}")
        _applies("--abs-per", abs_per, method, chosen.scorer, "gradient")
        _applies("--objective", objective, method, chosen.scorer, "gnorm")
    options = LearnedOptions(
        mode=mode, epochs=epochs, max_steps=max_steps, lr=2e-5 if lr is None else lr, gate_lr=gate_lr,
        warmup_steps=warmup_steps or 0, grad_accum=grad_accum or 1, eval_every=eval_every,
        checkpoint_every=100 if checkpoint_every is None else checkpoint_every, lam=lam, cooldown=cooldown,
        lambda_step=lambda_step,
    ) if learned else None
    if gqa not in GQA_POLICIES:
        raise HeadcutError(f"unknown --gqa policy {gqa!r}; choose one of {', '.join(GQA_POLICIES)}")
    config = PruneConfig(
        method=method, keep=keep, sparsity=sparsity, max_drop=max_drop, step=step, uniform=uniform,
        min_heads_per_block=min_heads_per_block, gqa=gqa, seed=seed, normalize=normalize,
        abs_per=abs_per or "example", objective=objective or "loss", trajectory=trajectory is not None,
        training=options,
    )
    config.validate()
    if options is not None:
        options.validate()
    if out is None:
        raise HeadcutError("--out DIR is required: the folder to save the pruned model in")
    if max_drop is not None and eval_data is None:
        raise HeadcutError("--max-drop needs --eval-data (the metric it watches)")
    if trajectory is not None and eval_data is None:
        raise HeadcutError("--trajectory needs --eval-data (the metric after every step)")
    if needs_data(chosen) and data is None:
        free = [m.name for m in METHODS.values() if not needs_data(m)]
        what = "training data with labels" if learned else "calibration data"
        raise HeadcutError(f"method {method} needs --data ({what}); {', '.join(free)} do not")
    traj_csv = _trajectory_csv(trajectory)
    opts: dict[str, Any] = dict(
        text_col=text_col, text_pair_col=text_pair_col, label_col=label_col, source_col=source_col,
        target_col=target_col, max_examples=max_examples, seq_len=seq_len, batch_size=batch_size, seed=seed,
    )
    data_cfg = data_config(data, split=split, **opts) if data is not None and needs_data(chosen) else None
    eval_cfg = data_config(eval_data, split=eval_split, **opts) if eval_data is not None else None
    if data_cfg is not None and eval_cfg is not None:
        why = same_data(data_cfg, eval_cfg)
        if why:
            raise HeadcutError(
                f"--data and --eval-data are the same data ({why}): calibration and evaluation data must differ; "
                "hold out part of the data for --eval-data"
            )
    dist = from_env()
    torch_device = dist.device(device or "auto") if learned else None
    ckpt = checkpoint_dir_for(out) if learned else None
    target, files = plan_outputs(
        reads={"MODEL": model, "--data": data, "--eval-data": eval_data},
        files={"--json": json_out, "--trajectory": traj_csv,
               "--trajectory (its PNG)": traj_csv.with_suffix(".png") if traj_csv is not None else None},
        file_force={"--trajectory": True, "--trajectory (its PNG)": True},
        out=out, force=force, checkpoint=ckpt,
    )
    assert target is not None
    if ckpt is not None:
        check_resume(out, resume, force)
    with target if dist.main else contextlib.nullcontext():
        _prune_work(
            model=model, method=method, chosen=chosen, learned=learned, config=config, options=options,
            data=data, data_cfg=data_cfg, eval_cfg=eval_cfg, out=out, target=target, files=files, ckpt=ckpt,
            resume=resume, dist=dist, torch_device=torch_device, gqa=gqa, seed=seed, task=task,
            allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, json_out=json_out, arguments=arguments,
            start=start,
        )


def _prune_work(*, model: str, method: str, chosen: Any, learned: bool, config: PruneConfig,
                options: LearnedOptions | None, data: str | None, data_cfg: DataConfig | None,
                eval_cfg: DataConfig | None, out: Path, target: OutputDir, files: dict[str, OutputFile],
                ckpt: Path | None, resume: bool, dist: Any, torch_device: Any, gqa: str, seed: int,
                task: str | None, allow_pickle: bool, trust_remote_code: bool, json_out: str | None,
                arguments: dict[str, Any], start: float) -> None:
    """The work of ``headcut prune`` once every refusal has been made (the output is locked)."""
    notes: list[str] = []
    loaded = io.load(model, task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, notes=notes)
    check_budget(loaded, config)  # refuse an unreachable budget before reading data or scoring
    if data is not None and data_cfg is None:
        notes.append(f"method {method} reads no data: --data was not used")
    calibration = read_calibration(model, loaded, data_cfg, trust_remote_code) if data_cfg is not None else None
    eval_cal = read_calibration(model, loaded, eval_cfg, trust_remote_code) if eval_cfg is not None else None
    for cal, what in ((calibration, "data"), (eval_cal, "eval data")):
        if cal is not None:
            notes += [f"{what}: {n}" for n in cal.notes]

    # ---- the work
    if learned and ckpt is not None and calibration is not None and torch_device is not None and options is not None:
        clear_stale(ckpt, resume, dist)
        move_to(loaded, torch_device)
        shard = len(calibration.batches) // dist.world
        total = options.train_config(options.mode or chosen.default_mode, seed).total_steps(max(shard, 1))
        metric = PRIMARY[eval_cal.task][0] if eval_cal is not None else None
        progress, on_done, show = training_progress(f"training gates ({method})", total, metric, dist)
        with progress, resumable(out, ckpt, options.checkpoint_every, show) as on_step:
            result = plan_learned(loaded, calibration, config, eval_calibration=eval_cal, checkpoint_dir=ckpt,
                                  resume=resume, progress=on_done, on_step=on_step, dist=dist,
                                  identity={"model": str(real_path(model)) if local_input(model) else model})
        loaded.to("cpu")
        run = result.training
        last_open = run.history[-1].get("open") if run.history else None
        if run.moved is None and last_open is not None and last_open != result.target:
            notes.append(f"training ended with {last_open:g} heads open, not {result.target}: the gates had not "
                         "converged, so keeping the top heads changed the trained model; more steps (--epochs, "
                         "--max-steps) let them settle")
        if run.moved is not None:
            notes.append(f"{method} kept {run.own_kept:g} heads by its own rule (gate > 0.5); the adjustment to "
                         f"--keep {result.target} moved {run.moved} head(s)")
    else:
        bars = PruneBars(method)
        with bars.progress:
            result = plan_prune(loaded, calibration, config, eval_calibration=eval_cal, progress=bars)
    slimmed = slim(loaded, result.mask, gqa=gqa)
    result.slim = slimmed
    notes += slimmed.notes
    if not dist.main:
        return
    source = local_input(model)
    temps: list[Path] = []
    csv_file, png_file = files.get("--trajectory"), files.get("--trajectory (its PNG)")
    png_written = False
    try:
        if csv_file is not None and png_file is not None:
            temps = [csv_file.temp()]
            write_trajectory_csv(temps[0], result)
            if importlib.util.find_spec("matplotlib") is not None:
                temps.append(png_file.temp())
                write_trajectory_png(temps[1], result, f"{Path(model).name}: {method}")
                png_written = True
            else:
                notes.append("no trajectory PNG: matplotlib is not installed (pip install 'headcut[plots]')")
        report: dict[str, Any] = {}

        def write_report(folder: Path) -> None:
            report.update(build_report(
                model=model, out=out, arguments=arguments, result=result, slimmed=slimmed,
                size_before=weights_bytes(source if source is not None and source.is_dir() else None),
                size_after=weights_bytes(folder),
                data=calibration.to_json() if calibration is not None else None,
                eval_data=eval_cal.to_json() if eval_cal is not None else None,
                seconds=time.perf_counter() - start, notes=notes,
            ))
            (folder / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")

        saved = io.save(loaded, target, source=source, extra=write_report, trust_remote_code=trust_remote_code)
        notes += saved.notes
        if ckpt is not None:
            shutil.rmtree(ckpt, ignore_errors=True)
        if csv_file is not None and png_file is not None:
            for temp, final in zip(temps, (csv_file, png_file)):
                final.commit(temp)
            temps = []
            if not png_written:
                png_file.path.unlink(missing_ok=True)  # a stale PNG of an earlier run (--force)
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)
    print_summary(report, result)
    if csv_file is not None and png_file is not None:
        png = f" and {png_file.path}" if png_written else ""
        console.print(f"trajectory written to {csv_file.path}{png}", highlight=False, markup=False, soft_wrap=True)
    for note in notes:
        console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    write_json(report, json_out)
