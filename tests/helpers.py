"""The tests' one shared helper module: tiny random models of every supported family, a word-level
tokenizer over their vocabulary, data files, the CLI runner and its assertions, and an independent
oracle of head removal (zeroing the output projection's input columns)."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers as T
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from typer.testing import CliRunner

import headcut
from headcut.model.masks import HeadMask

V = 99  # vocabulary size of the tiny text models
#: RoPE settings of the tiny decoders' tests (positions scaled from 16: the tiny models read 64)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
YARN_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}


def _cfg(family: str) -> Any:
    common = dict(vocab_size=V, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "bert":
        return T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **common)
    if family == "roberta":
        return T.RobertaConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **common
        )
    if family == "xlm-roberta":
        return T.XLMRobertaConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **common
        )
    if family == "electra":
        return T.ElectraConfig(
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            **common,
        )
    if family == "distilbert":
        return T.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=37, vocab_size=V, pad_token_id=0)
    if family == "albert":
        return T.AlbertConfig(
            embedding_size=16,
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=37,
            **common,
        )
    if family == "deberta-v2":
        return T.DebertaV2Config(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            max_relative_positions=16,
            position_buckets=8,
            **common,
        )
    if family == "gpt2":
        return T.GPT2Config(
            n_embd=32, n_layer=3, n_head=4, n_positions=64, vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0
        )
    if family in ("llama", "qwen2", "mistral"):
        cls = {"llama": T.LlamaConfig, "qwen2": T.Qwen2Config, "mistral": T.MistralConfig}[family]
        return cls(
            hidden_size=48,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            intermediate_size=37,
            max_position_embeddings=64,
            **common,
        )
    if family in ("qwen3", "smollm3"):
        extra = {"no_rope_layers": [1, 0, 1]} if family == "smollm3" else {"head_dim": 10}
        cls = {"qwen3": T.Qwen3Config, "smollm3": T.SmolLM3Config}[family]
        return cls(
            hidden_size=48,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            intermediate_size=37,
            max_position_embeddings=64,
            **extra,
            **common,
        )
    if family in ("gemma2", "gemma3"):
        # layer 1 attends through a sliding window of 4 (shorter than the test inputs); Gemma 2 soft-caps logits
        extra = {"attn_logit_softcapping": 5.0} if family == "gemma2" else {}
        cls = {"gemma2": T.Gemma2Config, "gemma3": T.Gemma3TextConfig}[family]
        return cls(
            hidden_size=48,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=12,
            intermediate_size=37,
            max_position_embeddings=64,
            sliding_window=4,
            query_pre_attn_scalar=10,
            layer_types=["full_attention", "sliding_attention", "full_attention"],
            **extra,
            **common,
        )
    if family == "phi3":
        return T.Phi3Config(
            hidden_size=48,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            intermediate_size=37,
            max_position_embeddings=64,
            **common,
        )
    if family == "olmo2":
        return T.Olmo2Config(
            hidden_size=48,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            intermediate_size=37,
            max_position_embeddings=64,
            **common,
        )
    if family == "gpt-neox":  # partial rotary: a quarter of each head
        return T.GPTNeoXConfig(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=64,
            rotary_pct=0.25,
            use_parallel_residual=True,
            **common,
        )
    if family == "modernbert":  # layers 0 and 2 global, 1 local with a window shorter than the inputs
        return T.ModernBertConfig(
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=64,
            global_attn_every_n_layers=2,
            local_attention=4,
            cls_token_id=1,
            sep_token_id=2,
            **common,
        )
    if family == "qwen3_5":
        # hybrid: Gated DeltaNet layers (6 value heads of 8 in 2 key heads of 10) and gated attention layers.
        # rms_norm_eps 1e-2: the DeltaNet's gated RMSNorm of its small per-head outputs otherwise amplifies
        # float rounding (outputs of projections of other widths differ in the last bit) to ~1e-5
        return T.Qwen3_5TextConfig(
            hidden_size=48,
            num_hidden_layers=4,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=8,
            intermediate_size=37,
            max_position_embeddings=64,
            linear_num_value_heads=6,
            linear_num_key_heads=2,
            linear_key_head_dim=10,
            linear_value_head_dim=8,
            rms_norm_eps=1e-2,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            **common,
        )
    if family == "gemma4":
        # sliding layers: 2 KV heads of 12; global layers (4, 6): 3 KV heads of 16, k = v (no v_proj); layers 5
        # and 6 reuse the keys and values that layers 3 and 4 store (KV sharing needs per-layer inputs)
        return T.Gemma4TextConfig(
            hidden_size=48,
            num_hidden_layers=7,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=12,
            global_head_dim=16,
            num_global_key_value_heads=3,
            attention_k_eq_v=True,
            num_kv_shared_layers=2,
            intermediate_size=37,
            max_position_embeddings=64,
            sliding_window=4,
            hidden_size_per_layer_input=16,
            vocab_size_per_layer_input=V,
            layer_types=["sliding_attention"] * 4 + ["full_attention", "sliding_attention", "full_attention"],
            **common,
        )
    if family == "bart":
        return T.BartConfig(
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            max_position_embeddings=64,
            decoder_start_token_id=2,
            forced_eos_token_id=None,
            **common,
        )
    if family == "marian":
        return T.MarianConfig(
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            max_position_embeddings=64,
            decoder_start_token_id=0,
            vocab_size=V,
            pad_token_id=0,
            eos_token_id=2,
        )
    if family == "t5":
        return T.T5Config(
            d_model=32,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
            vocab_size=V,
            pad_token_id=0,
            eos_token_id=2,
            relative_attention_num_buckets=8,
        )
    if family == "vit":
        return T.ViTConfig(
            image_size=16,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            num_channels=3,
            num_labels=3,
        )
    raise KeyError(family)


#: family -> transformers classes to test (base model and task heads as they exist)
CLASSES: dict[str, list[str]] = {
    "bert": ["BertModel", "BertForSequenceClassification", "BertForMaskedLM"],
    "roberta": ["RobertaForSequenceClassification", "RobertaForMaskedLM"],
    "xlm-roberta": ["XLMRobertaForSequenceClassification"],
    "electra": ["ElectraForSequenceClassification", "ElectraForMaskedLM"],
    "distilbert": ["DistilBertModel", "DistilBertForSequenceClassification", "DistilBertForMaskedLM"],
    "albert": ["AlbertForSequenceClassification", "AlbertForMaskedLM"],
    "deberta-v2": ["DebertaV2ForSequenceClassification", "DebertaV2ForMaskedLM"],
    "gpt2": ["GPT2LMHeadModel", "GPT2ForSequenceClassification"],
    "llama": ["LlamaForCausalLM", "LlamaForSequenceClassification"],
    "qwen2": ["Qwen2ForCausalLM"],
    "mistral": ["MistralForCausalLM"],
    "qwen3": ["Qwen3ForCausalLM", "Qwen3ForSequenceClassification"],
    "smollm3": ["SmolLM3ForCausalLM"],
    "gemma2": ["Gemma2ForCausalLM", "Gemma2ForSequenceClassification"],
    "gemma3": ["Gemma3ForCausalLM", "Gemma3TextForSequenceClassification"],
    "qwen3_5": ["Qwen3_5ForCausalLM", "Qwen3_5TextForSequenceClassification", "Qwen3_5TextModel"],
    "phi3": ["Phi3ForCausalLM", "Phi3ForSequenceClassification"],
    "olmo2": ["Olmo2ForCausalLM"],
    "gpt-neox": ["GPTNeoXForCausalLM", "GPTNeoXForSequenceClassification"],
    "modernbert": ["ModernBertModel", "ModernBertForSequenceClassification", "ModernBertForMaskedLM"],
    "bart": ["BartForConditionalGeneration", "BartForSequenceClassification"],
    "marian": ["MarianMTModel"],
    "gemma4": ["Gemma4ForCausalLM", "Gemma4TextModel"],
    "t5": ["T5ForConditionalGeneration", "T5EncoderModel"],
    "vit": ["ViTModel", "ViTForImageClassification"],
}

FAMILIES = list(CLASSES)
#: causal decoders with grouped-query attention (Llama's layout and its relatives)
GQA_DECODERS = [
    "llama",
    "qwen2",
    "mistral",
    "qwen3",
    "smollm3",
    "gemma2",
    "gemma3",
    "phi3",
    "olmo2",
    "qwen3_5",
    "gemma4",
]
#: the families ``--format decilm`` writes (tests/test_vllm.py serves each in vLLM)
DECILM_FAMILIES = ["llama", "mistral", "qwen2"]
DECODERS = ["gpt2", "gpt-neox", *GQA_DECODERS, "bart", "marian", "t5"]
#: the classes used for generation tests
GENERATORS = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "gpt-neox": "GPTNeoXForCausalLM",
    "bart": "BartForConditionalGeneration",
    "marian": "MarianMTModel",
    "t5": "T5ForConditionalGeneration",
    "qwen3_5": "Qwen3_5ForCausalLM",
    "gemma4": "Gemma4ForCausalLM",
}


def make_config(family: str, num_labels: int = 3) -> Any:
    cfg = _cfg(family)
    # large random weights: every head then moves the output by far more than the test tolerance
    for attr in ("initializer_range", "init_std"):
        if hasattr(cfg, attr):
            setattr(cfg, attr, 0.2)
    if family != "vit":
        cfg.num_labels = num_labels
    return cfg


def make_model(family: str, cls_name: str | None = None, seed: int = 0, **config: Any) -> torch.nn.Module:
    """The tiny random model of ``family``; ``config``: fields of its tiny config changed before it is built."""
    cls = getattr(T, cls_name or CLASSES[family][0])
    torch.manual_seed(seed)
    cfg = make_config(family)
    for key, value in config.items():
        setattr(cfg, key, value)
    model = cls(cfg).eval()
    # random biases make head removal visible in the output (zero-init biases hide bugs)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and p.dim() == 1:
                p.normal_(0, 0.1)
    return model


def make_inputs(
    family: str, model: torch.nn.Module, batch: int = 2, length: int = 7, seed: int = 1
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if family == "vit":
        return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}
    ids = torch.randint(3, V, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[-1, -2:] = 0  # some padding
        if family in ("gpt2", "gpt-neox") or family in GQA_DECODERS:
            mask = torch.ones(batch, length, dtype=torch.long)  # right padding changes nothing we test
    if model.config.is_encoder_decoder and type(model).__name__.endswith("ForSequenceClassification"):
        # BART-style classifiers read the hidden state at the (single) eos token of every example
        last = mask.sum(dim=1) - 1
        ids[torch.arange(batch), last] = model.config.eos_token_id
    inputs = {"input_ids": ids, "attention_mask": mask}
    if model.config.is_encoder_decoder and not type(model).__name__.endswith(
        ("EncoderModel", "ForSequenceClassification")
    ):
        inputs["decoder_input_ids"] = torch.randint(3, V, (batch, 5), generator=g)
    return inputs


def output_tensor(out: Any) -> torch.Tensor:
    """The main output of a forward (logits, or the last hidden state)."""
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if value is not None:
            return value
    return out[0]


# ---- the CLI ------------------------------------------------------------------------------------------------

runner = CliRunner()


def run(*args: Any):
    """``headcut ARGS`` in this process (typer's runner; stdout and stderr apart)."""
    from headcut.cli import app

    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result, *needles: str) -> str:
    """The command failed with one ``error: ...`` line naming every needle, and exit code 2."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    text = result.stderr.strip()
    assert len(text.splitlines()) == 1, text
    assert text.startswith("error:"), text
    for needle in needles:
        assert needle in text, text
    return text


def digest(folder: Path) -> dict[str, str]:
    """The SHA-256 of every file of a folder (to show it is unchanged)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


# ---- tokenizer and data ---------------------------------------------------------------------------------------

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]  # ids 0..4: pad 0, bos 1, eos 2 as in the tiny configs
_BASE = (
    "the a an movie film plot actor actress story scene good bad great awful fine dull fun boring love hate is was "
    "and but not very really quite so too it this that with without of in on to for by from at as be been have has "
    "had do does did will would can could should may might must i you he she we they me him her us them my your "
    "his its our their what which who when where why how all any both each few more most other some such"
).split()
WORDS = (_BASE + [f"w{i}" for i in range(V)])[: V - len(SPECIALS)]
VOCAB = {t: i for i, t in enumerate(SPECIALS + WORDS)}
assert len(VOCAB) == V


def make_tokenizer() -> Any:
    """A word-level tokenizer over the tiny models' 99 ids: [CLS] text [SEP] (pairs: token types 0/1)."""
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    return T.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        unk_token="[UNK]",
        mask_token="[MASK]",
        bos_token="[CLS]",
        eos_token="[SEP]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def save_tiny(folder: Path, family: str, cls_name: str, tokenizer: bool = True, seed: int = 0, **config: Any) -> Path:
    """A tiny checkpoint folder (random weights) with the word-level tokenizer; ``config``: fields of the tiny
    config changed before the model is built."""
    model = make_model(family, cls_name, seed=seed, **config)
    model.save_pretrained(folder)
    if tokenizer:
        make_tokenizer().save_pretrained(folder)
    return folder


def tiny_lm(root: Path, text_seed: int = 1, seed: int = 0, **config: Any) -> tuple[Path, Path]:
    """A tiny Llama causal LM (``config``: its fields changed) and a text file of 80 lines of 12 tiny-vocabulary
    words drawn with ``text_seed``: calibration data for the decoder stages' tests."""
    folder = save_tiny(root / "llama", "llama", "LlamaForCausalLM", seed=seed, **config)
    g = torch.Generator().manual_seed(text_seed)
    text = root / "text.txt"
    text.write_text("\n".join(sentence(g, 12) for _ in range(80)) + "\n")
    return folder, text


def sentence(rng: torch.Generator, n: int) -> str:
    return " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (n,), generator=rng))


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write records as csv, tsv, json (a list), jsonl or parquet, from the suffix."""
    suffix = path.suffix
    if suffix in (".csv", ".tsv"):
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if suffix == ".tsv" else ",")
            w.writeheader()
            w.writerows(rows)
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise ValueError(suffix)
    return path


def cls_rows(n: int = 20, seed: int = 0) -> list[dict[str, Any]]:
    """Labelled rows (three classes) of tiny-vocabulary sentences."""
    g = torch.Generator().manual_seed(seed)
    return [{"text": sentence(g, 3 + i % 5), "label": i % 3} for i in range(n)]


# ---- batches, forwards and reloads ---------------------------------------------------------------------------

ATOL = 1e-5


def is_base_model(name: str) -> bool:
    """A bare model class without a task head (and so without a loss)."""
    return name.endswith("Model") and not name.endswith(("LMHeadModel", "MTModel"))


def loss_class(family: str) -> str:
    """The first class of the family that has a loss."""
    return next(name for name in CLASSES[family] if not is_base_model(name))


def make_batch(
    model: torch.nn.Module, batch: int = 3, length: int = 8, seed: int = 0, pad: int = 0, dec_length: int = 5
) -> dict[str, torch.Tensor]:
    """Random inputs with right padding (example i loses i tokens) and labels for the model's task;
    ``pad`` extra padding columns (and extra ignored label columns) at the end."""
    g = torch.Generator().manual_seed(seed)
    name = type(model).__name__
    base_model = is_base_model(name)
    if "ViT" in name:
        pixels = {"pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}
        return pixels if base_model else dict(pixels, labels=torch.randint(0, 3, (batch,), generator=g))
    ids = torch.randint(3, V, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for i in range(1, batch):
        mask[i, length - i :] = 0
    ids = ids.masked_fill(mask == 0, 0)
    if model.config.is_encoder_decoder and name.endswith("ForSequenceClassification"):
        ids[torch.arange(batch), mask.sum(dim=1) - 1] = model.config.eos_token_id  # BART reads the eos state
    out: dict[str, torch.Tensor] = {}
    labels = None
    if base_model:
        pass
    elif name.endswith("ForSequenceClassification"):
        labels = torch.randint(0, 3, (batch,), generator=g)
    elif name.endswith(("ForCausalLM", "LMHeadModel")):
        labels = ids.masked_fill(mask == 0, -100)
    elif name.endswith("ForMaskedLM"):
        labels = torch.full_like(ids, -100)
        labels[:, 1:3] = ids[:, 1:3]
    else:  # seq2seq: target ids with -100 padding
        labels = torch.randint(3, V, (batch, dec_length), generator=g)
        for i in range(1, batch):
            labels[i, dec_length - i :] = -100
        labels = torch.cat([labels, torch.full((batch, pad), -100)], dim=1)
    if pad:
        ids = torch.cat([ids, torch.zeros(batch, pad, dtype=ids.dtype)], dim=1)
        mask = torch.cat([mask, torch.zeros(batch, pad, dtype=mask.dtype)], dim=1)
        if labels is not None and labels.dim() == 2 and labels.shape[1] == length:
            labels = torch.cat([labels, torch.full((batch, pad), -100)], dim=1)
    out.update(input_ids=ids, attention_mask=mask)
    if labels is not None:
        out["labels"] = labels
    return out


def forward(model, inputs):
    with torch.no_grad():
        return output_tensor(model(**inputs))


def auto_class_for(model) -> type:
    name = type(model).__name__.removeprefix("Headcut")
    for auto_name in dir(T):
        auto = getattr(T, auto_name)
        names = getattr(getattr(auto, "_model_mapping", None), "_model_mapping", None)
        if auto_name.startswith("AutoModel") and isinstance(names, dict) and names.get(model.config.model_type) == name:
            return auto
    raise AssertionError(f"no Auto class loads {name}")


def check_reload(model, inputs, expected):
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/slim"
        headcut.save(model, out)
        again = headcut.load(out)
        assert type(again).__name__.removeprefix("Headcut") == type(model).__name__.removeprefix("Headcut")
        assert torch.allclose(forward(again, inputs), expected, atol=ATOL, rtol=0)
        remote = auto_class_for(model).from_pretrained(out, trust_remote_code=True).eval()
        assert torch.allclose(forward(remote, inputs), expected, atol=ATOL, rtol=0)
        assert headcut.info(remote).total_heads == headcut.info(model).total_heads


# ---- prune units ---------------------------------------------------------------------------------------------

BERT = ("bert", "BertForSequenceClassification")
ALBERT = ("albert", "AlbertForSequenceClassification")
LLAMA = ("llama", "LlamaForSequenceClassification")

#: case -> (family and class, --gqa, a valid --keep); tiny models: bert 2x4 heads, albert 3 layers x 4
#: heads sharing one set of weights, llama 3 x 6 query heads in 2 KV groups of 3
CASES = {
    "bert": (BERT, "auto", 3),
    "albert-shared": (ALBERT, "auto", 6),
    "llama-group": (LLAMA, "group", 9),
    "llama-duplicate": (LLAMA, "duplicate", 7),
    "llama-uniform": (LLAMA, "uniform", 10),
}


def check_units(case: str, model, mask: HeadMask, result) -> None:
    if case == "albert-shared":  # one unit = the same head in every layer: sharing survives
        assert len({tuple(v) for v in mask.keep.values()}) == 1
        assert model.config.num_hidden_groups == 1 and result.slim.unshared_params == 0
    if case == "llama-group":  # whole KV groups of 3
        for kept in mask.keep.values():
            groups = {h // 3 for h in kept}
            assert sorted(kept) == [h for g in sorted(groups) for h in range(3 * g, 3 * g + 3)]
        for b in headcut.model_blocks(model):
            assert b.kv_heads * 3 == b.heads
    if case == "llama-uniform":  # every remaining group keeps the same number of query heads
        for kept in mask.keep.values():
            per_group = [sum(1 for h in kept if h // 3 == g) for g in range(2)]
            assert len({c for c in per_group if c}) <= 1


# ---- stock checkpoints, loaded where headcut cannot be imported ------------------------------------------

#: run in a fresh interpreter: headcut made unimportable, then each folder loaded by its Auto class alone
STOCK_LOADER = r"""
import json, sys
sys.modules["headcut"] = None  # `import headcut` now raises ImportError
import torch, transformers
try:
    import headcut  # noqa: F401
    raise SystemExit("headcut could be imported")
except ImportError:
    pass
out = {}
for case in json.loads(sys.argv[1]):
    auto = getattr(transformers, case["auto"])
    model = auto.from_pretrained(case["folder"]).eval()  # no trust_remote_code
    inputs = torch.load(case["inputs"])
    with torch.no_grad():
        logits = model(**inputs).logits
    expected = torch.load(case["expected"])
    out[case["folder"]] = {"class": type(model).__name__, "diff": float((logits - expected).abs().max())}
print(json.dumps(out))
"""


def load_without_headcut(cases: list[dict]) -> dict:
    """Load each case's folder in a fresh process where headcut cannot be imported (no network)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-c", STOCK_LOADER, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(cases[0]["folder"]).parent,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


#: the vLLM environment the README's test command builds (vLLM pins its own torch and transformers)
VLLM_ENV_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


def vllm_python() -> str | None:
    """The interpreter of the vLLM install the serving tests use: ``$HEADCUT_VLLM_PYTHON``, else the README
    test command's ``.venv-vllm`` at the repository root, else None (those tests skip)."""
    given = os.environ.get("HEADCUT_VLLM_PYTHON")
    if given:
        return given
    return str(VLLM_ENV_PYTHON) if VLLM_ENV_PYTHON.is_file() else None
