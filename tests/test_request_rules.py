"""One home for the prune request's rules (issue 69): the command line, the Python API and a recipe file reach one
check (:func:`headcut.jobs.prune.request.prune_request`), and each refusal reads the same from all three (the
command line names flags, Python keywords, a recipe file its keys and where in the file)."""

from __future__ import annotations

import re

import pytest
from helpers import one_line_error, run, save_tiny

import headcut
from headcut.errors import HeadcutError

#: rule -> (flags, keywords, the recipe file's text or None where a file cannot say it, the refusal's words)
RULES = {
    "one budget in heads": (
        ["--method", "magnitude", "--keep", 5, "--sparsity", 0.5],
        dict(method="magnitude", keep=5, sparsity=0.5),
        "stages: [{choose: {method: magnitude}}, cut]\nbudget: {keep: 5, sparsity: 0.5}",
        "give one budget: keep or sparsity, not both",
    ),
    "bytes or heads": (
        ["--method", "magnitude", "--keep", 5, "--kv-budget", 0.5],
        dict(method="magnitude", keep=5, kv_budget=0.5),
        "stages: [{choose: {method: magnitude}}, cut]\nbudget: {keep: 5, kv_budget: 0.5}",
        "give one budget: kv_budget (bytes) or keep, sparsity or max_drop (heads)",
    ),
    "a KV budget places scored heads": (
        ["--method", "pass", "--kv-budget", 0.5],
        dict(method="pass", kv_budget=0.5),
        "stages: [{choose: {method: pass}}, cut]\nbudget: {kv_budget: 0.5}",
        "kv_budget places the heads by their scores",
    ),
    "a context needs a budget in bytes or speed": (
        ["--method", "magnitude", "--keep", 5, "--context", 512],
        dict(method="magnitude", keep=5, context=512),
        "stages: [{choose: {method: magnitude}}, cut]\nbudget: {keep: 5, context: 512}",
        "context is the length kv_budget or target_speedup is counted at: give one of them too",
    ),
    "rounds are for score-based methods": (
        ["--method", "pass", "--keep", 5, "--schedule", "6,5"],
        dict(method="pass", keep=5, schedule="6,5"),
        "stages: [{choose: {method: pass}}, cut]\nschedule:\n  - rounds: [{keep: 6}, {keep: budget}]",
        "each scored on the model the one before left: it applies to the score-based methods",
    ),
    "a stage option's range": (
        ["--method", "magnitude", "--keep", 5, "--recover-steps", -1],
        dict(method="magnitude", keep=5, recover_steps=-1),
        "stages: [{choose: {method: magnitude}}, cut, {recover: {recover_steps: -1}}]",
        "recover_steps must be an integer >= 0 (got -1)",
    ),
    "a cut option's choices": (
        ["--method", "magnitude", "--keep", 5, "--gqa", "sideways"],
        dict(method="magnitude", keep=5, gqa="sideways"),
        "stages: [{choose: {method: magnitude}}, {cut: {gqa: sideways}}]",
        "unknown gqa 'sideways'; choose one of auto, group, uniform, duplicate",
    ),
    "method or recipe": (
        ["--method", "magnitude", "--recipe", "encoder", "--keep", 5],
        dict(method="magnitude", recipe="encoder", keep=5),
        None,
        "(the method alone, with its paper's defaults) or recipe, not both",
    ),
    "two rounds or a schedule": (
        ["--method", "magnitude", "--keep", 5, "--via", 6, "--schedule", "7,6"],
        dict(method="magnitude", keep=5, via=6, schedule="7,6"),
        None,
        "give via (two rounds) or schedule, not both",
    ),
}


def _words(text: str) -> str:
    """A refusal with the flags written as keywords (``--kv-budget`` -> ``kv_budget``)."""
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), text)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("rules") / "bert", "bert", "BertForSequenceClassification")


@pytest.mark.parametrize("rule", list(RULES))
def test_each_rule_refuses_alike_from_flags_keywords_and_a_recipe_file(rule, model, tmp_path):
    flags, keywords, recipe, words = RULES[rule]
    cli = one_line_error(run("prune", model, *flags, "--out", tmp_path / "cli"))
    assert words in _words(cli), cli
    with pytest.raises(HeadcutError) as api:
        headcut.prune(str(model), out=str(tmp_path / "api"), **keywords)
    assert words in str(api.value), api.value
    # the same sentence: the command line's names its flags, Python's its keywords
    assert _words(cli).removeprefix("error: ") == str(api.value)
    if recipe is not None:
        path = tmp_path / "recipe.yaml"
        path.write_text(f"name: rule\n{recipe}\n", encoding="utf-8")
        from_file = one_line_error(run("prune", model, "--recipe", path, "--out", tmp_path / "file"))
        assert str(path) in from_file and words in from_file, from_file
        with pytest.raises(HeadcutError) as api_file:
            headcut.prune(str(model), recipe=str(path), out=str(tmp_path / "api-file"))
        assert from_file.removeprefix("error: ") == str(api_file.value)
        assert one_line_error(run("recipes", path)) == from_file  # headcut recipes checks a file as prune does
    assert not any((tmp_path / name).exists() for name in ("cli", "api", "file", "api-file"))
