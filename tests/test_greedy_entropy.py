"""greedy-entropy: Greedy-Gnorm's loop over the rectified attention entropy, checked against the loop written
out with the entropy scorer on the gated model; its two options reach the score and the order."""

from __future__ import annotations

import pytest
from helpers import cls_rows, make_model, make_tokenizer

import headcut
from headcut import scoring
from headcut.data import DataConfig, load_calibration
from headcut.pruning import PruneConfig, plan_prune
from headcut.scoring import ScoreConfig

BERT = ("bert", "BertForSequenceClassification")


@pytest.fixture(scope="module")
def cal():
    model = make_model(*BERT)
    return load_calibration(
        model, make_tokenizer(), DataConfig(path="<rows>", seq_len=12, batch_size=4), dataset=cls_rows(16)
    )


@pytest.mark.parametrize("options", [{}, {"focused_first": True}, {"epsilon": 1e-3}])
def test_greedy_entropy_removes_one_head_at_a_time_by_the_current_entropy(cal, options):
    model = make_model(*BERT)
    result = plan_prune(model, cal, PruneConfig(method="greedy-entropy", keep=3), dict(options))
    mask = {b.name: list(range(b.heads)) for b in headcut.model_blocks(model)}
    order = list(mask)
    sign = -1.0 if options.get("focused_first") else 1.0
    config = ScoreConfig(scorer="entropy", epsilon=options.get("epsilon", ScoreConfig().epsilon))
    expected = []
    while sum(map(len, mask.values())) > 3:
        with headcut.gated(model, {"keep": mask}):  # the entropies of the model as pruned so far
            imp = scoring.score(model, cal.batches, config).importance()
        units = [(n, h) for n in mask for h in mask[n]]
        name, head = min(units, key=lambda u: (sign * imp[u[0]][u[1]], order.index(u[0]), u[1]))
        mask[name].remove(head)
        expected.append([f"{name}:{head}"])
    assert [p.removed for p in result.trajectory[1:]] == expected
    assert result.scorings == len(expected)


def test_greedy_entropy_options_are_checked(cal):
    with pytest.raises(headcut.HeadcutError, match="epsilon must be in"):
        plan_prune(make_model(*BERT), cal, PruneConfig(method="greedy-entropy", keep=3), {"epsilon": 0.5})
