"""Qwen3.5 text models: gated attention and Gated DeltaNet layers cut exactly (see headcut.adapters.qwen3_5)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import ATOL, check_reload, forward, make_inputs, make_model, run, save_tiny

import headcut
from headcut.adapters import adapter_for, runtime
from headcut.errors import HeadcutError

CLM = "Qwen3_5ForCausalLM"
LIN, ATT = "self.0", "self.1"  # layer types of the tiny config: linear, full, linear, full


def slim_copy(model, keep: dict, gqa: str = "duplicate"):
    out = copy.deepcopy(model)
    headcut.slim(out, {"keep": keep}, gqa=gqa)
    return out


def gated_forward(model, inputs, keep: dict) -> torch.Tensor:
    with headcut.gated(model, {"keep": keep}):
        return forward(model, inputs)


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def test_blocks_one_per_layer_with_their_mixer():
    model = make_model("qwen3_5")
    blocks = headcut.model_blocks(model)
    assert [b.name for b in blocks] == ["self.0", "self.1", "self.2", "self.3"]
    assert [b.layer for b in blocks] == [0, 1, 2, 3]
    assert [b.mixer for b in blocks] == ["linear attention", "attention", "linear attention", "attention"]
    lin, att = blocks[0], blocks[1]
    assert (lin.heads, lin.kv_heads, lin.head_dim, lin.o) == (6, 2, 8, "layers.0.linear_attn.out_proj")
    assert (att.heads, att.kv_heads, att.head_dim, att.o) == (6, 2, 8, "layers.1.self_attn.o_proj")


def test_value_head_reads_key_head_h_div_group():
    """The layout the adapter assumes, checked against transformers: value head h of V reads key head
    h // (V / K) (repeat_interleave), not h % K."""
    model = make_model("qwen3_5")
    la = model.model.layers[0].linear_attn
    x = torch.randn(2, 7, 48, generator=torch.Generator().manual_seed(0))
    seen = {}
    hook = la.out_proj.register_forward_pre_hook(lambda _m, a: seen.__setitem__("x", a[0].clone()))
    with torch.no_grad():
        la(x)
        before = seen["x"]
        dk = la.head_k_dim
        la.in_proj_qkv.weight[dk : 2 * dk] += 1.0  # the query channels of key head 1
        la(x)
    hook.remove()
    moved = (seen["x"] - before).abs().reshape(2, 7, 6, 8).amax(dim=(0, 1, 3))
    assert (moved[:3] == 0).all() and (moved[3:] > 1e-3).all(), moved


def test_gate_rows_go_with_their_head():
    model = make_model("qwen3_5")
    att = model.model.layers[1].self_attn
    d = att.head_dim
    q_before = att.q_proj.weight.detach().clone().reshape(6, 2 * d, -1)  # per head: query | gate
    keep = {ATT: [1, 4]}
    inputs = make_inputs("qwen3_5", model)
    expected = gated_forward(model, inputs, keep)
    slim = slim_copy(model, keep)
    q_after = slim.model.layers[1].self_attn.q_proj.weight.reshape(2, 2 * d, -1)
    assert torch.equal(q_after, q_before[[1, 4]])
    assert slim.model.layers[1].self_attn.o_proj.in_features == 2 * d
    assert maxdiff(forward(slim, inputs), expected) <= ATOL


@pytest.mark.parametrize(
    "gqa,keep,kv",
    [
        ("group", [3, 4, 5], [1]),  # a whole key group: key head 0 goes
        ("uniform", [0, 2, 3, 5], [0, 1]),  # two value heads of each key head
        ("duplicate", [1, 5], [0, 1]),  # any subset: a key head per kept value head
        ("duplicate", [0, 1, 2], [0, 0, 0]),
    ],
)
def test_deltanet_cut_equals_gated(gqa, keep, kv):
    model = make_model("qwen3_5")
    inputs = make_inputs("qwen3_5", model)
    full = model.model.layers[0].linear_attn
    qkv_before = full.in_proj_qkv.weight.detach().clone()
    conv_before = full.conv1d.weight.detach().clone()
    expected = gated_forward(model, inputs, {LIN: keep})
    slim = slim_copy(model, {LIN: keep}, gqa)
    la = slim.model.layers[0].linear_attn
    n, k, dk, dv = len(keep), len(kv), la.head_k_dim, la.head_v_dim
    assert (la.num_v_heads, la.num_k_heads, la.key_dim, la.value_dim) == (n, k, k * dk, n * dv)
    assert la.conv_dim == la.conv1d.in_channels == la.conv1d.out_channels == la.conv1d.groups == 2 * k * dk + n * dv
    assert la.dt_bias.shape == la.A_log.shape == (n,)
    assert torch.equal(la.A_log, full.A_log[keep]) and torch.equal(la.dt_bias, full.dt_bias[keep])
    assert la.in_proj_b.out_features == la.in_proj_a.out_features == n
    assert la.out_proj.in_features == la.in_proj_z.out_features == n * dv
    # q | k | v channels: the kept key heads' q and k channels, then the kept value heads' v channels
    index = (
        [h * dk + i for h in kv for i in range(dk)]
        + [2 * dk + h * dk + i for h in kv for i in range(dk)]
        + [4 * dk + h * dv + i for h in keep for i in range(dv)]
    )
    assert torch.equal(la.in_proj_qkv.weight, qkv_before[index])
    assert torch.equal(la.conv1d.weight, conv_before[index])
    block = headcut.model_blocks(slim)[0]
    assert (block.heads, block.kv_heads) == (n, k)
    assert maxdiff(forward(slim, inputs), expected) <= ATOL


def test_default_norm_eps_differs_from_gated_by_rounding_only():
    """With the released models' rms_norm_eps (1e-6) the DeltaNet's gated RMSNorm of small per-head
    outputs amplifies last-bit differences (projections of another width round differently) to about
    1e-5 on this tiny random model; a wrong head would move the output by far more."""
    model = make_model("qwen3_5")
    model.config.rms_norm_eps = 1e-6
    for mod in model.modules():
        for attr in ("eps", "variance_epsilon"):
            if hasattr(mod, attr):
                setattr(mod, attr, 1e-6)
    inputs = make_inputs("qwen3_5", model)
    keep = {LIN: [0, 2, 5], ATT: [1, 2, 3], "self.2": [4], "self.3": []}
    expected = gated_forward(model, inputs, keep)
    error = maxdiff(forward(slim_copy(model, keep), inputs), expected)
    assert error <= 1e-4
    wrong = {LIN: [0, 2, 4], ATT: [1, 2, 3], "self.2": [4], "self.3": []}  # one value head off
    assert maxdiff(gated_forward(model, inputs, wrong), expected) > 1e-2


@pytest.mark.parametrize("empty", [[LIN], [ATT], [LIN, ATT, "self.2", "self.3"]])
def test_zero_head_layers_of_both_kinds(empty):
    model = make_model("qwen3_5")
    inputs = make_inputs("qwen3_5", model)
    keep = {name: [] for name in empty}
    expected = gated_forward(model, inputs, keep)
    slim = slim_copy(model, keep)
    assert [b.heads for b in headcut.model_blocks(slim) if b.name in empty] == [0] * len(empty)
    assert maxdiff(forward(slim, inputs), expected) <= ATOL
    la = slim.model.layers[0].linear_attn
    if LIN in empty:  # nothing of the layer's heads is left; it adds zero
        assert la.conv1d.weight.shape[0] == la.in_proj_qkv.out_features == la.dt_bias.numel() == 0
        with torch.no_grad():
            out = la(torch.randn(2, 5, 48))
        assert isinstance(out, torch.Tensor) and out.shape == (2, 5, 48) and not out.any()
    check_reload(slim, inputs, forward(slim, inputs))


@pytest.mark.parametrize("empty", [None, LIN, ATT])
def test_cached_generation_with_a_cut_equals_gated(empty):
    model = make_model("qwen3_5", CLM, seed=5)
    model.generation_config.pad_token_id = 0
    keep = {LIN: [1, 3, 4], ATT: [0, 5], "self.2": [2], "self.3": [1, 2, 3, 4]}
    if empty:
        keep[empty] = []
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(8))
    gen = dict(max_new_tokens=8, do_sample=False, use_cache=True, num_beams=1, return_dict_in_generate=True)
    with torch.no_grad():
        with headcut.gated(model, {"keep": keep}):
            expected = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen).sequences
        headcut.slim(model, {"keep": keep}, gqa="duplicate")
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen)
        uncached = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **dict(gen, use_cache=False))
    assert torch.equal(out.sequences, expected)
    assert torch.equal(out.sequences, uncached.sequences)
    cache = runtime.returned_cache(out)
    assert cache.get_seq_length() == out.sequences.shape[1] - 1
    for i in (0, 2):  # the linear layers' states have the cut layer's shapes
        la = model.model.layers[i].linear_attn
        heads = len(keep[f"self.{i}"])
        assert cache.get_conv_state(i).shape[:2] == (2, la.conv1d.out_channels)
        assert cache.get_recurrent_state(i).shape[:2] == (2, heads)
        if heads:
            assert cache.get_recurrent_state(i).shape[2:] == (la.head_k_dim, la.head_v_dim)
        assert cache.has_previous_state(i)


@pytest.mark.parametrize("gqa", ["group", "uniform"])
def test_reload_by_both_routes_under_grouped_policies(gqa):
    model = make_model("qwen3_5", "Qwen3_5TextForSequenceClassification")
    inputs = make_inputs("qwen3_5", model)
    keep = {LIN: [3, 4, 5], ATT: [0, 1, 2], "self.2": [], "self.3": list(range(6))}
    if gqa == "uniform":
        keep = {LIN: [0, 1, 4, 5], ATT: [0, 3], "self.2": [2, 5], "self.3": []}
    expected = gated_forward(model, inputs, keep)
    headcut.slim(model, {"keep": keep}, gqa=gqa)
    assert maxdiff(forward(model, inputs), expected) <= ATOL
    check_reload(model, inputs, forward(model, inputs))


def test_info_lists_the_blocks(tmp_path):
    src = save_tiny(tmp_path / "src", "qwen3_5", CLM)
    result = run("info", src, "--json", "-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(b["name"], b["heads"], b["kv_heads"], b["head_dim"]) for b in data["blocks"]] == [
        ("self.0", 6, 2, 8),
        ("self.1", 6, 2, 8),
        ("self.2", 6, 2, 8),
        ("self.3", 6, 2, 8),
    ]
    model = headcut.load(src)
    headcut.slim(model, {"keep": {LIN: [0, 1, 2], ATT: []}})
    headcut.save(model, tmp_path / "slim")
    data = json.loads(run("info", tmp_path / "slim", "--json", "-").stdout)
    assert [(b["heads"], b["kv_heads"]) for b in data["blocks"]] == [(3, 1), (0, 0), (6, 2), (6, 2)]
    assert data["total_heads"] == 15


def test_a_tampered_deltanet_op_is_refused(tmp_path):
    model = make_model("qwen3_5", CLM)
    headcut.slim(model, {"keep": {LIN: [3, 4, 5]}})
    headcut.save(model, tmp_path / "slim")
    config = json.loads((tmp_path / "slim" / "config.json").read_text())
    op = next(op for op in config["headcut"]["ops"] if op["op"] == "channels")
    op["parts"][2]["heads"] = [0, 1, 2]  # other value heads' filters than the ones kept everywhere else
    (tmp_path / "slim" / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadcutError, match="ops are not the ones"):
        headcut.load(tmp_path / "slim")


def _part(heads, head_dim, count):
    return {"heads": heads, "head_dim": head_dim, "count": count}


@pytest.mark.parametrize(
    "op",
    [
        # parts that do not cover the projection exactly, or name heads outside a part
        {"op": "rows", "path": "layers.0.linear_attn.in_proj_qkv", "parts": [_part([0], 10, 2), _part([0], 10, 2)]},
        {
            "op": "rows",
            "path": "layers.0.linear_attn.in_proj_qkv",
            "parts": [_part([2], 10, 2), _part([0], 10, 2), _part([0], 8, 6)],
        },
        {
            "op": "rows",
            "path": "layers.0.linear_attn.in_proj_qkv",
            "heads": [0],
            "head_dim": 8,
            "parts": [_part([0], 10, 2), _part([0], 10, 2), _part([0], 8, 6)],
        },
        {"op": "rows", "path": "layers.0.linear_attn.in_proj_qkv", "parts": [{"heads": [0], "head_dim": 88}]},
        # channels only of a depthwise Conv1d
        {"op": "channels", "path": "layers.0.linear_attn.in_proj_qkv", "heads": [0], "head_dim": 8},
        {"op": "channels", "path": "layers.0.linear_attn.conv1d", "heads": [11], "head_dim": 8},
        # param: the module's own parameters only
        {"op": "param", "path": "layers.0.linear_attn", "name": "out_proj.weight", "heads": [0], "head_dim": 1},
        {"op": "param", "path": "layers.0.linear_attn", "name": "__dict__", "heads": [0], "head_dim": 1},
        {"op": "param", "path": "layers.0.linear_attn", "name": "A_log", "heads": [6], "head_dim": 1},
        {"op": "param", "path": "layers.0.linear_attn", "name": "A_log", "parts": [_part([0], 1, 6)]},
        {"op": "set", "path": "layers.0.linear_attn", "attrs": {"head_v_dim": 4}},
    ],
)
def test_runtime_refuses_malformed_new_ops(op):
    model = make_model("qwen3_5")
    with pytest.raises(runtime.CutError):
        runtime.apply_ops(model.base_model, [op])


def test_config_checks():
    adapter = adapter_for(make_model("qwen3_5"))
    config = make_model("qwen3_5").config
    config.layer_types = ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]
    with pytest.raises(ValueError, match="sliding_attention"):
        adapter.check_config(config)
    model = make_model("qwen3_5")
    numbers = adapter.config_numbers(lambda name: getattr(model.config, name))
    assert 0 < adapter.min_values(numbers, CLM) <= headcut.count_params(model)
