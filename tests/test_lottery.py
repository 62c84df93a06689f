"""The lottery (``--method lottery``): the rewind to the late-resetting checkpoint (weights, slices,
optimizer and schedule), attention confidence across attention kinds, the global ranking of each
iteration, resume, the control, and the method end to end on a tiny classifier and on a tiny
encoder-decoder trained from scratch on a text-to-text task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from helpers import BERT, cls_rows, make_batch, make_model, run, save_tiny, sentence, write_rows

import headcut
from headcut.errors import HeadcutError
from headcut.model.masks import HeadMask
from headcut.pruning import lottery
from headcut.pruning.lottery import LotteryOptions, default_per_step, reinitialise, removed_by_kind
from headcut.scoring import score
from headcut.scoring.attention_maps import eager_attention, maps_by_block
from headcut.training import TrainConfig, Trainer

# ---- the rewind ----------------------------------------------------------------------------------------------


def _batches(model: torch.nn.Module, n: int = 4) -> list[dict[str, torch.Tensor]]:
    return [make_batch(model, batch=3, length=6, seed=i) for i in range(n)]


def _equal_state(a: dict, b: dict) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal_state(x, y) for x, y in zip(a, b))
    return a == b


def test_rewind_restores_the_checkpoint_weights_optimizer_and_schedule():
    model = make_model(*BERT)
    batches = _batches(model)
    cfg = TrainConfig(max_steps=3, lr=1e-3, schedule="constant", warmup_steps=2, checkpoint_every=None, seed=1)
    first = Trainer(model, None, batches, cfg)
    first.train()
    c = first.snapshot()
    kept = {k: v.clone() for k, v in c["model"].items()}
    # train on from C with another data order, as an iteration does
    second = Trainer(model, None, batches, TrainConfig(**{**cfg.__dict__, "max_steps": 7, "seed": 2}))
    second.rewind(c)
    assert second.step == 3 and second.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    second.train()
    moved = model.state_dict()
    assert any(not torch.equal(moved[k], kept[k]) for k in kept)
    assert all(torch.equal(c["model"][k], kept[k]) for k in kept)  # training after a rewind left C alone
    third = Trainer(model, None, batches, TrainConfig(**{**cfg.__dict__, "max_steps": 7, "seed": 3}))
    third.rewind(c)
    assert all(torch.equal(model.state_dict()[k], kept[k]) for k in kept)
    assert _equal_state(third.optimizer.state_dict(), c["optimizer"])
    assert third.scheduler.state_dict()["last_epoch"] == c["scheduler"]["last_epoch"] == 3
    assert third.step == 3


def test_the_rewound_survivors_are_the_checkpoints_slices():
    """After a rewind the slimmed model's surviving heads hold exactly C's rows and columns."""
    model = make_model(*BERT)
    first = Trainer(
        model, None, _batches(model), TrainConfig(max_steps=2, lr=1e-3, schedule="constant", checkpoint_every=None)
    )
    first.train()
    c = first.snapshot()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # training moved everything
    Trainer(model, None, _batches(model), TrainConfig(max_steps=4, checkpoint_every=None)).rewind(c)
    keep = {"self.0": [1, 3], "self.1": [0]}
    headcut.slim(model, HeadMask(keep))
    d = headcut.model_blocks(make_model(*BERT))[0].head_dim
    for i, heads in enumerate(keep.values()):
        rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in heads])
        prefix = f"bert.encoder.layer.{i}.attention"
        got = model.state_dict()
        for name in ("self.query", "self.key", "self.value"):
            assert torch.equal(got[f"{prefix}.{name}.weight"], c["model"][f"{prefix}.{name}.weight"][rows])
            assert torch.equal(got[f"{prefix}.{name}.bias"], c["model"][f"{prefix}.{name}.bias"][rows])
        assert torch.equal(got[f"{prefix}.output.dense.weight"], c["model"][f"{prefix}.output.dense.weight"][:, rows])


# ---- confidence and ranking ----------------------------------------------------------------------------------


def test_cross_attention_confidence_by_hand():
    """Confidence of a decoder-encoder (cross) head: the maximum weight over the source tokens, averaged
    over the real target tokens (labels != -100); padded source keys never hold the maximum."""
    model = make_model("bart", "BartForConditionalGeneration")
    batch = make_batch(model, batch=3, length=7, pad=2)
    blocks = headcut.model_blocks(model)
    with eager_attention(model), torch.no_grad():
        maps = maps_by_block(model(**batch, output_attentions=True), blocks)
    result = score(model, [batch], "confidence")
    real = batch["labels"] != -100
    cross = [b for b in blocks if b.kind == "cross"]
    assert cross
    for b in cross:
        top = maps[b.name].amax(dim=-1)  # (B, H, T target)
        expected = torch.stack([top[:, h][real].mean() for h in range(b.heads)])
        assert torch.allclose(torch.tensor(result.blocks[b.name], dtype=torch.float32), expected, atol=1e-6)


def test_per_step_default_and_kinds():
    assert default_per_step(18) == 9 and default_per_step(6) == 3 and default_per_step(1) == 1
    kinds = {"encoder.0": "encoder", "cross.1": "cross"}
    assert removed_by_kind(["encoder.0:1", "cross.1:0", "cross.1:3"], kinds) == {"encoder": 1, "cross": 2}


def test_reinitialise_draws_fresh_weights_from_the_seed():
    a, b, c = (make_model(*BERT) for _ in range(3))
    before = {k: v.clone() for k, v in a.state_dict().items()}
    reinitialise(a, 5)
    reinitialise(b, 5)
    reinitialise(c, 6)
    w = "bert.encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(a.state_dict()[w], before[w])
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in before)
    assert not torch.equal(a.state_dict()[w], c.state_dict()[w])


def test_options_are_checked():
    for bad, match in (
        ({"reset_at": 0}, "reset_at"),
        ({"prune_every": -1}, "prune_every"),
        ({"per_step": 0}, "per_step"),
        ({"control": "shuffle"}, "control"),
        ({"schedule": "linear"}, "constant rate"),
        ({"patience": 0}, "patience"),
    ):
        with pytest.raises(HeadcutError, match=match):
            LotteryOptions(**bad).validate()


# ---- end to end: a tiny classifier ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("lottery")
    save_tiny(d / "bert", *BERT)
    write_rows(d / "train.csv", cls_rows(48, seed=1))
    write_rows(d / "dev.csv", cls_rows(24, seed=2))
    return d


FAST = [
    "--reset-at",
    "4",
    "--prune-every",
    "3",
    "--eval-every",
    "2",
    "--max-steps",
    "8",
    "--seq-len",
    "16",
    "--batch-size",
    "8",
]


def prune_lottery(folder: Path, out: Path, *extra: object) -> dict:
    res = run(
        "prune",
        folder / "bert",
        "--method",
        "lottery",
        "--keep",
        "3",
        "--data",
        folder / "train.csv",
        "--eval-data",
        folder / "dev.csv",
        "--out",
        out,
        "--json",
        "-",
        *FAST,
        *extra,
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_lottery_prunes_iteratively_and_the_result_reloads(folder, tmp_path):
    out = tmp_path / "slim"
    report = prune_lottery(folder, out, "--trajectory", tmp_path / "curve.csv")
    lot = report["lottery"]
    assert report["heads"]["after"] == 3 and report["stopped"] == "budget"
    assert lot["per_step"] == 1 and lot["reset_at"] == 4 and lot["score_data"] == "--eval-data"
    its = lot["iterations"]
    assert [it["heads"] for it in its] == [7, 6, 5, 4, 3]
    assert [it["seed"] for it in its] == [1, 2, 3, 4, 5]  # a new data order every iteration
    kept = {b: list(range(4)) for b in ("self.0", "self.1")}
    for it in its:
        # the least confident kept head goes (global ranking over every block)
        candidates = [(it["confidence"][b][h], b, h) for b, hs in kept.items() for h in hs]
        _, b, h = min(candidates)
        assert it["removed"] == [f"{b}:{h}"] and it["removed_by_kind"] == {"self": 1}
        kept[b].remove(h)
        assert it["metric_trained"] is not None and it["metric_pruned"] is not None
    assert report["mask"]["keep"] == kept
    conv = lot["converge"]
    assert conv["from_step"] == 4 and conv["steps"] <= 4 + 8 and conv["early_stopping"]["patience"] == 10
    curve = (tmp_path / "curve.csv").read_text().splitlines()
    assert len(curve) == 1 + 6  # header, the unpruned model and one row per iteration
    ours = headcut.load(out)
    plain = transformers.AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
    batch = make_batch(plain, length=6)
    with torch.no_grad():
        assert torch.allclose(ours(**batch).logits, plain(**batch).logits, atol=1e-5)
    assert sum(b.heads for b in headcut.model_blocks(plain)) == 3


def test_lottery_is_deterministic_and_reports_the_control(folder, tmp_path):
    one = prune_lottery(folder, tmp_path / "a", "--control", "reinit", "--per-step", "2")
    two = prune_lottery(folder, tmp_path / "b", "--control", "reinit", "--per-step", "2")
    assert one["mask"] == two["mask"] and one["metric"] == two["metric"]
    assert [it["heads"] for it in one["lottery"]["iterations"]] == [6, 4, 3]  # the last one only reaches K
    control = one["lottery"]["control"]
    assert control == two["lottery"]["control"] | {"seconds": control["seconds"]}
    assert control["kind"] == "reinit" and control["steps"] == one["lottery"]["converge"]["steps"]
    assert control["metric"] is not None


def test_an_interrupted_lottery_resumes_to_the_same_result(folder, tmp_path, monkeypatch):
    whole = headcut.prune(
        folder / "bert",
        "lottery",
        keep=3,
        data=str(folder / "train.csv"),
        eval_data=str(folder / "dev.csv"),
        reset_at=4,
        prune_every=3,
        max_steps=6,
        data_options={"seq_len": 16, "batch_size": 8},
    )
    ckpt = tmp_path / "ckpt"
    real = lottery.score_masked
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(lottery, "score_masked", failing)
    kwargs = dict(
        keep=3,
        data=str(folder / "train.csv"),
        eval_data=str(folder / "dev.csv"),
        reset_at=4,
        prune_every=3,
        max_steps=6,
        data_options={"seq_len": 16, "batch_size": 8},
        checkpoint_dir=ckpt,
    )
    with pytest.raises(KeyboardInterrupt):
        headcut.prune(folder / "bert", "lottery", **kwargs)
    saved = torch.load(ckpt / lottery.STATE_NAME, weights_only=True)
    assert len(saved["iterations"]) == 2
    monkeypatch.setattr(lottery, "score_masked", real)
    resumed = headcut.prune(folder / "bert", "lottery", resume=True, **kwargs)
    assert resumed.report["lottery"]["resumed_at"] == 2
    assert resumed.mask.keep == whole.mask.keep
    assert resumed.report["metric"] == whole.report["metric"]
    with pytest.raises(HeadcutError, match="other settings or data"):
        headcut.prune(folder / "bert", "lottery", resume=True, **{**kwargs, "prune_every": 4})


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ([], "no budget: give --keep, --sparsity or --max-drop"),
        (["--keep", "3", "--max-drop", "0.1"], "--max-drop applies to the score-based methods"),
        (["--keep", "3", "--episodes", "4"], "--episodes does not apply to lottery"),
        (["--keep", "3", "--control", "shuffle"], "unknown --control"),
    ],
)
def test_lottery_refusals(folder, tmp_path, extra, needle):
    res = run(
        "prune", folder / "bert", "--method", "lottery", "--data", folder / "train.csv", "--out", tmp_path / "x", *extra
    )
    assert res.exit_code == 2 and needle in res.output, res.output
    assert not (tmp_path / "x").exists()


# ---- end to end: an encoder-decoder trained from scratch -------------------------------------------------------


def reversal_rows(n: int, seed: int) -> list[dict[str, str]]:
    """A deterministic text-to-text task: the source's words in reverse order."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        words = sentence(g, 3 + i % 4).split()
        rows.append({"source": " ".join(words), "target": " ".join(reversed(words))})
    return rows


def test_encoder_decoder_lottery_ranks_encoder_decoder_and_cross_heads_together(tmp_path):
    """A tiny BART trained from scratch on word-order reversal: 24 heads in encoder self-, decoder self-
    and cross attention, six attention layers, so three heads go per iteration, chosen by confidence
    across all three kinds; training from the checkpoint lowers the loss; the slimmed model reloads."""
    save_tiny(tmp_path / "bart", "bart", "BartForConditionalGeneration")
    write_rows(tmp_path / "train.csv", reversal_rows(96, seed=1))
    write_rows(tmp_path / "dev.csv", reversal_rows(24, seed=2))
    out = tmp_path / "slim"
    res = run(
        "prune",
        tmp_path / "bart",
        "--method",
        "lottery",
        "--keep",
        "12",
        "--data",
        tmp_path / "train.csv",
        "--eval-data",
        tmp_path / "dev.csv",
        "--out",
        out,
        "--json",
        "-",
        "--reset-at",
        "30",
        "--prune-every",
        "10",
        "--max-steps",
        "30",
        "--eval-every",
        "10",
        "--lr",
        "3e-3",
        "--seq-len",
        "16",
        "--batch-size",
        "8",
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    lot = report["lottery"]
    assert lot["per_step"] == 3 and report["heads"]["after"] == 12
    its = lot["iterations"]
    assert [it["heads"] for it in its] == [21, 18, 15, 12]
    blocks = {b: 4 for b in lot["iterations"][0]["confidence"]}
    assert {b.split(".")[0] for b in blocks} == {"encoder", "decoder", "cross"}
    kept = {b: list(range(n)) for b, n in blocks.items()}
    for it in its:
        ranked = sorted((it["confidence"][b][h], b, h) for b, hs in kept.items() for h in hs)
        assert sorted(it["removed"]) == sorted(f"{b}:{h}" for _, b, h in ranked[:3])
        for name in it["removed"]:
            b, h = name.rsplit(":", 1)
            kept[b].remove(int(h))
    assert report["mask"]["keep"] == kept
    # the model learned from scratch: training took the loss well below its start
    assert lot["reset_loss"] is not None and its[-1]["metric_trained"] < report["metric"]["before"]
    ours = headcut.load(out)
    plain = transformers.AutoModelForSeq2SeqLM.from_pretrained(out, trust_remote_code=True).eval()
    batch = make_batch(plain, batch=2, length=6)
    with torch.no_grad():
        assert torch.allclose(ours(**batch).logits, plain(**batch).logits, atol=1e-5)


# ---- a decoder with grouped-query attention ----------------------------------------------------------------------


def test_decoder_lottery_removes_whole_kv_groups_by_causal_confidence(tmp_path):
    """A tiny Llama (3 layers x 6 query heads in 2 KV groups): confidence over causal attention, one KV
    group (3 heads) per iteration under --gqa auto, and the slimmed model reloads."""
    folder = save_tiny(tmp_path / "llama", "llama", "LlamaForCausalLM")
    g = torch.Generator().manual_seed(0)
    for name, n in (("train.txt", 48), ("dev.txt", 16)):
        (tmp_path / name).write_text("\n".join(sentence(g, 12) for _ in range(n)) + "\n")
    pruned = headcut.prune(
        folder,
        "lottery",
        keep=9,
        data=str(tmp_path / "train.txt"),
        eval_data=str(tmp_path / "dev.txt"),
        reset_at=3,
        prune_every=2,
        max_steps=4,
        data_options={"seq_len": 8, "batch_size": 4},
    )
    lot = pruned.report["lottery"]
    assert lot["per_step"] == 1  # three attention layers / 2, at least one unit (a group of 3) per iteration
    assert [it["heads"] for it in lot["iterations"]] == [15, 12, 9]
    for it in lot["iterations"]:
        assert len(it["removed"]) == 3 and all(0.0 < v <= 1.0 for vs in it["confidence"].values() for v in vs)
        heads = sorted(int(n.rsplit(":", 1)[1]) for n in it["removed"])
        assert heads in ([0, 1, 2], [3, 4, 5])  # a whole KV group
    assert pruned.report["metric"]["name"] == "perplexity"
    out = tmp_path / "slim"
    pruned.save(out)
    ours = headcut.load(out)
    plain = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    ids = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(ours(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-5)
