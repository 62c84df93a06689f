"""GGUF export (headcut.outputs.formats.gguf): files read back with gguf-py, refusals, and (when llama-cpp-python
is installed) tiny slimmed models run in llama.cpp against torch."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import transformers as T
from helpers import WORDS, make_model, make_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

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
    args = dict(hidden_size=96, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2, intermediate_size=64,
                max_position_embeddings=128, vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                initializer_range=0.2, tie_word_embeddings=family == "llama")
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
    trainer = trainers.BpeTrainer(vocab_size=TOKENS, special_tokens=["<|endoftext|>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    g = torch.Generator().manual_seed(0)
    tok.train_from_iterator([" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (12,), generator=g))
                             for _ in range(200)], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<|endoftext|>",
                                     unk_token="<|endoftext|>")
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
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(int(n) for n in reversed(t.shape)))
            for t in reader.tensors}


def unrope(rows: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """Undo the rotary row order of the file (pairs side by side) back to transformers' (half-split)."""
    half = head_dim // 2
    perm = (np.arange(heads)[:, None] * head_dim
            + np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)[None, :]).reshape(-1)
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


def test_llama3_rope_is_written_as_frequency_factors(tmp_path, tokenizer_dir):
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
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


# ---- llama.cpp ---------------------------------------------------------------------------------------

def llama_cpp_logits(path, ids: list[int], f32_cache: bool, prompt: int | None = None) -> np.ndarray:
    """llama.cpp's logits at every position: one batch, or ``prompt`` tokens then one token at a time
    (through the KV cache)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    kv = {"type_k": 0, "type_v": 0} if f32_cache else {}
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=64, n_threads=1, n_threads_batch=1, verbose=False, **kv)
    try:
        llm.eval(ids[:prompt])
        for tok in ids[len(ids[:prompt]):]:
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


@pytest.mark.parametrize("family,cut", [("llama", "group"), ("llama", "empty-layer-0"), ("qwen2", "uniform"),
                                        ("mistral", "duplicate")])
def test_llama_cpp_runs_the_slimmed_model(family, cut, tmp_path, tokenizer_dir):
    """llama.cpp gives torch's logits: f32 file and KV cache within 1e-4 of the largest logit; f16 file
    (float16 weights, activations and KV cache) within 3e-2 (observed up to 1.5e-2 with these large random weights)."""
    pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python")
    mask, gqa = CUTS[cut]
    model = tiny_lm(family)
    headcut.slim(model, mask, gqa=gqa)
    folder = staged(tmp_path, tokenizer_dir, model)
    text = "the movie was really good and the actor was fine but the plot was awful"
    ids = bpe_tokenizer()(text)["input_ids"]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    scale = np.abs(ref).max()
    for outtype, f32_cache, tol in (("f32", True, 1e-4), ("f16", False, 3e-2)):
        path = folder / export_gguf(model, folder, outtype=outtype).file
        for prompt in (None, 5) if outtype == "f32" else (None,):  # f32: also decoding through the KV cache
            got = llama_cpp_logits(path, ids, f32_cache, prompt)
            assert np.abs(got - ref).max() <= tol * scale, (outtype, prompt, np.abs(got - ref).max() / scale)


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
    assert [model.model.layers[i].self_attn.q_proj.out_features // 16 for i in range(4)] == entry["head_count"] \
        == [3, 0, 3, 6]

