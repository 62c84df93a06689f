"""``headcut score``: per-head importance on calibration data, as a heatmap and JSON."""

from __future__ import annotations

import importlib.util
import math
from typing import Annotated, Any, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import io
from ..adapters import Block
from ..errors import HeadcutError
from ..scoring import SCORERS, HeadScores, ScoreConfig, get_scorer, score
from ..scoring.base import ABS_PER, NORMALIZE, OBJECTIVES
from ..surgery import model_blocks
from . import app
from .common import (
    AllowPickle,
    JsonOut,
    ModelArg,
    Task,
    TrustRemote,
    batch_progress,
    console,
    handle_errors,
    plan_outputs,
    write_json,
)
from .data_opts import (
    BatchSize,
    D,
    DataOptional,
    DataSeed,
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

SCORE_HELP = "\n\n".join([
    "Score every attention head of MODEL on calibration data: which heads matter for this task?",
    "\n".join(["Scorers:"] + [f"{s.name}: {s.summary}" for s in SCORERS.values()]),
    "One pass over the data: a forward and a backward per batch for gradient and gnorm, a forward for "
    "confidence and entropy; value-l1, magnitude and random need no --data. The heatmap (one table per "
    "attention kind, layers x heads, darker = more important) goes to stderr; --json writes the scores "
    "in the order of `headcut info`.",
])

_C = ScoreConfig()


def _importance_colour(value: float, low: float, high: float) -> str:
    share = 0.0 if high <= low else (value - low) / (high - low)
    level = int(40 + 180 * share)
    return f"on rgb({level // 3},{level // 2},{level})"


def heatmap_tables(blocks: list[Block], scores: HeadScores) -> list[Table]:
    """One table per attention kind: a row per layer, a cell per head, shaded by importance."""
    importance = scores.importance()
    tables = []
    for kind in dict.fromkeys(b.kind for b in blocks):
        of_kind = [b for b in blocks if b.kind == kind]
        values = [v for b in of_kind for v in importance[b.name]]
        low, high = (min(values), max(values)) if values else (0.0, 0.0)
        width = max((b.heads for b in of_kind), default=0)
        # one power of ten per table keeps the cells short: a cell shows score / 10**exp
        biggest = max((abs(v) for b in of_kind for v in scores.blocks[b.name]), default=0.0)
        exp = math.floor(math.log10(biggest)) if biggest > 0 and math.isfinite(biggest) else 0
        unit = f" (x 1e{exp})" if exp else ""
        table = Table(title=f"{scores.scorer} scores{unit}: {kind} attention", box=box.SIMPLE_HEAD, padding=(0, 1))
        table.add_column("layer", justify="right", no_wrap=True)
        for h in range(width):
            table.add_column(str(h), justify="right", no_wrap=True)
        for b in of_kind:
            cells: list[Any] = []
            for h, raw in enumerate(scores.blocks[b.name]):
                shade = _importance_colour(importance[b.name][h], low, high)
                cells.append(Text(f"{raw / 10 ** exp:.2f}", style=shade))
            cells += ["-"] * (width - b.heads)
            table.add_row(str(b.layer), *cells)
        tables.append(table)
    return tables


def write_plot(path: str, blocks: list[Block], scores: HeadScores) -> None:
    """A PNG heatmap per attention kind (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    kinds = list(dict.fromkeys(b.kind for b in blocks))
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        of_kind = [b for b in blocks if b.kind == kind]
        width = max((b.heads for b in of_kind), default=0)
        grid = np.full((len(of_kind), max(width, 1)), np.nan)
        for i, b in enumerate(of_kind):
            grid[i, : b.heads] = scores.blocks[b.name]
        image = ax.imshow(grid, aspect="auto", cmap="viridis" if scores.higher_is_important else "viridis_r")
        ax.set_xticks(range(width))
        ax.set_yticks(range(len(of_kind)), [str(b.layer) for b in of_kind])
        ax.set_title(f"{scores.scorer}: {kind}")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


@app.command(name="score", help=SCORE_HELP)
@handle_errors
def score_cmd(
    model: ModelArg,
    scorer: Annotated[str, typer.Option("--scorer", help=f"One of: {', '.join(SCORERS)}.")] = _C.scorer,
    data: DataOptional = None,
    normalize: Annotated[
        str, typer.Option("--normalize", help=f"{' | '.join(NORMALIZE)}: layer divides each block's scores by their "
                          "L2 norm (Michel et al.).")
    ] = _C.normalize,
    abs_per: Annotated[
        str, typer.Option("--abs-per", help=f"gradient: {' | '.join(ABS_PER)}: |dL/dg| per example (Michel et al.) "
                          "or of each batch's mean loss (TextPruner).")
    ] = _C.abs_per,
    objective: Annotated[
        str, typer.Option("--objective", help=f"gnorm: {' | '.join(OBJECTIVES)}: the task loss, or the label-free "
                          "norm of the logits (the Greedy-Gnorm paper's).")
    ] = _C.objective,
    plot: Annotated[
        Optional[str], typer.Option("--plot", help="Also write a PNG heatmap (needs matplotlib: pip install "
                                    "'headcut[plots]').", metavar="FILE.png")
    ] = None,
    split: Split = D.split,
    text_col: TextCol = None,
    text_pair_col: TextPairCol = None,
    label_col: LabelCol = None,
    source_col: SourceCol = None,
    target_col: TargetCol = None,
    max_examples: MaxExamples = None,
    seq_len: SeqLen = D.seq_len,
    batch_size: BatchSize = D.batch_size,
    seed: DataSeed = D.seed,
    json_out: JsonOut = None,
    task: Task = None,
    allow_pickle: AllowPickle = False,
    trust_remote_code: TrustRemote = False,
) -> None:
    """Score heads (see SCORE_HELP)."""
    chosen = get_scorer(scorer)
    config = ScoreConfig(scorer=scorer, normalize=normalize, abs_per=abs_per, objective=objective, seed=seed)
    config.validate()
    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise HeadcutError("--plot needs matplotlib: pip install 'headcut[plots]' (or pip install matplotlib)")
    if chosen.needs_data and data is None:
        raise HeadcutError(f"scorer {scorer} needs --data (value-l1, magnitude and random do not)")
    data_cfg = None
    if data is not None and chosen.needs_data:
        data_cfg = data_config(
            data, split=split, text_col=text_col, text_pair_col=text_pair_col, label_col=label_col,
            source_col=source_col, target_col=target_col, max_examples=max_examples, seq_len=seq_len,
            batch_size=batch_size, seed=seed,
        )
    _, files = plan_outputs(reads={"MODEL": model, "--data": data}, files={"--json": json_out, "--plot": plot})
    loaded = io.load(model, task, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    calibration = None
    if data_cfg is not None:
        calibration = read_calibration(model, loaded, data_cfg, trust_remote_code)
        progress, on_progress = batch_progress(f"scoring ({scorer})", len(calibration.batches))
        with progress:
            result = score(loaded, calibration.batches, config, progress=on_progress)
    else:
        result = score(loaded, None, config)
    blocks = model_blocks(loaded)
    out_console = console if console.is_terminal else Console(stderr=True, width=200)
    for table in heatmap_tables(blocks, result):
        out_console.print(table)
    direction = "higher" if result.higher_is_important else "lower"
    console.print(
        f"{result.scorer}: {direction} = more important; {result.examples:,} examples, {result.seconds:.2f} s",
        highlight=False,
    )
    if calibration is not None:
        for note in calibration.notes:
            console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    if plot is not None:
        png = files["--plot"]
        tmp = png.temp()
        try:
            write_plot(str(tmp), blocks, result)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        png.commit(tmp)
        console.print(f"heatmap written to {plot}", highlight=False)
    out: dict[str, Any] = {"model": model, **result.to_json(), "config": config.to_json()}
    if calibration is not None:
        out["data"] = calibration.to_json()
    write_json(out, json_out)
