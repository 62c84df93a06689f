"""Peak memory and time of ``headcut prune --layerwise`` against depth, on synthetic Llama-architecture checkpoints.

Each model is a Llama config (SmolLM2's tokenizer and vocabulary, tied embeddings) whose weights are random
bf16 values (normal, std 0.02; norms 1) written as safetensors shards of at most 1 GB, tensor by tensor, so
that making a model never holds it whole. Random weights say nothing about quality: these runs measure memory
and time only. Each prune runs in its own process (``python -m headcut prune ... --layerwise --method
fluctuation``, calibration: 16 blocks of 128 tokens of the first half of hamlet.txt, batch 4) and its peak
resident memory is the report's ``layerwise.peak_rss_bytes`` (``getrusage``: the process's own high-water
mark, everything included: Python, torch, tokenizer, activations, one layer).

    python -m benchmarks.studies.layerwise_memory --models depth-8,depth-16,depth-24,depth-48   # same width, four depths
    python -m benchmarks.studies.layerwise_memory --models llama-3b              # a 3B-class model (about 6.4 GB)

Results: ``benchmarks/results/layerwise_memory.json`` (one row per model, kept across runs).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

BENCHMARKS = Path(__file__).resolve().parent.parent  # this file also runs as a script, in its --build children
RESULTS = BENCHMARKS / "results" / "layerwise_memory.json"
sys.path.insert(0, str(BENCHMARKS.parent / "src"))
sys.path.insert(0, str(BENCHMARKS.parent))  # headcut_offline, at the repository's root (no part of headcut)

#: name -> Llama config fields (width 2048 for the depth pair: TinyLlama's shape; llama-3b: Llama 3.2 3B's shape
#: with SmolLM2's vocabulary)
MODELS: dict[str, dict[str, int]] = {
    "depth-8": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "num_hidden_layers": 8,
    },
    "depth-24": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "num_hidden_layers": 24,
    },
    "depth-16": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "num_hidden_layers": 16,
    },
    "depth-48": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "num_hidden_layers": 48,
    },
    "llama-3b": {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "num_hidden_layers": 28,
    },
}
SHARD = 1_000_000_000


def build(folder: Path, fields: dict[str, int], tokenizer_dir: Path, seed: int = 0) -> int:
    """Write a random bf16 checkpoint of ``fields`` into ``folder`` (shards of at most 1 GB); returns its bytes."""
    import transformers
    from safetensors.torch import save_file

    from headcut.model.streamed import params_on_meta

    config = transformers.LlamaConfig(
        vocab_size=49152,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        bos_token_id=1,
        eos_token_id=2,
        **fields,
    )
    config.dtype = "bfloat16"
    config.architectures = ["LlamaForCausalLM"]
    with params_on_meta():
        model = transformers.LlamaForCausalLM(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    folder.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    files: list[tuple[str, list[str]]] = []
    pending: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            name = f"part-{len(files):05d}"
            save_file(pending, str(folder / name), metadata={"format": "pt"})
            files.append((name, list(pending)))
            pending, size = {}, 0

    for key, shape in shapes.items():
        if key.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        nbytes = t.numel() * 2
        if pending and size + nbytes > SHARD:
            flush()
        pending[key] = t
        size += nbytes
        total += nbytes
    flush()
    weight_map = {}
    for i, (name, keys) in enumerate(files):
        final = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        (folder / name).rename(folder / final)
        weight_map.update({k: final for k in keys})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    config.save_pretrained(folder)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, folder / f.name)
    return total


def machine() -> dict[str, Any]:
    import os

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
    }


def run(name: str, work: Path, calibration: Path) -> dict[str, Any]:
    fields = MODELS[name]
    folder = work / name
    start = time.perf_counter()
    # built in a process of its own: this one stays small while headcut runs
    subprocess.run([sys.executable, __file__, "--build", name, "--work", str(work)], check=True)
    size = int(
        (folder / "model.safetensors.index.json").exists()
        and json.loads((folder / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    )
    built = time.perf_counter() - start
    out = work / f"{name}-cut"
    groups = fields["num_hidden_layers"] * fields["num_key_value_heads"]
    size_group = fields["num_attention_heads"] // fields["num_key_value_heads"]
    keep = (groups - groups // 4) * size_group  # a quarter of the KV groups removed
    cmd = [
        sys.executable,
        "-m",
        "headcut",
        "prune",
        str(folder),
        "--layerwise",
        "--method",
        "fluctuation",
        "--keep",
        str(keep),
        "--gqa",
        "group",
        "--data",
        str(calibration),
        "--seq-len",
        "128",
        "--max-examples",
        "16",
        "--batch-size",
        "4",
        "--out",
        str(out),
        "--json",
        "-",
        "--quiet",
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name}: headcut failed\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    layerwise = report["layerwise"]
    written = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    row = {
        "model": name,
        **fields,
        "checkpoint_bytes": size,
        "build_seconds": round(built, 1),
        "keep": keep,
        "heads_before": report["heads"]["before"],
        "heads_after": report["heads"]["after"],
        "prune_wall_seconds": round(wall, 1),
        "score_seconds": layerwise["score_seconds"],
        "write_seconds": layerwise["write_seconds"],
        "peak_rss_bytes": layerwise["peak_rss_bytes"],
        "peak_fraction_of_checkpoint": round(layerwise["peak_rss_bytes"] / size, 3),
        "largest_layer_bytes": layerwise["largest_layer_bytes"],
        "activations": layerwise["activations"],
        "activation_bytes": layerwise["activation_bytes"],
        "written_bytes": written,
        "shards": layerwise["shards"],
        "form": report["checkpoint"]["form"],
        "command": " ".join(cmd[1:]).replace(str(work), "WORK"),
        "machine": machine(),
    }
    shutil.rmtree(folder)
    shutil.rmtree(out)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="depth-8,depth-24", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--work", default=None, help="folder for the checkpoints (default: a temporary folder)")
    parser.add_argument("--build", default=None, help=argparse.SUPPRESS)  # one checkpoint into --work, and stop
    args = parser.parse_args()
    import headcut_offline as offline

    if args.build:
        build(Path(args.work) / args.build, MODELS[args.build], offline.smollm_dir())
        return

    rows = json.loads(RESULTS.read_text())["rows"] if RESULTS.exists() else []
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        text = offline.hamlet_path().read_text()
        calibration = work / "hamlet-a.txt"
        calibration.write_text(text[: len(text) // 2])
        for name in args.models.split(","):
            row = run(name, work, calibration)
            rows = [r for r in rows if r["model"] != name] + [row]
            RESULTS.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
            print(
                f"{name}: {row['checkpoint_bytes'] / 1e9:.2f} GB, peak {row['peak_rss_bytes'] / 1e9:.2f} GB "
                f"({row['peak_fraction_of_checkpoint']:.2f} of it), {row['prune_wall_seconds']:.0f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
