"""Recipes (headcut.recipes, issue 57): a prune job's stages and rounds as data, the default recipe of a model's
kind, the flags on top of a recipe, and the replay of a run from the recipe it saved."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
import torch
import yaml
from helpers import cls_rows, digest, one_line_error, run, save_tiny, sentence, write_rows

import headcut
from headcut.errors import HeadcutError, HeadcutValueError
from headcut.recipes import RECIPE_FILE, builtin_recipes, default_recipe, from_dict, read_recipe, recipe_yaml
from headcut.recipes.recipe import BUDGET_FIELDS, DATA_FIELDS, option_owners, stage_options

#: the README main job's recipe before recipes existed (scripts/demo.sh), at 8 heads of 2 x 4 (a budget under a
#: third of the heads: two rounds, to ceil(8/3) = 3 heads first), with 2 recovery steps per round instead of 500
MAIN_JOB_FLAGS = dict(
    refit=True,
    recover_steps=2,
    recover_hidden_weight=2.0,
    recover_average=0.5,
    data_options={"batch_size": 8, "max_examples": 4000},
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipes")
    return {
        "src": save_tiny(root / "bert", "bert", "BertForSequenceClassification"),  # 2 blocks x 4 heads
        "train": write_rows(root / "train.csv", cls_rows(24)),
        "dev": write_rows(root / "dev.csv", cls_rows(12, seed=1)),
        "root": root,
    }


def test_the_builtin_recipes_read_back_and_every_option_is_declared():
    from headcut.config import Budget
    from headcut.data.config import DataConfig
    from headcut.options import specs

    found = builtin_recipes()
    encoder = default_recipe("sequence-classification")
    assert encoder == found["encoder"]
    assert encoder is not None and encoder.name == "encoder"
    assert (encoder.method, encoder.stage("refit") is not None) == ("fluctuation", True)
    assert encoder.options_of("recover") == {"recover_steps": 500, "recover_hidden_weight": 2, "recover_average": 0.5}
    assert dict(encoder.data) == {"batch_size": 8, "max_examples": 4000}
    assert len(encoder.measured) == 8  # the page's "Targets on every task" rows
    assert set(BUDGET_FIELDS) == {s.name for s in specs(Budget)}
    assert set(DATA_FIELDS) == {"max_examples", "seq_len", "batch_size", "mlm_probability"}
    assert set(DATA_FIELDS) <= {s.name for s in specs(DataConfig)}
    owners = option_owners()  # every stage option belongs to one kind
    assert {owners[s.name] for s in stage_options("recover")} == {"recover"}
    assert [s.name for s in stage_options("cut")] == ["uniform", "gqa", "min_heads_per_block", "allocation"]
    for recipe in found.values():  # YAML and back, unchanged
        assert from_dict(yaml.safe_load(recipe_yaml(recipe)), "again") == recipe


def test_the_encoder_schedule_picks_its_rounds_by_the_budget():
    encoder = builtin_recipes()["encoder"]
    assert encoder.case(72, 24) is None and encoder.case(72, 30) is None  # one round
    at16 = encoder.case(72, 16)
    assert at16 is not None and [r.keep for r in at16.rounds] == [Fraction(1, 3), None]
    assert all(not r.options for r in at16.rounds)  # the recover stage's 500 steps in both
    at8 = encoder.case(72, 8)
    assert at8 is not None and [dict(r.options) for r in at8.rounds] == [
        {"recover_steps": 250},
        {"recover_steps": 750},
    ]
    assert encoder.case(72, 12) == at16  # 12 is not under a sixth of 72


@pytest.mark.parametrize(
    "change,message",
    [
        ({"colour": 1}, "unknown key 'colour'"),
        ({"stages": [{"cut": {}}]}, "every recipe has the stages choose and cut; choose is missing"),
        ({"stages": [{"cut": {}}, {"choose": {"method": "fluctuation"}}]}, "choose is out of it"),
        ({"stages": [{"choose": {"method": "nope"}}, {"cut": {}}]}, "'method' must name a method"),
        ({"stages": [{"choose": {"method": "fluctuation", "lam": 1}}, {"cut": {}}]}, "unknown option 'lam'"),
        ({"stages": [{"choose": {"method": "fluctuation"}}, {"cut": {"keep": 3}}]}, "unknown option 'keep'"),
        ({"stages": [{"choose": {"method": "fluctuation"}}, {"cut": {}}, {"mix": {}}]}, "unknown stage 'mix'"),
        (
            {"stages": [{"choose": {"method": "fluctuation"}}, {"cut": {}}, {"recover": {"recover_average": 2}}]},
            "recover_average must be in [0, 1] (got 2)",
        ),
        ({"stages": [{"choose": {"method": "fluctuation"}}, {"cut": {"gqa": "all"}}]}, "unknown gqa 'all'"),
        ({"data": {"batch_size": 0}}, "batch_size must be an integer >= 1"),
        ({"data": {"text_col": "x"}}, "unknown option 'text_col'"),
        ({"budget": {"keep": 3, "sparsity": 0.5}}, "give one budget: keep or sparsity, not both"),
        ({"schedule": [{"rounds": [{"keep": "1/3"}]}]}, "the last round, and only it, keeps the budget"),
        ({"schedule": [{"rounds": [{"keep": "4/3"}, {"keep": "budget"}]}]}, "a share of the model's heads"),
        ({"schedule": [{"rounds": [{"keep": "budget", "refit": True}]}]}, "unknown option 'refit'"),
        (
            {"stages": [{"choose": {"method": "pass"}}, {"cut": {}}]},
            "its schedule cuts in rounds, each scored on the model the one before left",
        ),
        ({"seed": -1}, "'seed' must be an integer >= 0"),
    ],
)
def test_a_recipe_file_is_checked_key_by_key(tmp_path, change, message):
    raw = {**builtin_recipes()["encoder"].to_dict(), **change}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(HeadcutValueError) as info:
        read_recipe(path)
    assert message in str(info.value) and str(path) in str(info.value)
    result = run("recipes", path)  # the command line shows the same refusal, on one line
    one_line_error(result, message)


def test_unreadable_recipes_are_refused_on_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [unclosed\n")
    with pytest.raises(HeadcutValueError, match="not YAML"):
        read_recipe(bad)
    with pytest.raises(HeadcutValueError, match="no recipe 'nothing-here'.*built-in recipe \\(decoder, encoder\\)"):
        read_recipe("nothing-here")
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"report_format": 1, "command": "export"}))
    with pytest.raises(HeadcutValueError, match="a report without a recipe"):
        read_recipe(report)


def test_the_default_recipe_is_the_main_jobs_flags(tiny):
    """No method: the encoder recipe, run exactly as its flags ran before recipes existed (same heads, same
    weights); the flags given change its options (here its recovery steps)."""
    src, train, dev = tiny["src"], tiny["train"], tiny["dev"]
    by_recipe = headcut.prune(src, keep=2, data=train, eval_data=dev, recover_steps=2)
    by_flags = headcut.prune(src, "fluctuation", keep=2, via=3, data=train, eval_data=dev, **MAIN_JOB_FLAGS)
    assert by_recipe.report["mask"] == by_flags.report["mask"]
    assert by_recipe.report["metric"] == by_flags.report["metric"]
    assert [r["keep"] for r in by_recipe.report["rounds"]] == [3]
    out1, out2 = tiny["root"] / "by-recipe", tiny["root"] / "by-flags"
    by_recipe.save(out1)
    by_flags.save(out2)
    assert digest(out1)["model.safetensors"] == digest(out2)["model.safetensors"]
    recipe = by_recipe.report["recipe"]
    assert recipe["name"] == "encoder" and recipe["budget"] == {"keep": 2} and recipe["seed"] == 0
    # its rules (3 heads first here), the rounds' own steps dropped: recover_steps was given, for every round
    changed = builtin_recipes()["encoder"].changed(options={"recover_steps": 2})
    assert recipe["schedule"] == changed.to_dict()["schedule"]
    assert recipe["schedule"][0]["rounds"] == [{"keep": "1/3"}, {"keep": "budget"}]
    # the method's run records itself as a recipe of the same stages, under the method's name
    assert (
        by_flags.report["recipe"]["stages"] == recipe["stages"] and by_flags.report["recipe"]["name"] == "fluctuation"
    )
    assert (out1 / RECIPE_FILE).read_text() == recipe_yaml(read_recipe(out1 / "headcut-report.json"))


def test_a_saved_recipe_replays_the_run(tiny, tmp_path):
    """The recipe a prune saves (YAML beside the report, the report itself, or the folder) replays it: the same
    heads and the same bytes; a budget given on top replaces the recorded one."""
    src, train, dev = tiny["src"], tiny["train"], tiny["dev"]
    first = tmp_path / "first"
    result = run(
        "prune",
        src,
        "--keep",
        "1",
        "--data",
        train,
        "--eval-data",
        dev,
        "--recover-steps",
        "2",
        "--seed",
        "3",
        "--out",
        first,
    )
    assert result.exit_code == 0, result.output
    assert "recipe encoder (fluctuation) kept 1 of 8 heads" in result.stdout
    assert "recipe encoder: fluctuation; refit; recovery steps=2" in result.stdout
    saved = json.loads((first / "headcut-report.json").read_text())
    assert [r["keep"] for r in saved["rounds"]] == [3]  # 1 head is under a sixth of 8: two rounds, to 3 first
    rounds = saved["recipe"]["schedule"][0]["rounds"]
    assert rounds == [{"keep": "1/3"}, {"keep": "budget"}]  # --recover-steps holds in every round
    assert saved["recipe"]["seed"] == 3 and saved["arguments"]["recipe"] is None
    for i, source in enumerate((first, first / RECIPE_FILE, first / "headcut-report.json")):
        again = tmp_path / f"again{i}"
        result = run("prune", src, "--recipe", source, "--data", train, "--eval-data", dev, "--out", again)
        assert result.exit_code == 0, result.output
        replayed = json.loads((again / "headcut-report.json").read_text())
        assert replayed["mask"] == saved["mask"] and replayed["recipe"]["seed"] == 3
        assert digest(again)["model.safetensors"] == digest(first)["model.safetensors"]
    wider = run("prune", src, "--recipe", first, "--keep", "6", "--data", train, "--out", tmp_path / "wider")
    assert wider.exit_code == 0, wider.output
    assert json.loads((tmp_path / "wider" / "headcut-report.json").read_text())["heads"]["after"] == 6


def test_flags_change_a_recipe_also_to_their_defaults(tiny, tmp_path):
    src, train = tiny["src"], tiny["train"]
    result = run("prune", src, "--keep", "6", "--data", train, "--recover-steps", "0", "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output
    recipe = json.loads((tmp_path / "o" / "headcut-report.json").read_text())["recipe"]
    assert [next(iter(s)) for s in recipe["stages"]] == ["choose", "cut", "refit"]  # no recovery
    assert "recovery" not in json.loads((tmp_path / "o" / "headcut-report.json").read_text())
    pruned = headcut.prune(src, keep=6, data=train, recover_steps=1, recover_average=0.25, gqa="group")
    recover = next(s["recover"] for s in pruned.report["recipe"]["stages"] if "recover" in s)
    assert recover == {"recover_steps": 1, "recover_hidden_weight": 2, "recover_average": 0.25}
    cut = next(s["cut"] for s in pruned.report["recipe"]["stages"] if "cut" in s)
    assert cut["gqa"] == "group"


def test_a_method_alone_and_its_replay(tiny, tmp_path):
    src = tiny["src"]
    alone = headcut.prune(src, "magnitude", keep=5, out=tmp_path / "m")
    recipe = alone.report["recipe"]
    assert recipe["name"] == "magnitude" and [next(iter(s)) for s in recipe["stages"]] == ["choose", "cut"]
    again = headcut.prune(src, recipe=tmp_path / "m", out=tmp_path / "m2")
    assert again.report["mask"] == alone.report["mask"]
    assert digest(tmp_path / "m2")["model.safetensors"] == digest(tmp_path / "m")["model.safetensors"]


def test_the_recipe_refusals(tiny, tmp_path):
    src, train = tiny["src"], tiny["train"]
    with pytest.raises(HeadcutError, match="give method .* or recipe, not both"):
        headcut.prune(src, "magnitude", recipe="encoder", keep=4)
    with pytest.raises(HeadcutError, match="recipe encoder reads training data with labels: give it as data"):
        headcut.prune(src, keep=4)
    with pytest.raises(HeadcutError, match="no budget"):
        headcut.prune(src, data=train)
    result = run("prune", src, "--method", "magnitude", "--recipe", "encoder", "--keep", "4", "--out", tmp_path / "x")
    one_line_error(result, "give --method (the method alone, with its paper's defaults) or --recipe, not both")
    result = run("prune", src, "--keep", "4", "--out", tmp_path / "x")
    one_line_error(result, "recipe encoder reads training data with labels: give it as --data")
    compensated = tmp_path / "compensated.yaml"
    raw = builtin_recipes()["encoder"].to_dict()
    raw["stages"][0] = {"choose": {"method": "fluctuation", "bias_compensation": True}}
    compensated.write_text(yaml.safe_dump(raw))
    with pytest.raises(HeadcutError, match="bias_compensation compensates a one-round cut"):
        headcut.prune(src, recipe=compensated, keep=2, data=train)
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """A tiny Llama (3 layers x 6 query heads in 2 KV groups of 3, 64 positions) and a text file of 40 lines."""
    root = tmp_path_factory.mktemp("recipes-lm")
    rng = torch.Generator().manual_seed(0)
    text = root / "text.txt"
    text.write_text("\n\n".join(sentence(rng, 30) for _ in range(40)) + "\n")
    return {"src": save_tiny(root / "llama", "llama", "LlamaForCausalLM"), "text": text, "root": root}


def test_a_causal_lm_runs_the_decoder_recipe(tiny_lm, tmp_path):
    """No method: a causal LM runs the built-in ``decoder`` recipe (the allocation over keep, merge and remove, the
    cut, block-local distillation), the same heads and bytes as its method and stages' options given by hand; its
    blocks, longer than the tiny model's 64 positions, are read at 64, with a note."""
    src, text = tiny_lm["src"], tiny_lm["text"]
    decoder = default_recipe("causal-lm")
    assert decoder is not None and decoder == builtin_recipes()["decoder"]
    assert decoder.options_of("cut").get("gqa") == "group" and decoder.measured
    by_recipe = headcut.prune(src, keep=12, data=text, out=tmp_path / "a")
    assert by_recipe.report["recipe"]["name"] == "decoder"
    assert by_recipe.report["allocate"]["chosen"] and by_recipe.report["distill"]
    # the allocation saves at least the KV bytes the method's own cut to 12 heads would (merges keep query heads)
    allocated = by_recipe.report["allocate"]
    assert allocated["bytes_after"] <= allocated["bytes_before"] - allocated["bytes_needed"]
    wanted = decoder.data["seq_len"]
    assert wanted > 64
    assert any(
        f"reads blocks of {wanted} tokens, more than this model's 64 positions" in n for n in by_recipe.report["notes"]
    )
    assert by_recipe.report["recipe"]["data"]["seq_len"] == 64
    by_hand = headcut.prune(
        src,
        decoder.method,
        keep=12,
        data=text,
        data_options={**decoder.data, "seq_len": 64},
        out=tmp_path / "b",
        allocate=True,
        **decoder.options_of("allocate"),
        **decoder.options_of("cut"),
        **decoder.options_of("distill"),
        **decoder.method_options,
    )
    assert by_hand.report["mask"] == by_recipe.report["mask"]
    assert digest(tmp_path / "a")["model.safetensors"] == digest(tmp_path / "b")["model.safetensors"]
    # whole KV groups go: every layer keeps a multiple of the group's 3 query heads
    assert all(len(kept) % 3 == 0 for kept in by_recipe.mask.keep.values())
    # the README's one line on the CLI, and its replay from the folder
    result = run("prune", src, "--keep", "6", "--data", text, "--out", tmp_path / "c")
    assert result.exit_code == 0, result.output
    assert "recipe decoder" in result.stdout and "more than this model's 64 positions" in result.output
    headcut.prune(src, recipe=tmp_path / "c", data=text, out=tmp_path / "d")
    assert digest(tmp_path / "c")["model.safetensors"] == digest(tmp_path / "d")["model.safetensors"]
    # a --seq-len given longer than the model reads is still refused
    with pytest.raises(HeadcutError, match="longer than the model's 64 positions"):
        headcut.prune(src, keep=12, data=text, data_options={"seq_len": 128})


def test_a_model_of_another_kind_has_no_default_recipe(tmp_path):
    base = save_tiny(tmp_path / "base", "bert", "BertModel")
    with pytest.raises(HeadcutValueError, match="no default recipe for a base model: no recipe has been measured"):
        headcut.prune(base, keep=4, data="x.txt")
    assert headcut.recipe_for(base, "encoder").name == "encoder"  # a recipe named runs on any model


def test_headcut_recipes_lists_and_shows(tmp_path):
    listed = run("recipes", "--json", "-")
    assert listed.exit_code == 0, listed.output
    names = [r["name"] for r in json.loads(listed.stdout)]
    assert names == list(builtin_recipes())
    shown = run("recipes", "encoder")
    assert shown.exit_code == 0, shown.output
    for needle in ("the default recipe of sequence-classification models", "recover_steps=500", "79.88"):
        assert needle in shown.stdout
    assert "a budget under 1/3 of the heads: 2 rounds, to 1/3 -> budget" in shown.stdout
    one = run("recipes", "encoder", "--json", "-")
    assert json.loads(one.stdout) == builtin_recipes()["encoder"].to_dict()


def test_a_schedule_of_three_rounds_each_with_its_own_recovery(tiny, tmp_path):
    src, train = tiny["src"], tiny["train"]
    recipe = {
        "name": "three-rounds",
        "stages": [{"choose": {"method": "fluctuation"}}, {"cut": {}}, {"recover": {"recover_steps": 2}}],
        "data": {"batch_size": 8},
        "schedule": [
            {"rounds": [{"keep": 6, "recover_steps": 1}, {"keep": "1/2", "recover_steps": 0}, {"keep": "budget"}]}
        ],
    }
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump(recipe))
    pruned = headcut.prune(src, recipe=path, keep=2, data=train)
    earlier = pruned.report["rounds"]
    assert [r["keep"] for r in earlier] == [6, 4]
    assert earlier[0]["recovery"]["steps"] == 1 and "recovery" not in earlier[1]
    assert pruned.report["recovery"]["steps"] == 2 and pruned.report["heads"]["after"] == 2
    assert all(set(pruned.mask.keep[b]) <= set(earlier[1]["mask"]["keep"][b]) for b in pruned.mask.keep)
    with pytest.raises(HeadcutError, match="round 1 of the schedule keeps 6 heads: a round before the last must"):
        headcut.prune(src, recipe=path, keep=7, data=train)
    again = run("prune", src, "--recipe", path, "--keep", "2", "--data", train, "--seed", "5", "--out", tmp_path / "o")
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "o" / "headcut-report.json").read_text())["recipe"]["seed"] == 5


@pytest.mark.parametrize(
    "method,options",
    [
        ("gradient", {}),
        ("michel", {}),  # iterative, re-scored every step
        ("fluctuation", {"bias_compensation": True}),
        ("pass", {"max_steps": 2}),  # learned gates: the training's every option is in the recipe
        ("voita", {"max_steps": 2}),
    ],
)
def test_every_kind_of_method_replays_from_its_saved_recipe(tiny, tmp_path, method, options):
    """A method's run replays from the recipe it saved: every one of the method's options (its defaults too) is in
    it, and the request check takes them all back (auber and lottery, too slow here, replayed the same by hand)."""
    src, train = tiny["src"], tiny["train"]
    first = headcut.prune(
        src, method, keep=4, data=train, data_options={"batch_size": 8}, out=tmp_path / "a", **options
    )
    again = headcut.prune(src, recipe=tmp_path / "a", data=train, out=tmp_path / "b")
    assert again.report["mask"] == first.report["mask"]
    assert again.report["recipe"] == first.report["recipe"]
    assert digest(tmp_path / "a")["model.safetensors"] == digest(tmp_path / "b")["model.safetensors"]


def test_schedule_flag_keyword_and_recipe_file_cut_in_the_same_rounds(tiny, tmp_path):
    """--schedule K1,K2 (issue 69): rounds to K1 then K2 heads, then the budget; the keyword and a recipe file's
    schedule run the same rounds, and --via K is --schedule K."""
    cli = tmp_path / "cli"
    done = run("prune", tiny["src"], "--method", "magnitude", "--keep", 5, "--schedule", "7,6", "--out", cli, "-q")
    assert done.exit_code == 0, done.output
    report = json.loads((cli / "headcut-report.json").read_text())
    assert [r["keep"] for r in report["rounds"]] == [7, 6]
    assert report["heads"]["after"] == 5
    assert report["recipe"]["schedule"] == [{"rounds": [{"keep": 7}, {"keep": 6}, {"keep": "budget"}]}]
    api = headcut.prune(str(tiny["src"]), method="magnitude", keep=5, schedule="7,6", out=str(tmp_path / "api"))
    path = tmp_path / "three.yaml"
    path.write_text(
        "name: three\nstages: [{choose: {method: magnitude}}, cut]\n"
        "schedule:\n  - rounds: [{keep: 7}, {keep: 6}, {keep: budget}]\n",
        encoding="utf-8",
    )
    file = tmp_path / "file"
    assert run("prune", tiny["src"], "--recipe", path, "--keep", 5, "--out", file, "-q").exit_code == 0
    replayed = json.loads((file / "headcut-report.json").read_text())
    assert api.report["mask"] == report["mask"] == replayed["mask"]
    assert [r["mask"] for r in api.report["rounds"]] == [r["mask"] for r in report["rounds"]]
    assert [r["mask"] for r in replayed["rounds"]] == [r["mask"] for r in report["rounds"]]

    def weights(folder):
        return {k: v for k, v in digest(folder).items() if k.endswith(".safetensors")}

    assert weights(cli) == weights(tmp_path / "api") == weights(file) != {}
    via, schedule = tmp_path / "via", tmp_path / "schedule"
    assert run("prune", tiny["src"], "--method", "magnitude", "--keep", 5, "--via", 6, "--out", via).exit_code == 0
    args = ("--method", "magnitude", "--keep", 5, "--schedule", "6", "--out", schedule)
    assert run("prune", tiny["src"], *args).exit_code == 0
    assert weights(via) == weights(schedule)
    for bad, words in (("6,7", "fewer heads each round"), ("7,x", "heads counts K1,K2,..."), ("4", "keeps 4 heads")):
        args = ("--method", "magnitude", "--keep", 5, "--schedule", bad, "--out", tmp_path / "bad")
        one_line_error(run("prune", tiny["src"], *args), words)
    assert not (tmp_path / "bad").exists()
