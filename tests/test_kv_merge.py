"""Merging KV heads (headcut.model.kv_merge, headcut.pruning.kv_merge): the closed forms are exact where they must
be, the structural cut computes what the merged model computed, saved and loaded back, and the blocks merged are
the ones measured cheapest."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import make_model, one_line_error, run, save_tiny, tiny_lm

import headcut
from headcut.errors import HeadcutError
from headcut.model import kv_merge as km
from headcut.model.surgery import model_blocks, reshape
from headcut.pruning.kv_merge import merge_kv_heads

torch.manual_seed(0)


def causal(family: str = "llama", **config) -> torch.nn.Module:
    return make_model(
        family, "LlamaForCausalLM" if family == "llama" else f"{family.capitalize()}ForCausalLM", **config
    )


def inputs(vocab: int, n: int = 4, t: int = 24, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.double()


def moments(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, km.InputMoments]:
    base = model.base_model
    blocks = model_blocks(model)
    out = {b.name: km.InputMoments(int(base.get_submodule(b.k).weight.shape[1])) for b in blocks}
    hooks = [base.get_submodule(b.k).register_forward_pre_hook(lambda m, a, n=b.name: out[n].add(a[0])) for b in blocks]
    logits(model, ids)
    for h in hooks:
        h.remove()
    return out


def rotate_pairs(rows: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """One head's rows (d x in) with each RoPE pair (j, j + d/2) multiplied by the complex ``alpha[j]``."""
    d = rows.shape[0]
    z = torch.complex(rows[: d // 2], rows[d // 2 :]) * alpha[:, None]
    return torch.cat([z.real, z.imag])


def test_an_unmerged_cluster_changes_nothing():
    model = causal().double()
    ids = inputs(model.config.vocab_size)
    block = model_blocks(model)[1]
    w = km.read_block(model.base_model, block)
    stats = moments(model, ids)[block.name]
    merged = km.merge_block(w, block, [[g] for g in range(block.kv_heads)], stats, centered=False)
    for name in ("q", "k", "v", "o"):
        assert torch.equal(getattr(merged.weights, name), getattr(w, name))


@pytest.mark.parametrize("centered", [False, True])
def test_groups_that_differ_by_a_rope_commuting_rotation_merge_exactly(centered):
    """Group 1's keys are group 0's with every RoPE pair multiplied by a complex scalar, its values group 0's: the
    merged block (one KV head, every query head kept, queries re-aligned) computes exactly what the block did, at
    every position (the alignment commutes with the rotary embedding)."""
    model = causal()
    model.double()
    base = model.base_model
    block = model_blocks(model)[1]
    d = block.head_dim
    with torch.no_grad():
        k = base.get_submodule(block.k).weight
        v = base.get_submodule(block.v).weight
        angle = torch.rand(d // 2, dtype=torch.float64) * 6.0
        alpha = torch.polar(0.5 + torch.rand(d // 2, dtype=torch.float64), angle)
        k[d : 2 * d] = rotate_pairs(k[:d].clone(), alpha)
        v[d : 2 * d] = v[:d]
    ids = inputs(model.config.vocab_size)
    reference = logits(model, ids)
    stats = moments(model, ids)[block.name]
    merged = km.merge_block(km.read_block(base, block), block, [[0, 1]], stats, centered=centered)
    assert merged.error["keys"] < 1e-10 and merged.error["values"] < 1e-10
    km.write_block(base, block, merged.weights)
    if centered:
        assert merged.o_bias_delta is not None and merged.o_bias_delta.abs().max() < 1e-8
    reshape(model, {block.name: km.merge_cut(block, merged.clusters)})
    after = model_blocks(model)[1]
    assert (after.heads, after.kv_heads) == (block.heads, 1)
    torch.testing.assert_close(logits(model, ids), reference, atol=1e-8, rtol=1e-8)


def test_the_structural_cut_computes_what_the_merged_weights_computed_and_loads_back(tmp_path):
    """Any merge written at the original shape, then cut to one KV head per cluster: the same logits; saved and
    loaded back by headcut.load: the same again."""
    model = causal(num_attention_heads=8, num_key_value_heads=4, hidden_size=64)
    ids = inputs(model.config.vocab_size)
    before = logits(model, ids)
    stats = moments(model, ids)
    base = model.base_model
    cuts = {}
    for block in model_blocks(model)[:2]:
        clusters = [[0, 2], [1, 3]] if block.layer == 0 else [[0, 1, 2, 3]]
        merged = km.merge_block(km.read_block(base, block), block, clusters, stats[block.name], centered=False)
        km.write_block(base, block, merged.weights)
        cuts[block.name] = km.merge_cut(block, merged.clusters)
    expanded = logits(model, ids)
    assert not torch.allclose(expanded, before, atol=1e-3)  # a real merge
    reshape(model, cuts)
    assert [(b.heads, b.kv_heads) for b in model_blocks(model)] == [(8, 2), (8, 1), (8, 4)]
    torch.testing.assert_close(logits(model, ids), expanded, atol=1e-5, rtol=1e-5)
    model.save_pretrained(tmp_path / "m")
    loaded = headcut.load(tmp_path / "m")
    assert [(b.heads, b.kv_heads) for b in model_blocks(loaded)] == [(8, 2), (8, 1), (8, 4)]
    torch.testing.assert_close(logits(loaded, ids), expanded, atol=1e-5, rtol=1e-5)


def attention_output(model: torch.nn.Module, block, ids: torch.Tensor) -> torch.Tensor:
    """What ``block``'s output projection writes, over ``ids``."""
    out = []
    handle = model.base_model.get_submodule(block.o).register_forward_hook(lambda m, a, o: out.append(o.detach()))
    logits(model, ids)
    handle.remove()
    return torch.cat(out)


@pytest.mark.parametrize("merge_to", [1, 2])
def test_aligned_least_squares_merge_beats_the_plain_mean(merge_to):
    """On a random block, the closed-form merge's output error on the calibration inputs is well below that of
    averaging the groups' keys and values (the naive merge the issue measured), and so is each part alone."""
    model = causal(num_attention_heads=8, num_key_value_heads=4, hidden_size=64).double()
    ids = inputs(model.config.vocab_size, n=8, t=32)
    base = model.base_model
    block = model_blocks(model)[0]
    d = block.head_dim
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # related groups, as in a trained model: keys turned and scaled per RoPE pair, values
        k = base.get_submodule(block.k).weight  # mixed within the head, each with some noise of its own
        v = base.get_submodule(block.v).weight
        for group in range(1, block.kv_heads):
            alpha = torch.polar(
                0.5 + torch.rand(d // 2, generator=g, dtype=torch.float64),
                torch.rand(d // 2, generator=g, dtype=torch.float64) * 6,
            )
            k[group * d : (group + 1) * d] = rotate_pairs(k[:d], alpha) + 0.05 * torch.randn(d, k.shape[1], generator=g)
            mix = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
            v[group * d : (group + 1) * d] = mix @ v[:d] + 0.05 * torch.randn(d, v.shape[1], generator=g)
    reference = attention_output(model, block, ids)
    original = km.read_block(base, block)
    stats = moments(model, ids)[block.name]
    clusters = [[0, 1, 2, 3]] if merge_to == 1 else [[0, 1], [2, 3]]
    merged = km.merge_block(original, block, clusters, stats, centered=False)
    km.write_block(base, block, merged.weights)
    ours = (attention_output(model, block, ids) - reference).pow(2).mean()
    mean = km.read_block(base, block)
    for part in ("k", "v"):
        rows = getattr(original, part).reshape(block.kv_heads, d, -1)
        for cluster in clusters:
            getattr(mean, part).reshape(block.kv_heads, d, -1)[cluster] = rows[cluster].mean(0)
    mean.q, mean.o = original.q.clone(), original.o.clone()
    km.write_block(base, block, mean)
    naive = (attention_output(model, block, ids) - reference).pow(2).mean()
    assert ours < 0.2 * naive, (float(ours), float(naive))


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return tiny_lm(tmp_path_factory.mktemp("merge"), num_attention_heads=8, num_key_value_heads=4)


def _calibration(folder, text):
    from headcut.data import DataConfig, load_calibration, load_tokenizer

    model = headcut.load(folder)
    config = DataConfig(path=str(text), seq_len=32, max_examples=8)
    return model, load_calibration(model, load_tokenizer(folder), config)


def test_the_cheapest_blocks_are_merged_and_costly_ones_kept_whole(lm):
    """Each block's cost is measured alone; the cheapest are merged; a block over the threshold is merged only when
    too few are under it, and the result says so."""
    folder, text = lm
    model, cal = _calibration(folder, text)
    everything = merge_kv_heads(model, cal, cal, layers=3, to=2, max_cost=1e9)
    costs = {c.block: c.cost for c in everything.layers}
    assert len(costs) == 3 and len(set(costs.values())) == 3 and all(c.merged for c in everything.layers)
    cheapest = min(costs, key=costs.get)
    middle = sorted(costs.values())[1]
    model, cal = _calibration(folder, text)
    one = merge_kv_heads(model, cal, cal, layers=1, to=2, max_cost=middle - 1e-9)
    assert one.merged == [cheapest] and not one.notes
    assert {c.block: c.over_threshold for c in one.layers} == {b: c > middle - 1e-9 for b, c in costs.items()}
    assert [(b.name, b.heads, b.kv_heads) for b in model_blocks(model) if b.kv_heads == 2] == [(cheapest, 8, 2)]
    assert one.kv_heads_before == 12 and one.kv_heads_after == 10
    model, cal = _calibration(folder, text)
    two = merge_kv_heads(model, cal, cal, layers=2, to=2, max_cost=middle - 1e-9)
    assert len(two.merged) == 2 and cheapest in two.merged
    assert len(two.notes) == 1 and "whose merge alone cost more than" in two.notes[0]
    # the measured costs are those of the merged block alone: the same in every run
    assert {c.block: c.cost for c in two.layers} == pytest.approx(costs, rel=1e-6)


def test_the_merge_stage_from_flags_and_keywords_loads_back_and_writes_decilm(lm, tmp_path):
    folder, text = lm
    args = ["--method", "magnitude", "--keep", 20, "--data", text, "--seq-len", 32, "--max-examples", 8]
    out = tmp_path / "cli"
    done = run(
        "prune", folder, *args, "--merge-layers", 2, "--merge-to", 1, "--out", out, "--format", "safetensors,decilm"
    )
    assert done.exit_code == 0, done.output
    assert "merge: the KV heads of 2 blocks merged into 1 each" in done.output
    report = json.loads((out / "headcut-report.json").read_text())
    assert [next(iter(s)) for s in report["recipe"]["stages"]] == ["choose", "cut", "merge"]
    merged = report["merge"]
    assert len(merged["blocks"]) == 2 and merged["kv_heads"]["after"] < merged["kv_heads"]["before"]
    assert merged["kv_bytes"]["after"] < merged["kv_bytes"]["before"]
    loaded = headcut.load(out)
    for block in model_blocks(loaded):
        assert block.kv_heads == (1 if block.name in merged["blocks"] else block.kv_heads)
    api = headcut.prune(
        str(folder),
        method="magnitude",
        keep=20,
        data=str(text),
        data_options={"seq_len": 32, "max_examples": 8},
        merge_layers=2,
    )
    ids = inputs(loaded.config.vocab_size)
    torch.testing.assert_close(logits(loaded, ids), logits(api.model, ids), atol=1e-5, rtol=1e-5)
    # DeciLM (per-layer KV heads, every query head): what vLLM computes with its weights is the merged model's
    from test_decilm import _reference

    torch.testing.assert_close(logits(_reference(out, out / "decilm"), ids), logits(loaded, ids), atol=1e-5, rtol=1e-5)


def test_merging_is_refused_where_it_cannot_be_exact_or_has_no_data(lm, tmp_path):
    folder, text = lm
    one_line_error(
        run("prune", folder, "--method", "magnitude", "--keep", 20, "--merge-layers", 1, "--out", tmp_path / "a"),
        "--merge-layers merges KV heads on the second moments of calibration data",
        "it needs --data",
    )
    qwen3 = save_tiny(tmp_path / "qwen3", "qwen3", "Qwen3ForCausalLM")
    one_line_error(
        run(
            "prune",
            qwen3,
            "--method",
            "magnitude",
            "--keep",
            12,
            "--data",
            text,
            "--seq-len",
            32,
            "--merge-layers",
            1,
            "--out",
            tmp_path / "b",
        ),
        "cannot merge qwen3's KV heads",
    )
    one_line_error(
        _merge_one(folder, text, tmp_path / "c", keep=20, to=3),
        "no block of this model has more than 3 KV heads in a multiple of 3",
    )


def _merge_one(folder, text, out, keep: int, to: int, *extra):
    """``headcut prune`` (magnitude) to ``keep`` heads with one layer's KV heads merged into ``to``."""
    return run(
        "prune", folder, "--method", "magnitude", "--keep", keep, "--data", text, "--seq-len", 32,
        "--merge-layers", 1, "--merge-to", to, "--out", out, *extra,
    )  # fmt: skip


def test_a_merged_record_that_pairs_a_query_head_outside_its_cluster_is_refused(lm, tmp_path):
    folder, text = lm
    out = tmp_path / "m"
    assert _merge_one(folder, text, out, 24, 2, "-q").exit_code == 0
    config = json.loads((out / "config.json").read_text())
    name, entry = next(iter(config["headcut"]["blocks"].items()))
    assert entry["merged"] and len(entry["merged"]) == 2
    entry["merged"] = [list(reversed(entry["merged"][0])), entry["merged"][1]]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadcutError, match="merged does not list each KV slot's heads"):
        headcut.load(out)


def test_a_merged_record_is_format_2_and_a_plain_one_stays_format_1(lm, tmp_path):
    """A headcut that predates merging refuses a merged model as newer than itself (format 2), while every other
    cut keeps format 1, which every headcut reads; format 1 cannot hold merged heads."""
    folder, text = lm
    args = ["--method", "magnitude", "--data", text, "--seq-len", 32, "-q"]
    assert run("prune", folder, "--keep", 24, *args, "--merge-layers", 1, "--out", tmp_path / "m").exit_code == 0
    assert run("prune", folder, "--keep", 20, *args, "--out", tmp_path / "p").exit_code == 0
    merged = json.loads((tmp_path / "m" / "config.json").read_text())
    plain = json.loads((tmp_path / "p" / "config.json").read_text())
    assert merged["headcut"]["format"] == 2 and plain["headcut"]["format"] == 1
    merged["headcut"]["format"] = 1
    (tmp_path / "m" / "config.json").write_text(json.dumps(merged))
    with pytest.raises(HeadcutError, match="merged KV heads in a format 1 record"):
        headcut.load(tmp_path / "m")
