"""The model card (``README.md``) headcut writes into every output folder.

It follows the Hugging Face model-card format: a YAML header (``base_model``, ``library_name``,
``pipeline_tag``, ``tags``) and a Markdown body that says what was removed (heads per block, before
and after, parameters), how (the method, its settings and its paper), the metric before and after
on the evaluation data when the command measured one, the speed-up when ``headcut bench
--update-card`` measured one, and how to load each file the folder holds.

Everything in it comes from the command's report and the saved model itself; nothing is estimated.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from torch import nn

from .. import __version__
from ..catalog import METHODS, PAPERS
from ..files.atomic import OutputFile
from ..model.info import info
from ..model.stock import auto_class_name, stock_form
from .reports import STOPPED

CARD = "README.md"
#: the marker between the card and the section ``headcut bench --update-card`` rewrites
SPEED_MARK = "<!-- headcut:speed -->"

PIPELINE_TAGS = {
    "ForSequenceClassification": "text-classification",
    "ForCausalLM": "text-generation",
    "ForMaskedLM": "fill-mask",
    "ForConditionalGeneration": "text2text-generation",
    "ForImageClassification": "image-classification",
    "ForTokenClassification": "token-classification",
    "ForQuestionAnswering": "question-answering",
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _yaml_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _front_matter(text: str) -> dict[str, str]:
    """The top-level ``key: value`` lines of a card's YAML header (enough to carry ``base_model``)."""
    if not text.startswith("---\n"):
        return {}
    end = text.find("\n---", 4)
    out: dict[str, str] = {}
    for line in text[4 : end if end > 0 else 0].splitlines():
        key, sep, value = line.partition(":")
        if sep and key and not key.startswith((" ", "-")) and value.strip():
            value = value.strip()
            try:
                value = json.loads(value) if value.startswith('"') else value
            except ValueError:
                pass
            out[key.strip()] = str(value)
    return out


def base_model(model_name: str, source: Path | None) -> str | None:
    """The Hub id the output derives from: the model argument itself when it is a Hub id, else the
    ``base_model`` of the source folder's own card (a chain prune -> finetune keeps it), else None."""
    if source is None:
        return model_name if _HUB_ID.match(model_name) else None
    card = source / CARD
    if card.is_file():
        try:
            found = _front_matter(card.read_text(encoding="utf-8", errors="replace")).get("base_model")
        except OSError:
            found = None
        if found and _HUB_ID.match(found):
            return found
    return None


def _architecture(model: nn.Module) -> str:
    return type(model).__name__.removeprefix("Headcut")


def _pipeline_tag(model: nn.Module) -> str | None:
    arch = _architecture(model)
    return next((tag for suffix, tag in PIPELINE_TAGS.items() if arch.endswith(suffix)), None)


def _heads(model: nn.Module) -> tuple[list[tuple[str, int, int, int, int]], int]:
    """(block, heads before, after, KV heads before, after) per block, from the model's cut record, and
    the parameters now."""

    described = info(model)
    record = getattr(model.config, "headcut", None) or {}
    cut = record.get("blocks", {}) if isinstance(record, dict) else {}
    rows = []
    for block in described.blocks:
        entry = cut.get(block.name) or {}
        rows.append(
            (
                block.name,
                int(entry.get("heads", block.heads)),
                block.heads,
                int(entry.get("kv_heads", block.kv_heads)),
                block.kv_heads,
            )
        )
    return rows, described.params


def _fmt_metric(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "—" if value is None else str(value)


def _method_section(report: dict[str, Any]) -> list[str]:
    command = report.get("command")
    lines: list[str] = []
    if command == "prune":
        entry = METHODS.get(str(report.get("method")))
        lines.append(
            f"Pruned by `headcut prune --method {report.get('method')}`" + (f": {entry.summary}." if entry else ".")
        )
        if entry:
            lines.append(f"Paper: {entry.citation}.")
        target = report.get("target")
        kv = report.get("kv_budget")
        speed = report.get("speed_target")
        if speed and speed.get("reached"):
            lines.append(
                f"Budget: decoding {speed['target']:g}x faster at {speed['context']:,} tokens on {speed['device']}, "
                f"measured {speed['reached']['speedup_median']:.3g}x (median of {speed['rounds']} paired rounds) at "
                f"--kv-budget {speed['chosen_fraction']:g}."
            )
        if kv:
            lines.append(
                f"Budget: at most {kv['fraction']:g} of the KV cache of one sequence of {kv['context']:,} tokens; "
                f"{kv['bytes_before']:,} -> {kv['bytes_after']:,} bytes ({kv['reached']:.3g} kept), the heads placed "
                f"by the {kv['allocation']} allocation."
            )
        elif target is not None:
            stopped = STOPPED.get(str(report.get("stopped")), str(report.get("stopped")))
            lines.append(f"Budget: keep {target} heads ({stopped}).")
        arguments = report.get("arguments") or {}
        hidden = {"model", "out", "force", "json", "json_out", "quiet", "output_format", "format"}
        if "gguf" not in str(arguments.get("output_format") or arguments.get("format") or ""):
            hidden.add("gguf_type")
        settings = {
            k: v for k, v in arguments.items() if v is not None and v is not False and v != "" and k not in hidden
        }
        if settings:
            lines.append("Settings: " + ", ".join(f"`{k}={v}`" for k, v in sorted(settings.items())) + ".")
        for stage in report.get("rounds") or []:
            lines.append(
                f"The cut ran in two rounds: first to {stage['keep']} heads"
                + (", refitted" if stage.get("refit") else "")
                + (
                    f" and fine-tuned for {stage['recovery']['steps']} step"
                    + ("s" if stage["recovery"]["steps"] != 1 else "")
                    if stage.get("recovery")
                    else ""
                )
                + ", then to the heads kept, as below."
            )
        recovery = report.get("recovery")
        if recovery:
            extra = recovery.get("recover_data")
            also = (
                f" on the training rows and {extra['examples']} unlabelled rows of {extra['source']} (alpha 1)"
                if extra
                else ""
            )
            weight = (recovery.get("config") or {}).get("hidden_weight")
            also += f", its hidden states matched with weight {weight:g}" if weight else ""
            average = (recovery.get("config") or {}).get("average_last")
            also += (
                f", at a constant learning rate with its weights averaged over the last {average:g} of the steps"
                if average
                else ""
            )
            lines.append(
                f"Then {recovery['steps']} steps of recovery fine-tuning, distilled from the unpruned model{also}."
            )
        distilled = (report.get("training") or {}).get("distillation") or {}
        if distilled:
            lines.append(
                f"The gates were trained with distillation from the unpruned model (alpha "
                f"{distilled.get('alpha')}, temperature {distilled.get('temperature')})."
            )
    elif command == "export":
        lines.append(
            "Heads removed by `headcut export` with a given mask "
            f"(`--mask {(report.get('arguments') or {}).get('mask')}`, GQA policy `{report.get('gqa')}`)."
        )
    elif command == "finetune":
        teacher = report.get("teacher")
        lines.append(
            f"Fine-tuned by `headcut finetune` for {report.get('steps')} steps"
            + (f", distilled from `{teacher}`" if teacher else "")
            + "; its heads were not changed."
        )
    if report.get("seconds") is not None:
        lines.append(f"The command took {float(report['seconds']):.0f} s.")
    return lines


def _metric_section(report: dict[str, Any]) -> list[str]:
    metric = report.get("metric")
    if not isinstance(metric, dict) or metric.get("name") is None:
        how = (
            "`headcut eval THIS_FOLDER --data FILE` measures one"
            if report.get("command") == "export"
            else "pass `--eval-data` to measure one"
        )
        return [f"No metric was measured by this command ({how})."]
    data = report.get("eval_data") or report.get("data") or {}
    where = data.get("source") or data.get("path") or data.get("name") or "the evaluation data"
    examples = data.get("examples")
    on = f"`{where}`" + (f", {examples:,} examples" if isinstance(examples, int) else "")
    return [
        "| metric | before | after | change |",
        "| --- | --- | --- | --- |",
        f"| {metric['name']} | {_fmt_metric(metric.get('before'))} | {_fmt_metric(metric.get('after'))} | "
        f"{_fmt_metric(metric.get('change'))} |",
        "",
        f"Measured on {on}." + _steps_line(report, metric),
    ]


def _steps_line(report: dict[str, Any], metric: dict[str, Any]) -> str:
    """The metric after each step between the cut and the saved model (the refit, the recovery)."""
    if metric.get("after_pruning") is None:
        return ""
    line = f" After the cut: {_fmt_metric(metric['after_pruning'])}"
    if metric.get("after_refit") is not None:
        line += f"; after the least-squares refit of the output projections: {_fmt_metric(metric['after_refit'])}"
    return line + (" (before the recovery fine-tuning)." if report.get("recovery") else ".")


def _auto_class(model: nn.Module) -> str:
    """The most specific Auto class that loads the model's architecture (``AutoModel`` at worst)."""

    return auto_class_name(model.config, _architecture(model))


def _checkpoint_lines(model: nn.Module, checkpoint: dict[str, Any]) -> list[str]:
    """How to load the safetensors checkpoint: stock transformers, or headcut's form and why."""
    arch = str(checkpoint.get("architecture") or _architecture(model))
    auto = _auto_class(model)
    if checkpoint.get("form") == "stock":
        lines = [
            f"A plain transformers checkpoint (`{arch}`, stock `{checkpoint.get('model_type')}` config): no custom "
            "code, no `trust_remote_code`, headcut not needed.",
            "",
            "```python",
            f"from transformers import {auto}",
            f'model = {auto}.from_pretrained("path/to/this/folder")',
            "```",
            "",
        ]
        padding = checkpoint.get("padding")
        if isinstance(padding, dict) and padding.get("query_heads_added"):
            lines += [
                f"To hold one head count in every layer, {padding['query_heads_added']} zero query heads were added "
                f"({padding.get('query_heads_per_kv_head')} query heads per KV head in every layer; the layers the "
                f"cut left fewer per KV head got zero q rows and zero o columns, so the outputs are the cut's). "
                f"They add {int(padding.get('params_added') or 0):,} parameters to the checkpoint (beyond the "
                "cut's count) and their share of the q/o compute; the KV cache and the K/V projections are unchanged by "
                "them.",
                "",
            ]
        if arch != _architecture(model):
            lines += [
                f"It is written as `{arch}`, not `{_architecture(model)}`: the {_architecture(model)} config "
                "refuses these head counts, and this class computes the same with the same weights "
                "(checked when it was written).",
                "",
            ]
        return lines
    return [
        "With plain transformers (the cut is applied by the small `modeling_headcut.py` shipped here):",
        "",
        "```python",
        f"from transformers import {auto}",
        f'model = {auto}.from_pretrained("path/to/this/folder", trust_remote_code=True)',
        "```",
        "",
        "With headcut (no remote code runs):",
        "",
        "```python",
        "import headcut",
        'model = headcut.load("path/to/this/folder")',
        "```",
        "",
        f"Not a plain checkpoint because {checkpoint.get('why_not_stock') or 'of the cut'}.",
        "",
    ]


def _files_section(
    model: nn.Module, formats: dict[str, Any], has_weights: bool, checkpoint: dict[str, Any] | None = None
) -> list[str]:
    lines = []
    if has_weights:
        if checkpoint is None:
            checkpoint = stock_form(model).to_json()
        lines += _checkpoint_lines(model, checkpoint)
    onnx = formats.get("onnx")
    if onnx:
        parity = onnx.get("parity")
        checked = (
            f" (checked: max abs difference from PyTorch {parity:.1e} in {onnx.get('checked_with')})"
            if isinstance(parity, float)
            else ""
        )
        lines += [
            f"ONNX (`{onnx.get('file')}`, opset {onnx.get('opset')}){checked}:",
            "",
            "```python",
            "import onnxruntime",
            f'session = onnxruntime.InferenceSession("{onnx.get("file")}")',
            f"# inputs: {', '.join(onnx.get('inputs', [])[:4])}" + (" ..." if len(onnx.get("inputs", [])) > 4 else ""),
            "```",
            "",
        ]
    decilm = formats.get("decilm")
    if decilm:
        pad = decilm.get("padding") or {}
        lines += [
            f"DeciLM / Nemotron-NAS for vLLM (`{decilm.get('folder')}/`, `DeciLMForCausalLM`, headcut's "
            f"`configuration_decilm.py`): {decilm.get('query_heads')} query heads in every layer, KV heads per layer "
            f"{decilm.get('kv_heads')}; {pad.get('query_heads_added')} zero query heads and {pad.get('kv_heads_added')} "
            f"zero KV heads hold the cut in that layout (exact; {int(pad.get('params_added') or 0):,} parameters).",
            "",
            "```bash",
            f"vllm serve path/to/this/folder/{decilm.get('folder')} --trust-remote-code",
            "```",
            "",
        ]
    gguf = formats.get("gguf")
    if gguf:
        lines += [
            f"GGUF for llama.cpp (`{gguf.get('file')}`, {gguf.get('outtype')}, architecture "
            f"`{gguf.get('arch')}` with per-layer head counts):",
            "",
            "```bash",
            f'llama-cli -m {gguf.get("file")} -p "Hello"',
            "```",
            "",
        ]
    return lines


def _engine_lines(report: dict[str, Any]) -> list[str]:
    """Which engines load what the folder holds (the report's ``engines``, :mod:`headcut.outputs.serving`)."""
    rows = report.get("engines") or []
    if not rows:
        return []
    lines = ["Engines that load it:", "", "| engine | what | how |", "| --- | --- | --- |"]
    for e in rows:
        how = str(e["how"]).replace('"OUT', '"path/to/this/folder').replace(" OUT", " path/to/this/folder")
        lines.append(f"| {e['engine']} | `{e['path']}` | `{how}` |")
    hint = report.get("not_served")
    return lines + ([""] + [f"{str(hint)[0].upper()}{str(hint)[1:]}."] if hint else []) + [""]


def card_text(
    model: nn.Module,
    report: dict[str, Any],
    *,
    source: Path | None = None,
    formats: dict[str, Any] | None = None,
    has_weights: bool = True,
) -> str:
    """The card of an output folder holding ``model``, written by the command of ``report``."""

    formats = formats or {}
    rows, params_after = _heads(model)
    model_name = str(report.get("model") or "")
    base = base_model(model_name, source)
    tags = ["headcut", "pruned", "attention-head-pruning"]
    if report.get("command") == "prune" and report.get("method"):
        tags.append(str(report["method"]))
    tags += [f for f in ("onnx", "gguf", "decilm") if f in formats]
    header = ["---"]
    header.append(
        f"base_model: {_yaml_str(base)}"
        if base
        else f"# base_model: not known (made from the local checkpoint {_yaml_str(Path(model_name).name)})"
    )
    header.append("library_name: transformers")
    tag = _pipeline_tag(model)
    if tag:
        header.append(f"pipeline_tag: {tag}")
    header.append("tags:")
    header += [f"- {t}" for t in tags]
    header.append("---")

    before = sum(r[1] for r in rows)
    after = sum(r[2] for r in rows)
    params = report.get("params") if isinstance(report.get("params"), dict) else {}
    params_before = params.get("before") or report.get("params_before")
    body = [
        "",
        f"# {Path(str(report.get('out') or 'model')).name}",
        "",
        f"A {_architecture(model)} with attention heads removed by headcut {__version__}, from `{model_name}`. The weights are really smaller: removed heads are sliced out "
        "of the projections, not masked.",
        "",
        "## What was removed",
        "",
        f"Heads: {before} -> {after}"
        + (f" ({100 * (before - after) / before:.0f} % removed)" if before else "")
        + ". Parameters: "
        + (f"{params_before:,} -> " if isinstance(params_before, int) else "")
        + f"{params_after:,}.",
        "",
        "| block | heads before | heads after | KV heads before | KV heads after |",
        "| --- | --- | --- | --- | --- |",
    ]
    body += [f"| {name} | {hb} | {ha} | {kb} | {ka} |" for name, hb, ha, kb, ka in rows]
    body += ["", "## How", "", *_method_section(report), "", "## Quality", "", *_metric_section(report), ""]
    checkpoint = report.get("checkpoint") if isinstance(report.get("checkpoint"), dict) else None
    body += ["## How to load it", "", *_files_section(model, formats, has_weights, checkpoint), *_engine_lines(report)]
    body += [
        SPEED_MARK,
        "## Speed",
        "",
        "Not measured yet: `headcut bench ORIGINAL THIS_FOLDER --update-card` times both and writes the speed-up here.",
        "",
    ]
    entry = METHODS.get(str(report.get("method"))) if report.get("command") == "prune" else None
    if entry is not None and entry.paper.split()[0] != "headcut":
        body += ["## Citation", "", PAPERS[entry.paper.split()[0]], ""]
    return "\n".join(header + body)


def speed_section(rows: list[dict[str, Any]], baseline: str, machine: str) -> str:
    """The card's speed section from ``headcut bench`` rows (this folder's rows and the baseline's)."""
    lines = [
        SPEED_MARK,
        "## Speed",
        "",
        f"Measured by `headcut bench` against `{baseline}` on {machine}:",
        "",
        "| runtime | device | dtype | input | median ms | speed-up | per-round speed-ups (p25-p75) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        speed, low, high = r.get("speedup"), r.get("speedup_p25"), r.get("speedup_p75")
        spread = "—" if low is None or high is None else f"{float(low):.2f}-{float(high):.2f}x"
        if r.get("within_noise"):
            spread += " (within run-to-run noise)"
        lines.append(
            f"| {r.get('runtime', 'torch')} | {r.get('device')} | {r.get('dtype')} | "
            f"{r.get('input', '')} | {float(r['median_ms']):.1f} | "
            f"{'—' if speed is None else f'{float(speed):.2f}x'} | {spread} |"
        )
    if any(r.get("speedup_p25") is not None for r in rows):
        lines += [
            "",
            "Timed interleaved (every model once per round, the order rotated each round); the per-round "
            "speed-ups are the baseline's time over this model's in the same round.",
        ]
    else:
        lines += ["", "Timed one model after the other (--no-interleave): under load the speed-up is not reliable."]
    return "\n".join(lines) + "\n"


def replace_speed(text: str, section: str) -> str:
    """``text`` (a card) with its speed section (from :data:`SPEED_MARK` to the next top-level section
    or the end) replaced by ``section``."""
    start = text.find(SPEED_MARK)
    if start < 0:
        return text.rstrip("\n") + "\n\n" + section
    rest = text[start + len(SPEED_MARK) :]
    nxt = re.search(r"^## (?!Speed)", rest, flags=re.MULTILINE)
    tail = rest[nxt.start() :] if nxt else ""
    return text[:start] + section + ("\n" + tail if tail else "")


def write_card(
    folder: Path,
    model: nn.Module,
    report: dict[str, Any],
    *,
    source: Path | None = None,
    formats: dict[str, Any] | None = None,
    has_weights: bool = True,
) -> None:
    """Write ``README.md`` into ``folder`` (a staging folder: the caller renames it into place)."""
    (folder / CARD).write_text(
        card_text(model, report, source=source, formats=formats, has_weights=has_weights), encoding="utf-8"
    )


def update_speed(results: list[Any], models: list[Any], machine: str) -> tuple[list[Path], list[str]]:
    """Write the speed section of the card of every benchmarked folder after the first (the baseline)
    that has a headcut card, from its ``headcut bench`` rows; speed-ups are against the baseline's row
    of the same runtime. Each card is replaced atomically. Returns the cards written and notes on the
    folders skipped."""

    names = [str(m) if isinstance(m, (str, Path)) else None for m in models]
    written: list[Path] = []
    notes: list[str] = []
    if len(models) < 2 or names[0] is None:
        return written, ["--update-card needs a baseline folder first and a headcut output after it"]
    base = {r.runtime: r for r in results if r.name == names[0]}
    for name in dict.fromkeys(n for n in names[1:] if n is not None):
        card = Path(name).expanduser() / CARD
        text = card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""
        if SPEED_MARK not in text:
            notes.append(f"{name}: no headcut model card (README.md with a speed section); not updated")
            continue
        rows = []
        for r in results:
            if r.name != name:
                continue
            ref = base.get(r.runtime)
            shape = "x".join(str(v) for v in next(iter(r.inputs.values()), []))
            rows.append(
                {
                    "runtime": r.runtime,
                    "device": r.device,
                    "dtype": r.dtype,
                    "input": shape,
                    "median_ms": r.median_ms,
                    "speedup": ref.median_ms / r.median_ms if ref is not None and r.median_ms else None,
                    "speedup_p25": getattr(r, "speedup_p25", None),
                    "speedup_p75": getattr(r, "speedup_p75", None),
                    "within_noise": getattr(r, "within_noise", None),
                }
            )
        OutputFile(card, "--update-card").write_text(replace_speed(text, speed_section(rows, names[0], machine)))
        written.append(card)
    return written, notes
