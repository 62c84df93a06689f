"""Layer-wise pruning (``prune --layerwise``): scores equal the whole-model scorer's, the written model equals
the gated model and reloads like any other, bf16 stays bf16, shards and spilled activations, the automatic
choice under ``max_memory``, and the refusals."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import digest, make_inputs, make_model, make_tokenizer, one_line_error, run, sentence, write_rows

import headcut
from headcut.config import ScoreConfig
from headcut.devices import parse_size
from headcut.errors import HeadcutError
from headcut.model.gating import gated
from headcut.model.streamed import LayerwiseStats, StreamedModel
from headcut.model.streamed_cut import write_layerwise
from headcut.model.tensor_files import Checkpoint
from headcut.scoring import score
from headcut.scoring.layerwise import MAP_SCORERS, score_layerwise

#: (family, class): decoders with and without GQA, GPT-2's Conv1D, a hybrid linear-attention stack, an encoder
CASES = [
    ("llama", "LlamaForCausalLM"),
    ("gemma3", "Gemma3ForCausalLM"),
    ("gpt2", "GPT2LMHeadModel"),
    ("qwen3_5", "Qwen3_5ForCausalLM"),
    ("gpt-neox", "GPTNeoXForCausalLM"),
    ("bert", "BertForMaskedLM"),
]


def _checkpoint(tmp_path, family, cls, dtype=torch.float32, shard="40KB"):
    model = make_model(family, cls).to(dtype)
    src = tmp_path / "src"
    model.save_pretrained(src, max_shard_size=shard)
    make_tokenizer().save_pretrained(src)
    rng = torch.Generator().manual_seed(0)
    text = tmp_path / "cal.txt"
    text.write_text("\n".join(sentence(rng, 12) for _ in range(60)))
    return model, src, text


def _batches(family, model):
    out = []
    for seed in range(3):
        batch = make_inputs(family, model, batch=2, length=7, seed=seed)
        if "attention_mask" in batch:
            batch["attention_mask"][1, -2:] = 0  # padding: only real tokens count
        out.append(batch)
    return out


@pytest.mark.parametrize("family,cls", CASES)
@pytest.mark.parametrize("scorer", ["fluctuation", "entropy", "confidence", "magnitude"])
def test_layerwise_scores_equal_the_whole_model_scores(tmp_path, family, cls, scorer):
    model, src, _ = _checkpoint(tmp_path, family, cls)
    batches = _batches(family, model)
    config = ScoreConfig(scorer=scorer)
    streamed = StreamedModel.open(src, model.config, type(model))
    if scorer in MAP_SCORERS and any(b.mixer != "attention" for b in streamed.blocks):
        for run_it in (
            lambda: score(model, batches, config),
            lambda: score_layerwise(streamed, batches, config, LayerwiseStats(), None),
        ):
            with pytest.raises(HeadcutError, match="linear attention without any"):  # no softmax maps there
                run_it()
        return
    whole = score(model, batches, config)
    assert len(Checkpoint(src).where) and len({p.name for p in src.glob("*.safetensors")}) > 1  # sharded
    spill = tmp_path / "spill"
    spill.mkdir()
    got = score_layerwise(streamed, batches, config, LayerwiseStats(), spill)
    assert list(got.blocks) == list(whole.blocks)
    for name in whole.blocks:
        assert got.blocks[name] == pytest.approx(whole.blocks[name], abs=1e-9, rel=1e-9), name
    assert got.kv_groups == pytest.approx(whole.kv_groups) if scorer == "magnitude" else True
    assert not list(spill.iterdir())  # spilled activations are removed as the layers go
    assert all(p.device.type == "meta" for p in streamed.model.parameters())  # nothing stays loaded


@pytest.mark.parametrize("family,cls", CASES)
def test_layerwise_output_is_the_gated_model_and_reloads(tmp_path, family, cls):
    model, src, text = _checkpoint(tmp_path, family, cls)
    before = digest(src)
    options = {"seq_len": 16, "max_examples": 12, "batch_size": 4}
    pruned = headcut.prune(
        src, "fluctuation", keep=6, data=text, data_options=options, layerwise=True, out=tmp_path / "out"
    )
    whole = headcut.prune(src, "fluctuation", keep=6, data=text, data_options=options, out=tmp_path / "whole")
    assert pruned.mask.to_json() == whole.mask.to_json()
    assert digest(src) == before
    report = json.loads((tmp_path / "out" / "headcut-report.json").read_text())
    assert report["layerwise"]["path"] == "layerwise" and report["layerwise"]["reason"] == "asked for"
    assert report["layerwise"]["layers"] == len(pruned.report["heads"]["per_block_before"])
    assert report["layerwise"]["peak_rss_bytes"] > 0 and report["heads"]["after"] == 6
    assert all(p.device.type == "meta" for p in pruned.model.parameters())
    reloaded = headcut.load(tmp_path / "out")
    inputs = make_inputs(family, model, batch=2, length=9, seed=5)
    with torch.no_grad(), gated(model, pruned.mask):
        expected = model(**inputs).logits
    with torch.no_grad():
        got = reloaded(**inputs).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert {k: v.shape for k, v in reloaded.state_dict().items()} == {
        k: v.shape for k, v in headcut.load(tmp_path / "whole").state_dict().items()
    }


def test_bf16_shards_stay_bf16_and_a_uniform_cut_is_stock(tmp_path):
    model, src, text = _checkpoint(tmp_path, "llama", "LlamaForCausalLM", torch.bfloat16)
    pruned = headcut.prune(
        src,
        "fluctuation",
        keep=9,
        uniform=True,
        data=text,
        layerwise=True,
        data_options={"seq_len": 16, "max_examples": 8, "batch_size": 4},
        out=tmp_path / "out",
    )
    assert pruned.report["checkpoint"]["form"] == "stock"
    import transformers

    stock = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert stock.dtype == torch.bfloat16 and stock.config.num_key_value_heads * 3 == stock.config.num_attention_heads
    whole = headcut.prune(
        src,
        "fluctuation",
        keep=9,
        uniform=True,
        data=text,
        out=tmp_path / "whole",
        data_options={"seq_len": 16, "max_examples": 8, "batch_size": 4},
    )
    assert whole.mask.to_json() == pruned.mask.to_json()  # bf16 activations, float64 statistics: the same cut
    inputs = make_inputs("llama", model, batch=1, length=6, seed=2)
    with torch.no_grad():  # the same bf16 tensors, sliced the same way: bit for bit
        assert torch.equal(stock(**inputs).logits, headcut.load(tmp_path / "whole")(**inputs).logits)
    assert {k: v.dtype for k, v in stock.state_dict().items()} == {k: torch.bfloat16 for k in stock.state_dict()}


def test_writer_shards_and_indexes(tmp_path):
    model, src, _ = _checkpoint(tmp_path, "llama", "LlamaForCausalLM")
    streamed = StreamedModel.open(src, model.config, type(model))
    out = tmp_path / "w"
    out.mkdir()
    stats = LayerwiseStats()
    write_layerwise(streamed, {}, out, stats, shard_bytes=30_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert stats.shards == len(set(index["weight_map"].values())) > 2
    from safetensors.torch import load_file

    written = {}
    for name in set(index["weight_map"].values()):
        written.update(load_file(out / name))
    for key, tensor in model.state_dict().items():
        if key in written:
            assert torch.equal(written[key], tensor), key
    assert set(model.state_dict()) - set(written) <= {"lm_head.weight"}  # tied to the embeddings


def test_spilled_activations_and_the_automatic_choice(tmp_path):
    model, src, text = _checkpoint(tmp_path, "llama", "LlamaForCausalLM")
    options = {"seq_len": 16, "max_examples": 12, "batch_size": 4}
    size = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    small = str(int(size * 1.1))  # the checkpoint fits, not with its working copy: layer-wise by itself
    pruned = headcut.prune(
        src, "fluctuation", keep=6, data=text, data_options=options, max_memory=small, out=tmp_path / "auto"
    )
    assert pruned.report["layerwise"]["reason"].startswith("automatic")
    tiny = headcut.prune(
        src,
        "fluctuation",
        keep=6,
        data=text,
        data_options=options,
        layerwise=True,
        max_memory="20KB",
        out=tmp_path / "spilled",
    )
    assert tiny.report["layerwise"]["activations"] == "disk"
    assert tiny.mask.to_json() == pruned.mask.to_json()
    with pytest.raises(HeadcutError, match="more than max_memory"):
        headcut.prune(src, "gradient", keep=6, data=text, data_options=options, max_memory="20KB")
    roomy = headcut.prune(src, "fluctuation", keep=6, data=text, data_options=options, max_memory="10GB")
    assert "layerwise" not in roomy.report


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"method": "gradient"}, "needs the whole model"),
        ({"eval_data": "EVAL"}, "eval_data needs the whole model"),
        ({"refit": True}, "refit needs the whole model"),
        ({"formats": "onnx"}, "writes safetensors only"),
        ({"max_memory": "lots"}, "max_memory must be a size"),
    ],
)
def test_layerwise_refusals(tmp_path, kwargs, needle):
    _, src, text = _checkpoint(tmp_path, "llama", "LlamaForCausalLM")
    args = {"method": "fluctuation", "keep": 6, "data": text, "layerwise": True, "out": tmp_path / "o", **kwargs}
    if args.get("eval_data") == "EVAL":
        args["eval_data"] = tmp_path / "eval.txt"
        args["eval_data"].write_text(text.read_text()[::-1])
    method = args.pop("method")
    with pytest.raises(HeadcutError, match=needle):
        headcut.prune(src, method, **args)
    assert not (tmp_path / "o").exists()


def test_layerwise_refuses_families_it_cannot_stream(tmp_path):
    for family, cls, needle in (
        ("bart", "BartForConditionalGeneration", "one list of layers"),
        ("albert", "AlbertForMaskedLM", "share weights"),
    ):
        model = make_model(family, cls)
        folder = tmp_path / family
        model.save_pretrained(folder)
        with pytest.raises(HeadcutError, match=needle):
            StreamedModel.open(folder, model.config, type(model))


def test_cli_layerwise_summary_and_one_line_errors(tmp_path):
    _, src, text = _checkpoint(tmp_path, "llama", "LlamaForCausalLM")
    done = run(
        "prune",
        str(src),
        "--method",
        "fluctuation",
        "--keep",
        "6",
        "--data",
        str(text),
        "--seq-len",
        "16",
        "--max-examples",
        "8",
        "--batch-size",
        "4",
        "--layerwise",
        "--out",
        str(tmp_path / "out"),
    )
    assert done.exit_code == 0, done.stderr
    assert "layer-wise (asked for): 3 layers read one at a time" in done.stdout
    one_line_error(
        run(
            "prune",
            str(src),
            "--method",
            "gradient",
            "--keep",
            "6",
            "--data",
            str(text),
            "--layerwise",
            "--out",
            str(tmp_path / "o2"),
        ),
        "--layerwise",
        "one-shot fluctuation",
    )
    one_line_error(
        run(
            "prune",
            str(src),
            "--method",
            "fluctuation",
            "--keep",
            "6",
            "--data",
            str(text),
            "--max-memory",
            "0GB",
            "--out",
            str(tmp_path / "o3"),
        ),
        "--max-memory",
    )


def test_parse_size():
    assert parse_size("12GB") == 12 * 1000**3 and parse_size("1.5GiB") == int(1.5 * 1024**3)
    assert parse_size(4096) == 4096 and parse_size("500 mb") == 500 * 1000**2
    for bad in ("", "GB", "-1GB", "12XB", "nan"):
        with pytest.raises(HeadcutError):
            parse_size(bad)


def test_cls_rows_for_an_encoder(tmp_path):
    """A classifier pruned layer-wise from labelled rows (the label column is not needed by fluctuation)."""
    model = make_model("bert", "BertForSequenceClassification")
    src = tmp_path / "src"
    model.save_pretrained(src)
    make_tokenizer().save_pretrained(src)
    rng = torch.Generator().manual_seed(0)
    rows = write_rows(tmp_path / "cal.csv", [{"text": sentence(rng, 9), "label": i % 3} for i in range(24)])
    opts = {"batch_size": 4, "seq_len": 32}
    a = headcut.prune(src, "fluctuation", keep=5, data=rows, data_options=opts, layerwise=True, out=tmp_path / "a")
    b = headcut.prune(src, "fluctuation", keep=5, data=rows, data_options=opts, out=tmp_path / "b")
    assert a.mask.to_json() == b.mask.to_json()
    ids = torch.randint(5, 90, (2, 9), generator=rng)
    with torch.no_grad():
        torch.testing.assert_close(
            headcut.load(tmp_path / "a")(input_ids=ids).logits, headcut.load(tmp_path / "b")(input_ids=ids).logits
        )


def _means_replaced(model, mask, means):
    """Forward pre-hooks that replace the removed heads' channels of every output projection's input by their
    calibration means (what FLAP's compensated cut computes)."""
    from headcut.model.surgery import model_blocks

    handles = []
    for block in model_blocks(model):
        removed = [h for h in range(block.heads) if h not in mask.keep[block.name]]
        if not removed:
            continue
        cols = torch.tensor([h * block.head_dim + j for h in removed for j in range(block.head_dim)])
        mean = means[block.name].to(torch.float32)[cols]

        def hook(mod, args, cols=cols, mean=mean):
            x = args[0].clone()
            x[..., cols] = mean
            return (x, *args[1:])

        handles.append(model.base_model.get_submodule(block.o).register_forward_pre_hook(hook))
    return handles


@pytest.mark.parametrize(
    "family,cls,field",
    [
        ("llama", "LlamaForCausalLM", "attention_bias"),
        ("gpt2", "GPT2LMHeadModel", None),
        ("gemma3", "Gemma3ForCausalLM", "attention_bias"),
    ],
)
def test_bias_compensation_is_the_mean_input_and_layerwise_agrees(tmp_path, family, cls, field):
    from headcut.scoring.fluctuation import input_moments

    model, src, text = _checkpoint(tmp_path, family, cls)
    options = {"seq_len": 16, "max_examples": 12, "batch_size": 4}
    whole = headcut.prune(
        src, "fluctuation", keep=6, data=text, data_options=options, bias_compensation=True, out=tmp_path / "whole"
    )
    layer = headcut.prune(
        src,
        "fluctuation",
        keep=6,
        data=text,
        data_options=options,
        bias_compensation=True,
        layerwise=True,
        out=tmp_path / "layer",
    )
    assert whole.mask.to_json() == layer.mask.to_json()
    for pruned in (whole, layer):
        assert pruned.report["bias_compensation"]["field"] == field
        assert pruned.report["bias_compensation"]["blocks"]
    from headcut.data import DataConfig, load_calibration

    cal = load_calibration(model, make_tokenizer(), DataConfig(path=str(text), **options))
    moments, _ = input_moments(model, [b for b in headcut.model_blocks(model)], cal.batches, "test")
    means = {name: m.mean() for name, m in moments.items()}
    inputs = make_inputs(family, model, batch=2, length=9, seed=4)
    handles = _means_replaced(model, whole.mask, means)  # the removed heads' outputs at their means: the cut
    try:
        with torch.no_grad():
            expected = model(**inputs).logits
    finally:
        for h in handles:
            h.remove()
    a, b = headcut.load(tmp_path / "whole"), headcut.load(tmp_path / "layer")
    with torch.no_grad():
        got_whole, got_layer = a(**inputs).logits, b(**inputs).logits
    torch.testing.assert_close(got_whole, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_layer, got_whole, atol=1e-6, rtol=1e-6)
    if field:
        assert a.config.attention_bias is True and a.base_model.layers[0].self_attn.q_proj.bias is not None


def test_bias_compensation_refused_where_the_stock_config_has_no_bias(tmp_path):
    _, src, text = _checkpoint(tmp_path, "mistral", "MistralForCausalLM")
    for layerwise in (False, True):
        with pytest.raises(HeadcutError, match="no attention_bias field"):
            headcut.prune(
                src, "fluctuation", keep=6, data=text, bias_compensation=True, layerwise=layerwise, out=tmp_path / "o"
            )
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("layerwise", [False, True])
def test_fluctuation_refuses_blocks_that_are_one_unit(tmp_path, layerwise):
    """FLAP standardises scores within a block: with one KV head per layer (Gemma 3 270M's shape) every KV
    group is a whole block and would score 0, so the cut would be arbitrary. Refused before any data is read;
    query heads (``--gqa uniform``) are still ranked."""
    import transformers as T
    from helpers import make_config

    config = make_config("llama")
    config.num_key_value_heads = 1
    torch.manual_seed(0)
    src = tmp_path / "src"
    T.LlamaForCausalLM(config).save_pretrained(src)
    make_tokenizer().save_pretrained(src)
    text = tmp_path / "cal.txt"
    text.write_text("\n".join(sentence(torch.Generator().manual_seed(0), 12) for _ in range(20)))
    options = {"seq_len": 16, "batch_size": 4}
    with pytest.raises(
        headcut.HeadcutError,
        match="fluctuation cannot rank this model's units: its scores are standardised within each block",
    ):
        headcut.prune(src, "fluctuation", keep=12, gqa="group", data=text, data_options=options, layerwise=layerwise)
    kept = headcut.prune(
        src,
        "fluctuation",
        keep=12,
        gqa="uniform",
        data=text,
        data_options=options,
        layerwise=layerwise,
        out=tmp_path / "q",
    )
    assert sum(b.heads for b in headcut.model_blocks(kept.model)) == 12
