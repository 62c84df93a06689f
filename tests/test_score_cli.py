"""`headcut score` from the command line: JSON layout, heatmap, data-free scorers, bad input."""

from __future__ import annotations

import importlib.util
import json

import pytest
from helpers import one_line_error, run, save_tiny, write_rows

import headcut


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("score") / "m", "bert", "BertForSequenceClassification")


@pytest.fixture(scope="module")
def cal(tmp_path_factory):
    rows = [{"text": f"word{i % 7} word{(i * 3) % 5} good bad", "label": i % 3} for i in range(24)]
    return write_rows(tmp_path_factory.mktemp("data") / "cal.csv", rows)


@pytest.mark.parametrize("scorer", ["gradient", "gnorm", "confidence", "entropy"])
def test_score_json_matches_library(classifier, cal, scorer):
    result = run("score", classifier, "--data", cal, "--scorer", scorer, "--seq-len", "16", "--json", "-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    model = headcut.load(classifier)
    blocks = headcut.model_blocks(model)
    assert list(data["blocks"]) == [b.name for b in blocks]
    assert [len(v) for v in data["blocks"].values()] == [b.heads for b in blocks]
    assert data["examples"] == 24 and data["scorer"] == scorer and data["seconds"] > 0
    assert data["higher_is_important"] is (scorer != "entropy")
    assert "attention" in result.stderr  # the heatmap table went to stderr


def test_data_free_scorer_needs_no_data(classifier):
    a = json.loads(run("score", classifier, "--scorer", "random", "--seed", "3", "--json", "-").stdout)
    b = json.loads(run("score", classifier, "--scorer", "random", "--seed", "3", "--json", "-").stdout)
    c = json.loads(run("score", classifier, "--scorer", "random", "--seed", "4", "--json", "-").stdout)
    assert a["blocks"] == b["blocks"] != c["blocks"]


def test_layer_normalisation_flag(classifier):
    data = json.loads(run("score", classifier, "--scorer", "magnitude", "--normalize", "layer", "--json", "-").stdout)
    for values in data["blocks"].values():
        assert abs(sum(v * v for v in values) - 1.0) < 1e-9


def test_unknown_scorer_lists_the_real_ones(classifier, cal):
    text = one_line_error(run("score", classifier, "--data", cal, "--scorer", "nope"), "unknown scorer 'nope'")
    for name in headcut.scoring.SCORERS:
        assert name in text


def test_data_scorer_without_data(classifier):
    one_line_error(run("score", classifier, "--scorer", "gradient"), "needs --data")


def test_bad_option_values(classifier, cal):
    one_line_error(run("score", classifier, "--data", cal, "--normalize", "x"), "normalize")
    one_line_error(run("score", classifier, "--data", cal, "--abs-per", "x"), "--abs-per")


def test_plot(classifier, tmp_path):
    png = tmp_path / "heat.png"
    result = run("score", classifier, "--scorer", "magnitude", "--plot", png)
    if importlib.util.find_spec("matplotlib") is None:
        one_line_error(result, "matplotlib", "headcut[plots]")
        assert not png.exists()
    else:
        assert result.exit_code == 0, result.output
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scorer_options_reach_the_library_with_the_declared_defaults(classifier, monkeypatch):
    import headcut.api
    from headcut.config import ScoreConfig
    from headcut.errors import HeadcutError
    from headcut.options import specs

    seen = []

    def fake_score(model, scorer, **kwargs):
        seen.append(kwargs)
        raise HeadcutError("stopped before any work")

    monkeypatch.setattr(headcut.api, "score", fake_score)
    declared = [s for s in specs(ScoreConfig) if s.meta.cli and s.name != "scorer"]  # the scorer: positional
    assert {s.name for s in declared} == {"normalize", "abs_per", "objective", "per"}
    one_line_error(run("score", classifier, "--scorer", "magnitude"), "stopped before any work")
    assert {s.name: seen[-1][s.name] for s in declared} == {s.name: s.default for s in declared}
    given = {s.name: next(c for c in s.meta.choices if c != s.default) for s in declared}
    args = [a for s in declared for a in (s.flag, given[s.name])]
    one_line_error(run("score", classifier, "--scorer", "magnitude", *args), "stopped before any work")
    assert {s.name: seen[-1][s.name] for s in declared} == given
