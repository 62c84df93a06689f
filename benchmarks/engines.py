"""The training engines side by side (``headcut.training.parallel``): DDP and FSDP over 2 processes.

Run it under ``torchrun --nproc_per_node 2 benchmarks/engines.py [--device cuda] [--width W --layers L]``.
A random Llama-architecture causal LM (no weights to download; memory and time only, no quality) is
trained for ``--steps`` steps on random tokens by headcut's Trainer, once with each engine; each process
reports its peak memory on the device (CUDA: ``torch.cuda.max_memory_allocated``; CPU: not measured), the
seconds per step, and rank 0 prints one JSON line per engine plus the largest weight difference between the
two engines' trained models (they must agree up to rounding).

With one GPU both processes share it through the gloo backend (NCCL refuses two processes on one GPU),
which is slow: the step times are not what NCCL on separate GPUs gives; the memory per process is the
point: DDP holds the whole model, its gradients and AdamW's two moments in every process (16 bytes per
fp32 parameter), FSDP one share of each.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from headcut.config import TrainConfig
from headcut.training.distributed import from_env
from headcut.training.engine import Trainer


def build(width: int, layers: int, seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=width,
        intermediate_size=width * 8 // 3 // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=width // 64,
        num_key_value_heads=width // 256,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")  # also with CUDA tensors: two processes may share one GPU
    dist = from_env()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(2 * args.steps):
        ids = torch.randint(0, 4096, (args.batch, args.seq), generator=gen)
        batches.append({"input_ids": ids, "labels": ids})
    results = {}
    for engine in ("ddp", "fsdp"):
        model = build(args.width, args.layers, 0)
        params = sum(p.numel() for p in model.parameters())
        if engine == "ddp":
            model.to(device)  # DDP trains the model where it is; FSDP keeps it in CPU memory and shards it
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        config = TrainConfig(max_steps=args.steps, lr=1e-4, checkpoint_every=None, engine=engine)
        trainer = Trainer(model, None, batches, config, dist=dist, device=device)
        start = time.perf_counter()
        try:
            trainer.train()
        except Exception as error:
            if dist.main:
                print(
                    json.dumps({"engine": engine, "error": f"{type(error).__name__}: {str(error)[:300]}"}), flush=True
                )
            continue
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
        peaks = [None] * dist.world
        torch.distributed.all_gather_object(peaks, peak)
        row = {
            "engine": trainer.engine_name,
            "processes": dist.world,
            "device": str(device),
            "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
            "parameters": params,
            "steps": args.steps,
            "seconds_per_step": seconds / args.steps,
            "peak_gib_per_process": peaks,
            "loss": [round(h["loss"], 5) for h in trainer.history],
            "torch": torch.__version__,
        }
        results[engine] = {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
        if dist.main:
            print(json.dumps(row), flush=True)
        del model, trainer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    worst = (
        max((results["ddp"][k] - results["fsdp"][k]).abs().max().item() for k in results["ddp"])
        if len(results) == 2
        else None
    )
    if dist.main:
        print(json.dumps({"max_weight_difference_ddp_fsdp": worst}), flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
