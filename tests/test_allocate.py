"""One allocation over every action (the ``allocate`` stage, headcut.pruning.allocate, headcut.model.replay): the
choice is the cheapest set of measured actions that saves the bytes, a replayed measure equals the full one, the
cut written computes what the allocation measured, and the requests it cannot serve are refused alike."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch
from helpers import one_line_error, run, save_tiny, sentence, tiny_lm

import headcut
from headcut.errors import HeadcutError
from headcut.model.gating import gated
from headcut.model.kv_cache import cache_account
from headcut.model.masks import HeadMask
from headcut.model.replay import LayerReplay, layer_path
from headcut.model.surgery import model_blocks, slim
from headcut.pruning.allocate import Action, allocate, choose, kept_after, merge_cuts, removal_counts

DATA = ["--seq-len", 32, "--max-examples", 16]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return tiny_lm(tmp_path_factory.mktemp("allocate"), text_seed=3, seed=2, num_hidden_layers=4)


def _action(block: str, saved: int, cost: float) -> Action:
    return Action(block, "remove", [[0]], 0, 0, saved, cost)


def test_the_choice_is_the_cheapest_set_of_actions_that_saves_the_bytes():
    rng = random.Random(0)
    for _ in range(60):
        options = {
            f"b{i}": [_action(f"b{i}", rng.randint(1, 6), rng.uniform(-0.05, 1.0)) for _ in range(rng.randint(1, 3))]
            for i in range(rng.randint(1, 5))
        }
        assert choose(options, 0) == []  # nothing left to save: nothing chosen
        need = rng.randint(1, 14)
        picked = choose(options, need)
        best = None
        for combo in itertools.product(*[[None, *acts] for acts in options.values()]):
            chosen = [a for a in combo if a is not None]
            if sum(a.saved for a in chosen) >= need:
                cost = sum(max(a.cost, 0.0) for a in chosen)
                best = cost if best is None else min(best, cost)
        if best is None:
            assert picked is None
            continue
        assert picked is not None and len({a.block for a in picked}) == len(picked)
        assert sum(a.saved for a in picked) >= need
        assert sum(max(a.cost, 0.0) for a in picked) == pytest.approx(best)


def test_removal_counts_are_fine_for_few_groups_and_divisor_levels_for_many():
    assert removal_counts(3) == [1, 2, 3]
    assert removal_counts(12) == [6, 8, 9, 10, 11, 12]


def _calibration(folder, text):
    from transformers import AutoTokenizer

    from headcut.data.config import DataConfig
    from headcut.data.tasks import load_calibration

    model = headcut.load(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    cal = load_calibration(model, tokenizer, DataConfig(path=str(text), seq_len=32, max_examples=16, batch_size=4))
    return model, cal


def test_a_replayed_measure_equals_the_full_forward(lm):
    from headcut.pruning import eval_metric

    model, cal = _calibration(*lm)
    blocks = model_blocks(model)
    assert layer_path(blocks[2]) == ("layers", 2)
    metric = eval_metric(model, cal)
    full = HeadMask.full(blocks)
    replay = LayerReplay(model, blocks)
    reference = replay.record(lambda: metric.measure(full))
    assert replay.usable and reference == pytest.approx(metric.measure(full), rel=1e-6)
    for block in blocks[1:]:
        cut = HeadMask({**full.keep, block.name: [0, 1, 2]})
        with replay.from_layer(block.name):
            replayed = metric.measure(cut)
        assert replayed == pytest.approx(metric.measure(cut), rel=1e-5)
        assert replayed != pytest.approx(reference, rel=1e-6)  # the change is seen


def test_the_cut_computes_what_the_allocation_measured_and_saves_the_bytes(lm):
    model, cal = _calibration(*lm)
    model.double()
    blocks = model_blocks(model)
    account = cache_account(model, 64)
    before = account.bytes(account.current())
    importance = {b.name: [float(h) for h in range(b.heads)] for b in blocks}
    need = before // 2
    done = allocate(model, cal, cal, importance, account, need, rounds=2)
    assert before - done.bytes_after >= need and done.bytes_before == before
    assert {a.kind for a in done.chosen.values()} <= {"merge", "remove"}
    assert len(done.rounds) == 2 and done.rounds[0].bytes_saved >= need // 2
    assert all(a in done.measured for a in done.chosen.values())
    # removals take the least important groups (importance rises with the head's index)
    for a in done.chosen.values():
        if a.kind == "remove":
            assert a.groups[0] == list(range(len(a.groups[0])))
    ids = torch.randint(3, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(4))
    mask = done.mask(blocks)
    with torch.no_grad(), gated(model, mask):
        measured = model(input_ids=ids, use_cache=False).logits
    slim(model, mask, planned=merge_cuts(blocks, done))
    with torch.no_grad():
        written = model(input_ids=ids, use_cache=False).logits
    assert (measured - written).abs().max() < 1e-8
    after = cache_account(model, 64)
    assert after.bytes(after.current()) == done.bytes_after
    assert {b.name: (b.heads, b.kv_heads) for b in model_blocks(model)} == kept_after(blocks, done)


def _prune(folder, text, out, *extra):
    done = run("prune", folder, "--method", "gradient", "--data", text, *DATA, *extra, "--out", out)
    assert done.exit_code == 0, done.output
    return json.loads((out / "headcut-report.json").read_text()), done.output


def test_prune_allocates_under_a_byte_budget_and_the_written_model_holds_it(lm, tmp_path):
    folder, text = lm
    report, output = _prune(folder, text, tmp_path / "o", "--kv-budget", 0.6, "--context", 64, "--allocate")
    chosen = {a["block"]: a for a in report["allocate"]["chosen"]}
    assert chosen and "allocation:" in output
    assert set(chosen) <= {a["block"] for a in report["allocate"]["measured"]}
    back = headcut.load(tmp_path / "o")
    account = cache_account(back, 64)
    assert account.bytes(account.current()) == report["kv_budget"]["bytes_after"]
    assert report["kv_budget"]["bytes_after"] <= report["kv_budget"]["bytes_target"]
    for b in model_blocks(back):
        a = chosen.get(b.name)
        assert (b.heads, b.kv_heads) == ((a["heads_after"], a["kv_heads_after"]) if a else (6, 2))


def test_allocation_refusals_read_alike(lm, tmp_path):
    folder, text = lm
    for extra, words in (
        (["--method", "pass", "--keep", 12, "--data", text, "--allocate"], "score-based"),
        (["--method", "gradient", "--keep", 12, "--allocate"], "calibration data"),
        (["--method", "gradient", "--keep", 12, "--data", text, "--allocate", "--merge-layers", 1], "--merge-layers"),
    ):
        one_line_error(run("prune", folder, *extra, "--out", tmp_path / "x"), words)
    with pytest.raises(HeadcutError, match="allocate measures and chooses every block's merge and removal"):
        headcut.prune(folder, "gradient", keep=12, data=str(text), allocate=True, protect=0.1)
    uniform = headcut.prune(
        folder, "gradient", keep=12, data=str(text), data_options={"seq_len": 32}, allocate=True, uniform=True
    )
    assert "allocate" not in uniform.report and any("allocation" in n and "did not run" in n for n in uniform.notes)


def test_a_family_without_merges_allocates_removals_by_bytes_with_its_sliding_layers(tmp_path):
    """Gemma 3 (sliding and full layers, merging refused): only removals are offered and a note says why; a sliding
    layer's groups save its window's bytes only; the layers are replayed exactly; the written model holds the
    bytes the report says."""
    folder = save_tiny(tmp_path / "gemma3", "gemma3", "Gemma3ForCausalLM", seed=3)
    text = tmp_path / "text.txt"
    g = torch.Generator().manual_seed(5)
    text.write_text("\n".join(sentence(g, 12) for _ in range(80)) + "\n")
    done = headcut.prune(
        folder, "gradient", kv_budget=0.5, context=64, data=str(text), data_options={"seq_len": 32}, allocate=True
    )
    report = done.report["allocate"]
    assert report["replayed"] and any("no merges offered" in n for n in report["notes"])
    assert {a["action"] for a in report["measured"]} == {"remove"}
    saved = {(a["block"], a["kv_heads_after"]): a["bytes_saved"] for a in report["measured"]}
    assert saved[("self.1", 1)] < saved[("self.0", 1)]  # the sliding layer holds 4 positions, not 64
    done.save(tmp_path / "o")
    back = headcut.load(tmp_path / "o")
    account = cache_account(back, 64)
    assert account.bytes(account.current()) == report["bytes_after"] <= report["bytes_before"] // 2
