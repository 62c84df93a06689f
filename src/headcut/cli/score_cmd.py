"""``headcut score``: per-head importance on calibration data, as a heatmap and JSON."""

from __future__ import annotations

from ..catalog import SCORERS
from ..config import PlotOptions, ScoreConfig
from ..config.run import DataSources, ModelSource, RunSettings
from ..data.config import DataConfig
from ..extras import imported
from ..files.plan import plan_outputs
from .app import app
from .declared import data_spec, with_settings, with_specs
from .failures import handle_errors
from .help import TidyCommand, examples
from .output import Out, Reporting
from .params import ModelArg

SCORE_HELP = "\n\n".join(
    [
        "Score every attention head of MODEL on calibration data: which heads matter for this task?",
        "\n".join(["Scorers:"] + [f"{s.name}: {s.summary}" for s in SCORERS.values()]),
        "One pass over the data: a forward and a backward per batch for gradient and gnorm, a forward for "
        "confidence and entropy; value-l1, magnitude and random need no --data. The heatmap (one table per "
        "attention kind, layers x heads, darker = more important) goes to stdout (stderr with --json -); --json "
        "writes the scores in the order of `headcut info`.",
    ]
)


@app.command(
    cls=TidyCommand,
    name="score",
    help=SCORE_HELP,
    epilog=examples(
        "headcut score model/ --data cal.csv --scorer gnorm",
        "headcut score model/ --data cal.csv --scorer gradient --normalize layer --json scores.json --plot scores.png",
        "headcut score model/ --scorer value-l1",
    ),
)
@handle_errors
@with_specs(ScoreConfig, "settings")
@with_specs(PlotOptions, "plotting")
@with_specs(DataConfig, "data_options")
@with_settings(DataSources, "sources", skip=("eval_data", "eval_split", "recover_data"))
@with_settings(RunSettings, "run", skip=("device", "resume"))
@with_settings(Reporting, "reporting")
@with_settings(ModelSource, "source")
def score_cmd(
    model: ModelArg,
    sources: DataSources = DataSources(),
    settings: dict | None = None,
    plotting: dict | None = None,
    run: RunSettings = RunSettings(),
    reporting: Reporting = Reporting(),
    source: ModelSource = ModelSource(),
    data_options: dict | None = None,
) -> None:
    """Score heads (see SCORE_HELP)."""
    data, seed, json_out = sources.data, run.seed, reporting.json_out
    out = Out(json_out, reporting.quiet)  # first: the log's 30 s clock starts with the command
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from .. import api
    from .render.score import (
        heatmap_tables,
        write_plot,
    )

    config = ScoreConfig(**(settings or {}))  # the flags not given: the declared defaults
    config.validate()
    plot = PlotOptions(**(plotting or {})).plot
    if plot is not None:
        hint = "pip install 'headcut[plots]' (or pip install matplotlib)"
        imported("matplotlib", "--plot", hint, missing=f"--plot needs matplotlib: {hint}")
    spec = data_spec(data, data_options or {}, seed) if data is not None else None
    _, files = plan_outputs(reads={"MODEL": model, "--data": data}, files={"--json": json_out, "--plot": plot})
    try:
        scored = api.score(
            model,
            config.scorer,
            data=spec,
            normalize=config.normalize,
            abs_per=config.abs_per,
            objective=config.objective,
            per=config.per,
            seed=seed,
            task=source.task,
            progress=out.progress,
            allow_pickle=source.allow_pickle,
            trust_remote_code=source.trust_remote_code,
        )
    finally:
        out.close()
    result = scored.scores
    for table in heatmap_tables(scored.blocks, result):
        out.show(table)
    direction = "higher" if result.higher_is_important else "lower"
    out.show(f"{result.scorer}: {direction} = more important; {result.examples:,} examples, {result.seconds:.2f} s")
    out.notes(scored.notes)
    if plot is not None:
        png = files["--plot"]
        tmp = png.temp()
        try:
            write_plot(str(tmp), scored.blocks, result)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        png.commit(tmp)
        out.log.print(f"heatmap written to {plot}", highlight=False, markup=False, soft_wrap=True)
    out.json(scored.report)
