"""Synthetic model inputs for ``headcut bench`` and the stock-checkpoint check.

Inputs are synthetic and reproducible from ``seed``: token ids drawn uniformly from the vocabulary
without the special tokens (pad, bos, eos, decoder start) and a full attention mask; encoder-decoder
inputs end with the eos token and get ``seq_len`` decoder ids starting with the decoder start token;
image models get ``pixel_values`` of ``(batch_size, num_channels, image_size, image_size)`` from the
config, drawn from a standard normal distribution.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from ..config import BenchConfig
from ..errors import HeadcutError


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def special_ids(model: nn.Module) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    sources = [model.config.get_text_config(), getattr(model, "generation_config", None)]
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        ids: list[int] = []
        for src in sources:
            if src is not None:
                ids += [i for i in _ids(getattr(src, key, None)) if i not in ids]
        out[key] = ids
    return out


def _forward_accepts(model: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def make_inputs(model: nn.Module, config: BenchConfig) -> dict[str, torch.Tensor]:
    """Synthetic inputs for one forward, reproducible from ``config.seed`` (see the module docstring)."""
    g = torch.Generator().manual_seed(config.seed)
    device = torch.device(config.device)
    cfg = model.config
    b, n = config.batch_size, config.seq_len
    main = getattr(model, "main_input_name", "input_ids")
    if main == "pixel_values":
        size = getattr(cfg, "image_size", None)
        if size is None:
            raise HeadcutError(f"{type(model).__name__} takes images but its config has no image_size")
        h, w = (size, size) if isinstance(size, int) else tuple(size)[-2:]
        channels = int(getattr(cfg, "num_channels", 3))
        dtype = next(model.parameters()).dtype
        return {"pixel_values": torch.randn(b, channels, h, w, generator=g).to(device=device, dtype=dtype)}
    if main != "input_ids":
        raise HeadcutError(f"headcut bench makes token or image inputs; {type(model).__name__} takes {main!r}")
    embeddings = model.get_input_embeddings()
    vocab = int(getattr(embeddings, "num_embeddings", 0) or cfg.get_text_config().vocab_size)
    special = special_ids(model)
    banned = {i for ids in special.values() for i in ids}
    allowed = torch.tensor([i for i in range(vocab) if i not in banned] or list(range(vocab)))
    ids = allowed[torch.randint(len(allowed), (b, n), generator=g)]
    encoder_decoder = bool(getattr(cfg, "is_encoder_decoder", False))
    if encoder_decoder and special["eos_token_id"]:
        ids[:, -1] = special["eos_token_id"][0]
    inputs = {"input_ids": ids, "attention_mask": torch.ones(b, n, dtype=torch.long)}
    if encoder_decoder and _forward_accepts(model, "decoder_input_ids"):
        dec = allowed[torch.randint(len(allowed), (b, n), generator=g)]
        if special["decoder_start_token_id"]:
            dec[:, 0] = special["decoder_start_token_id"][0]
        inputs["decoder_input_ids"] = dec
    return {k: v.to(device) for k, v in inputs.items()}


def check_positions(model: nn.Module, config: BenchConfig, generates: bool) -> None:
    text = model.config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if not isinstance(limit, int) or getattr(model, "main_input_name", "input_ids") != "input_ids":
        return
    if config.seq_len > limit:
        raise HeadcutError(f"--seq-len {config.seq_len} is longer than the model's {limit} positions")
    if not (generates and config.gen_tokens):
        return
    if getattr(model.config, "is_encoder_decoder", False):
        if config.gen_tokens + 1 > limit:  # the decoder starts from its start token
            raise HeadcutError(f"--gen-tokens {config.gen_tokens} is longer than the model's {limit} positions")
    elif config.seq_len + config.gen_tokens > limit:
        raise HeadcutError(
            f"--seq-len {config.seq_len} plus --gen-tokens {config.gen_tokens} is longer than the model's "
            f"{limit} positions"
        )


def describe_inputs(inputs: dict[str, torch.Tensor]) -> str:
    return ", ".join(f"{k} {tuple(v.shape)}" for k, v in inputs.items())
