"""Tiny random models of every supported family, for fast tests."""

from __future__ import annotations

from typing import Any

import torch
import transformers as T

V = 99  # vocabulary size of the tiny text models


def _cfg(family: str) -> Any:
    common = dict(vocab_size=V, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "bert":
        return T.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **common)
    if family == "roberta":
        return T.RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **common)
    if family == "xlm-roberta":
        return T.XLMRobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **common)
    if family == "electra":
        return T.ElectraConfig(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **common)
    if family == "distilbert":
        return T.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=37, vocab_size=V, pad_token_id=0)
    if family == "albert":
        return T.AlbertConfig(embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37, **common)
    if family == "deberta-v2":
        return T.DebertaV2Config(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, relative_attention=True,
            pos_att_type=["p2c", "c2p"], max_relative_positions=16, position_buckets=8, **common,
        )
    if family == "gpt2":
        return T.GPT2Config(n_embd=32, n_layer=3, n_head=4, n_positions=64, vocab_size=V, bos_token_id=1, eos_token_id=2,
                            pad_token_id=0)
    if family in ("llama", "qwen2", "mistral"):
        cls = {"llama": T.LlamaConfig, "qwen2": T.Qwen2Config, "mistral": T.MistralConfig}[family]
        return cls(hidden_size=48, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, intermediate_size=37,
                   max_position_embeddings=64, **common)
    if family == "bart":
        return T.BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                            encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64, decoder_start_token_id=2,
                            forced_eos_token_id=None, **common)
    if family == "marian":
        return T.MarianConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                              encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64, decoder_start_token_id=0,
                              vocab_size=V, pad_token_id=0, eos_token_id=2)
    if family == "t5":
        return T.T5Config(d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, decoder_start_token_id=0, vocab_size=V,
                          pad_token_id=0, eos_token_id=2, relative_attention_num_buckets=8)
    if family == "vit":
        return T.ViTConfig(image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=37, num_channels=3, num_labels=3)
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
    "bart": ["BartForConditionalGeneration", "BartForSequenceClassification"],
    "marian": ["MarianMTModel"],
    "t5": ["T5ForConditionalGeneration", "T5EncoderModel"],
    "vit": ["ViTModel", "ViTForImageClassification"],
}

FAMILIES = list(CLASSES)
DECODERS = ["gpt2", "llama", "qwen2", "mistral", "bart", "marian", "t5"]
#: the classes used for generation tests
GENERATORS = {
    "gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM", "bart": "BartForConditionalGeneration", "marian": "MarianMTModel",
    "t5": "T5ForConditionalGeneration",
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


def make_model(family: str, cls_name: str | None = None, seed: int = 0) -> torch.nn.Module:
    cls = getattr(T, cls_name or CLASSES[family][0])
    torch.manual_seed(seed)
    model = cls(make_config(family)).eval()
    # random biases make head removal visible in the output (zero-init biases hide bugs)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and p.dim() == 1:
                p.normal_(0, 0.1)
    return model


def make_inputs(family: str, model: torch.nn.Module, batch: int = 2, length: int = 7, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if family == "vit":
        return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}
    ids = torch.randint(3, V, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[-1, -2:] = 0  # some padding
        if family in ("gpt2", "llama", "qwen2", "mistral"):
            mask = torch.ones(batch, length, dtype=torch.long)  # right padding changes nothing we test
    if model.config.is_encoder_decoder and type(model).__name__.endswith("ForSequenceClassification"):
        # BART-style classifiers read the hidden state at the (single) eos token of every example
        last = mask.sum(dim=1) - 1
        ids[torch.arange(batch), last] = model.config.eos_token_id
    inputs = {"input_ids": ids, "attention_mask": mask}
    if model.config.is_encoder_decoder and not type(model).__name__.endswith(("EncoderModel", "ForSequenceClassification")):
        inputs["decoder_input_ids"] = torch.randint(3, V, (batch, 5), generator=g)
    return inputs


def output_tensor(out: Any) -> torch.Tensor:
    """The main output of a forward (logits, or the last hidden state)."""
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if value is not None:
            return value
    return out[0]
