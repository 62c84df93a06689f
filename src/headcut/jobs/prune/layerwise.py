"""``headcut prune --layerwise``: the prune job on a checkpoint read one layer at a time
(:mod:`headcut.model.streamed`), chosen by the user or automatically when the model would not fit
``max_memory``.

The result's ``model`` is the cut model on the meta device (its structure, config and record, no weights):
``save(out)`` reads the checkpoint again, layer by layer, cuts each layer and writes it, so the weights of the
pruned model exist only in the saved folder (``headcut.load(out)`` loads it like any other)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...arguments.table import checked
from ...errors import HeadcutError, label
from ...files.atomic import OutputDir
from ...files.plan import check_paths
from ...model import compensation
from ...model.loading import open_checkpoint
from ...model.masks import plan_cuts, resolve_mask
from ...model.saving import SavedModel, finish_checkpoint
from ...model.stock import stock_form
from ...model.streamed import LayerwiseStats, StreamedModel, activation_bytes
from ...model.streamed_cut import write_layerwise
from ...model.surgery import slim
from ...model.tensor_files import DTYPE_BYTES
from ...outputs.modelcard import write_card
from ...outputs.reports import prune_report, weights_bytes
from ...progress import Reporter, quiet
from ...pruning import check_budget, run_search
from ...pruning.ranked import ScoreMethod, oriented
from ...pruning.schedule import Round
from ...scoring.layerwise import score_layerwise, spill_folder
from ..bars import Bars
from ..base import LoadedModel, calibration, plain_arguments
from ..results import Pruned
from ..saving import local_reads, serving_entries, write_report
from .layerwise_choice import Choice, checkpoint_bytes
from .recipes import resolved_recipe
from .request import PruneRequest


@dataclass(kw_only=True)
class LayerwisePruned(Pruned):
    """:class:`Pruned` of a layer-wise run: ``model`` is on the meta device (see the module's doc)."""

    folder: Path = field(default=Path("."))
    config_obj: Any = None
    model_cls: Any = None
    gqa: str = "auto"
    stats: LayerwiseStats = field(default_factory=LayerwiseStats)
    progress: Reporter = field(default_factory=quiet)
    #: FLAP's bias compensation: each block's mean output-projection input (None: no compensation)
    means: dict[str, Any] | None = None

    @checked("Written.save")
    def save(
        self,
        out: str | os.PathLike[str] | OutputDir,
        force: bool = False,
        *,
        formats: Any = None,
        gguf_type: str | None = None,
    ) -> Any:
        """Read the checkpoint again layer by layer, cut and write every layer, then the config, the side files,
        the report and the model card (atomically, as any save)."""

        if formats not in (None, "safetensors", ("safetensors",), ["safetensors"]):
            raise HeadcutError(f"{label('layerwise')} writes safetensors only (convert the output with headcut export)")
        target = out if isinstance(out, OutputDir) else OutputDir(out, force)
        check_paths(
            reads={k: v for k, v in self.reads.items() if v is not None}, writes={}, replaces={"--out": target.path}
        )
        held = target.lock.held
        if not held:
            target.check()
            target.acquire()
        report = self.report
        report["out"] = str(target.path)
        try:
            fresh = StreamedModel.open(self.folder, self.config_obj, self.model_cls)
            cuts = plan_cuts(resolve_mask(self.mask.to_json(), fresh.blocks), fresh.blocks, self.gqa)
            before, after, compensate = self._compensation(fresh)
            with target.staging(need=fresh.stored_bytes(self.model)) as tmp:
                with self.progress.task("cutting and writing, layer by layer", len(fresh.layers), "layers") as bar:
                    write_layerwise(
                        fresh,
                        cuts,
                        tmp,
                        self.stats,
                        progress=lambda d, t: bar.update(d, t),
                        before_cut=before,
                        after_cut=after,
                    )
                if compensate is not None:
                    compensate()
                form = stock_form(fresh.model, verify=False, meta=True)
                report["checkpoint"] = form.to_json()
                notes = finish_checkpoint(fresh.model, tmp, self.folder, self.trust_remote_code, form)
                if isinstance(report.get("size_bytes"), dict):
                    report["size_bytes"]["after"] = weights_bytes(tmp)
                serving_entries(report, fresh.model)
                report["layerwise"] = self.stats.to_json()
                report["seconds"] = round(float(report.get("seconds") or 0.0) + self.stats.write_seconds, 3)
                write_card(tmp, fresh.model, report, source=self.folder, formats=None, has_weights=True)
                write_report(tmp, report, self.REPORT)
        finally:
            if not held:
                target.release()
        if notes:
            report.setdefault("notes", []).extend(n for n in notes if n not in report.get("notes", []))
        return SavedModel(Path(target.path), notes, form)

    def _compensation(self, fresh: StreamedModel) -> tuple[Any, Any, Any]:
        """The write pass's hooks of FLAP's bias compensation (None without): each layer's bias increments from
        its uncut weights, added after its cut; and the final check of the compensated model's names."""
        if self.means is None:
            return None, None, None

        bias_field = compensation.bias_field(fresh.model, fresh.blocks)
        by_layer: dict[int, list[Any]] = {}
        for block in fresh.blocks:
            by_layer.setdefault(fresh.layer_of[block.name], []).append(block)
        pending: dict[str, Any] = {}
        keep = self.mask.keep

        def before(i: int) -> None:
            pending.update(compensation.deltas(fresh.model, by_layer.get(i, []), keep, self.means or {}))

        def after(i: int) -> None:
            compensation.apply(fresh.model, fresh.blocks, pending, bias_field, modules=by_layer.get(i, []))

        def finish() -> None:
            if bias_field is not None:
                setattr(fresh.model.config, bias_field, True)
            compensation.check_names(fresh.model, bias_field)
            self.report["bias_compensation"] = {
                "blocks": sorted(pending),
                "field": bias_field,
                "metric_uncompensated": None,
            }

        return before, after, finish


def prune_layerwise(request: PruneRequest, arguments: dict[str, Any] | None, choice: Choice) -> LayerwisePruned:
    """The work of :func:`headcut.prune` on a checked request that runs layer-wise."""

    src, sources, config = request.source, request.sources, request.config
    split = request.data_options.get("split", "train")
    data_options = {k: v for k, v in request.data_options.items() if k != "split"}
    progress = request.run.progress or quiet()
    notes = list(request.notes)
    start = time.perf_counter()
    folder, _, config_obj, cls, _, own = open_checkpoint(src.model, src.task, src.allow_pickle, src.trust_remote_code)
    assert folder is not None
    stats = LayerwiseStats(max_memory=choice.max_memory, reason=choice.reason)
    with progress.step(f"reading the structure of {src.model} (no weights)"):
        streamed = StreamedModel.open(folder, config_obj, cls, new_head=src.task is not None and not own)
    stats.layers = len(streamed.layers)
    stats.layer_bytes = max(streamed.layer_bytes(i) for i in range(len(streamed.layers)))
    stats.checkpoint_bytes = checkpoint_bytes(folder)
    sets, budget, method, options = check_budget(streamed.model, request.config, request.options, checked=True)
    assert isinstance(method, ScoreMethod)  # the layer-wise choice admits the one-shot score methods only
    means: dict[str, Any] | None = {} if getattr(options, "bias_compensation", False) else None
    if means is not None:
        compensation.bias_field(streamed.model, streamed.blocks)  # refused before any work
    loaded = LoadedModel(streamed.model, str(src.model), folder)
    cal = calibration(
        request.data_spec,
        loaded,
        src.tokenizer,
        split,
        data_options,
        config.seed,
        src.trust_remote_code,
        progress,
        "data",
    )
    if cal is not None:
        notes += [f"data: {n}" for n in cal.notes]
    batches = cal.batches if cal is not None else None
    score_config = method.score_config(request.config, options)
    outside = streamed.outside_layers()
    element = DTYPE_BYTES.get(streamed.checkpoint.dtypes[outside[0][1]], 4) if outside else 4
    width = int(getattr(streamed.model.config, "hidden_size", 0) or 0)
    stats.activation_bytes = activation_bytes(batches or [], width, element) if width else 0
    # inputs and outputs of one layer beside two copies of the largest layer
    spill = 2 * stats.activation_bytes + 2 * stats.layer_bytes > choice.max_memory
    stats.activations = "disk" if spill else "memory"
    with spill_folder(None) as tmp:
        with progress.task("scoring, layer by layer", len(streamed.layers), "layers") as bar:
            scores = score_layerwise(
                streamed,
                batches,
                score_config,
                stats,
                Path(tmp) if spill else None,
                progress=lambda d, t: bar.update(d, t),
                means=means,
            )

    inverse = method.inverse

    class Fixed:
        """The layer-wise scores, for the exact-budget search (scored once)."""

        rescoring = False
        scorings = 1

        def importance(self, model: Any, mask: Any, progress: Any) -> dict[str, list[float]]:
            return oriented(scores.importance(), inverse)

    bars = Bars(progress, config.method, None)
    try:
        result = run_search(streamed.model, streamed.blocks, sets, budget, Fixed(), request.config, None, bars)
    finally:
        bars.close()
    result.score_config = score_config
    result.options = options
    plan_cuts(result.mask, streamed.blocks, request.config.gqa)
    slimmed = slim(streamed.model, result.mask, gqa=request.config.gqa)  # the meta model: shapes and record
    result.slim = slimmed
    notes += slimmed.notes
    notes.append(
        f"pruned layer by layer ({choice.reason}): scores from one layer at a time, activations in "
        f"{stats.activations}; the weights were never all in memory"
    )
    arguments = (
        arguments
        if arguments is not None
        else plain_arguments(
            dict(
                model=src.model,
                method=config.method,
                keep=config.keep,
                sparsity=config.sparsity,
                kv_budget=config.kv_budget,
                context=config.context,
                allocation=config.allocation,
                data=sources.data,
                uniform=config.uniform,
                min_heads_per_block=config.min_heads_per_block,
                gqa=config.gqa,
                seed=config.seed,
                task=src.task,
                split=split,
                data_options=data_options,
                layerwise=True,
                **request.method_options,
            )
        )
    )
    report = prune_report(
        model=str(src.model),
        arguments=arguments,
        result=result,
        slimmed=slimmed,
        size_before=weights_bytes(folder),
        data=cal.to_json() if cal is not None else None,
        eval_data=None,
        seconds=time.perf_counter() - start,
        notes=notes,
    )
    report["layerwise"] = stats.to_json()
    report["recipe"] = resolved_recipe(
        request.recipe, request.stages, config, request.data_spec, data_options, [Round(config)]
    ).to_dict()
    reads = local_reads(**{"MODEL": folder, "--data": request.data_spec, "--recipe": request.recipe.source})
    return LayerwisePruned(
        model=streamed.model,
        mask=result.mask,
        report=report,
        result=result,
        source=folder,
        notes=notes,
        reads=reads,
        trust_remote_code=src.trust_remote_code,
        folder=folder,
        config_obj=config_obj,
        model_cls=cls,
        gqa=request.config.gqa,
        stats=stats,
        progress=progress,
        means=means,
    )
