"""``headcut export``: remove the heads a mask file drops and save the slimmed model."""

from __future__ import annotations

from pathlib import Path

from ..config import MaskSource
from ..config.run import ModelSource, OutputSettings
from ..files.plan import plan_outputs
from ..recipes.recipe import stage_options
from .app import app
from .declared import with_settings, with_specs
from .failures import handle_errors
from .help import TidyCommand, examples
from .output import Out, Reporting
from .params import ModelArg
from .render.checkpoint import checkpoint_lines, formats_lines


@app.command(
    cls=TidyCommand,
    epilog=examples(
        'echo \'{"drop": {"self.0": [0, 3], "self.5": [1]}}\' > mask.json',
        "headcut export model/ --mask mask.json --out slim/",
        "headcut export model/ --mask prune-report-mask.json --out slim/ --force --json -",
    ),
)
@handle_errors
@with_specs([s for s in stage_options("cut") if s.name == "gqa"], "cut")  # prune's --gqa (the cut stage's)
@with_settings(MaskSource, "inputs", required=("mask",))
@with_settings(OutputSettings, "output", required=("out",))
@with_settings(Reporting, "reporting")
@with_settings(ModelSource, "source")
def export(
    model: ModelArg,
    inputs: MaskSource = MaskSource(),
    output: OutputSettings = OutputSettings(),
    cut: dict | None = None,
    reporting: Reporting = Reporting(),
    source: ModelSource = ModelSource(),
) -> None:
    """Remove the heads a mask file drops and save a slimmed model that loads back."""
    out, force, output_format, gguf_type = Path(str(output.out)), output.force, output.formats, output.gguf_type
    json_out, task = reporting.json_out, source.task
    mask = Path(str(inputs.mask))
    gqa = (cut or {}).get("gqa", "auto")
    # imported here, not at the top: torch loads only when a command runs (fast --help, completion)
    from .. import api
    from ..outputs.formats import parse_formats

    parse_formats(output_format)  # a bad --format is refused before anything is read

    plan_outputs(reads={"MODEL": model, "--mask": mask}, files={"--json": json_out}, out=out, force=force)
    log = Out(json_out, reporting.quiet)
    arguments = {
        "model": model,
        "mask": str(mask),
        "out": str(out),
        "gqa": gqa,
        "force": force,
        "task": task,
        "format": output_format,
        "gguf_type": gguf_type if "gguf" in output_format else None,
    }
    exported = api.export(
        model,
        mask,
        gqa=gqa,
        task=task,
        allow_pickle=source.allow_pickle,
        trust_remote_code=source.trust_remote_code,
        formats=output_format,
        gguf_type=gguf_type,
        out=out,
        force=force,
        arguments=arguments,
    )
    s = exported.slim
    log.show(
        f"kept {s.total_after} of {s.total_before} heads; parameters {s.params_before:,} -> {s.params_after:,}; "
        f"saved to {out}"
    )
    if s.unshared_params:
        log.note(f"unsharing weights added {s.unshared_params:,} parameters before the cut")
    for line in checkpoint_lines(exported.report) + formats_lines(exported.report):
        log.show(line)
    log.notes(exported.report.get("notes", []))
    log.json(exported.report)
