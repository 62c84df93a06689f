"""ONNX export of slimmed tiny models: onnxruntime matches PyTorch on padded batches, and decoders
generate token by token with the exported KV cache."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from helpers import make_model  # noqa: E402

import headcut  # noqa: E402
from headcut.errors import HeadcutError  # noqa: E402
from headcut.outputs.formats import onnx as hx  # noqa: E402

# family -> (class, gqa policy, heads kept per layer): non-uniform, one layer without heads
CASES = {
    "bert": ("BertForSequenceClassification", "auto", [[], [0, 2, 3]]),
    "roberta": ("RobertaForMaskedLM", "auto", [[1], []]),
    "distilbert": ("DistilBertModel", "auto", [[0, 1, 3], []]),
    "deberta-v2": ("DebertaV2ForSequenceClassification", "auto", [[], [1, 2]]),
    "gpt2": ("GPT2LMHeadModel", "auto", [[], [0, 3], [0, 1, 2, 3]]),
    "llama": ("LlamaForCausalLM", "duplicate", [[0, 4], [], [0, 1, 2, 3, 4, 5]]),
    # the new families whose graphs differ from Llama's: fused and interleaved projections, a config view,
    # norms over all heads, local/global encoder layers
    "modernbert": ("ModernBertForSequenceClassification", "auto", [[], [0, 2, 3], [1]]),
    "gpt-neox": ("GPTNeoXForCausalLM", "auto", [[], [0, 3], [0, 1, 2, 3]]),
    "phi3": ("Phi3ForCausalLM", "duplicate", [[0, 4], [], [0, 1, 2, 3, 4, 5]]),
    "olmo2": ("Olmo2ForCausalLM", "uniform", [[1, 4], [], [0, 1, 2, 3, 4, 5]]),
}
DECODERS = ["gpt2", "llama", "gpt-neox", "phi3", "olmo2"]
TOKEN_TYPES = {"bert", "roberta"}


def slimmed(family: str) -> torch.nn.Module:
    cls, gqa, kept = CASES[family]
    model = make_model(family, cls, seed=2)
    blocks = headcut.model_blocks(model)
    headcut.slim(model, {"keep": {b.name: k for b, k in zip(blocks, kept)}}, gqa=gqa)
    assert [b.heads for b in headcut.model_blocks(model)] == [len(k) for k in kept]
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """family -> (slimmed model, folder, OnnxExport); each family exported once for the module."""
    done: dict[str, tuple] = {}

    def get(family: str) -> tuple:
        if family not in done:
            model = slimmed(family)
            folder = tmp_path_factory.mktemp(family)
            done[family] = (model, folder, hx.export_onnx(model, folder))
        return done[family]

    return get


def padded(model, batch: int, length: int, lengths: list[int], left: bool, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, model.config.vocab_size, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for i, n in enumerate(lengths):
        if left:
            mask[i, : length - n] = 0
        else:
            mask[i, n:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


def positions(mask: torch.Tensor, length: int) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)[:, -length:]


def max_diff(ref: torch.Tensor, got: np.ndarray, mask: torch.Tensor | None = None) -> float:
    assert tuple(got.shape) == tuple(ref.shape)
    diff = (ref - torch.from_numpy(got)).abs()
    if mask is not None:
        diff = diff[mask.bool()]
    return diff.max().item()


@pytest.mark.parametrize("family", list(CASES))
def test_onnxruntime_matches_torch_on_a_padded_batch(exported, family):
    model, folder, result = exported(family)
    assert result.file == "model.onnx" and (folder / "model.onnx").is_file()
    assert result.opset == hx.OPSET and result.external_data is False and result.dtype == "float32"
    assert result.parity is not None and result.parity <= hx.ONNX_TOLERANCE
    assert result.checked_with == f"onnxruntime {ort.__version__}"
    expected_in = ["input_ids", "attention_mask"] + (["token_type_ids"] if family in TOKEN_TYPES else [])
    assert result.inputs[: len(expected_in)] == expected_in
    first = {"distilbert": "last_hidden_state"}.get(family, "logits")
    assert result.outputs[0] == first
    # a batch other than the export's own check: three sequences, padded, another length
    decoder = family in DECODERS
    batch = padded(model, 3, 9, [9, 5, 2], left=decoder, seed=11)
    if family in TOKEN_TYPES:
        batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
        batch["token_type_ids"][:, 4:] = 1
    if decoder:
        batch["position_ids"] = positions(batch["attention_mask"], 9)
    with torch.no_grad():
        ref = getattr(model(**batch), first)
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {k: v.numpy() for k, v in batch.items()}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values."):
            feeds[i.name] = np.zeros((3, i.shape[1], 0, i.shape[3]), np.float32)
    assert set(feeds) == {i.name for i in session.get_inputs()}
    got = session.run([first], feeds)[0]
    assert max_diff(ref, got, batch["attention_mask"] if got.ndim == 3 else None) <= hx.ONNX_TOLERANCE


@pytest.mark.parametrize("family", DECODERS)
def test_decoder_steps_with_the_cache_match_torch(exported, family):
    model, folder, result = exported(family)
    layers = model.config.num_hidden_layers
    assert result.inputs[3:] == [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    assert result.outputs[1:] == [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    runner = hx.load_session(folder)
    assert runner.decoder
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    kv_heads = [b.kv_heads for b in headcut.model_blocks(model)]
    prompt = padded(model, 2, 6, [6, 3], left=True, seed=5)
    mask = prompt["attention_mask"]
    with torch.no_grad():
        ref = model(**prompt, position_ids=positions(mask, 6), use_cache=True)
    got = runner.run(prompt)  # position ids and empty pasts filled in by the runner
    assert max_diff(ref.logits, got["logits"], mask) <= hx.ONNX_TOLERANCE
    for step in range(3):
        total = mask.shape[1]
        for i in range(layers):  # every layer its own width; a layer without heads a 1-feature placeholder
            want = (2, kv_heads[i], total, head_dim) if kv_heads[i] else (2, 1, total, 1)
            assert got[f"present.{i}.key"].shape == got[f"present.{i}.value"].shape == want
        ids = ref.logits[:, -1:].argmax(-1)
        assert torch.equal(ids, torch.from_numpy(got["logits"][:, -1:].argmax(-1)))
        mask = torch.cat([mask, torch.ones_like(ids)], dim=1)
        with torch.no_grad():
            ref = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions(mask, 1),
                past_key_values=ref.past_key_values,
                use_cache=True,
            )
        got = runner.run({"input_ids": ids, "attention_mask": mask}, past=runner.presents(got))
        assert max_diff(ref.logits, got["logits"]) <= hx.ONNX_TOLERANCE, step
    # greedy generation in onnxruntime gives torch's tokens
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=1, pad_token_id=0)
    tokens, presents = runner.generate(prompt["input_ids"].numpy(), prompt["attention_mask"].numpy(), 4)
    assert np.array_equal(tokens, out[:, 6:].numpy())
    assert presents["present.1.key"].shape[2] == 6 + 4 - 1


def test_export_refuses_a_mismatch(tmp_path, monkeypatch):
    monkeypatch.setattr(hx, "ONNX_TOLERANCE", 1e-12)  # stricter than float32 arithmetic can be
    with pytest.raises(HeadcutError, match="does not match PyTorch: max abs difference"):
        hx.export_onnx(slimmed("distilbert"), tmp_path)


def test_external_data_half_precision_without_onnxruntime(tmp_path, monkeypatch, capfd):
    real = hx.missing_modules
    monkeypatch.setattr(hx, "missing_modules", lambda runtime=False: ["onnxruntime"] if runtime else real())
    monkeypatch.setattr(hx, "EXTERNAL_DATA_BYTES", 0)  # as if the weights were over 2 GB
    model = slimmed("distilbert").to(torch.bfloat16).train()
    result = hx.export_onnx(model, tmp_path)
    monkeypatch.undo()
    assert capfd.readouterr().out == ""
    assert result.parity is None and result.checked_with is None  # not checked without onnxruntime
    assert result.external_data and (tmp_path / "model.onnx.data").is_file() and result.dtype == "float32"
    import onnx
    from onnx.external_data_helper import uses_external_data

    graph = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph
    assert sum(uses_external_data(t) for t in graph.initializer) >= 6  # the projections at least
    assert next(model.parameters()).dtype == torch.bfloat16 and model.training  # the model is left as it was
    assert set(result.to_json()) == {
        "file",
        "opset",
        "inputs",
        "outputs",
        "external_data",
        "parity",
        "checked_with",
        "seconds",
        "dtype",
    }
    # onnxruntime reads the external weights: float32 outputs of the bfloat16 weights
    runner = hx.load_session(tmp_path)
    assert runner.dtype == "float32"
    batch = padded(model, 2, 6, [6, 2], left=False, seed=4)
    with torch.no_grad():
        ref = model.float().eval()(**batch).last_hidden_state
    assert max_diff(ref, runner.run(batch)["last_hidden_state"], batch["attention_mask"]) <= hx.ONNX_TOLERANCE


def test_missing_extra_and_unsupported_models_are_refused(tmp_path, monkeypatch):
    with pytest.raises(HeadcutError, match="encoder-decoder models .*BartForConditionalGeneration"):
        hx.export_onnx(make_model("bart", "BartForConditionalGeneration"), tmp_path)
    monkeypatch.setattr(hx, "missing_modules", lambda runtime=False: ["onnxruntime"] if runtime else ["onnxscript"])
    with pytest.raises(HeadcutError, match=r"onnx extra \(onnxscript missing\): pip install 'headcut\[onnx\]'"):
        hx.export_onnx(make_model("bert", "BertModel"), tmp_path)
    assert not (tmp_path / "model.onnx").exists()
    with pytest.raises(HeadcutError, match=r"needs onnxruntime: pip install 'headcut\[onnx\]'"):
        hx.load_session(tmp_path)


def test_runner_refuses_unknown_inputs_and_missing_cuda(exported, monkeypatch):
    _, folder, _ = exported("bert")
    runner = hx.load_session(folder)
    with pytest.raises(HeadcutError, match="takes no input 'pixel_values'"):
        runner.run({"input_ids": np.ones((1, 3), np.int64), "pixel_values": np.zeros(1)})
    out = runner.run({"input_ids": np.ones((1, 3), np.int64)})  # mask and token types filled in
    assert out["logits"].shape == (1, 3)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(HeadcutError, match="CUDAExecutionProvider"):
        hx.load_session(folder, device="cuda")
