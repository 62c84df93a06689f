"""KV-cache budgets: the exact count of the cache (headcut.model.kv_cache) against the caches transformers holds,
and ``--kv-budget`` / ``--context`` with the cost-aware allocation (headcut.pruning.costs)."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import replace

import pytest
import torch
from helpers import GENERATORS, make_model

import headcut
from headcut.errors import HeadcutError
from headcut.model.kv_cache import cache_account
from headcut.model.masks import HeadMask, valid_counts

FAMILIES = [f for f, cls in GENERATORS.items() if f not in ("bart", "marian", "t5")]


def held(cache, skip: set[int]) -> int:
    """Values transformers' cache holds: keys and values of every layer, a linear layer's conv and recurrent
    states (layers in ``skip``, whose blocks have no heads, hold headcut's one-value position placeholder)."""
    total = 0
    for i, layer in enumerate(cache.layers):
        if i in skip:
            continue
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                total += t.numel()
        for name in ("conv_states", "recurrent_states"):
            states = getattr(layer, name, None)
            if isinstance(states, dict):
                total += sum(t.numel() for t in states.values() if isinstance(t, torch.Tensor))
    return total


def generated_cache(model, tokens: int, seed: int = 0):
    """The cache after a prompt of ``tokens - 1`` tokens and one decoding step."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 50, (1, tokens), generator=g)
    with torch.no_grad():
        out = model(input_ids=ids[:, :-1], use_cache=True)
        out = model(input_ids=ids[:, -1:], cache=out.past_key_values, use_cache=True)
    return out.cache if getattr(out, "cache", None) is not None else out.past_key_values


def random_mask(model, gqa: str, seed: int) -> HeadMask:
    rng = random.Random(seed)
    keep = {}
    for block in headcut.model_blocks(model):
        count = rng.choice(valid_counts(block, gqa))
        if gqa == "duplicate" or block.group_size == 1:
            keep[block.name] = sorted(rng.sample(range(block.heads), count))
        else:
            g = block.group_size
            per = g if count % g == 0 and count // g <= block.kv_heads and gqa == "group" else None
            if per is None:  # uniform: c groups of m heads
                pairs = [(c, count // c) for c in range(1, block.kv_heads + 1) if count % c == 0 and count // c <= g]
                c, m = rng.choice(pairs) if count else (0, 0)
            else:
                c, m = count // g, g
            groups = sorted(rng.sample(range(block.kv_heads), c))
            keep[block.name] = sorted(k * g + h for k in groups for h in rng.sample(range(g), m))
    return HeadMask(keep)


@pytest.mark.parametrize("family", FAMILIES)
def test_count_equals_the_cache_transformers_holds(family):
    model = make_model(family, GENERATORS[family]).eval()
    for tokens in (3, 20):  # shorter and longer than the tiny models' sliding windows (4)
        account = cache_account(model, tokens)
        assert held(generated_cache(model, tokens), set()) == account.values(account.current())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("gqa", ["auto", "duplicate"])
def test_count_of_a_cut_equals_the_cut_models_cache(family, gqa):
    model = make_model(family, GENERATORS[family]).eval()
    account = cache_account(model, 20)
    for seed in range(3):
        mask = random_mask(model, "uniform" if gqa == "auto" else gqa, seed)
        kept = account.kept(mask, gqa)
        cut = copy.deepcopy(model)
        headcut.slim(cut, mask, gqa=gqa)
        # blocks without heads (a layer whose keys and values others read keeps them)
        empty = {b.layer for b in account.blocks if kept[b.name][0] == 0 and account.costs[b.name].fixed_kv is None}
        assert held(generated_cache(cut, 20), empty) == account.values(kept)
        # counted on the cut model as it is: the same
        again = cache_account(cut, 20)
        assert again.values(again.current()) == account.values(kept)


def test_windows_shared_and_linear_layers_are_counted_as_their_kind():
    gemma3 = cache_account(make_model("gemma3", GENERATORS["gemma3"]), 1000)
    kinds = {n: (c.kind, c.window) for n, c in gemma3.costs.items()}
    assert kinds == {
        "self.0": ("full_attention", None),
        "self.1": ("sliding_attention", 3),
        "self.2": ("full_attention", None),
    }
    per_block = gemma3.per_block(gemma3.current())
    block = {b.name: b for b in gemma3.blocks}["self.0"]
    assert per_block["self.0"] == 1000 * 2 * block.head_dim * block.kv_heads * 4
    assert per_block["self.1"] == 3 * 2 * block.head_dim * block.kv_heads * 4

    gemma4 = make_model("gemma4", GENERATORS["gemma4"])
    account = cache_account(gemma4, 50)
    modes = list(gemma4.config.kv_sharing_modes)
    for b in account.blocks:
        cost = account.costs[b.name]
        if modes[b.layer] == "reuse":
            assert cost.kind == "dummy" and account.block_values(b.name, b.heads, b.kv_heads) == 0
        if modes[b.layer] == "store":  # its keys and values stay, whatever its heads
            assert account.block_values(b.name, 0, 0) == account.block_values(b.name, b.heads, b.kv_heads) > 0

    qwen = cache_account(make_model("qwen3_5", GENERATORS["qwen3_5"]), 50)
    linear = qwen.costs["self.0"]
    assert (linear.kind, linear.per_position) == ("linear_attention", 0)
    assert qwen.block_values("self.0", 6, 2) == cache_account(make_model("qwen3_5"), 5000).block_values("self.0", 6, 2)


def test_a_model_without_a_decoder_cache_is_refused():
    with pytest.raises(HeadcutError, match="no KV cache to budget"):
        cache_account(make_model("bert", "BertForSequenceClassification"))
    with pytest.raises(HeadcutError, match="encoder-decoder"):
        cache_account(make_model("t5", "T5ForConditionalGeneration"))


# ---- the budget and the allocations --------------------------------------------------------------------------


@pytest.fixture
def tiny_gemma3(tmp_path):
    """A tiny Gemma 3 (layers: global, sliding window 4, global) and some text."""
    from helpers import save_tiny, sentence

    src = save_tiny(tmp_path / "gemma3", "gemma3", "Gemma3ForCausalLM")
    g = torch.Generator().manual_seed(0)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(sentence(g, 30) for _ in range(40)))
    return src, text


OPTIONS = {"seq_len": 16, "max_examples": 12, "batch_size": 4}


def _sets_and_budget(model, fraction: float, context: int, allocation: str = "cost", gqa: str = "auto", **kw):
    from headcut.config import PruneConfig
    from headcut.pruning.costs import resolve_bytes
    from headcut.pruning.units import block_sets

    config = PruneConfig(method="gradient", kv_budget=fraction, context=context, allocation=allocation, gqa=gqa, **kw)
    sets = block_sets(headcut.model_blocks(model), gqa)
    return sets, resolve_bytes(sets, config, cache_account(model, context))


def test_cost_allocation_spends_the_budget_where_heads_cost_most():
    """Global layers hold 85x the cache of the sliding one at 256 tokens: removing the sliding layer's KV
    heads first (they score lowest) buys almost nothing; the cost-aware cut takes global ones instead."""
    from headcut.pruning.costs import allocate
    from headcut.pruning.units import UnitState

    model = make_model("gemma3", GENERATORS["gemma3"])
    sets, budget = _sets_and_budget(model, 0.8, 256)
    importance = {"self.0": [1.0] * 6, "self.1": [0.1] * 6, "self.2": [0.5, 0.5, 0.5, 2.0, 2.0, 2.0]}
    start = UnitState.full(sets)
    mask = lambda st: st.mask(headcut.model_blocks(model))  # noqa: E731
    count, _, _ = allocate(start, importance, replace(budget, allocation="count"), 0, None, mask)
    cost, candidates, chosen = allocate(start, importance, budget, 0, None, mask)
    assert budget.fits(count) and budget.fits(cost)
    assert count.per_block() == {"self.0": 6, "self.1": 0, "self.2": 3}  # the plain order: the cheap layer first
    assert cost.per_block() == {"self.0": 6, "self.1": 6, "self.2": 3}  # one global group: the least important
    assert {c.name for c in candidates} == {"ratio", "count", "knapsack"} and chosen == "ratio"


def test_knapsack_is_the_least_summed_score_that_fits():
    """The knapsack candidate against brute force over every subset of units (a byte target small enough that
    its steps are single bytes: exact)."""
    import itertools

    from headcut.pruning.costs import knapsack, saving_moves, weight
    from headcut.pruning.units import UnitState

    model = make_model("llama", GENERATORS["llama"])  # 3 blocks x 2 KV groups of 3 query heads
    for seed in range(5):
        rng = random.Random(seed)
        sets, budget = _sets_and_budget(model, rng.choice([0.3, 0.5, 0.7]), 7)
        importance = {b.name: [rng.uniform(-0.2, 1.0) for _ in range(b.heads)] for b in headcut.model_blocks(model)}
        start = UnitState.full(sets)
        units = saving_moves(start, importance, budget, 0)
        best = None
        for r in range(len(units) + 1):
            for subset in itertools.combinations(units, r):
                trial = start.copy()
                for move in subset:
                    trial.apply(move)
                if budget.fits(trial):
                    total = sum(weight(start, m) for m in subset)
                    best = total if best is None else min(best, total)
        got = knapsack(start, importance, budget, 0)
        assert got is not None and budget.fits(got)
        removed = [m for m in units if not set(m.heads) <= set(got.kept[m.index])]
        assert sum(weight(start, m) for m in removed) == pytest.approx(best)


def test_kv_budget_from_python_reaches_it_and_the_saved_model_holds_those_bytes(tiny_gemma3, tmp_path):
    src, text = tiny_gemma3
    out = tmp_path / "out"
    pruned = headcut.prune(src, "gradient", kv_budget=0.5, context=64, data=text, data_options=OPTIONS, out=out)
    kv = pruned.report["kv_budget"]
    assert kv["context"] == 64 and kv["fraction"] == 0.5 and kv["allocation"] == "cost"
    assert kv["bytes_after"] <= kv["bytes_target"] == kv["bytes_before"] // 2
    assert kv["reached"] == pytest.approx(kv["bytes_after"] / kv["bytes_before"])
    assert kv["chosen"] in {c["name"] for c in kv["candidates"]}
    chosen = [c for c in kv["candidates"] if c["name"] == kv["chosen"]]
    assert all(c["loss"] is not None for c in kv["candidates"])
    assert chosen[0]["loss"] == min(c["loss"] for c in kv["candidates"])  # refined by calibration loss
    assert sum(row["bytes"][1] for row in kv["blocks"]) == kv["bytes_after"]
    reloaded = headcut.load(out)
    account = cache_account(reloaded, 64)
    assert account.bytes(account.current()) == kv["bytes_after"]  # the written model holds what was counted
    assert json.loads((out / "headcut-report.json").read_text())["kv_budget"] == kv
    assert f"{kv['bytes_before']:,} -> {kv['bytes_after']:,} bytes" in (out / "README.md").read_text()  # the card
    # the recipe of the run replays it
    again = headcut.prune(src, recipe=out, data=text)
    assert again.mask.to_json() == pruned.mask.to_json()
    assert again.report["kv_budget"]["bytes_after"] == kv["bytes_after"]


def test_count_allocation_and_uniform_budgets(tiny_gemma3, tmp_path):
    src, text = tiny_gemma3
    count = headcut.prune(
        src, "gradient", kv_budget=0.5, context=64, allocation="count", data=text, data_options=OPTIONS
    )
    kv = count.report["kv_budget"]
    assert kv["bytes_after"] <= kv["bytes_target"] and [c["name"] for c in kv["candidates"]] == ["count"]
    assert kv["candidates"][0]["loss"] is None  # nothing to refine
    uniform = headcut.prune(
        src, "gradient", kv_budget=0.5, context=64, uniform=True, gqa="group", data=text, data_options=OPTIONS
    )
    kv = uniform.report["kv_budget"]
    per_block = set(uniform.report["heads"]["per_block_after"].values())
    assert per_block == {kv["uniform_level"]} and kv["bytes_after"] <= kv["bytes_target"]
    # the most heads per block that fit: one more KV group in every block would not
    assert kv["uniform_level"] == 3


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"method": "pass", "kv_budget": 0.5}, "a score-based method"),
        ({"method": "gradient", "kv_budget": 0.5, "keep": 6}, "give one budget"),
        ({"method": "gradient", "context": 64, "keep": 6}, "context is the length kv_budget or target_speedup"),
        ({"method": "gradient", "kv_budget": 0.5, "via": 9}, "one round"),
        ({"method": "gradient", "kv_budget": 0.01, "min_heads_per_block": 3}, "cannot be met"),
        ({"method": "gradient", "kv_budget": 0.5, "uniform": True, "gqa": "uniform"}, "--gqa group"),
        ({"method": "gradient", "kv_budget": 1.5}, r"kv_budget must be in \(0, 1\]"),
        ({"method": "gradient", "kv_budget": 0.5, "allocation": "best"}, "unknown allocation 'best'"),
    ],
)
def test_kv_budget_refusals(tiny_gemma3, kwargs, message):
    src, text = tiny_gemma3
    method = kwargs.pop("method")
    with pytest.raises(HeadcutError, match=message):
        headcut.prune(src, method, data=text, data_options=OPTIONS, **kwargs)


def test_an_encoder_has_no_cache_to_budget(tmp_path):
    from helpers import cls_rows, save_tiny, write_rows

    src = save_tiny(tmp_path / "bert", "bert", "BertForSequenceClassification")
    rows = write_rows(tmp_path / "rows.csv", cls_rows())
    with pytest.raises(HeadcutError, match="no KV cache to budget"):
        headcut.prune(src, "gradient", kv_budget=0.5, data=rows)


def test_the_context_defaults_to_the_models_length(tiny_gemma3):
    src, text = tiny_gemma3
    pruned = headcut.prune(src, "magnitude", kv_budget=0.7)
    assert pruned.report["kv_budget"]["context"] == 64  # the tiny config's max_position_embeddings


def test_layerwise_kv_budget_places_heads_without_holding_the_model(tiny_gemma3, tmp_path):
    src, text = tiny_gemma3
    options = {"seq_len": 16, "max_examples": 12, "batch_size": 4}
    pruned = headcut.prune(
        src,
        "fluctuation",
        kv_budget=0.5,
        context=64,
        data=text,
        data_options=options,
        layerwise=True,
        out=tmp_path / "o",
    )
    kv = pruned.report["kv_budget"]
    assert kv["bytes_after"] <= kv["bytes_target"] and kv["chosen"] == "ratio"
    assert all(c["loss"] is None for c in kv["candidates"])  # nothing loaded to measure a loss on
    account = cache_account(headcut.load(tmp_path / "o"), 64)
    assert account.bytes(account.current()) == kv["bytes_after"]


def test_cli_kv_budget_prints_the_budget_and_writes_it(tiny_gemma3, tmp_path):
    from helpers import run

    src, text = tiny_gemma3
    result = run(
        "prune",
        str(src),
        "--method",
        "gradient",
        "--kv-budget",
        "0.5",
        "--context",
        "64",
        "--data",
        str(text),
        "--seq-len",
        "16",
        "--max-examples",
        "12",
        "--out",
        str(tmp_path / "o"),
        "--json",
        "-",
    )
    assert result.exit_code == 0, result.output
    assert "KV cache of one sequence of 64 tokens" in result.stderr
    report = json.loads(result.stdout)
    assert report["kv_budget"]["bytes_after"] <= report["kv_budget"]["bytes_target"]
    assert report["arguments"]["kv_budget"] == 0.5 and report["arguments"]["context"] == 64
    help_text = run("prune", "--help").output
    for flag in ("--kv-budget", "--context", "--allocation"):
        assert flag in help_text


# ---- --target-speedup -----------------------------------------------------------------------------------------


def _bytes_clock(monkeypatch):
    """Time every decode as 1 ms plus one per kilobyte of the model's KV cache at the context: a machine where the
    cache is all that costs (deterministic, so the search's choice can be checked)."""
    from headcut.jobs.prune import speed_target
    from headcut.model.measure import SelfTimed

    def fake(model, context, tokens, device, seed):
        account = cache_account(model, context)
        ms = 1.0 + account.bytes(account.current()) / 1000.0
        return lambda: SelfTimed(ms)

    monkeypatch.setattr(speed_target, "decode_call", fake)


def test_target_speedup_chooses_the_least_cut_timed_fast_enough(tiny_gemma3, tmp_path, monkeypatch):
    _bytes_clock(monkeypatch)
    src, text = tiny_gemma3
    pruned = headcut.prune(
        src, "gradient", target_speedup=1.5, context=64, data=text, data_options=OPTIONS, out=tmp_path / "o"
    )
    speed = pruned.report["speed_target"]
    assert speed["target"] == 1.5 and speed["context"] == 64 and speed["device"] == "cpu"
    chosen = speed["chosen_fraction"]
    tried = {t["fraction"]: t for t in speed["tried"]}
    assert tried[chosen]["reached"] and tried[chosen]["speedup_p25"] >= 1.5
    assert all(not t["reached"] for f, t in tried.items() if f > chosen)  # every lighter cut timed fell short
    kv = pruned.report["kv_budget"]
    assert kv["fraction"] == chosen and kv["bytes_after"] == tried[chosen]["kv_bytes"]
    assert pruned.report["heads"]["after"] == tried[chosen]["heads"]
    # the same heads as asking for that budget in bytes
    direct = headcut.prune(src, "gradient", kv_budget=chosen, context=64, data=text, data_options=OPTIONS)
    assert direct.mask.to_json() == pruned.mask.to_json()
    # the saved recipe replays it as the budget in bytes it chose
    assert pruned.report["recipe"]["budget"] == {"kv_budget": chosen, "context": 64}


def test_target_speedup_out_of_reach_names_the_best_measured(tiny_gemma3, monkeypatch):
    _bytes_clock(monkeypatch)
    src, text = tiny_gemma3
    with pytest.raises(HeadcutError, match=r"50x was not reached .* the best measured was [0-9.]+x"):
        headcut.prune(src, "gradient", target_speedup=50, context=64, data=text, data_options=OPTIONS)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"method": "michel"}, "one-shot score-based method"),
        ({"method": "pass"}, "one-shot score-based method"),
        ({"method": "gradient", "kv_budget": 0.5}, "give one budget"),
        ({"method": "fluctuation", "layerwise": True}, "needs the model in memory"),
    ],
)
def test_target_speedup_refusals(tiny_gemma3, kwargs, message):
    src, text = tiny_gemma3
    method = kwargs.pop("method")
    with pytest.raises(HeadcutError, match=message):
        headcut.prune(src, method, target_speedup=1.2, data=text, data_options=OPTIONS, **kwargs)


def test_an_iterative_method_steps_towards_the_bytes_and_allocates_on_its_last_step(tiny_gemma3):
    src, text = tiny_gemma3
    pruned = headcut.prune(src, "michel", kv_budget=0.5, context=64, step=3, data=text, data_options=OPTIONS)
    kv = pruned.report["kv_budget"]
    assert kv["bytes_after"] <= kv["bytes_target"] and kv["candidates"]
    assert pruned.report["scorings"] > 1  # scored again before every step
    steps = pruned.report["trajectory"][1:]
    assert all(len(p["removed"]) <= 3 for p in steps[:-1])  # --step heads at most, before the allocating step
