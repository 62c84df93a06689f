"""What prune, finetune and export show of the output they wrote: how the checkpoint loads, the serving engines
that load it, and its ONNX, GGUF and DeciLM files."""

from __future__ import annotations

import json
from typing import Any


def checkpoint_lines(report: dict[str, Any]) -> list[str]:
    """How the written checkpoint loads (``report["checkpoint"]``): stock transformers, or headcut's form with
    the reason and, after a non-uniform prune, the ``--uniform`` budgets that would make it stock."""
    form = report.get("checkpoint")
    if not isinstance(form, dict):
        return []
    loader = str(form.get("loader")).replace('"OUT"', json.dumps(str(report.get("out") or "OUT")))
    if form.get("form") == "stock":
        line = (
            f"checkpoint: plain transformers {form.get('architecture')}, loads with {loader} "
            "(no trust_remote_code, no headcut)"
        )
        padding = form.get("padding")
        if isinstance(padding, dict) and padding.get("query_heads_added"):
            line += (
                f"; {padding['query_heads_added']} zero query heads added to hold one count per layer "
                f"({int(padding.get('params_added') or 0):,} parameters, KV cache unchanged)"
            )
        return [line] + serving_lines(report)
    line = (
        f"checkpoint: headcut's form, loads with {loader}; not a plain transformers checkpoint "
        f"because {form.get('why_not_stock')}"
    )
    near = report.get("uniform_budgets")
    if near:
        line += (
            "; --uniform would write a plain one: the nearest uniform budgets are "
            + " or ".join(f"--keep {k}" for k in near)
            + " (their quality was not measured)"
        )
    return [line] + serving_lines(report)


def serving_lines(report: dict[str, Any]) -> list[str]:
    """The serving engines that load the output (``report["engines"]``) beyond transformers, or, for a causal LM
    none loads, what would make it servable (``report["not_served"]``)."""
    served = [e for e in report.get("engines") or [] if e.get("engine") not in ("transformers",)]
    out = str(report.get("out") or "OUT")
    lines = []
    if served:
        lines.append("serves in: " + "; ".join(f"{e['engine']}: {str(e['how']).replace('OUT', out)}" for e in served))
    if report.get("not_served"):
        lines.append(str(report["not_served"]))
    return lines


def formats_lines(report: dict[str, Any]) -> list[str]:
    """One line per ONNX / GGUF file an output holds (``report["formats"]``), with its check."""
    out = []
    formats = report.get("formats") or {}
    onnx = formats.get("onnx")
    if onnx:
        parity = onnx.get("parity")
        check = (
            f"max abs difference from PyTorch {parity:.1e} in {onnx.get('checked_with')}"
            if isinstance(parity, (int, float))
            else "not checked: onnxruntime is not installed"
        )
        out.append(f"wrote {onnx['file']} (opset {onnx.get('opset')}; {check})")
    gguf = formats.get("gguf")
    if gguf:
        out.append(
            f"wrote {gguf['file']} ({gguf.get('outtype')}, llama.cpp architecture {gguf.get('arch')}, "
            f"{gguf.get('bytes', 0) / 2**20:.1f} MiB)"
        )
    decilm = formats.get("decilm")
    if decilm:
        pad = decilm.get("padding") or {}
        kv = decilm.get("kv_bytes_per_token") or {}
        out.append(
            f"wrote {decilm['folder']}/ (DeciLM for vLLM: {decilm['query_heads']} query heads per layer, "
            f"{pad.get('kv_heads_written')} KV heads written, {pad.get('query_heads_added')} zero query heads and "
            f"{pad.get('kv_heads_added')} zero KV heads added, {int(pad.get('params_added') or 0):,} parameters; "
            f"KV cache {kv.get('written')} bytes per token, the cut's {kv.get('cut')}, unpruned {kv.get('unpruned')})"
        )
    if formats and "safetensors" not in formats:
        out.append("no safetensors weights written (--format leaves them out)")
    return out
