"""Head-importance scorers on tiny random models of every supported family."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import CLASSES, FAMILIES, V, loss_class, make_batch, make_model

import headcut
from headcut.model.gating import HeadGates
from headcut.scoring import SCORERS, HeadScores, ScoreConfig, get_scorer, score
from headcut.scoring.attention_maps import eager_attention, maps_by_block
from headcut.scoring.entropy import rectified_entropy
from headcut.scoring.gradient import per_example_gate_grads


def finite(scores: HeadScores) -> bool:
    return all(math.isfinite(v) for values in scores.blocks.values() for v in values)


def check_shapes(model, scores: HeadScores) -> None:
    blocks = headcut.model_blocks(model)
    assert list(scores.blocks) == [b.name for b in blocks]
    for b in blocks:
        assert len(scores.blocks[b.name]) == b.heads, b.name
        groups = scores.kv_groups[b.name]
        if b.heads and b.group_size > 1:
            assert groups is not None and len(groups) == b.kv_heads
        else:
            assert groups is None
    assert finite(scores)


# --------------------------------------------------------------------------------------------
# every scorer, every family


def maps_refused(model, name: str, batches) -> bool:
    """A scorer that reads attention maps refuses a model with blocks that have none (Qwen3.5's linear
    attention), naming them; True when it did."""
    if name not in ("confidence", "entropy") or all(b.mixer == "attention" for b in headcut.model_blocks(model)):
        return False
    with pytest.raises(
        headcut.HeadcutError, match=rf"{name} reads attention maps, and blocks self\.0.* linear attention"
    ):
        score(model, batches, name)
    return True


@pytest.mark.parametrize("family", FAMILIES)
def test_every_scorer_on_every_family(family):
    model = make_model(family, loss_class(family))
    batches = [make_batch(model, seed=0), make_batch(model, seed=1, batch=2)]
    for name, scorer in SCORERS.items():
        if maps_refused(model, name, batches):
            continue
        result = score(model, batches if scorer.needs_data else None, ScoreConfig(scorer=name))
        check_shapes(model, result)
        assert result.scorer == name
        assert result.examples == (5 if scorer.needs_data else 0)
        assert result.higher_is_important == (name != "entropy")
        assert set(result.to_json()) == {"scorer", "blocks", "kv_groups", "examples", "seconds", "higher_is_important"}
        assert any(v != 0 for values in result.blocks.values() for v in values), name
    again = score(model, batches, ScoreConfig(scorer="gradient", abs_per="batch"))
    check_shapes(model, again)
    for objective in ("loss", "logits-norm"):
        check_shapes(model, score(model, batches, ScoreConfig(scorer="gnorm", objective=objective)))


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_head_blocks_after_slim(family):
    model = make_model(family, loss_class(family))
    blocks = headcut.model_blocks(model)
    keep = {blocks[0].name: [], blocks[-1].name: [0, blocks[-1].heads - 1]}
    headcut.slim(model, {"keep": keep}, gqa="duplicate")
    batch = make_batch(model)
    for name, scorer in SCORERS.items():
        if maps_refused(model, name, [batch]):
            continue
        result = score(model, [batch] if scorer.needs_data else None, name)
        check_shapes(model, result)
        assert result.blocks[blocks[0].name] == []
        assert len(result.blocks[blocks[-1].name]) == 2


@pytest.mark.parametrize("family,cls_name", [(f, c) for f in FAMILIES for c in CLASSES[f]])
def test_attention_maps_map_to_blocks(family, cls_name):
    """Every class's attention tuples land on the blocks of the right kind, heads and lengths."""
    model = make_model(family, cls_name)
    batch = make_batch(model)
    if maps_refused(model, "confidence", [batch]):
        return
    if model.config.is_encoder_decoder and "labels" not in batch and not cls_name.endswith("EncoderModel"):
        batch["decoder_input_ids"] = torch.randint(3, V, (3, 5))
    with eager_attention(model), torch.no_grad():
        out = model(**batch, output_attentions=True)
    maps = maps_by_block(out, headcut.model_blocks(model))
    enc_len = batch["input_ids"].shape[1] if "input_ids" in batch else None
    for b in headcut.model_blocks(model):
        bsz, heads, t, s = maps[b.name].shape
        assert heads == b.heads and bsz == 3
        if b.kind in ("self", "encoder") and enc_len is not None:
            assert (t, s) == (enc_len, enc_len)
        dec_len = batch["labels"].shape[1] if batch.get("labels", torch.zeros(0)).dim() == 2 else enc_len
        if b.kind == "cross":
            assert s == enc_len and t == dec_len
        if b.kind == "decoder":
            assert t == s == dec_len
    for name in ("confidence", "entropy"):
        check_shapes(model, score(model, [batch], name))


# --------------------------------------------------------------------------------------------
# gradient


def gated_loss(model, batch, values: dict[str, torch.Tensor]) -> float:
    gates = HeadGates(model)
    gates.gates.update(values)
    with gates.installed(), torch.no_grad():
        out = model(**batch)
    if type(model).__name__.endswith("ForCausalLM"):
        # transformers computes causal-LM losses in float32; finite differences need float64
        logits, labels = out.logits[:, :-1], batch["labels"][:, 1:]
        return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)))
    return float(out.loss)


def ones(model, dtype=torch.float64) -> dict[str, torch.Tensor]:
    return {b.name: torch.ones(b.heads, dtype=dtype) for b in headcut.model_blocks(model)}


def finite_difference(model, batch, step: float = 1e-5) -> dict[str, torch.Tensor]:
    """dL/dg_h at g = 1 by central differences (float64 model)."""
    out = {}
    for b in headcut.model_blocks(model):
        grads = []
        for h in range(b.heads):
            plus, minus = ones(model), ones(model)
            plus[b.name][h] += step
            minus[b.name][h] -= step
            grads.append((gated_loss(model, batch, plus) - gated_loss(model, batch, minus)) / (2 * step))
        out[b.name] = torch.tensor(grads, dtype=torch.float64)
    return out


def single(batch: dict, i: int) -> dict:
    return {k: v[i : i + 1] for k, v in batch.items()}


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_gradient_matches_finite_differences(family):
    model = make_model(family, loss_class(family)).double()
    batch = make_batch(model, batch=3)
    # Llama's norms and rotary embeddings compute in float32 even in a float64 model: a larger step
    step, tol = (1e-5, {"rtol": 1e-4, "atol": 1e-7}) if family == "bert" else (3e-3, {"rtol": 1e-3, "atol": 1e-4})
    fd_batch = finite_difference(model, batch, step)
    fd_examples = [finite_difference(model, single(batch, i), step) for i in range(3)]
    per_batch = score(model, [batch], ScoreConfig(scorer="gradient", abs_per="batch"))
    per_example = score(model, [batch], ScoreConfig(scorer="gradient", abs_per="example"))
    signs_differ = 0
    for b in headcut.model_blocks(model):
        expected_batch = fd_batch[b.name].abs()
        stacked = torch.stack([fd[b.name] for fd in fd_examples])  # (examples, heads)
        expected_example = stacked.abs().mean(dim=0)
        assert torch.allclose(torch.tensor(per_batch.blocks[b.name], dtype=torch.float64), expected_batch, **tol)
        assert torch.allclose(torch.tensor(per_example.blocks[b.name], dtype=torch.float64), expected_example, **tol)
        differ = (stacked > tol["atol"]).any(dim=0) & (stacked < -tol["atol"]).any(dim=0)
        signs_differ += int(differ.sum())
        # where the examples' gradients disagree in sign, the variants disagree (example > batch for
        # a mean-over-examples loss; for token losses the batch weights examples by their tokens)
        ex = torch.tensor(per_example.blocks[b.name], dtype=torch.float64)
        bt = torch.tensor(per_batch.blocks[b.name], dtype=torch.float64)
        assert torch.all((ex - bt).abs()[differ] > 1e-6)
        if family == "bert":
            assert torch.all(ex >= bt * (1 - 1e-5))
    assert signs_differ > 0


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2", "t5", "bart", "albert"])
def test_per_example_gradient_one_backward_equals_loop(family):
    model = make_model(family, loss_class(family))
    if family == "bert":
        model = make_model(family, "BertForMaskedLM")
    batch = make_batch(model, batch=3)
    blocks = headcut.model_blocks(model)
    gates = HeadGates(model, requires_grad=True)
    with gates.installed():
        grads, weights = per_example_gate_grads(model, gates, blocks, batch)
    assert torch.all(weights > 0) and abs(float(weights.sum()) - 1) < 1e-6
    assert all(p.grad is None for p in model.parameters())  # one backward, w.r.t. the gates only
    for i in range(3):
        looped = HeadGates(model, requires_grad=True)
        with looped.installed():
            model(**single(batch, i)).loss.backward()
        for b in blocks:
            assert torch.allclose(grads[b.name][i], looped.gates[b.name].grad, rtol=1e-4, atol=1e-6), (b.name, i)


def test_scoring_changes_nothing_and_restores_state():
    model = make_model("bert", "BertForSequenceClassification")
    model.train()
    model.bert.encoder.layer[0].eval()  # mixed flags are restored exactly
    before = {k: v.clone() for k, v in model.state_dict().items()}
    impl = model.config._attn_implementation
    calls = []
    batches = [make_batch(model, seed=s) for s in range(3)]
    for name in SCORERS:
        calls.clear()
        score(model, batches, ScoreConfig(scorer=name), progress=lambda d, t: calls.append((d, t)))
        if SCORERS[name].needs_data:
            assert calls == [(1, 3), (2, 3), (3, 3)]
        assert model.training and not model.bert.encoder.layer[0].training and model.bert.encoder.layer[1].training
        assert model.config._attn_implementation == impl
        assert all(p.grad is None for p in model.parameters())
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())

    def boom(done, total):
        raise RuntimeError("interrupted")

    for name in ("entropy", "gnorm"):
        with pytest.raises(RuntimeError):
            score(model, batches, ScoreConfig(scorer=name), progress=boom)
        assert model.config._attn_implementation == impl and model.training
        assert all(p.grad is None for p in model.parameters())


def test_gnorm_enables_frozen_weights_only_for_the_pass():
    model = make_model("bert", "BertForSequenceClassification")
    for p in model.parameters():
        p.requires_grad_(False)
    result = score(model, [make_batch(model)], "gnorm")
    assert finite(result) and all(v > 0 for vs in result.blocks.values() for v in vs)
    assert not any(p.requires_grad for p in model.parameters())


# --------------------------------------------------------------------------------------------
# gnorm


def manual_norms(model, batch, objective: str):
    """Per block: (q, k, v) per-head gradient-block norms for one batch, by hand (.grad)."""
    m = copy.deepcopy(model)
    out = m(**batch)
    value = out.loss if objective == "loss" else torch.norm(out.logits)
    value.backward()
    norms = {}
    for b in headcut.model_blocks(m):
        base = m.base_model
        d = b.head_dim
        if b.fused_qkv:  # Conv1D: weight is (in, 3 * heads * d)
            grad = base.get_submodule(b.q).weight.grad.t()
            width = grad.shape[0] // 3
            q, k, v = (grad[i * width : (i + 1) * width] for i in range(3))
        else:
            q = base.get_submodule(b.q).weight.grad
            k = base.get_submodule(b.k).weight.grad
            v = base.get_submodule(b.v).weight.grad
        nq = torch.stack([q[h * d : (h + 1) * d].norm() for h in range(b.heads)])
        nk = torch.stack([k[g * d : (g + 1) * d].norm() for g in range(b.kv_heads)])
        nv = torch.stack([v[g * d : (g + 1) * d].norm() for g in range(b.kv_heads)])
        norms[b.name] = (nq, nk, nv)
    return norms


@pytest.mark.parametrize(
    "family,objective", [("bert", "loss"), ("bert", "logits-norm"), ("gpt2", "loss"), ("llama", "loss")]
)
def test_gnorm_equals_manual_computation(family, objective):
    model = make_model(family, "BertForSequenceClassification" if family == "bert" else loss_class(family))
    batches = [make_batch(model, seed=0)]
    if family == "bert":
        batches.append(make_batch(model, seed=1, batch=2))
        batches[1]["attention_mask"][:] = 1  # classification logits: the norm is over the whole (B, C)
    manual = [manual_norms(model, b, objective) for b in batches]
    result = score(model, batches, ScoreConfig(scorer="gnorm", objective=objective))
    for b in headcut.model_blocks(model):
        nq, nk, nv = (sum(m[b.name][i] for m in manual) / len(manual) for i in range(3))  # mean over batches
        group = torch.arange(b.heads) // b.group_size
        expected = nq * nk[group] * nv[group]
        assert torch.allclose(
            torch.tensor(result.blocks[b.name], dtype=torch.float32), expected, rtol=1e-4, atol=1e-9
        ), b.name


def test_gnorm_albert_shares_scores_across_layers():
    model = make_model("albert", loss_class("albert"))
    batch = make_batch(model)
    blocks = headcut.model_blocks(model)
    assert len({b.shared for b in blocks}) == 1 and blocks[0].shared is not None
    for name in ("gnorm", "value-l1", "magnitude"):
        result = score(model, [batch], name)
        first = result.blocks[blocks[0].name]
        assert all(result.blocks[b.name] == first for b in blocks), name
    for name in ("gradient", "confidence", "entropy"):  # these see every layer's call
        result = score(model, [batch], name)
        rows = [tuple(result.blocks[b.name]) for b in blocks]
        assert len(set(rows)) == len(blocks), name


# --------------------------------------------------------------------------------------------
# attention scorers


@pytest.mark.parametrize(
    "family", ["bert", "distilbert", "albert", "deberta-v2", "gpt2", "llama", "bart", "marian", "t5"]
)
def test_attention_scorers_ignore_padding(family):
    model = make_model(family, loss_class(family))
    plain = make_batch(model, seed=4)
    padded = make_batch(model, seed=4, pad=5)
    assert padded["input_ids"].shape[1] == plain["input_ids"].shape[1] + 5
    for name in ("confidence", "entropy"):
        a = score(model, [plain], name)
        b = score(model, [padded], name)
        for block, values in a.blocks.items():
            assert torch.allclose(torch.tensor(values), torch.tensor(b.blocks[block]), rtol=2e-6, atol=2e-7), (
                name,
                block,
            )


def plain_entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * torch.log(p)).sum(dim=-1)


def test_rectified_entropy_is_finite_where_plain_entropy_fails():
    one_hot = torch.zeros(2, 3, 5, 7)
    one_hot[..., 2] = 1.0
    g = torch.Generator().manual_seed(0)
    peaked = torch.softmax(torch.randn(2, 3, 5, 7, generator=g) * 1e4, dim=-1)
    long = torch.softmax(torch.randn(1, 2, 3, 100_000, generator=g) * 40, dim=-1)  # diffuse: many exact zeros
    for attn in (one_hot, peaked, long):
        assert torch.isnan(plain_entropy(attn)).any()  # the underflow the rectification removes
        h = rectified_entropy(attn, 1e-7)
        assert torch.isfinite(h).all()
    assert rectified_entropy(one_hot, 1e-7).abs().max() < 1e-4  # one-hot: entropy ~ 0
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.isfinite(rectified_entropy(peaked.to(dtype), 1e-7)).all()


def test_rectified_entropy_orders_like_plain_entropy():
    g = torch.Generator().manual_seed(1)
    temps = torch.tensor([0.3, 0.7, 1.0, 2.0, 5.0, 0.5])[None, :, None, None]
    attn = torch.softmax(torch.randn(4, 6, 9, 12, generator=g) / temps, dim=-1)  # 6 heads, distinct focus
    plain = plain_entropy(attn).mean(dim=(0, 2))
    rect = rectified_entropy(attn, 1e-7).mean(dim=(0, 2))
    assert torch.equal(torch.argsort(plain), torch.argsort(rect))
    assert torch.allclose(plain, rect, atol=1e-4)


def test_entropy_scorer_on_degenerate_and_normal_attention():
    model = make_model("bert", "BertForSequenceClassification")
    batch = make_batch(model, length=12)
    batch["attention_mask"][:] = 1
    blocks = headcut.model_blocks(model)
    with eager_attention(model), torch.no_grad():
        maps = maps_by_block(model(**batch, output_attentions=True), blocks)
    result = score(model, [batch], "entropy")
    for b in blocks:  # normal attention: the same order as plain entropy
        plain = plain_entropy(maps[b.name]).mean(dim=(0, 2))
        assert torch.equal(
            torch.argsort(plain), torch.argsort(torch.tensor(result.blocks[b.name], dtype=torch.float32))
        )
    with torch.no_grad():  # extremely peaked attention: plain entropy is NaN, the scorer is finite
        for layer in model.bert.encoder.layer:
            layer.attention.self.query.weight.mul_(1e4)
    with eager_attention(model), torch.no_grad():
        maps = maps_by_block(model(**batch, output_attentions=True), blocks)
    assert any(torch.isnan(plain_entropy(m)).any() for m in maps.values())
    peaked = score(model, [batch], "entropy")
    assert finite(peaked)
    assert min(min(v) for v in peaked.blocks.values()) < min(min(v) for v in result.blocks.values())


def test_confidence_is_mean_max_attention_over_real_tokens():
    model = make_model("bert", "BertForSequenceClassification")
    batch = make_batch(model)
    blocks = headcut.model_blocks(model)
    with eager_attention(model), torch.no_grad():
        maps = maps_by_block(model(**batch, output_attentions=True), blocks)
    real = batch["attention_mask"].bool()
    result = score(model, [batch], "confidence")
    for b in blocks:
        top = maps[b.name].amax(dim=-1)  # (B, H, T)
        expected = torch.stack([top[:, h][real].mean() for h in range(b.heads)])
        assert torch.allclose(torch.tensor(result.blocks[b.name], dtype=torch.float32), expected, atol=1e-6)


# --------------------------------------------------------------------------------------------
# data-free scorers, GQA, normalisation, API


def test_value_l1_and_magnitude_by_hand():
    model = make_model("llama", loss_class("llama"))
    base = model.base_model
    for b in headcut.model_blocks(model):
        d, g = b.head_dim, b.group_size
        wq, wk, wv, wo = (base.get_submodule(p).weight.detach() for p in (b.q, b.k, b.v, b.o))
        l1 = [float(wv[(h // g) * d : (h // g + 1) * d].detach().abs().sum()) for h in range(b.heads)]
        mag = [
            math.sqrt(
                float(
                    wq[h * d : (h + 1) * d].pow(2).sum()
                    + wk[(h // g) * d : (h // g + 1) * d].pow(2).sum()
                    + wv[(h // g) * d : (h // g + 1) * d].pow(2).sum()
                    + wo[:, h * d : (h + 1) * d].pow(2).sum()
                )
            )
            for h in range(b.heads)
        ]
        assert score(model, None, "value-l1").blocks[b.name] == pytest.approx(l1, rel=1e-5)
        assert score(model, None, "magnitude").blocks[b.name] == pytest.approx(mag, rel=1e-5)


def test_gqa_kv_group_scores_for_llama():
    model = make_model("llama", loss_class("llama"))
    batch = make_batch(model)
    for name, scorer in SCORERS.items():
        if maps_refused(model, name, [batch]):
            continue
        result = score(model, [batch] if scorer.needs_data else None, name)
        for b in headcut.model_blocks(model):
            assert b.group_size == 3
            groups = result.kv_groups[b.name]
            heads = torch.tensor(result.blocks[b.name]).reshape(b.kv_heads, b.group_size)
            assert groups == pytest.approx(heads.mean(dim=1).tolist(), rel=1e-6)
    bert = make_model("bert")
    assert all(v is None for v in score(bert, None, "magnitude").kv_groups.values())


def test_random_is_seeded():
    model = make_model("gpt2")
    a = score(model, None, ScoreConfig(scorer="random", seed=3))
    b = score(model, None, ScoreConfig(scorer="random", seed=3))
    c = score(model, None, ScoreConfig(scorer="random", seed=4))
    assert a.blocks == b.blocks
    assert a.blocks != c.blocks
    assert all(0 <= v < 1 for vs in a.blocks.values() for v in vs)


@pytest.mark.parametrize("name", list(SCORERS))
def test_normalize_layer_gives_unit_norm_per_block(name):
    model = make_model("llama", loss_class("llama"))
    batch = make_batch(model)
    raw = score(model, [batch], ScoreConfig(scorer=name))
    result = score(model, [batch], ScoreConfig(scorer=name, normalize="layer"))
    for block, values in result.blocks.items():
        norm = math.sqrt(sum(v * v for v in values))
        assert norm == pytest.approx(1.0, rel=1e-6)
        factor = math.sqrt(sum(v * v for v in raw.blocks[block]))
        assert values == pytest.approx([v / factor for v in raw.blocks[block]], rel=1e-6)
        assert result.kv_groups[block] == pytest.approx([v / factor for v in raw.kv_groups[block]], rel=1e-6)
    sign = 1 if get_scorer(name).higher_is_important else -1
    assert result.importance() == {k: [sign * v for v in vs] for k, vs in result.blocks.items()}


def test_errors_name_the_choices():
    model = make_model("bert")
    with pytest.raises(headcut.HeadcutError) as err:
        score(model, None, "fisher")
    for name in SCORERS:
        assert name in str(err.value)
    assert set(SCORERS) == {
        "gradient",
        "gnorm",
        "confidence",
        "entropy",
        "value-l1",
        "fluctuation",
        "magnitude",
        "random",
    }
    with pytest.raises(headcut.HeadcutError, match="calibration"):
        score(model, None, "entropy")
    with pytest.raises(headcut.HeadcutError, match="calibration"):
        score(model, [], "gradient")
    classifier = make_model("bert", "BertForSequenceClassification")
    unlabelled = {k: v for k, v in make_batch(classifier).items() if k != "labels"}
    for config in (ScoreConfig(scorer="gradient"), ScoreConfig(scorer="gnorm", objective="loss")):
        with pytest.raises(headcut.HeadcutError, match="loss"):
            score(classifier, [unlabelled], config)
    # Greedy-Gnorm's own objective, the logits' norm, needs no labels (the default)
    assert finite(score(classifier, [unlabelled], "gnorm"))
    with pytest.raises(headcut.HeadcutError, match="abs_per"):
        score(model, None, ScoreConfig(scorer="magnitude", abs_per="token"))
    with pytest.raises(headcut.HeadcutError, match="objective"):
        score(model, None, ScoreConfig(scorer="gnorm", objective="accuracy"))


def test_gnorm_per_example_is_the_expectation_over_sentences():
    """--per example: the norms of each sentence's own gradient, averaged (Greedy-Gnorm §3.1.2); equal to
    --per batch on batches of one sentence."""
    from headcut.scoring.gnorm import one_example

    model = make_model("bert", loss_class("bert"))
    batch = make_batch(model, batch=3)
    singles = [one_example(batch, i, 3) for i in range(3)]
    per_example = score(model, [batch], ScoreConfig(scorer="gnorm", per="example"))
    per_single_batch = score(model, singles, ScoreConfig(scorer="gnorm", per="batch"))
    for name, values in per_example.blocks.items():
        assert values == pytest.approx(per_single_batch.blocks[name], rel=1e-5)
    per_batch = score(model, [batch], ScoreConfig(scorer="gnorm", per="batch"))
    assert per_batch.blocks != per_example.blocks  # the norm of a mean is not the mean of the norms
    assert per_example.examples == per_batch.examples == 3


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2"])
def test_fluctuation_is_flaps_standardised_weighted_input_variance(family):
    """FLAP's score computed independently: the output projection's inputs at the real tokens (padding dropped),
    their unbiased variance per channel times the squared column norms, squared, standardised over the layer's
    channels, averaged per head; padding changes nothing."""
    model = make_model(family, loss_class(family))
    batch = make_batch(model, seed=3, batch=3)
    batch["attention_mask"][0, -2:] = 0  # two padded tokens in the first row
    blocks = headcut.model_blocks(model)
    seen: dict[str, list[torch.Tensor]] = {b.name: [] for b in blocks}
    handles = []
    for b in blocks:
        mod = model.base_model.get_submodule(b.o)
        handles.append(
            mod.register_forward_pre_hook(
                lambda m, args, name=b.name: seen[name].append(args[0][batch["attention_mask"].bool()].double())
            )
        )
    with torch.no_grad():
        model.eval()
        model(**batch)
    for h in handles:
        h.remove()
    result = score(model, [batch], "fluctuation")
    for b in blocks:
        x = torch.cat(seen[b.name])
        mod = model.base_model.get_submodule(b.o)
        w = mod.weight.double() if isinstance(mod, torch.nn.Linear) else mod.weight.double().t()
        metric = (x.var(dim=0, unbiased=True) * w.pow(2).sum(dim=0)).pow(2)
        expected = ((metric - metric.mean()) / metric.std()).reshape(b.heads, b.head_dim).mean(dim=1)
        assert torch.allclose(
            torch.tensor(result.blocks[b.name], dtype=torch.float64), expected, rtol=1e-6, atol=1e-9
        ), b.name
    padded = {k: v.clone() for k, v in batch.items()}
    padded["input_ids"][0, -2:] = 1  # other ids at the padded places: the score does not move
    again = score(model, [padded], "fluctuation")
    for name, values in result.blocks.items():
        assert values == pytest.approx(again.blocks[name], rel=1e-9, abs=1e-12)
    assert result.higher_is_important and result.examples == 3
