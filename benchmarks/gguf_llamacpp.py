"""Benchmark: SmolLM2-135M (Llama, 30 layers x 9 query / 3 KV heads) exported as GGUF and run in
llama.cpp (through llama-cpp-python), against transformers on the same (slimmed) model.

Models: the unpruned checkpoint; a uniform cut (the last query head of every KV group removed in every
layer, ``--gqa uniform``: 6 query heads over 3 KV heads everywhere, llama.cpp arch ``llama``); a non-uniform cut (KV group 2 removed in odd layers, groups 1 and 2 in layers 10-14, every
head of layer 20: arch ``deci``, with one attention-free layer). Each is written as f32, f16 and q8_0.

Measured per model and type: the max abs difference of the logits at every position of a few
prompts (and whether the top-1 token agrees), the perplexity on the first ``--tokens`` tokens of
hamlet.txt in windows of ``--block`` (the transformers tokenizer's ids are fed to both, so tokenisation
does not count; whether llama.cpp's own tokenizer gives the same ids is reported separately), and
llama.cpp's speed: prompt tokens/s (one ``--block`` batch) and generation tokens/s (``--gen`` single-token
decodes after it; best of ``--repeat``). The f32 file runs with an f32 KV cache (an exactness check); f16 and q8_0 run with
llama.cpp's default f16 KV cache.

    python -m benchmarks.gguf_llamacpp [--tokens 2048] [--block 512] [--gen 64] [--threads 2] [--repeat 3] [--json PATH]

With ``--folder DIR`` (repeatable) it measures headcut outputs instead of its own cuts: each folder's
safetensors model (transformers, through ``headcut.load``) against the ``*.gguf`` file beside it, as
``headcut prune/export ... --format safetensors,gguf`` writes them, with the folder's own tokenizer (any
family the GGUF writer knows: e.g. Gemma 3 270M, written as llama.cpp's ``gemma3`` with its SentencePiece
tokenizer).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

import headcut
import headcut_offline as offline
from headcut.model.saving import copy_side_files
from headcut.outputs.formats.gguf import export_gguf

PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWhat is 17 times 3?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer",
]
TYPES = ("f32", "f16", "q8_0")


def masks(blocks) -> dict[str, tuple[dict | None, str]]:
    """name -> (mask, --gqa policy)."""
    uniform = {"drop": {b.name: [2, 5, 8] for b in blocks}}
    drop: dict[str, list[int]] = {}
    for b in blocks:
        if b.layer == 20:
            drop[b.name] = list(range(9))
        elif 10 <= b.layer <= 14:
            drop[b.name] = [3, 4, 5, 6, 7, 8]
        elif b.layer % 2 == 1:
            drop[b.name] = [6, 7, 8]
    return {"unpruned": (None, "auto"), "uniform": (uniform, "uniform"), "nonuniform": ({"drop": drop}, "group")}


def hf_nll(model, ids: list[int], block: int) -> tuple[float, int]:
    nll, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(ids) - 1, block):
            chunk = torch.tensor([ids[start : start + block]])
            if chunk.shape[1] < 2:
                break
            n = chunk.shape[1] - 1
            nll += model(input_ids=chunk, labels=chunk).loss.item() * n
            count += n
    return nll, count


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def cpp_nll(llm, ids: list[int], block: int) -> tuple[float, int]:
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, block):
        chunk = ids[start : start + block]
        if len(chunk) < 2:
            break
        llm.reset()
        llm.eval(chunk)
        lp = log_softmax(np.asarray(llm.scores[: len(chunk) - 1]))
        nll -= lp[np.arange(len(chunk) - 1), chunk[1:]].sum()
        count += len(chunk) - 1
    return nll, count


def prompt_logits_hf(model, prompts: list[list[int]]) -> list[np.ndarray]:
    with torch.inference_mode():
        return [model(input_ids=torch.tensor([p])).logits[0].float().numpy() for p in prompts]


def prompt_logits_cpp(llm, prompts: list[list[int]]) -> list[np.ndarray]:
    out = []
    for p in prompts:
        llm.reset()
        llm.eval(p)
        out.append(np.array(llm.scores[: len(p)]))
    return out


def speed(path: Path, ids: list[int], block: int, gen: int, threads: int, repeat: int) -> dict[str, float]:
    """Prompt and generation tokens/s, the best of ``repeat`` runs (the machine is shared)."""
    from llama_cpp import Llama

    llm = Llama(
        str(path), n_ctx=block + gen + 8, n_batch=block, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    prompt = ids[:block]
    llm.eval(prompt[:16])  # warm-up
    t_prompt = t_gen = math.inf
    for _ in range(repeat):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t_prompt = min(t_prompt, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for tok in ids[block : block + gen]:
            llm.eval([tok])
        t_gen = min(t_gen, time.perf_counter() - t0)
    llm.close()
    return {"prompt_tok_s": round(block / t_prompt, 1), "gen_tok_s": round(gen / t_gen, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="speed: best of this many runs")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--out", default=None, help="keep the exported folders here")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--folder",
        action="append",
        default=[],
        help="a headcut output with safetensors and .gguf files (repeatable): measure it, not the built-in cuts",
    )
    args = ap.parse_args()
    from llama_cpp import Llama

    torch.set_num_threads(args.threads)
    types = [t for t in args.types.split(",") if t]
    text = offline.hamlet_path().read_text()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gguf-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    report: dict = {"block": args.block, "threads": args.threads, "models": {}}
    if args.folder:  # each folder with its own tokenizer (any family the GGUF writer knows)
        cases = {Path(f).name: (Path(f), None) for f in args.folder}
    else:
        src = offline.smollm_dir()
        cases = {label: (src, cut) for label, cut in masks(headcut.model_blocks(headcut.load(src))).items()}
    checked: set[Path] = set()  # sources whose tokenizer llama.cpp was compared with
    for label, (path_in, cut) in cases.items():
        tok = transformers.AutoTokenizer.from_pretrained(path_in)
        all_ids = tok(text)["input_ids"]
        ids = all_ids[: args.tokens]
        prompts = [tok(p)["input_ids"] for p in PROMPTS]
        report["tokens"] = len(ids)
        tokenizer_checked = path_in in checked
        checked.add(path_in)
        model = headcut.load(path_in)
        if cut is not None and cut[0] is not None:
            headcut.slim(model, cut[0], gqa=cut[1])
        info = {
            "heads": sum(b.heads for b in headcut.model_blocks(model)),
            "kv_heads": sum(b.kv_heads for b in headcut.model_blocks(model)),
            "params": headcut.count_params(model),
        }
        t0 = time.perf_counter()
        nll, count = hf_nll(model, ids, args.block)
        info["hf_ppl"] = round(math.exp(nll / count), 4)
        info["hf_ppl_seconds"] = round(time.perf_counter() - t0, 2)
        ref = prompt_logits_hf(model, prompts)
        info["types"] = {}
        if cut is None:  # a headcut output: its own GGUF files, as written by --format gguf
            report_file = json.loads((path_in / "headcut-report.json").read_text())
            written = report_file.get("formats", {}).get("gguf")
            if not written:
                raise SystemExit(f"{path_in}: no GGUF in its report (write it with --format safetensors,gguf)")
            files = [(written["outtype"], path_in / written["file"], written)]
        else:
            folder = root / label
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            model.config.save_pretrained(folder)
            copy_side_files(src, folder)
            files = [(t, None, None) for t in types]
        for outtype, path, written in files:
            if path is None:
                exported = export_gguf(model, folder, outtype=outtype)
                path = folder / exported.file
                written = exported.to_json()
            kv = {"type_k": 0, "type_v": 0} if outtype == "f32" else {}
            llm = Llama(
                str(path),
                logits_all=True,
                n_ctx=max(args.block, 256),
                n_batch=args.block,
                n_threads=args.threads,
                n_threads_batch=args.threads,
                verbose=False,
                **kv,
            )
            if not tokenizer_checked:
                own = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
                same = own == all_ids
                first = next(
                    (i for i, (a, b) in enumerate(zip(own, all_ids)) if a != b),
                    None if len(own) == len(all_ids) else min(len(own), len(all_ids)),
                )
                chat = [llm.tokenize(p.encode("utf-8"), add_bos=True, special=True) for p in PROMPTS] == prompts
                report["llamacpp_tokenizer_same_ids"] = report.get("llamacpp_tokenizer_same_ids", True) and same
                report.setdefault("llamacpp_tokenizer_first_mismatch", first)
                report["llamacpp_tokenizer_prompts_same_ids"] = (
                    report.get("llamacpp_tokenizer_prompts_same_ids", True) and chat
                )
                info["llamacpp_tokenizer"] = {"same_ids": same, "first_mismatch": first, "prompts_same_ids": chat}
                tokenizer_checked = True
            got = prompt_logits_cpp(llm, prompts)
            diff = max(float(np.abs(g - r).max()) for g, r in zip(got, ref))
            scale = max(float(np.abs(r).max()) for r in ref)
            top1 = float(np.mean(np.concatenate([g.argmax(-1) == r.argmax(-1) for g, r in zip(got, ref)])))
            t0 = time.perf_counter()
            c_nll, c_count = cpp_nll(llm, ids, args.block)
            llm.close()
            entry = {
                "arch": written["arch"],
                "bytes": written["bytes"],
                "export_seconds": round(written["seconds"], 2),
                "kv_cache": "f32" if outtype == "f32" else "f16",
                "max_abs_logit_diff": diff,
                "rel_logit_diff": diff / scale,
                "top1_agree": top1,
                "llamacpp_ppl": round(math.exp(c_nll / c_count), 4),
                "ppl_seconds": round(time.perf_counter() - t0, 2),
                **speed(path, all_ids, args.block, args.gen, args.threads, args.repeat),
            }
            if written.get("notes"):
                entry["notes"] = written["notes"]
            info["types"][outtype] = entry
            info["head_count"] = written["head_count"]
            info["head_count_kv"] = written["head_count_kv"]
            print(label, outtype, json.dumps(entry), flush=True)
        report["models"][label] = info
        del model
    print()
    print(
        f"{'model':<11} {'type':<5} {'arch':<6} {'heads':>5} {'MiB':>6} {'max|dlogit|':>11} {'top1':>5} "
        f"{'ppl hf':>8} {'ppl cpp':>8} {'pp tok/s':>9} {'tg tok/s':>9}"
    )
    for label, info in report["models"].items():
        for outtype, e in info["types"].items():
            print(
                f"{label:<11} {outtype:<5} {e['arch']:<6} {info['heads']:>5} {e['bytes'] / 2**20:>6.1f} "
                f"{e['max_abs_logit_diff']:>11.2e} {e['top1_agree']:>5.3f} {info['hf_ppl']:>8.3f} "
                f"{e['llamacpp_ppl']:>8.3f} {e['prompt_tok_s']:>9.1f} {e['gen_tok_s']:>9.1f}"
            )
    print(
        f"llama.cpp's own tokenizer gives transformers' ids: hamlet {report['llamacpp_tokenizer_same_ids']} "
        f"(first mismatch {report['llamacpp_tokenizer_first_mismatch']}), prompts "
        f"{report['llamacpp_tokenizer_prompts_same_ids']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if not args.out:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
