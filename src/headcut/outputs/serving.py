"""Which engines load what an output folder holds: the report's ``engines`` entry, read by the model card and the
command line.

From the checkpoint's form (:mod:`headcut.model.stock`) and the formats written (:mod:`headcut.outputs.formats`):

* a **stock** checkpoint loads in plain transformers without remote code; a stock causal LM is also what vLLM
  serves (``vllm serve OUT``; headcut's serving tests serve stock Llama and Gemma 3 cuts in vLLM's CPU build and
  compare greedy tokens with transformers');
* **headcut's form** (different head counts per layer) loads in transformers with ``trust_remote_code=True``
  (``modeling_headcut.py``) or with ``headcut.load``; no serving engine runs it;
* ``decilm/`` (``--format decilm``): vLLM serves it natively (``DeciLMForCausalLM``; its config class is the
  ``configuration_decilm.py`` headcut writes beside it, hence ``--trust-remote-code``);
* the GGUF file: llama.cpp; ``model.onnx``: onnxruntime.

Each entry: ``engine``, ``path`` (relative to the folder; ``.`` for the folder itself) and ``how`` (the call, with
``OUT`` for the folder).
"""

from __future__ import annotations

from typing import Any


def engines(report: dict[str, Any], causal_lm: bool) -> list[dict[str, str]]:
    """The engines that load the output ``report`` describes (its ``checkpoint`` and ``formats`` entries)."""
    out: list[dict[str, str]] = []
    checkpoint = report.get("checkpoint") if isinstance(report.get("checkpoint"), dict) else None
    formats = report.get("formats") if isinstance(report.get("formats"), dict) else {}
    has_weights = not formats or "safetensors" in formats
    if checkpoint is not None and has_weights:
        loader = str(checkpoint.get("loader") or "")
        if checkpoint.get("form") == "stock":
            out.append({"engine": "transformers", "path": ".", "how": loader + " (no remote code)"})
            if causal_lm:
                out.append({"engine": "vLLM", "path": ".", "how": "vllm serve OUT"})
        else:
            out.append({"engine": "transformers", "path": ".", "how": loader})
    decilm = formats.get("decilm")
    if isinstance(decilm, dict):
        folder = str(decilm.get("folder") or "decilm")
        out.append({"engine": "vLLM", "path": folder, "how": f"vllm serve OUT/{folder} --trust-remote-code"})
    gguf = formats.get("gguf")
    if isinstance(gguf, dict):
        out.append(
            {"engine": "llama.cpp", "path": str(gguf.get("file")), "how": f"llama-cli -m OUT/{gguf.get('file')}"}
        )
    onnx = formats.get("onnx")
    if isinstance(onnx, dict):
        out.append(
            {
                "engine": "onnxruntime",
                "path": str(onnx.get("file")),
                "how": f'onnxruntime.InferenceSession("OUT/{onnx.get("file")}")',
            }
        )
    return out


def not_served(report: dict[str, Any], causal_lm: bool) -> str | None:
    """For a causal LM no serving engine loads (headcut's form, no ``decilm/``): what would make it servable."""
    if not causal_lm or any(e["engine"] in ("vLLM", "llama.cpp") for e in report.get("engines") or []):
        return None
    near = report.get("uniform_budgets")
    options = []
    if near:
        options.append("--uniform (the nearest uniform budgets: " + " or ".join(f"--keep {k}" for k in near) + ")")
    else:
        options.append("--uniform")
    options.append("--format decilm (this cut, for vLLM; Llama-layout families)")
    return "no serving engine loads this cut as written: " + " or ".join(options)


__all__ = ["engines", "not_served"]
