"""Protection by measurement (the ``protect`` stage, headcut.pruning.layer_costs): each block's cut is measured alone,
a block whose cut costs more than the threshold is kept whole and the heads are chosen again, unless the budget
cannot be met otherwise (then the report and a note name it)."""

from __future__ import annotations

import json

import pytest
from helpers import one_line_error, run, tiny_lm

import headcut
from headcut.errors import HeadcutError
from headcut.pruning.ranked import protect

DATA = ["--seq-len", 32, "--max-examples", 16]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return tiny_lm(tmp_path_factory.mktemp("protect"), text_seed=2, seed=1, num_hidden_layers=4)


def _prune(folder, text, tmp_path, name, *extra, keep=12):
    out = tmp_path / name
    done = run("prune", folder, "--method", "gradient", "--keep", keep, "--data", text, *DATA, *extra, "--out", out)
    assert done.exit_code == 0, done.output
    return json.loads((out / "headcut-report.json").read_text()), done.output


def test_a_block_whose_cut_alone_costs_too_much_is_kept_whole(lm, tmp_path):
    folder, text = lm
    plain, _ = _prune(folder, text, tmp_path, "plain")
    cut = {b for b, kept in plain["mask"]["keep"].items() if len(kept) < 6}
    # every block the plain cut takes heads from, measured alone (a threshold above everything: nothing protected;
    # with this seed, cutting either block costs something)
    measured, _ = _prune(folder, text, tmp_path, "measured", "--protect", 1e6)
    costs = measured["protect"]["measured"][0]
    assert set(costs) == cut and measured["mask"] == plain["mask"] and measured["protect"]["protected"] == []
    costly = max(costs, key=costs.get)
    threshold = (costs[costly] + min(costs.values())) / 2 if len(costs) > 1 else costs[costly] / 2
    guarded, output = _prune(folder, text, tmp_path, "guarded", "--protect", threshold)
    report = guarded["protect"]
    assert costly in report["protected"] and report["threshold"] == threshold
    assert report["measured"][0] == pytest.approx(costs)
    assert not report["cut_anyway"] and not any("--protect" in n for n in guarded["notes"])
    assert len(guarded["mask"]["keep"][costly]) == 6  # kept whole, the budget met elsewhere
    assert guarded["heads"]["after"] == 12
    assert [next(iter(s)) for s in guarded["recipe"]["stages"]][:3] == ["choose", "protect", "cut"]


def test_a_budget_that_needs_the_protected_blocks_cuts_them_and_says_so(lm, tmp_path):
    folder, text = lm
    report, output = _prune(folder, text, tmp_path, "tight", "--protect", 1e-9, keep=6)
    assert report["protect"]["cut_anyway"] and report["heads"]["after"] == 6
    assert "--protect 1e-09: the budget cannot be met without cutting" in " ".join(report["notes"])
    assert "the budget cannot be met without cutting" in output


def test_protected_blocks_rank_above_every_head_the_cheapest_lowest():
    ranked = protect({"a": [5.0, -3.0], "b": [0.1, 0.2], "c": [9.0, 1.0]}, {"a": 0.5, "b": 0.2})
    assert min(ranked["a"] + ranked["b"]) > max(ranked["c"])
    assert max(ranked["b"]) < min(ranked["a"])
    assert ranked["c"] == [9.0, 1.0] and protect({"c": [1.0]}, {}) == {"c": [1.0]}


def test_protection_refusals_read_alike(lm, tmp_path):
    folder, text = lm
    one_line_error(
        run("prune", folder, "--method", "gradient", "--keep", 12, "--protect", 0.1, "--out", tmp_path / "a"),
        "--protect measures each block's cut on calibration data: it needs --data",
    )
    one_line_error(
        run(
            "prune", folder, "--method", "pass", "--keep", 12, "--data", text, "--protect", 0.1, "--out", tmp_path / "b"
        ),
        "--protect ranks the protected blocks' heads above the others",
        "not pass (learned)",
    )
    with pytest.raises(HeadcutError, match="protect ranks the protected blocks"):
        headcut.prune(str(folder), method="pass", keep=12, data=str(text), protect=0.1)
