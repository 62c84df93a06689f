"""Gemma 4 text models (on top of test_surgery.py and test_oracle.py, which run the tiny "gemma4" config):
per-layer head sizes and KV-head counts, k = v layers and the v norm, KV sharing (store layers that keep
their keys and values, reader layers that select from them), cached generation, layers without heads and
reloading."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
import torch
import transformers as T
from helpers import ATOL, V, check_reload, forward, make_inputs, make_model

import headcut
from headcut.adapters import MISSING, adapter_for_config, adapter_for_model_type
from headcut.errors import HeadcutError

S, F = "sliding_attention", "full_attention"
#: the tiny family config's sizes (tests/helpers.py), for variants of its layer plan
BASE = dict(
    vocab_size=V,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    hidden_size=48,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=12,
    global_head_dim=16,
    num_global_key_value_heads=3,
    attention_k_eq_v=True,
    intermediate_size=37,
    max_position_embeddings=64,
    sliding_window=4,
    hidden_size_per_layer_input=16,
    vocab_size_per_layer_input=V,
    initializer_range=0.2,
)


def tiny(layer_types: list[str], seed: int = 0, **changes: object) -> torch.nn.Module:
    """A tiny random Gemma4ForCausalLM with the family config's sizes and another layer plan."""
    settings = {**BASE, **changes}
    config = T.Gemma4TextConfig(num_hidden_layers=len(layer_types), layer_types=list(layer_types), **settings)
    torch.manual_seed(seed)
    return T.Gemma4ForCausalLM(config).eval()


def no_sharing(k_eq_v: bool = True) -> torch.nn.Module:
    """Plain global layers 1 and 3 (3 KV heads of 16; a v_proj only without k = v); layers 4 and 5 store
    keys and values that no layer of this model reads."""
    types = [S, F, S, F, S, F]
    if k_eq_v:
        return tiny(types)
    wide = {i: {"head_dim": 16, "num_key_value_heads": 3} for i, t in enumerate(types) if t == F}
    return tiny(types, attention_k_eq_v=False, per_layer_config=wide)


def one_kv_head() -> torch.nn.Module:
    """Gemma 4 E2B's shape: one KV head per layer; layers 4 and 5 reuse what layers 2 and 3 store."""
    return tiny([S, F, S, F, S, F], num_key_value_heads=1, num_global_key_value_heads=1, num_kv_shared_layers=2)


def inputs_for(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return make_inputs("gemma4", model)


def slim_equals_gated(model: torch.nn.Module, keep: dict[str, list[int]], gqa: str = "duplicate") -> torch.Tensor:
    """Slim ``model`` in place and check it against the gated original; returns the output."""
    inputs = inputs_for(model)
    with headcut.gated(model, {"keep": keep}):
        expected = forward(model, inputs)
    headcut.slim(model, {"keep": keep}, gqa=gqa)
    got = forward(model, inputs)
    assert (got - expected).abs().max().item() <= ATOL, (got - expected).abs().max().item()
    heads = {b.name: b.heads for b in headcut.model_blocks(model)}
    assert {name: heads[name] for name in keep} == {name: len(kept) for name, kept in keep.items()}
    return got


def zeroed_oracle(model: torch.nn.Module, keep: dict[str, list[int]]) -> torch.nn.Module:
    """A copy whose output projections have the dropped heads' input columns zeroed (headcut's code unused);
    layers ``keep`` does not name keep every head."""
    oracle = copy.deepcopy(model)
    with torch.no_grad():
        for i, layer in enumerate(oracle.model.layers):
            module = layer.self_attn
            d = module.head_dim
            heads = range(module.o_proj.in_features // d)
            for h in set(heads) - set(keep.get(f"self.{i}", heads)):
                module.o_proj.weight[:, h * d : (h + 1) * d] = 0
    return oracle


def attn(model: torch.nn.Module, layer: int) -> torch.nn.Module:
    return model.model.layers[layer].self_attn


# ---- blocks and config ----------------------------------------------------------------------------------


def test_blocks_read_per_layer_sizes_and_kv_sharing_roles():
    model = make_model("gemma4")
    cfg = model.config
    assert cfg.kv_sharing_modes == [None] * 3 + ["store"] * 2 + ["reuse"] * 2
    assert {cfg.per_layer_config[i].num_key_value_heads for i in range(7)} == {2, 3}  # per-layer KV counts
    blocks = headcut.model_blocks(model)
    sizes = [cfg.per_layer_config[i].head_dim for i in range(7)]
    assert [b.head_dim for b in blocks] == sizes == [12] * 4 + [16, 12, 16]
    # store layers show one KV slot per query head (any subset is exact); readers the stored KV heads
    assert [(b.heads, b.kv_heads) for b in blocks] == [(6, 2)] * 3 + [(6, 6)] * 2 + [(6, 2), (6, 3)]
    assert blocks[5].k == blocks[5].rows("k").path == "layers.3.self_attn.k_proj"
    assert blocks[5].v == "layers.3.self_attn.v_proj"
    assert blocks[6].k == blocks[6].v == "layers.4.self_attn.k_proj"  # k = v in global layers
    assert attn(model, 4).v_proj is None and blocks[4].v == blocks[4].k
    assert not hasattr(attn(model, 5), "k_proj")
    base = model.base_model
    for b in blocks:
        for path in (b.attn, b.q, b.k, b.v, b.o, *(b.rows(p).path for p in "qkv")):
            base.get_submodule(path)


def test_config_numbers_check_per_layer_fields():
    model = make_model("gemma4")
    cfg = model.config
    adapter = adapter_for_config(cfg)
    with pytest.raises(RuntimeError):
        cfg.head_dim  # noqa: B018 - transformers refuses a global read of a per-layer field
    numbers = adapter.config_numbers(lambda name: getattr(cfg, name, MISSING))
    assert numbers["head_dim"] == 12 and numbers["num_attention_heads"] == 6
    raw = cfg.to_dict()
    assert raw["per_layer_config"]
    adapter = adapter_for_model_type("gemma4_text")
    assert adapter.config_numbers(lambda name: raw.get(name, MISSING))["head_dim"] == 12
    layer = sorted(raw["per_layer_config"])[0]
    bad = copy.deepcopy(raw)
    bad["per_layer_config"][layer]["head_dim"] = 0
    with pytest.raises(ValueError, match=rf"per_layer_config\[{layer}\]\.head_dim is 0"):
        adapter.config_numbers(lambda name: bad.get(name, MISSING))
    bad = copy.deepcopy(raw)
    bad["per_layer_config"][layer]["num_key_value_heads"] = 4
    with pytest.raises(ValueError, match="not a multiple of"):
        adapter.config_numbers(lambda name: bad.get(name, MISSING))


def test_layers_that_reuse_keys_no_layer_stores_are_refused():
    cfg = T.Gemma4TextConfig(**{**BASE, "num_hidden_layers": 2, "layer_types": [S, F], "num_kv_shared_layers": 2})
    with pytest.raises(HeadcutError, match="reuse keys and values that no layer stores"):
        adapter_for_config(cfg)


# ---- k = v, v norm, plain global layers ----------------------------------------------------------------------


@pytest.mark.parametrize("k_eq_v", [True, False])
def test_global_layers_lose_kv_heads_with_and_without_k_eq_v(k_eq_v):
    model = no_sharing(k_eq_v)
    a1 = attn(model, 1)
    assert (a1.v_proj is None) == k_eq_v
    assert not list(a1.v_norm.parameters())  # v_norm has no scale: nothing to slice
    assert a1.q_norm.weight.shape == a1.k_norm.weight.shape == (16,)  # shared by the heads
    # layer 1: KV group 1 only (--gqa group); layer 3: one head of every group (uniform); layer 0: a group
    keep = {"self.0": [0, 1, 2], "self.1": [2, 3], "self.3": [0, 2, 4]}
    out = slim_equals_gated(model, keep, gqa="auto")
    assert a1.k_proj.out_features == 16 and a1.num_key_value_groups == 2
    if not k_eq_v:
        assert a1.v_proj.out_features == 16
    a3 = attn(model, 3)
    assert a3.k_proj.out_features == 3 * 16 and a3.num_key_value_groups == 1
    blocks = {b.name: b for b in headcut.model_blocks(model)}
    assert (blocks["self.1"].kv_heads, blocks["self.3"].kv_heads) == (1, 3)
    check_reload(model, inputs_for(model), out)


# ---- KV sharing ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("store", [3, 4])
def test_store_layers_keep_the_keys_and_values_they_share(store):
    model = make_model("gemma4")
    inputs = inputs_for(model)
    with torch.no_grad():
        before = model(**inputs, return_shared_kv_states=True).shared_kv_states
    # the layers before ``store`` keep their heads, so its input (and so its keys and values) are the original
    keep = {"self.3": [1, 2, 3], "self.4": [], "self.5": [0], "self.6": [4, 5]}
    if store == 4:
        keep = {"self.4": [0, 1, 2], "self.6": []}
    out = slim_equals_gated(model, keep, gqa="auto")
    with torch.no_grad():
        after = model(**inputs, return_shared_kv_states=True).shared_kv_states
    for kind in (S, F) if store == 4 else (S,):  # cutting layer 3 changes layer 4's input
        for old, new in zip(before[kind], after[kind]):
            assert torch.equal(old, new), kind
    a3, a4 = attn(model, 3), attn(model, 4)
    assert a3.k_proj.out_features == 2 * 12 and a4.k_proj.out_features == 3 * 16  # KV heads kept
    if store == 3:
        # layer 3 keeps 2 + 1 heads of its 2 KV heads: 2 positions each, 1 placeholder; layer 4 keeps no
        # query head: one placeholder per KV head
        assert (a3.q_proj.out_features // 12, a3.num_key_value_groups, a3._hc_real) == (4, 2, [0, 1, 2])
        assert (a4.q_proj.out_features, a4.o_proj.in_features, a4._hc_real) == (3 * 16, 0, [])
    else:
        # layer 4 keeps 2 + 1 + 0 heads of its 3 KV heads: 2 positions each, 3 of them placeholders
        assert (a4.q_proj.out_features // 16, a4.num_key_value_groups, a4._hc_real) == (6, 2, [0, 1, 2])
        assert a4.o_proj.in_features == 3 * 16
    notes = headcut.info(model).notes
    assert len(notes) == 1 and "placeholder" in notes[0] and "self.4" in notes[0]
    check_reload(model, inputs, out)


def test_a_store_layer_without_heads_still_serves_its_readers():
    """Gemma 4 E2B's case: one KV head, the store layers lose every query head, the readers keep some."""
    model = one_kv_head()
    inputs = inputs_for(model)
    keep = {"self.2": [], "self.3": [], "self.4": [1, 4], "self.5": [0, 2, 3, 5]}
    expected = forward(zeroed_oracle(model, keep), inputs)
    assert (expected - forward(model, inputs)).abs().max().item() > 1e-3  # the cut is visible
    out = slim_equals_gated(model, keep, gqa="auto")  # one KV group: any subset of it is uniform
    assert (out - expected).abs().max().item() <= ATOL
    assert attn(model, 2).q_proj.out_features == 12 and attn(model, 3).q_proj.out_features == 16
    check_reload(model, inputs, out)


GROUP_MASKS = {
    # policy -> kept heads of the readers self.5 (2 stored KV heads, groups of 3) and self.6 (3, groups of 2),
    # and the stored heads each then selects; self.3, a store layer, keeps an uneven subset under every policy
    "group": (([3, 4, 5], [0, 1, 4, 5]), ([1], [0, 2])),
    "uniform": (([0, 3], [1, 3, 5]), ([0, 1], [0, 1, 2])),
    "duplicate": (([0, 1, 3], [5]), ([0, 0, 1], [2])),
}


@pytest.mark.parametrize("policy", list(GROUP_MASKS))
def test_readers_select_stored_kv_heads_under_every_policy(policy):
    model = make_model("gemma4", seed=4)
    (five, six), (select5, select6) = GROUP_MASKS[policy]
    keep = {"self.3": [0, 1, 3], "self.5": five, "self.6": six}
    slim_equals_gated(model, keep, gqa=policy)
    assert (attn(model, 5)._hc_kv_select, attn(model, 6)._hc_kv_select) == (select5, select6)
    blocks = headcut.model_blocks(model)
    assert [(b.heads, b.kv_heads) for b in blocks[5:]] == [(len(five), len(select5)), (len(six), len(select6))]
    # a second cut composes with the selection; gates on the cut model (placeholders in self.3) agree
    second = {"self.3": [1, 2], "self.5": [0], "self.6": [0]}
    slim_equals_gated(model, second, gqa="duplicate")
    assert attn(model, 5)._hc_kv_select == [select5[0]]
    check_reload(model, inputs_for(model), forward(model, inputs_for(model)))


# ---- generation, layers without heads, attention weights ------------------------------------------------------


@pytest.mark.parametrize("variant", ["family", "one-kv-head", "no-sharing"])
def test_cached_generation_equals_gated(variant):
    model = {
        "family": lambda: make_model("gemma4", "Gemma4ForCausalLM", seed=5),
        "one-kv-head": one_kv_head,
        "no-sharing": no_sharing,
    }[variant]()
    model.generation_config.pad_token_id = 0
    n = len(model.model.layers)
    modes = model.config.kv_sharing_modes
    # layer 0 gives the cache length; layer 1 is the first global layer of two variants (its cache sizes the mask)
    keep: dict[str, list[int]] = {"self.0": [], "self.1": []}
    first_store = modes.index("store")
    keep[f"self.{first_store}"] = []  # a store layer without heads still stores (and caches) its keys
    keep[f"self.{first_store + 1}"] = [0, 1, 5]
    if "reuse" in modes:
        keep[f"self.{n - 2}"] = []
        keep[f"self.{n - 1}"] = [1, 2, 4]
    ids = torch.randint(3, V, (2, 6), generator=torch.Generator().manual_seed(8))
    gen = dict(max_new_tokens=8, do_sample=False, use_cache=True, num_beams=1)
    with torch.no_grad():
        with headcut.gated(model, {"keep": keep}):
            expected = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen)
        headcut.slim(model, {"keep": keep}, gqa="duplicate")
        got = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen)
        uncached = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **dict(gen, use_cache=False))
    assert torch.equal(got, expected)
    assert torch.equal(got, uncached)


def test_every_layer_without_heads():
    model = make_model("gemma4")
    inputs = inputs_for(model)
    nothing = {f"self.{i}": [] for i in range(7)}
    expected = forward(zeroed_oracle(model, nothing), inputs)
    headcut.slim(model, {"keep": nothing})
    assert headcut.info(model).total_heads == 0
    assert (forward(model, inputs) - expected).abs().max().item() <= ATOL
    # the store layers still compute their keys and values, one placeholder query head per KV head
    assert [attn(model, i).q_proj.out_features for i in range(7)] == [0, 0, 0, 2 * 12, 3 * 16, 0, 0]
    ids = inputs["input_ids"]
    with torch.no_grad():
        cached = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
        plain = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False, use_cache=False
        )
    assert torch.equal(cached, plain)
    check_reload(model, inputs, forward(model, inputs))


def test_attention_weights_of_a_padded_store_layer_are_the_kept_heads():
    model = make_model("gemma4", seed=2)
    model.set_attn_implementation("eager")
    inputs = inputs_for(model)
    keep = {"self.3": [1, 2, 3], "self.4": [5], "self.6": [0, 3]}
    with torch.no_grad(), headcut.gated(model, {"keep": keep}):
        full = model(**inputs, output_attentions=True).attentions
    headcut.slim(model, {"keep": keep})
    with torch.no_grad():
        cut = model(**inputs, output_attentions=True).attentions
    for i in (3, 4, 6):
        assert torch.allclose(cut[i], full[i][:, keep[f"self.{i}"]], atol=ATOL, rtol=0), i


# ---- saving -------------------------------------------------------------------------------------------------


def test_saved_config_keeps_the_original_per_layer_counts():
    model = make_model("gemma4", "Gemma4TextModel")
    original = model.config.to_dict()["per_layer_config"]
    keep = {"self.1": [3, 4, 5], "self.3": [2], "self.4": [], "self.6": [0, 1]}
    out = slim_equals_gated(model, keep, gqa="auto")
    with tempfile.TemporaryDirectory() as tmp:
        headcut.save(model, Path(tmp) / "slim")
        saved = json.loads((Path(tmp) / "slim" / "config.json").read_text())
        assert saved["per_layer_config"] == original and saved["num_key_value_heads"] == 2
        assert set(saved["headcut"]["blocks"]) == set(keep)
        assert "class HeadcutGemma4Attention" in (Path(tmp) / "slim" / "headcut_runtime.py").read_text()
    check_reload(model, inputs_for(model), out)


def test_cuts_are_exact_in_float64():
    """Slimmed equals gated to rounding in float64 too (with head sizes of 8, float32 sums in another order
    differ by ~1e-5 on this model; with 12 and 16 they are bitwise equal)."""
    model = make_model("gemma4").double()
    inputs = inputs_for(model)
    blocks = headcut.model_blocks(model)
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for policy in ("duplicate", "auto"):
        keep = {}
        for b in blocks:
            if policy == "auto" and b.kv_heads < b.heads:  # whole KV groups where there are groups
                groups = torch.randperm(b.kv_heads, generator=g)[: 1 + b.layer % b.kv_heads].tolist()
                keep[b.name] = sorted(h for h in range(b.heads) if h // b.group_size in groups)
            else:
                count = int(torch.randint(0, b.heads + 1, (1,), generator=g))
                keep[b.name] = sorted(torch.randperm(b.heads, generator=g)[:count].tolist())
        cut = copy.deepcopy(model)
        with headcut.gated(cut, {"keep": keep}):
            expected = forward(cut, inputs)
        headcut.slim(cut, {"keep": keep}, gqa=policy)
        worst = max(worst, (forward(cut, inputs) - expected).abs().max().item())
    assert worst <= 1e-10, worst
