"""Block-local distillation (issue 70, point 3): every attention block a cut changed, trained alone to reproduce the
unpruned model's block on cached calibration inputs (headcut.training.block_distill), and the ``distill`` stage that
runs it after any cut (flags, keywords, recipe files, its report)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import make_batch, make_model, one_line_error, output_tensor, run, tiny_lm

import headcut
from headcut.data.tasks import Calibration
from headcut.errors import HeadcutError
from headcut.model.masks import HeadMask
from headcut.model.surgery import model_blocks, slim
from headcut.training.block_distill import distill_blocks

FAMILIES = [
    ("llama", "LlamaForCausalLM"),  # GQA, the output projection inside the attention module
    ("gpt2", "GPT2LMHeadModel"),  # fused q, k, v
    ("bert", "BertForSequenceClassification"),  # the output projection outside the attention module
    ("t5", "T5ForConditionalGeneration"),  # encoder, decoder and cross-attention blocks
]


def _cut(family: str, cls: str, skip: str | None = None):
    """A tiny model, its unpruned copy, and the model cut to about half its heads (whole KV groups); ``skip``:
    a block left whole."""
    model = make_model(family, cls)
    teacher = copy.deepcopy(model).eval()
    keep = {}
    for b in model_blocks(model):
        if b.name == skip:
            keep[b.name] = list(range(b.heads))
        elif b.group_size > 1:
            keep[b.name] = list(range(b.group_size * max(1, b.kv_heads // 2)))
        else:
            keep[b.name] = list(range(max(1, b.heads // 2)))
    slim(model, HeadMask(keep))
    batches = [make_batch(teacher, batch=3, length=8, seed=s) for s in range(3)]
    cal = Calibration(task="test", batches=batches, examples=9, source="random", columns={})
    return model, teacher, cal


def _distance(model, teacher, batches) -> float:
    """The relative squared distance of the models' outputs over ``batches``."""
    num = den = 0.0
    with torch.no_grad():
        for batch in batches:
            a, b = output_tensor(model(**batch)).float(), output_tensor(teacher(**batch)).float()
            num += float(((a - b) ** 2).sum())
            den += float((b * b).sum())
    return num / den


@pytest.mark.parametrize(("family", "cls"), FAMILIES)
def test_each_changed_block_comes_closer_to_the_unpruned_block(family, cls):
    model, teacher, cal = _cut(family, cls, skip=model_blocks(make_model(family, cls))[0].name)
    before = _distance(model.eval(), teacher, cal.batches)
    untouched = {n: p.detach().clone() for n, p in model.named_parameters()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    unpruned = {n: p.detach().clone() for n, p in teacher.named_parameters()}
    done = distill_blocks(model, teacher, cal, steps=40, lr=1e-2)
    names = [b.name for b in done.blocks]
    first = model_blocks(model)[0].name
    assert first not in names and names  # the block the cut left whole is not trained
    for b in done.blocks:
        assert b.error_after < b.error_before, b
    assert _distance(model.eval(), teacher, cal.batches) < before
    # only the trained blocks' attention weights (their output projections included) changed
    trained = set()
    for b in model_blocks(model):
        if b.name in names:
            for path in (b.attn, b.o):
                trained |= {id(p) for p in model.base_model.get_submodule(path).parameters()}
    changed = {id(p) for n, p in model.named_parameters() if not torch.equal(p, untouched[n])}
    assert changed and changed <= trained
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(torch.equal(p, unpruned[n]) for n, p in teacher.named_parameters())  # the teacher untouched


def test_output_only_trains_the_output_projections_and_cut_inputs_run():
    model, teacher, cal = _cut("llama", "LlamaForCausalLM")
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    done = distill_blocks(model, teacher, cal, steps=20, lr=1e-2, train="output", inputs="cut")
    assert done.to_json()["train"] == "output" and done.to_json()["inputs"] == "cut"
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, saved[n])}
    assert changed and all("o_proj" in n for n in changed)
    assert all(b.error_after <= b.error_before for b in done.blocks)


def test_the_same_seed_gives_the_same_weights_and_bad_settings_are_refused():
    (a, teacher, cal), (b, _, _) = _cut("gpt2", "GPT2LMHeadModel"), _cut("gpt2", "GPT2LMHeadModel")
    distill_blocks(a, teacher, cal, steps=10, lr=1e-3, seed=3)
    distill_blocks(b, teacher, cal, steps=10, lr=1e-3, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    for kwargs, words in (
        (dict(steps=0), "at least 1 step"),
        (dict(steps=1, train="everything"), "trains one of attention, output"),
        (dict(steps=1, inputs="teacher"), "inputs from one of unpruned, cut"),
    ):
        with pytest.raises(HeadcutError, match=words):
            distill_blocks(a, teacher, cal, **kwargs)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return tiny_lm(tmp_path_factory.mktemp("distill"))


def test_the_distill_stage_from_flags_keywords_and_a_recipe_file(lm, tmp_path):
    folder, text = lm
    args = ["--method", "magnitude", "--keep", 6, "--data", text, "--seq-len", 32, "--max-examples", 8]
    plain = tmp_path / "plain"
    assert run("prune", folder, *args, "--out", plain, "-q").exit_code == 0
    out = tmp_path / "cli"
    done = run("prune", folder, *args, "--distill-steps", 15, "--distill-lr", 1e-3, "--recover-steps", 2, "--out", out)
    assert done.exit_code == 0, done.output
    report = json.loads((out / "headcut-report.json").read_text())
    assert [next(iter(s)) for s in report["recipe"]["stages"]] == ["choose", "cut", "distill", "recover"]
    distilled = report["distill"]
    assert distilled["steps"] == 15 and distilled["lr"] == 1e-3 and distilled["blocks"]
    assert all(b["error_after"] <= b["error_before"] for b in distilled["blocks"])
    assert json.loads((plain / "headcut-report.json").read_text()).get("distill") is None
    # Python: the same request, the same weights
    api = headcut.prune(
        str(folder),
        method="magnitude",
        keep=6,
        data=str(text),
        data_options={"seq_len": 32, "max_examples": 8},
        distill_steps=15,
        distill_lr=1e-3,
        recover_steps=2,
        out=str(tmp_path / "api"),
    )
    assert api.report["distill"]["blocks"] == distilled["blocks"]
    # replayed from its recipe: the same weights again
    again = tmp_path / "again"
    assert run("prune", folder, "--recipe", out, "--data", text, "--out", again, "-q").exit_code == 0
    from safetensors.torch import load_file

    ours, replayed = load_file(str(out / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert all(torch.equal(ours[k], replayed[k]) for k in ours)
    listed = run("recipes")
    assert "distill" in listed.stdout and "distill_steps=0" in listed.stdout


def test_the_distill_stage_refusals_read_alike(lm, tmp_path):
    folder, text = lm
    flags = one_line_error(
        run("prune", folder, "--method", "magnitude", "--keep", 6, "--distill-steps", 5, "--out", tmp_path / "a"),
        "--distill-steps trains each changed block on cached inputs of calibration data: it needs --data",
    )
    with pytest.raises(HeadcutError) as api:
        headcut.prune(str(folder), method="magnitude", keep=6, distill_steps=5, out=str(tmp_path / "b"))
    assert str(api.value) == flags.removeprefix("error: ").replace("--distill-steps", "distill_steps").replace(
        "--data", "data"
    )
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nstages: [{choose: {method: magnitude}}, cut, {distill: {distill_train: all}}]\n")
    one_line_error(
        run("prune", folder, "--recipe", recipe, "--keep", 6, "--data", text, "--out", tmp_path / "c"),
        "stage distill",
        "distill_train",
    )
    one_line_error(
        run(
            "prune",
            folder,
            "--method",
            "magnitude",
            "--keep",
            6,
            "--data",
            text,
            "--distill-steps",
            2,
            "--distill-lr",
            0,
            "--out",
            tmp_path / "d",
        ),
        "--distill-lr must be > 0",
    )
    assert not any((tmp_path / n).exists() for n in "abcd")
