"""Exact head surgery on tiny random models of every supported family.

Slimmed outputs must equal gated outputs, and saved models must reload (headcut's loader and
transformers with trust_remote_code) with the same outputs."""

from __future__ import annotations

import tempfile

import pytest
import torch
from helpers import ATOL, CLASSES, FAMILIES, GENERATORS, GQA_DECODERS, check_reload, forward, make_inputs, make_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import headcut

CASES = [(f, c) for f in FAMILIES for c in CLASSES[f]]


def draw_mask(data, blocks) -> dict:
    """A random non-uniform keep-mask with at least one empty and one full block."""
    keep = {}
    for b in blocks:
        keep[b.name] = sorted(data.draw(st.sets(st.integers(0, b.heads - 1), max_size=b.heads), label=b.name))
    empty = data.draw(st.integers(0, len(blocks) - 1), label="empty block")
    keep[blocks[empty].name] = []
    full = (empty + 1 + data.draw(st.integers(0, len(blocks) - 2), label="full block")) % len(blocks)
    keep[blocks[full].name] = list(range(blocks[full].heads))
    return {"keep": keep}


@pytest.mark.parametrize("family,cls_name", CASES)
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_slimmed_equals_gated(family, cls_name, data):
    model = make_model(family, cls_name)
    inputs = make_inputs(family, model)
    blocks = headcut.model_blocks(model)
    mask = draw_mask(data, blocks)
    with headcut.gated(model, mask):
        gated = forward(model, inputs)
    result = headcut.slim(model, mask, gqa="duplicate")
    assert result.total_after == sum(len(v) for v in mask["keep"].values())
    assert [b.heads for b in headcut.model_blocks(model)] == [len(mask["keep"][b.name]) for b in blocks]
    slimmed = forward(model, inputs)
    assert (slimmed - gated).abs().max().item() <= ATOL


@pytest.mark.parametrize("family,cls_name", CASES)
def test_slimmed_model_reloads_by_both_routes(family, cls_name):
    """Once per class (not per drawn mask): a mask with an empty block, a full block and a subset."""
    model = make_model(family, cls_name)
    inputs = make_inputs(family, model)
    blocks = headcut.model_blocks(model)
    keep = {b.name: list(range(0, b.heads, 2)) for b in blocks}
    keep[blocks[0].name] = []
    keep[blocks[-1].name] = list(range(blocks[-1].heads))
    headcut.slim(model, {"keep": keep}, gqa="duplicate")
    check_reload(model, inputs, forward(model, inputs))


@pytest.mark.parametrize("family", FAMILIES)
def test_all_heads_kept_changes_nothing(family):
    model = make_model(family)
    inputs = make_inputs(family, model)
    before = forward(model, inputs)
    params = headcut.count_params(model)
    headcut.slim(model, {"keep": {}})
    assert headcut.count_params(model) == params
    assert torch.equal(forward(model, inputs), before)


@pytest.mark.parametrize("family", FAMILIES)
def test_slim_twice_composes(family):
    model = make_model(family, seed=3)
    inputs = make_inputs(family, model)
    blocks = headcut.model_blocks(model)
    first = {b.name: list(range(1, b.heads)) for b in blocks}  # drop head 0 everywhere
    second = {blocks[0].name: [0], blocks[-1].name: []}  # then keep one / none (current numbering)
    combined = dict(first)
    combined[blocks[0].name] = [first[blocks[0].name][0]]
    combined[blocks[-1].name] = []
    with headcut.gated(model, {"keep": combined}):
        expected = forward(model, inputs)
    headcut.slim(model, {"keep": first}, gqa="duplicate")
    headcut.slim(model, {"keep": second}, gqa="duplicate")
    assert (forward(model, inputs) - expected).abs().max().item() <= ATOL
    record = model.config.headcut["blocks"]
    assert record[blocks[0].name]["q"] == [1]
    check_reload(model, inputs, forward(model, inputs))


@pytest.mark.parametrize("family", list(GENERATORS))
@pytest.mark.parametrize("empty_layers", [False, True])
def test_cached_generation_matches_gated(family, empty_layers):
    model = make_model(family, GENERATORS[family], seed=5)
    model.generation_config.pad_token_id = 0
    blocks = headcut.model_blocks(model)
    g = torch.Generator().manual_seed(7)
    keep = {}
    for b in blocks:
        if empty_layers and b.layer == 0:
            keep[b.name] = []  # layer 0 reads the cache length: the hardest case
        else:
            n = max(1, b.heads // 2)
            keep[b.name] = sorted(torch.randperm(b.heads, generator=g)[:n].tolist())
    mask = {"keep": keep}
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(8))
    gen = dict(max_new_tokens=8, do_sample=False, use_cache=True, num_beams=1)
    with torch.no_grad():
        with headcut.gated(model, mask):
            expected = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen)
        headcut.slim(model, mask, gqa="duplicate")
        got = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **gen)
        uncached = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **dict(gen, use_cache=False))
    assert torch.equal(got, expected)
    assert torch.equal(got, uncached)


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2", "t5", "albert"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_is_preserved(family, dtype):
    model = make_model(family).to(dtype)
    blocks = headcut.model_blocks(model)
    headcut.slim(model, {"drop": {blocks[0].name: [0]}}, gqa="duplicate")
    with tempfile.TemporaryDirectory() as tmp:
        headcut.save(model, f"{tmp}/m")
        again = headcut.load(f"{tmp}/m")
        assert next(again.parameters()).dtype == dtype
        sd1, sd2 = model.state_dict(), again.state_dict()
        for k, v in sd1.items():
            assert torch.equal(v, sd2[k]), k


# every GQA policy on every family with grouped-query attention: query heads h // 3 read KV head h // 3
# of the tiny configs' 6 query and 2 KV heads; layer 0 always loses every head
GQA_POLICY_MASKS = {
    # policy -> (kept query heads of layers 1 and 2, KV heads each then has)
    "group": (([3, 4, 5], [0, 1, 2, 3, 4, 5]), (1, 2)),
    "uniform": (([0, 2, 4, 5], [1, 4]), (2, 2)),
    "duplicate": (([0, 1, 3], [5]), (3, 1)),
}


@pytest.mark.parametrize("family", GQA_DECODERS)
@pytest.mark.parametrize("policy", list(GQA_POLICY_MASKS))
def test_every_gqa_policy_is_exact(family, policy):
    model = make_model(family, GENERATORS[family], seed=9)
    inputs = make_inputs(family, model)
    blocks = headcut.model_blocks(model)
    assert [(b.heads, b.kv_heads) for b in blocks[:3]] == [(6, 2)] * 3
    (one, two), kv = GQA_POLICY_MASKS[policy]
    mask = {"keep": {blocks[0].name: [], blocks[1].name: one, blocks[2].name: two}}
    with headcut.gated(model, mask):
        expected = forward(model, inputs)
    headcut.slim(model, mask, gqa=policy)
    after = headcut.model_blocks(model)
    assert [(b.heads, b.kv_heads) for b in after[:3]] == [(0, 0), (len(one), kv[0]), (len(two), kv[1])]
    assert (forward(model, inputs) - expected).abs().max().item() <= ATOL
    check_reload(model, inputs, expected)
