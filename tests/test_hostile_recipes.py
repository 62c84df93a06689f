"""Hostile recipe files and budget values (issue 68): a recipe file, like every file a command reads, is an input
(never written over, never inside ``--out``, never replaced by ``--force``); recipes are read with limits (size,
depth, aliases) and every value in them is checked as the flag of the same name is, by ``headcut prune`` and
``headcut recipes`` alike; text from a file is shown as text; a ``--context`` is checked against the model's
positions and, for ``--target-speedup``, against the device's memory before anything is allocated."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from helpers import cls_rows, digest, one_line_error, run, save_tiny, sentence, write_rows

import headcut
from headcut.errors import HeadcutError, HeadcutTypeError, HeadcutValueError
from headcut.jobs.prune import check_recipe
from headcut.recipes import builtin_recipes, from_dict, read_recipe


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch

    root = tmp_path_factory.mktemp("hostile-recipes")
    rng = torch.Generator().manual_seed(0)
    text = root / "text.txt"
    text.write_text("\n".join(sentence(rng, 40) for _ in range(24)))
    return {
        "bert": save_tiny(root / "bert", "bert", "BertForSequenceClassification"),  # 2 blocks x 4 heads
        "llama": save_tiny(root / "llama", "llama", "LlamaForCausalLM"),  # 3 blocks x 6 heads, 64 positions
        "train": write_rows(root / "train.csv", cls_rows(24)),
        "text": text,
        "root": root,
    }


def _recipe(path: Path, **change) -> Path:
    """A small valid recipe (magnitude, no data needed) with ``change`` on top, written as YAML or JSON."""
    raw = {"name": "small", "stages": [{"choose": {"method": "magnitude"}}, {"cut": {}}], **change}
    path.write_text(json.dumps(raw) if path.suffix == ".json" else yaml.safe_dump(raw, sort_keys=False))
    return path


def _bytes(path: Path) -> bytes:
    return path.read_bytes()


# ---- a recipe file is an input --------------------------------------------------------------------------------


def test_prune_json_never_writes_over_the_recipe_it_reads(tiny, tmp_path):
    recipe = _recipe(tmp_path / "r.json")
    before = _bytes(recipe)
    result = run("prune", tiny["bert"], "--recipe", recipe, "--keep", 4, "--out", tmp_path / "o", "--json", recipe)
    one_line_error(result, "--json", "is the --recipe input itself")
    assert _bytes(recipe) == before
    assert not (tmp_path / "o").exists()


def test_recipes_json_never_rewrites_the_recipe_it_shows(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# my notes\nname: small  # mine\nstages: [{choose: {method: magnitude}}, {cut: {}}]\n")
    before = _bytes(recipe)
    one_line_error(run("recipes", recipe, "--json", recipe), "--json", "is the RECIPE input itself")
    assert _bytes(recipe) == before


def test_a_replayed_folder_is_never_replaced_by_its_own_replay(tiny, tmp_path):
    out = tmp_path / "o"
    first = run("prune", tiny["bert"], "--recipe", _recipe(tmp_path / "r.yaml"), "--keep", 4, "--out", out)
    assert first.exit_code == 0, first.output
    before = digest(out)
    again = run("prune", tiny["bert"], "--recipe", out, "--keep", 4, "--out", out, "--force")
    one_line_error(again, "--out", "contains the --recipe input", "headcut-recipe.yaml")
    assert digest(out) == before
    with pytest.raises(HeadcutValueError, match="contains the recipe input"):
        headcut.prune(tiny["bert"], recipe=out, keep=4, out=out, force=True)
    assert digest(out) == before


def _inputs(tiny, tmp_path):
    """Every command with a file input and --json: (args without --json, {flag: the input file})."""
    recipe = _recipe(tmp_path / "r.yaml")
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"drop": {"self.0": [0]}}))
    fake_python = tmp_path / "python3"
    fake_python.write_text("#!/bin/sh\nexit 1\n")
    fake_python.chmod(0o755)
    bert, train, out = tiny["bert"], tiny["train"], tmp_path / "out"
    return [
        (["prune", bert, "--recipe", recipe, "--keep", 4, "--data", train, "--out", out], recipe),
        (["prune", bert, "--method", "magnitude", "--keep", 4, "--data", train, "--out", out], train),
        (["prune", bert, "--keep", 4, "--data", train, "--eval-data", tmp_path / "dev.csv", "--out", out], "dev"),
        (["finetune", bert, "--data", train, "--out", out], train),
        (["finetune", bert, "--data", train, "--distill-from", tiny["llama"] / "config.json", "--out", out], "teach"),
        (["score", bert, "--data", train], train),
        (["eval", bert, "--data", train], train),
        (["export", bert, "--mask", mask, "--out", out], mask),
        (["recipes", recipe], recipe),
        (["bench", bert, "--runtime", "vllm", "--vllm-python", fake_python], fake_python),
    ]


def test_no_command_writes_its_json_over_an_input(tiny, tmp_path):
    write_rows(tmp_path / "dev.csv", cls_rows(8, seed=1))
    for args, target in _inputs(tiny, tmp_path):
        if target == "dev":
            target = tmp_path / "dev.csv"
        elif target == "teach":
            target = tiny["llama"] / "config.json"
        before = _bytes(target)
        result = run(*args, "--json", target)
        assert result.exit_code == 2, (args, result.output)
        assert "headcut never writes over its inputs" in result.stderr, (args, result.stderr)
        assert _bytes(target) == before, args
        assert not (tmp_path / "out").exists(), args


# ---- read with limits -------------------------------------------------------------------------------------------


def _alias_bomb(levels: int, width: int, where: str) -> str:
    """A YAML recipe whose ``where`` (``measured`` or a method option) names ``width ** levels`` values through
    ``levels`` nested aliases."""
    chain = [f"&a0 [{', '.join(['lol'] * width)}]"]
    chain += [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    value = "[" + ", ".join(chain) + "]"
    if where == "measured":
        return (
            f"name: bomb\nstages: [{{choose: {{method: magnitude}}}}, {{cut: {{}}}}]\nmeasured:\n  - {{x: {value}}}\n"
        )
    return f"name: bomb\nstages:\n  - choose:\n      method: magnitude\n      rounds: {value}\n  - cut: {{}}\n"


def _merge_bomb(levels: int, width: int) -> str:
    """A YAML recipe whose measured row merges ``width`` copies of the mapping before it, ``levels`` times."""
    lines = ["name: bomb", "stages: [{choose: {method: magnitude}}, {cut: {}}]", "measured:", "  - &m0 {a: 1, b: 2}"]
    for i in range(1, levels):
        lines.append(f"  - &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * width)}], k{i}: 1}}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["measured", "option"])
def test_yaml_aliases_that_name_too_many_values_are_refused(tiny, tmp_path, where):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(6, 9, where))  # 9**6 = 531,441 values through 6 aliases
    before = _bytes(path)
    with pytest.raises(HeadcutValueError, match="more than 100,000 values"):
        read_recipe(path)
    one_line_error(run("recipes", path), "more than 100,000 values", str(path))
    result = run("prune", tiny["bert"], "--recipe", path, "--keep", 4, "--out", tmp_path / "o")
    one_line_error(result, "more than 100,000 values")
    assert _bytes(path) == before


def test_a_mapping_that_shares_its_values_is_counted_as_a_recipe_file_is():
    row: list = ["lol"] * 9
    for _ in range(6):
        row = [row] * 9
    raw = {"name": "bomb", "stages": [{"choose": {"method": "magnitude"}}, {"cut": {}}], "measured": [{"x": row}]}
    with pytest.raises(HeadcutValueError, match="more than 100,000 values"):
        read_recipe(raw)
    looped: dict = {"name": "loop", "stages": [{"choose": {"method": "magnitude"}}, {"cut": {}}], "measured": []}
    looped["measured"].append(looped)
    with pytest.raises(HeadcutValueError, match="nested more than 32 levels"):
        read_recipe(looped)


SCRIPT = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
    from headcut.cli import app
    sys.argv = ["headcut", *sys.argv[1:]]
    app()
""")


@pytest.mark.parametrize("kind", ["alias", "merge"])
def test_a_billion_values_end_in_one_line_quickly_within_bounded_memory(tmp_path, kind):
    """The attack as a user's machine meets it: 9**10 values (alias) or 9**10 merged pairs, in a process capped at
    3 GB of address space; today's code grows past it, or runs for minutes."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(10, 9, "measured") if kind == "alias" else _merge_bomb(10, 9))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "recipes", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert "more than 100,000 values" in done.stderr


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_values_nested_100000_deep_are_refused_on_one_line(tiny, tmp_path, suffix):
    path = tmp_path / f"deep{suffix}"
    path.write_text("[" * 100_000 + "]" * 100_000 if suffix == ".json" else "name: x\nstages: " + "[" * 100_000)
    with pytest.raises(HeadcutValueError, match="nested more than 32 levels deep"):
        read_recipe(path)
    one_line_error(run("recipes", path), "nested more than 32 levels deep")
    result = run("prune", tiny["bert"], "--recipe", path, "--keep", 4, "--out", tmp_path / "o")
    one_line_error(result, "nested more than 32 levels deep")


def test_a_recipe_file_larger_than_a_recipe_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("name: big\nabout: '" + "x" * (2 * 1024**2) + "'\nstages: [choose, cut]\n")
    one_line_error(run("recipes", path), "more than 1 MiB of YAML")


@pytest.mark.parametrize("source", [5, None, 1.5, b"recipe.yaml", ["encoder"]])
def test_read_recipe_refuses_what_is_no_recipe(source):
    with pytest.raises(HeadcutTypeError, match="a recipe is a built-in name, a recipe file's path"):
        read_recipe(source)


# ---- every value checked as the flags check it ---------------------------------------------------------------


def test_recover_steps_past_64_bits_in_a_recipe_is_refused_as_the_flag_is(tiny, tmp_path, monkeypatch):
    from headcut.training import finetuning

    def started(*args, **kwargs):
        raise AssertionError("the recovery started training")

    monkeypatch.setattr(finetuning, "finetune", started)  # a recipe let through would train (nearly) forever
    huge = 10**30
    path = _recipe(tmp_path / "r.yaml", stages=[{"choose": {"method": "magnitude"}}, {"cut": {}}])
    raw = yaml.safe_load(path.read_text())
    raw["stages"].append({"recover": {"recover_steps": huge}})
    path.write_text(yaml.safe_dump(raw))
    flag = run(*_flag_args(tiny, tmp_path), "--recover-steps", huge)
    one_line_error(flag, "--recover-steps", "integers here fit in 64 bits")
    from_file = run(
        "prune", tiny["bert"], "--recipe", path, "--keep", 4, "--data", tiny["train"], "--out", tmp_path / "o"
    )
    one_line_error(from_file, "recipe small", "recover_steps", "integers here fit in 64 bits")
    one_line_error(run("recipes", path), "recipe small", "recover_steps", "integers here fit in 64 bits")
    with pytest.raises(HeadcutValueError, match="recover_steps .* integers here fit in 64 bits"):
        headcut.prune(tiny["bert"], recipe=raw, keep=4, data=tiny["train"])
    schedule = dict(
        raw,
        stages=[*raw["stages"][:2], {"recover": {"recover_steps": 2}}],
        schedule=[{"rounds": [{"keep": 6, "recover_steps": huge}, {"keep": "budget"}]}],
    )
    with pytest.raises(HeadcutValueError, match="recover_steps .* integers here fit in 64 bits"):
        check_recipe(from_dict(schedule, "r"))


def _flag_args(tiny, tmp_path):
    return [
        "prune",
        tiny["bert"],
        "--method",
        "magnitude",
        "--keep",
        4,
        "--data",
        tiny["train"],
        "--out",
        tmp_path / "f",
    ]


def test_a_method_given_as_a_list_is_refused_on_one_line(tiny, tmp_path):
    path = _recipe(tmp_path / "r.yaml", stages=[{"choose": {"method": ["magnitude"]}}, {"cut": {}}])
    one_line_error(run("recipes", path), "'method' must name a method")
    result = run("prune", tiny["bert"], "--recipe", path, "--keep", 4, "--out", tmp_path / "o")
    one_line_error(result, "'method' must name a method")
    with pytest.raises(HeadcutValueError, match="'method' must name a method"):
        headcut.prune(tiny["bert"], recipe=yaml.safe_load(path.read_text()), keep=4)


def test_headcut_recipes_refuses_a_method_option_prune_refuses(tiny, tmp_path):
    path = _recipe(tmp_path / "r.yaml", stages=[{"choose": {"method": "magnitude", "rounds": -3}}, {"cut": {}}])
    shown = one_line_error(run("recipes", path), "rounds must be an integer >= 1 (got -3)")
    pruned = one_line_error(run("prune", tiny["bert"], "--recipe", path, "--keep", 4, "--out", tmp_path / "o"))
    assert shown == pruned  # the same check, the same line


HOSTILE = [None, [], {}, [1], {"a": 1}, 1.5, float("nan"), True, -3, 0, 10**30, 2**63, "", "1/0", "\x1b[31m", (1,)]


def _paths(value, at=()):
    yield at
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*at, i))


def test_no_value_anywhere_in_a_recipe_ends_in_anything_but_a_refusal():
    """Every value of a full recipe (the encoder's, with a budget, a seed and a method option) replaced by each of
    a set of hostile values: read and checked, it is a recipe or a HeadcutError, never another exception."""
    base = builtin_recipes()["encoder"].to_dict()
    base.update(budget={"keep": 4}, seed=3)
    base["stages"][0]["choose"]["bias_compensation"] = False
    for at in list(_paths(base)):
        for value in HOSTILE:
            raw = copy.deepcopy(base)
            if at:
                holder = raw
                for key in at[:-1]:
                    holder = holder[key]
                holder[at[-1]] = value
            else:
                raw = value
            try:
                check_recipe(from_dict(raw, "r"))
            except HeadcutError:
                pass


# ---- text from a file shown as text -------------------------------------------------------------------------


def test_markup_and_escape_bytes_in_a_recipe_are_shown_as_text(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        'name: shown\nabout: "x\\e]0;title\\a and \\e[31mred"\nstages: [{choose: {method: magnitude}}, {cut: {}}]\n'
        'measured:\n  - {"[b]key": "[bold red]x[/blue]", note: "\\e[2J"}\n'
    )
    result = run("recipes", path)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "[bold red]x[/blue]" in result.stdout and "[b]key" in result.stdout
    assert "\\x1b[31mred" in result.stdout  # the escape shown, not acted on
    named = _recipe(tmp_path / "n.yaml", name="evil\x1b[31m")
    one_line_error(run("recipes", named), "'name' must be printable text")


# ---- contexts and budgets against what can be allocated --------------------------------------------------------


@pytest.mark.parametrize("context", [10**12, 2**63])
def test_a_context_longer_than_the_model_reads_is_refused_before_any_allocation(tiny, tmp_path, context):
    for budget in (["--target-speedup", "1.05"], ["--kv-budget", "0.5"]):
        result = run(
            "prune", tiny["llama"], *budget, "--context", context, "--data", tiny["text"], "--out", tmp_path / "o"
        )
        one_line_error(result, f"--context {context} is longer than the 64 positions this model reads")
    with pytest.raises(HeadcutError, match="longer than the 64 positions"):
        headcut.prune(tiny["llama"], "gradient", target_speedup=1.05, context=context, data=tiny["text"])
    recipe = _recipe(tmp_path / "r.yaml", budget={"target_speedup": 1.05, "context": context})
    result = run("prune", tiny["llama"], "--recipe", recipe, "--data", tiny["text"], "--out", tmp_path / "o")
    one_line_error(result, "longer than the 64 positions")
    assert not (tmp_path / "o").exists()


def test_target_speedup_refuses_a_context_whose_caches_do_not_fit(tiny, tmp_path):
    long = tmp_path / "long"
    save_tiny(long, "llama", "LlamaForCausalLM", max_position_embeddings=2**62)
    for context in (10**12, 2**62):
        result = run(
            "prune",
            long,
            "--target-speedup",
            1.05,
            "--context",
            context,
            "--data",
            tiny["text"],
            "--out",
            tmp_path / "o",
        )
        one_line_error(result, "--target-speedup times decoding at", "GiB is free: give a shorter --context")
    with pytest.raises(HeadcutError, match="GiB is free"):
        headcut.prune(long, "gradient", target_speedup=1.05, context=10**12, data=tiny["text"])


def test_target_speedup_takes_the_device_it_is_timed_on(tiny, tmp_path):
    """The README's form, ``--target-speedup X --context N --device D``: the device is where the cuts are timed."""
    result = run(
        "prune",
        tiny["llama"],
        "--target-speedup",
        1.01,
        "--context",
        64,
        "--device",
        "cpu",
        "--data",
        tiny["text"],
        "--out",
        tmp_path / "o",
        "--seq-len",
        16,
    )
    assert "--device applies" not in result.output
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:  # a tiny model may not be measurably faster: the refusal names the timing
        one_line_error(result, "was not reached at 64 tokens on cpu")
    one_line_error(
        run(
            "prune",
            tiny["llama"],
            "--method",
            "gradient",
            "--keep",
            6,
            "--device",
            "cpu",
            "--data",
            tiny["text"],
            "--out",
            tmp_path / "p",
        ),
        "--device applies to the methods that train",
    )
