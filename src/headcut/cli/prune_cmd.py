"""``headcut prune``: choose heads with a pruning method, remove them, save the slimmed model with its
report (``headcut-report.json`` inside it, written in the same atomic save)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..catalog import (
    ABS_PER,
    AUBER_REWARD_EXAMPLES,
    AUBER_STATES,
    GNORM_PER,
    LOTTERY_CONTROLS,
    LOTTERY_PATIENCE,
    LOTTERY_PRUNE_EVERY,
    LOTTERY_RESET_AT,
    LOTTERY_SCORE_EXAMPLES,
    METHODS,
    MODES,
    NORMALIZE,
    OBJECTIVES,
    REWARD_METRICS,
    method_entry,
)
from ..config import PruneConfig
from ..errors import HeadcutError
from ..outputs import checkpoint_dir_for
from ..reports import PRUNE_REPORT
from . import app
from .common import (
    DATA_HELP,
    FORCE_HELP,
    AllowPickle,
    DataOptions,
    GgufType,
    Gqa,
    JsonOut,
    MethodOpt,
    ModelArg,
    Out,
    Out_,
    OutputFormat,
    Quiet,
    Task,
    TidyCommand,
    TrainOptions,
    TrustRemote,
    _choices,
    data_spec,
    examples,
    handle_errors,
    locked_run,
    plan_outputs,
    with_data_options,
    with_training_options,
)

LEARNED = [m.name for m in METHODS.values() if m.kind == "learned"]
RESUMABLE = [m.name for m in METHODS.values() if m.resumable]
TRAINING = [m.name for m in METHODS.values() if m.data == "training"]

PRUNE_HELP = "\n\n".join([
    "Remove attention heads of MODEL with a pruning method and save the slimmed model to --out, with "
    f"{PRUNE_REPORT} inside it (the mask, heads, parameters, sizes, metric before/after).",
    "\n".join(["Methods:"] + [f"{m.name}: {m.summary} [{m.short_citation}]" for m in METHODS.values()]),
    "Budget: --keep K heads, or --sparsity S (K = floor((1 - S) x heads)), met exactly in whole units "
    "(layers sharing weights lose a head together; --gqa group/auto removes whole KV groups) or refused "
    "with the nearest valid budgets; or --max-drop D (score-based methods): remove heads step by step while the "
    "--eval-data metric stays within D of the unpruned model (absolute, in the metric's units), --keep/--sparsity "
    "then being a floor.",
    f"Learned-gate methods ({', '.join(LEARNED)}) train gates on --data (labelled training data), with the model "
    "(--mode joint, default) or on the frozen model (--mode pipelined), then keep exactly K heads by the learned "
    "ranking; the report holds the training curve. Checkpoints go to OUT.headcut-checkpoint/; run the same command "
    "with --resume to continue an interrupted run. They run unchanged under accelerate launch / torchrun.",
    "auber (for small training sets) needs no budget: layer by layer, a DQN agent trained for --episodes episodes "
    "removes the heads whose removal raises the metric of a held-out part of --data (--reward-metric, on "
    "--reward-examples examples), the layer is fine-tuned (--lr, default 2e-6; --layer-epochs), and at the end the "
    "model is fine-tuned with early stopping (--patience, at most --epochs, default 2). --keep/--sparsity, if given, "
    "is an upper bound on the heads kept. The report lists every layer's heads, reward path and metrics.",
    "lottery trains --data for --reset-at steps (the late-resetting checkpoint C, optimizer state included), then "
    "repeats: train --prune-every steps from C with a new data order, remove the --per-step least confident heads "
    "(attention confidence on --eval-data, else --data; encoder, decoder and cross attention ranked together), "
    "rewind the rest to C; at K heads it converges from C with early stopping on the --eval-data loss (--patience "
    "evaluations, every --eval-every steps, at most --max-steps). --control reinit also trains the pruned structure "
    "from a fresh initialisation, for comparison. Checkpoints and --resume as for the learned-gate methods.",
    "A method's own options (--step, --rounds, --normalize, --abs-per, --objective, --per; --mode, --gate-lr, --gates-first, --sparsity-warmup, --alpha, --temperature, --lambda, "
    "--lambda-trials, --cooldown, --lambda-step; --episodes, --reverse, --state, --reward-examples, --reward-metric, "
    "--allow-empty-layers, --layer-epochs, --patience; --reset-at, --prune-every, --per-step, --score-examples, "
    "--control; and the training options) are refused for a method that has "
    "no such option. --data and --eval-data must differ.",
])


@app.command(cls=TidyCommand, name="prune", help=PRUNE_HELP, epilog=examples(
    "headcut prune model/ --method pass --keep 16 --data train.csv --eval-data dev.csv --out slim/",
    "headcut prune model/ --method greedy-gnorm --keep 48 --data cal.csv --eval-data dev.csv --out slim/",
    "headcut prune model/ --method michel --max-drop 0.01 --data cal.csv --eval-data dev.csv --out slim/ "
    "--trajectory curve.csv",
    "headcut prune model/ --method auber --data train.csv --eval-data dev.csv --out slim/   # small data",
    "headcut prune model/ --method lottery --keep 16 --data train.csv --eval-data dev.csv --out slim/",
    "headcut prune model/ --method pass --keep 16 --data train.csv --out slim/ --resume   # after an interruption"))
@handle_errors
@with_data_options
@with_training_options
def prune_cmd(
    model: ModelArg,
    method: MethodOpt = None,
    keep: Annotated[Optional[int], typer.Option("--keep", help="Heads to keep (exactly; auber: at most).",
                                                metavar="K")] = None,
    sparsity: Annotated[Optional[float], typer.Option(
        "--sparsity", help="Fraction of heads to remove: keep floor((1 - S) x heads).", metavar="S")] = None,
    max_drop: Annotated[Optional[float], typer.Option(
        "--max-drop", metavar="D", help="Remove heads while the --eval-data metric stays within D of the unpruned "
        "model (metric units; needs --eval-data; score-based methods).")] = None,
    data: Annotated[Optional[str], typer.Option("--data", help=DATA_HELP, metavar="FILE|NAME[:CONFIG]",
                                                show_default=False)] = None,
    eval_data: Annotated[Optional[str], typer.Option(
        "--eval-data", metavar="FILE|NAME[:CONFIG]", help="Evaluation data, in the formats of --data (and must differ "
        "from it): the metric before/after, for --max-drop, --trajectory and --eval-every.")] = None,
    eval_split: Annotated[str, typer.Option("--eval-split", help="Split of an --eval-data datasets name.",
                                            metavar="SPLIT")] = "validation",
    out: Out_ = None,
    uniform: Annotated[bool, typer.Option("--uniform", help="Keep the same number of heads in every block.",
                                          metavar="")] = False,
    min_heads_per_block: Annotated[int, typer.Option("--min-heads-per-block", metavar="M",
                                                     help="Never take a block below M heads.")] = 0,
    gqa: Gqa = "auto",
    recover_steps: Annotated[int, typer.Option(
        "--recover-steps", metavar="N",
        help="After the cut, N steps of recovery fine-tuning on --data, distilled from the unpruned model "
             "(finetune's loss and defaults); the metric after is the recovered model's.")] = 0,
    output_format: OutputFormat = "safetensors",
    gguf_type: GgufType = "f16",
    step: Annotated[Optional[int], typer.Option(
        "--step", metavar="N", rich_help_panel="Method options", help="Score-based methods: heads removed per step "
        "(whole units: at most N, at least one); default: 10 % of the heads, 1 for greedy-gnorm.")] = None,
    rounds: Annotated[Optional[int], typer.Option(
        "--rounds", metavar="R", rich_help_panel="Method options", help="Score-based methods: reach K in R steps "
        "instead of steps of --step, the heads to remove split evenly, the larger steps first (TextPruner's "
        "schedule; an iterative method then scores R times whatever K).")] = None,
    normalize: Annotated[Optional[str], typer.Option(
        "--normalize", metavar="|".join(NORMALIZE), rich_help_panel="Method options",
        help="Score-based methods: divide each block's scores by their L2 norm; default: layer for michel, none "
             "otherwise.")] = None,
    abs_per: Annotated[Optional[str], typer.Option(
        "--abs-per", metavar="|".join(ABS_PER), rich_help_panel="Method options",
        help="Gradient methods: |dL/dg| per example (default) or per batch.")] = None,
    objective: Annotated[Optional[str], typer.Option(
        "--objective", metavar="|".join(OBJECTIVES), rich_help_panel="Method options",
        help="Gnorm methods: gradient of the logits' norm (default; the paper's) or of the task loss.")] = None,
    per: Annotated[Optional[str], typer.Option(
        "--per", metavar="|".join(GNORM_PER), rich_help_panel="Method options",
        help="Gnorm methods: gradient norms of every batch (default) or every example.")] = None,
    mode: Annotated[Optional[str], typer.Option(
        "--mode", metavar="|".join(MODES), rich_help_panel="Method options", autocompletion=_choices(MODES),
        help="Learned gates: joint (train the model with the gates; default) or pipelined (frozen model).")] = None,
    gate_lr: Annotated[Optional[float], typer.Option(
        "--gate-lr", metavar="LR", rich_help_panel="Method options",
        help="Learned gates: the gates' learning rate (default: the paper's).")] = None,
    sparsity_warmup: Annotated[Optional[int], typer.Option(
        "--sparsity-warmup", metavar="N", rich_help_panel="Method options",
        help="lag: raise the target sparsity linearly from 0 over the first N steps (CoFi's schedule); 0 "
             "(default): the paper's fixed target.")] = None,
    gates_first: Annotated[Optional[int], typer.Option(
        "--gates-first", metavar="N", rich_help_panel="Method options",
        help="Learned gates, joint mode: the model's weights stay fixed for the first N steps (the gates learn "
             "alone), then train with the gates; 0 (default): joint from the start.")] = None,
    alpha: Annotated[Optional[float], typer.Option(
        "--alpha", metavar="A", rich_help_panel="Method options",
        help="Learned gates, lottery, auber: weight in [0, 1] of distillation from the unpruned model (logit KL "
             "at --temperature) in every training step; 0 (default): the paper's task loss alone.")] = None,
    temperature: Annotated[Optional[float], typer.Option(
        "--temperature", metavar="T", rich_help_panel="Method options",
        help="Learned gates, lottery, auber: distillation temperature with --alpha (default 2.0).")] = None,
    lam: Annotated[Optional[float], typer.Option(
        "--lambda", metavar="L", rich_help_panel="Method options",
        help="voita: the L0 penalty's weight (default: searched so that the gates keep K heads).")] = None,
    lambda_trials: Annotated[Optional[int], typer.Option(
        "--lambda-trials", metavar="N", rich_help_panel="Method options",
        help="voita: training runs of the lambda search (default 5).")] = None,
    cooldown: Annotated[Optional[int], typer.Option(
        "--cooldown", metavar="N", rich_help_panel="Method options",
        help="dsp: temperature cooldown steps (default 25,000, or 68 % of a shorter run).")] = None,
    lambda_step: Annotated[Optional[int], typer.Option(
        "--lambda-step", metavar="N", rich_help_panel="Method options",
        help="pass/passconc: n_step of the lambda schedule (default 1,000, or steps/6 under 6,000 steps).")] = None,
    episodes: Annotated[Optional[int], typer.Option(
        "--episodes", metavar="N", rich_help_panel="Method options",
        help="auber: DQN episodes per layer (default 150, the paper's).")] = None,
    reverse: Annotated[Optional[bool], typer.Option(
        "--reverse", metavar="", rich_help_panel="Method options",
        help="auber: process the last layer first (the paper's AUBER-Reverse ablation).")] = None,
    state: Annotated[Optional[str], typer.Option(
        "--state", metavar="|".join(AUBER_STATES), rich_help_panel="Method options",
        autocompletion=_choices(AUBER_STATES),
        help="auber: the state feature: L1 norm of each head's value matrix (default), or the query, key or value "
             "L2 ablations.")] = None,
    reward_examples: Annotated[Optional[int], typer.Option(
        "--reward-examples", metavar="N", rich_help_panel="Method options",
        help=f"auber: mini-dev examples each reward is measured on (default {AUBER_REWARD_EXAMPLES}).")] = None,
    reward_metric: Annotated[Optional[str], typer.Option(
        "--reward-metric", metavar="|".join(REWARD_METRICS), rich_help_panel="Method options",
        autocompletion=_choices(REWARD_METRICS),
        help="auber: the metric the reward is the change of (default: a classifier's accuracy when the rewards see "
             "all of mini-dev, as in the paper, else its loss; the loss for language models).")] = None,
    allow_empty_layers: Annotated[Optional[bool], typer.Option(
        "--allow-empty-layers", metavar="", rich_help_panel="Method options",
        help="auber: let the agent prune a layer's last head (by default one stays).")] = None,
    layer_epochs: Annotated[Optional[int], typer.Option(
        "--layer-epochs", metavar="N", rich_help_panel="Method options",
        help="auber: fine-tuning epochs on mini-train after each layer (default 1; 0: none).")] = None,
    patience: Annotated[Optional[int], typer.Option(
        "--patience", metavar="N", rich_help_panel="Method options",
        help=f"auber, lottery: evaluations without improvement that stop the final fine-tune / the convergence "
             f"(default 20 / {LOTTERY_PATIENCE}).")] = None,
    reset_at: Annotated[Optional[int], typer.Option(
        "--reset-at", metavar="STEPS", rich_help_panel="Method options",
        help=f"lottery: training steps to the late-resetting checkpoint (default {LOTTERY_RESET_AT}).")] = None,
    prune_every: Annotated[Optional[int], typer.Option(
        "--prune-every", metavar="STEPS", rich_help_panel="Method options",
        help=f"lottery: training steps from the checkpoint before each pruning decision (default "
             f"{LOTTERY_PRUNE_EVERY}).")] = None,
    per_step: Annotated[Optional[int], typer.Option(
        "--per-step", metavar="N", rich_help_panel="Method options",
        help="lottery: heads removed per iteration (default: attention layers / 2, as the paper).")] = None,
    score_examples: Annotated[Optional[int], typer.Option(
        "--score-examples", metavar="N", rich_help_panel="Method options",
        help=f"lottery: examples the attention confidence is averaged over (default {LOTTERY_SCORE_EXAMPLES}).")
    ] = None,
    control: Annotated[Optional[str], typer.Option(
        "--control", metavar="|".join(LOTTERY_CONTROLS), rich_help_panel="Method options",
        autocompletion=_choices(LOTTERY_CONTROLS),
        help="lottery: also train the pruned structure re-initialised, as long as the ticket (the paper's control); "
             "the report shows both.")] = None,
    trajectory: Annotated[Optional[str], typer.Option(
        "--trajectory", metavar="FILE.csv", help="Write the metric after every step to FILE.csv, and a PNG beside it "
        "when matplotlib is installed (needs --eval-data; score-based methods).")] = None,
    force: Annotated[bool, typer.Option("--force", metavar="", help=FORCE_HELP + " Also replaces trajectory files and "
                                        "starts over from a stale checkpoint folder.")] = False,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed: data shuffling and masking, batch order, "
                                      "dropout and every random choice of the method.")] = 0,
    json_out: JsonOut = None,
    task: Task = None,
    quiet: Quiet = False,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
    data_options: DataOptions = DataOptions(),
    training: TrainOptions = TrainOptions(),
) -> None:
    """Prune heads (see PRUNE_HELP)."""
    from .. import api
    from ..formats import parse_formats

    parse_formats(output_format)  # a bad --format is refused before anything is read

    arguments = _arguments(locals())
    # ---- every refusal before any work
    if method is None:
        raise HeadcutError(f"--method is required; choose one of: {', '.join(METHODS)}")
    entry = method_entry(method)
    PruneConfig(method=method, keep=keep, sparsity=sparsity, max_drop=max_drop, uniform=uniform,
                min_heads_per_block=min_heads_per_block, gqa=gqa, seed=seed,
                trajectory=trajectory is not None).validate()
    if out is None:
        raise HeadcutError("--out DIR is required: the folder to save the pruned model in")
    if trajectory is not None and Path(trajectory).suffix.lower() != ".csv":
        raise HeadcutError(f"--trajectory must name a .csv file (a .png is written beside it), got {trajectory}")
    options: dict[str, Any] = {k: v for k, v in dict(
        step=step, rounds=rounds, normalize=normalize, abs_per=abs_per, objective=objective, per=per, mode=mode, gate_lr=gate_lr,
        gates_first=gates_first, sparsity_warmup=sparsity_warmup, alpha=alpha, temperature=temperature, lam=lam, lambda_trials=lambda_trials, cooldown=cooldown, lambda_step=lambda_step, episodes=episodes,
        reverse=reverse, state=state, reward_examples=reward_examples, reward_metric=reward_metric,
        allow_empty_layers=allow_empty_layers, layer_epochs=layer_epochs, patience=patience, reset_at=reset_at,
        prune_every=prune_every, per_step=per_step, score_examples=score_examples, control=control,
        **training.given()).items() if v is not None}
    learned = entry.resumable
    if training.resume and not learned:
        raise HeadcutError(f"--resume applies to the methods that keep checkpoints ({', '.join(RESUMABLE)}), not "
                           f"to {method}")
    if training.device is not None and entry.data != "training":
        raise HeadcutError(f"--device applies to the methods that train ({', '.join(TRAINING)}), not to {method}")
    use_data = data is not None and entry.data != "none"
    data_cfg = data_spec(data, data_options.split, data_options, seed) if use_data else data
    eval_cfg = data_spec(eval_data, eval_split, data_options, seed) if eval_data is not None else None
    ckpt = checkpoint_dir_for(out) if learned else None
    traj_png = Path(trajectory).with_suffix(".png") if trajectory is not None else None
    target, files = plan_outputs(
        reads={"MODEL": model, "--data": data, "--eval-data": eval_data},
        files={"--json": json_out, "--trajectory": trajectory, "--trajectory (its PNG)": traj_png},
        file_force={"--trajectory": True, "--trajectory (its PNG)": True},
        out=out, force=force, checkpoint=ckpt,
    )
    assert target is not None
    from ..distributed import from_env

    dist = from_env()
    log = Out(json_out, quiet)
    with locked_run(target, dist.main, out, ckpt, log):
        pruned = api.prune(
            model, method, keep=keep, sparsity=sparsity, max_drop=max_drop, data=data_cfg, eval_data=eval_cfg,
            uniform=uniform, min_heads_per_block=min_heads_per_block, gqa=gqa, seed=seed,
            trajectory=trajectory is not None, task=task, split=data_options.split, eval_split=eval_split,
            data_options=data_options.for_api(), device=training.device, checkpoint_dir=ckpt, resume=training.resume,
            restart=force, progress=log.progress, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
            formats=output_format, gguf_type=gguf_type, recover_steps=recover_steps, arguments=arguments, **options,
        )
        if not dist.main:
            return
        pruned.save(target)
        if ckpt is not None:
            shutil.rmtree(ckpt, ignore_errors=True)
        written = pruned.write_trajectory(files["--trajectory"]) if trajectory is not None else []
    from .render import prune_summary

    for item in prune_summary(pruned.report, pruned.result, PRUNE_REPORT):
        log.show(item)
    if written:
        log.log.print(f"trajectory written to {' and '.join(map(str, written))}", highlight=False, markup=False,
                      soft_wrap=True)
        if len(written) == 1:
            log.note("no trajectory PNG: matplotlib is not installed (pip install 'headcut[plots]')")
    log.notes(pruned.report["notes"])
    log.json(pruned.report)


def _arguments(values: dict[str, Any]) -> dict[str, Any]:
    """The command's arguments as the report records them (flag names as parameters)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key in ("data_options", "training"):
            out.update({k: v for k, v in vars(value).items()})
        elif isinstance(value, Path):
            out[key] = str(value)
        elif isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
    return out
