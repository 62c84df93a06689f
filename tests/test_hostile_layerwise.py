"""The layer-wise path (``prune --layerwise``) accepts and refuses the same checkpoints as the whole-model path:
a tensor outside the layers that is missing, of the wrong shape, of the wrong kind of number or not used by the
model is refused by both with the same line (it used to be copied, or dropped, into a checkpoint that plain
transformers then filled at random); shards of mixed dtypes run on both."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import make_model, make_tokenizer, one_line_error, run, sentence
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import headcut
from headcut.errors import HeadcutError

OPTIONS = {"seq_len": 16, "max_examples": 12, "batch_size": 4}


def _sharded(tmp_path, edit=None, config=None):
    """A sharded tiny Llama (its output head untied), its shards rewritten by ``edit(file, tensors)``
    and its config.json updated with ``config``; and a calibration text."""
    model = make_model("llama", "LlamaForCausalLM")
    src = tmp_path / "src"
    model.save_pretrained(src, max_shard_size="40KB")
    make_tokenizer().save_pretrained(src)
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1
    if edit is not None:
        weight_map = {}
        for f in files:
            tensors = edit(f, load_file(src / f))
            save_file(tensors, src / f, metadata={"format": "pt"})
            weight_map.update({k: f for k in tensors})
        index["weight_map"] = weight_map
        index_path.write_text(json.dumps(index))
    if config:
        cfg = json.loads((src / "config.json").read_text())
        cfg.update(config)
        (src / "config.json").write_text(json.dumps(cfg))
    rng = torch.Generator().manual_seed(0)
    text = tmp_path / "cal.txt"
    text.write_text("\n".join(sentence(rng, 12) for _ in range(60)))
    return src, text


def _drop(name):
    return lambda f, t: {k: v for k, v in t.items() if k != name}


def _change(name, fn):
    return lambda f, t: {k: (fn(v) if k == name else v) for k, v in t.items()}


def _add(name, value):
    return lambda f, t: dict(t, **{name: value}) if f.startswith("model-00001") else t


DAMAGED = [
    ("missing head", _drop("lm_head.weight"), "1 tensor(s) missing from its weights (lm_head.weight)"),
    ("missing norm", _drop("model.norm.weight"), "1 tensor(s) missing from its weights (model.norm.weight)"),
    (
        "head of the wrong shape",
        _change("lm_head.weight", lambda v: v[:-1].clone()),
        "1 tensor(s) have the wrong shape (lm_head.weight: (98, 48) in the weights, (99, 48) in the model)",
    ),
    (
        "embeddings of the wrong shape",
        _change("model.embed_tokens.weight", lambda v: v[:, :-1].clone()),
        "wrong shape (model.embed_tokens.weight: (99, 47) in the weights",
    ),
    (
        "unused tensor",
        _add("model.bogus.weight", torch.zeros(3)),
        "1 unexpected tensor(s) in its weights (model.bogus.weight)",
    ),
    (
        "integer head",
        _change("lm_head.weight", lambda v: v.to(torch.int32)),
        "stored in the wrong kind of number (lm_head.weight: I32 in the weights, float32 in the model)",
    ),
    (
        "integer layer weight",
        _change("model.layers.1.mlp.up_proj.weight", lambda v: v.to(torch.int32)),
        "(model.layers.1.mlp.up_proj.weight: I32 in the weights, float32 in the model)",
    ),
]


@pytest.mark.parametrize("case,edit,needle", DAMAGED, ids=[c[0] for c in DAMAGED])
def test_both_paths_refuse_the_same_damaged_checkpoints(tmp_path, case, edit, needle):
    src, text = _sharded(tmp_path, edit)
    lines = {}
    for layerwise in (False, True):
        out = tmp_path / f"out-{layerwise}"
        with pytest.raises(HeadcutError) as caught:
            headcut.prune(src, "fluctuation", keep=6, data=text, data_options=OPTIONS, layerwise=layerwise, out=out)
        assert needle in str(caught.value)
        assert not out.exists()
        flags = ["--layerwise"] if layerwise else []
        result = run(
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
            "12",
            "--out",
            str(out),
            *flags,
        )
        lines[layerwise] = one_line_error(result, needle)
        assert not out.exists()
    assert lines[True] == lines[False]  # the same refusal, word for word


def test_a_tied_head_may_be_missing_on_both_paths(tmp_path):
    src, text = _sharded(tmp_path, _drop("lm_head.weight"), config={"tie_word_embeddings": True})
    masks = {}
    for layerwise in (False, True):
        out = tmp_path / f"out-{layerwise}"
        masks[layerwise] = headcut.prune(
            src, "fluctuation", keep=6, data=text, data_options=OPTIONS, layerwise=layerwise, out=out
        ).mask.to_json()
        model = headcut.load(out)
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert masks[True] == masks[False]


@pytest.mark.parametrize("config_dtype", ["float32", "bfloat16"])
def test_mixed_dtype_shards_run_layerwise_as_they_load_whole(tmp_path, config_dtype):
    def mixed(f, tensors):  # the second shard float32, the others bf16
        dtype = torch.float32 if f.startswith("model-00002") else torch.bfloat16
        return {k: v.to(dtype) for k, v in tensors.items()}

    src, text = _sharded(tmp_path, mixed, config={"dtype": config_dtype})
    masks = {}
    for layerwise in (False, True):
        out = tmp_path / f"out-{layerwise}"
        pruned = headcut.prune(
            src, "fluctuation", keep=6, data=text, data_options=OPTIONS, layerwise=layerwise, out=out
        )
        masks[layerwise] = pruned.mask.to_json()
        dtypes = {t.dtype for f in out.glob("*.safetensors") for t in load_file(f).values()}
        assert dtypes == {getattr(torch, config_dtype)}  # one dtype, as transformers loads it whole
    assert masks[True] == masks[False]
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    twice = [
        AutoModelForCausalLM.from_pretrained(tmp_path / "out-True", trust_remote_code=True)(ids).logits
        for _ in range(2)
    ]
    assert torch.equal(twice[0], twice[1])  # nothing initialised at random
    assert torch.allclose(headcut.load(tmp_path / "out-True")(ids).logits, twice[0])


def test_layerwise_refuses_a_new_task_head_it_cannot_write(tmp_path):
    src, text = _sharded(tmp_path)
    rows = tmp_path / "rows.csv"
    rows.write_text(
        "text,label\n" + "\n".join(f"{sentence(torch.Generator().manual_seed(i), 8)},{i % 2}" for i in range(20))
    )
    with pytest.raises(HeadcutError, match="cannot add a new task head"):
        headcut.prune(
            src,
            "fluctuation",
            keep=6,
            data=rows,
            data_options=OPTIONS,
            task="sequence-classification",
            layerwise=True,
            out=tmp_path / "out",
        )
    assert not (tmp_path / "out").exists()
