"""`headcut prune` and headcut.pruning: exact budgets for every method on every unit kind (heads, GQA
groups/duplicate/uniform, ALBERT's shared layers), the --max-drop rule on a constructed metric,
inverse orders, Greedy-Gnorm's Algorithm 1 recomputed by hand, Michel's re-scoring, the report
against the slimmed model, and every refusal (one line, exit 2, nothing written)."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import (
    ALBERT,
    BERT,
    CASES,
    LLAMA,
    check_units,
    cls_rows,
    make_model,
    make_tokenizer,
    one_line_error,
    run,
    save_tiny,
    write_rows,
)
from safetensors.torch import load_file

import headcut
from headcut import scoring
from headcut.catalog import METHODS
from headcut.data import DataConfig, load_calibration
from headcut.errors import HeadcutError
from headcut.model.evaluation import evaluate
from headcut.model.masks import plan_cuts
from headcut.pruning import Metric, PruneConfig, keep_from_sparsity, plan_prune, prune
from headcut.scoring import ScoreConfig


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("prune-data")
    write_rows(d / "cal.csv", cls_rows(24, seed=0))
    write_rows(d / "dev.csv", cls_rows(24, seed=1))
    return d


@pytest.fixture(scope="module")
def cals(data_dir):
    tok = make_tokenizer()
    cache: dict[tuple[str, str, str], object] = {}

    def get(kind: tuple[str, str], name: str = "cal.csv"):
        key = (*kind, name)
        if key not in cache:
            cache[key] = load_calibration(
                make_model(*kind), tok, DataConfig(path=str(data_dir / name), seq_len=16, batch_size=8)
            )
        return cache[key]

    return get


def names(points) -> list[list[str]]:
    return [p.removed for p in points]


def split(entry: str) -> tuple[str, int]:
    name, head = entry.split(":")
    return name, int(head)


# ------------------------------------------------------------------------------------- budgets


# auber's --keep is an upper bound (tests/test_auber.py); every other method meets K exactly
@pytest.mark.parametrize("method", [name for name, entry in METHODS.items() if entry.budget == "required"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_method_meets_the_budget_exactly(case, method, cals):
    kind, gqa, keep = CASES[case]
    model = make_model(*kind)
    blocks = headcut.model_blocks(model)
    result = prune(model, cals(kind), PruneConfig(method=method, keep=keep, gqa=gqa, seed=3))
    assert result.total_after == keep == result.slim.total_after
    assert result.heads_after == result.slim.heads_after == {n: len(v) for n, v in result.mask.keep.items()}
    assert sum(b.heads for b in headcut.model_blocks(model)) == keep
    plan_cuts(result.mask, blocks, gqa)  # realisable under the policy
    check_units(case, model, result.mask, result)


def test_plan_leaves_the_model_unchanged(cals):
    model = make_model(*BERT)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = plan_prune(model, cals(BERT), PruneConfig(method="greedy-gnorm", keep=2))
    assert result.total_after == 2
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(not p.requires_grad or p.grad is None for p in model.parameters())


def test_sparsity_keeps_floor_of_the_rest():
    assert keep_from_sparsity(0.3, 12) == 8  # floor(8.4)
    assert keep_from_sparsity(0.5, 7) == 3  # floor(3.5)
    assert keep_from_sparsity(0.9, 10) == 1  # the decimal 0.9, not 0.9000000000000000222
    assert keep_from_sparsity(0.0, 7) == 7 and keep_from_sparsity(1.0, 7) == 0
    model = make_model(*BERT)
    result = plan_prune(model, None, PruneConfig(method="magnitude", sparsity=0.3))
    assert result.total_after == 5 == result.target  # floor(0.7 * 8)


@pytest.mark.parametrize(
    "kind,config,needles",
    [
        (ALBERT, dict(keep=7), ["keep 7", "share weights", "6 or 9"]),
        (ALBERT, dict(sparsity=0.3), ["floor(0.7 x 12) = 8", "6 (sparsity 0.5) or 9 (sparsity 0.25)"]),
        (LLAMA, dict(keep=7), ["whole KV groups of 3", "6 or 9"]),
        (LLAMA, dict(keep=17, gqa="uniform"), ["gqa uniform", "16 or 18"]),
        (BERT, dict(keep=5, uniform=True), ["uniform keeps", "2 blocks", "4 or 6"]),
        (BERT, dict(keep=3, min_heads_per_block=2), ["min_heads_per_block 2", "at least 4"]),
        (BERT, dict(keep=9), ["more than the model's 8 heads"]),
    ],
)
def test_unreachable_budgets_are_refused_before_scoring(kind, config, needles, cals, monkeypatch):
    def no_scoring(*args, **kwargs):
        raise AssertionError("scored before the budget was checked")

    monkeypatch.setattr(scoring, "score", no_scoring)
    with pytest.raises(HeadcutError) as err:
        plan_prune(make_model(*kind), cals(kind), PruneConfig(method="gradient", **config))
    for needle in needles:
        assert needle in str(err.value)


def test_min_heads_per_block_is_respected(cals):
    model = make_model(*LLAMA)
    result = plan_prune(
        model, cals(LLAMA), PruneConfig(method="inverse-gradient", keep=6, gqa="duplicate", min_heads_per_block=2)
    )
    assert result.total_after == 6 and all(n == 2 for n in result.heads_after.values())


def test_uniform_keeps_each_blocks_top_heads():
    model = make_model(*BERT)
    result = plan_prune(model, None, PruneConfig(method="magnitude", keep=4, uniform=True))
    importance = scoring.score(model, None, "magnitude").importance()
    for name, values in importance.items():
        top = sorted(range(len(values)), key=lambda h: -values[h])[:2]
        assert result.mask.keep[name] == sorted(top)


def test_uniform_with_gqa_groups_and_shared_layers(cals):
    llama = plan_prune(make_model(*LLAMA), cals(LLAMA), PruneConfig(method="gradient", keep=9, uniform=True))
    assert llama.heads_after == {"self.0": 3, "self.1": 3, "self.2": 3}
    albert = plan_prune(make_model(*ALBERT), cals(ALBERT), PruneConfig(method="gnorm", keep=3, uniform=True))
    assert albert.heads_after == {"self.0": 1, "self.1": 1, "self.2": 1}


def test_random_is_seeded():
    model = make_model(*BERT)
    a, b, c = (plan_prune(model, None, PruneConfig(method="random", keep=4, seed=s)).mask.keep for s in (1, 1, 2))
    assert a == b != c


# ------------------------------------------------------------------------------------- max-drop


def kept_fraction(total: int) -> Metric:
    """A metric that is a known function of the mask: the fraction of heads kept (each head 1/total)."""
    return Metric("kept", True, lambda mask: mask.total() / total)


def test_max_drop_stops_at_the_last_step_within():
    model = make_model(*BERT)  # 8 heads: every head removed costs 0.125
    r = plan_prune(model, None, PruneConfig(method="magnitude", max_drop=0.3), {"step": 1}, metric=kept_fraction(8))
    assert r.stopped == "max-drop" and r.total_after == 6
    assert [p.heads for p in r.trajectory] == [8, 7, 6, 5]
    assert [p.within for p in r.trajectory] == [None, True, True, False]
    assert r.metric_before == 1.0 and r.metric_after == 0.75
    # a drop of exactly D is within D
    r = plan_prune(model, None, PruneConfig(method="magnitude", max_drop=0.25), {"step": 1}, metric=kept_fraction(8))
    assert r.total_after == 6
    # the first step already too far: nothing is removed
    r = plan_prune(model, None, PruneConfig(method="magnitude", max_drop=0.3), {"step": 3}, metric=kept_fraction(8))
    assert r.total_after == 8 and [p.heads for p in r.trajectory] == [8, 5] and r.mask.total() == 8


def test_max_drop_stops_at_the_first_violation_even_if_later_steps_recover():
    values = {8: 0.9, 7: 0.9, 6: 0.88, 5: 0.5, 4: 0.95, 3: 0.95, 2: 0.95, 1: 0.95, 0: 0.95}
    metric = Metric("accuracy", True, lambda mask: values[mask.total()])
    r = plan_prune(make_model(*BERT), None, PruneConfig(method="random", max_drop=0.05), {"step": 1}, metric=metric)
    assert r.total_after == 6 and r.stopped == "max-drop" and r.trajectory[-1].heads == 5


def test_max_drop_for_a_lower_is_better_metric():
    metric = Metric("perplexity", False, lambda mask: 10.0 + (8 - mask.total()))  # +1 per head removed
    r = plan_prune(make_model(*BERT), None, PruneConfig(method="magnitude", max_drop=2.5), {"step": 1}, metric=metric)
    assert r.total_after == 6 and r.metric_after == 12.0


def test_max_drop_floor_and_units(cals):
    model = make_model(*BERT)
    r = plan_prune(
        model, None, PruneConfig(method="magnitude", max_drop=1.0, keep=3), {"step": 1}, metric=kept_fraction(8)
    )
    assert r.stopped == "floor" and r.total_after == 3
    r = plan_prune(
        model,
        None,
        PruneConfig(method="magnitude", max_drop=1.0, min_heads_per_block=1),
        {"step": 1},
        metric=kept_fraction(8),
    )
    assert r.stopped == "floor" and r.total_after == 2
    # ALBERT: a step of one head is one unit, a head in each of the 3 sharing layers
    albert = make_model(*ALBERT)
    r = plan_prune(albert, cals(ALBERT), PruneConfig(method="greedy-gnorm", max_drop=0.3), metric=kept_fraction(12))
    assert [p.heads for p in r.trajectory] == [12, 9, 6] and r.total_after == 9


def test_default_steps_are_ten_percent_and_one(cals):
    model = make_model(*LLAMA)  # 18 heads: 10 % = 1 head; --gqa duplicate: units of one head
    metric = kept_fraction(18)
    r = plan_prune(
        model, cals(LLAMA), PruneConfig(method="gradient", max_drop=1.0, keep=14, gqa="duplicate"), metric=metric
    )
    assert [p.heads for p in r.trajectory] == [18, 17, 16, 15, 14]
    r = plan_prune(
        model,
        cals(LLAMA),
        PruneConfig(method="gradient", max_drop=1.0, keep=12, gqa="duplicate"),
        {"step": 4},
        metric=metric,
    )
    assert [p.heads for p in r.trajectory] == [18, 14, 12]


def test_max_drop_with_evaluation_data(cals):
    model = make_model(*BERT)
    dev = cals(BERT, "dev.csv")
    r = plan_prune(model, cals(BERT), PruneConfig(method="greedy-gnorm", max_drop=0.0), eval_calibration=dev)
    assert r.metric == "accuracy" and r.metric_before == evaluate(model, dev).value
    points = [p for p in r.trajectory[1:] if p.within]
    assert r.metric_after == (points[-1].metric if points else r.metric_before)
    assert r.metric_after >= r.metric_before - 1e-12
    with headcut.gated(model, r.mask):
        assert evaluate(model, dev).value == r.metric_after


def test_max_drop_and_trajectory_need_a_metric(cals):
    with pytest.raises(HeadcutError, match="--eval-data"):
        plan_prune(make_model(*BERT), cals(BERT), PruneConfig(method="gradient", max_drop=0.01))
    with pytest.raises(HeadcutError, match="--eval-data"):
        plan_prune(make_model(*BERT), cals(BERT), PruneConfig(method="gradient", keep=4, trajectory=True))


# ------------------------------------------------------------------------------ method definitions


@pytest.mark.parametrize("scorer", ["magnitude", "gradient", "entropy", "value-l1"])
def test_inverse_one_shot_order_is_the_reverse(scorer, cals):
    model = make_model(*BERT)
    forward = plan_prune(model, cals(BERT), PruneConfig(method=scorer, keep=0))
    inverse = plan_prune(model, cals(BERT), PruneConfig(method=f"inverse-{scorer}", keep=0))
    order = forward.trajectory[1].removed  # one step, removed in score order
    importance = scoring.score(model, cals(BERT).batches, scorer).importance()
    values = [importance[n][h] for n, h in map(split, order)]
    assert len(set(values)) == len(values) == 8
    assert values == sorted(values)  # least important first
    assert inverse.trajectory[1].removed == order[::-1]


def test_inverse_one_shot_on_shared_layers_reverses_units(cals):
    model = make_model(*ALBERT)
    forward = plan_prune(model, cals(ALBERT), PruneConfig(method="gradient", keep=0), {"step": 3})
    inverse = plan_prune(model, cals(ALBERT), PruneConfig(method="inverse-gradient", keep=0), {"step": 3})
    heads = [[split(e)[1] for e in p.removed] for p in forward.trajectory[1:]]
    assert all(len(set(h)) == 1 and len(h) == 3 for h in heads)  # a unit: one head index in 3 layers
    assert [p.removed for p in inverse.trajectory[1:]] == [p.removed for p in forward.trajectory[1:]][::-1]


def _units(kind: tuple[str, str], mask: dict[str, list[int]]) -> list[list[tuple[str, int]]]:
    if kind == ALBERT:  # one unit per head index, across the layers that share weights
        return [[(n, h) for n in mask] for h in mask["self.0"]]
    return [[(n, h)] for n in mask for h in mask[n]]


@pytest.mark.parametrize("kind", [BERT, ALBERT])
@pytest.mark.parametrize("method", ["greedy-gnorm", "inverse-gnorm"])
def test_greedy_gnorm_step_one_is_algorithm_1(kind, method, cals):
    model = make_model(*kind)
    cal = cals(kind)
    keep = 2 if kind == BERT else 3
    result = plan_prune(model, cal, PruneConfig(method=method, keep=keep))
    mask = {b.name: list(range(b.heads)) for b in headcut.model_blocks(model)}
    order = list(mask)
    sign = 1.0 if method == "greedy-gnorm" else -1.0
    expected = []
    while sum(map(len, mask.values())) > keep:
        with headcut.gated(model, {"keep": mask}):  # Gnorm of the model as pruned so far
            imp = scoring.score(model, cal.batches, ScoreConfig(scorer="gnorm")).importance()
        units = _units(kind, mask)
        best = min(units, key=lambda u: (sign * sum(imp[n][h] for n, h in u) / len(u), order.index(u[0][0]), u[0][1]))
        for n, h in best:
            mask[n].remove(h)
        expected.append([f"{n}:{h}" for n, h in best])
    assert names(result.trajectory[1:]) == expected
    assert result.scorings == len(expected)
    assert result.mask.keep == mask


def test_michel_rescores_the_masked_model_every_step(cals, monkeypatch):
    model = make_model(*BERT)
    calls: list[dict[str, list[float]]] = []
    real = scoring.score

    def spy(model, batches, config=None, progress=None):
        out = real(model, batches, config, progress)
        calls.append(out.importance())
        return out

    monkeypatch.setattr(scoring, "score", spy)
    result = plan_prune(model, cals(BERT), PruneConfig(method="michel", keep=2), {"step": 2})
    assert result.scorings == len(calls) == 3
    assert [p.heads for p in result.trajectory] == [8, 6, 4, 2] and all(p.rescored for p in result.trajectory[1:])
    assert result.score_config.scorer == "gradient" and result.score_config.normalize == "layer"
    removed: set[tuple[str, int]] = set()
    for imp, point in zip(calls, result.trajectory[1:]):
        for values in imp.values():  # Michel et al.'s per-layer L2 normalisation
            assert sum(v * v for v in values) == pytest.approx(1.0) or not any(values)
        for n, h in removed:
            assert imp[n][h] == 0.0  # a masked head gets no gradient
        remaining = sorted((imp[n][h], n, h) for n, vs in imp.items() for h in range(len(vs)) if (n, h) not in removed)
        step = {split(e) for e in point.removed}
        assert step == {(n, h) for _, n, h in remaining[:2]}  # the two lowest of this step's scores
        removed |= step
    # re-scoring changed the scores of heads still kept (one-shot would reuse the first scores)
    kept_after_first = [
        (n, h)
        for n, vs in calls[0].items()
        for h in range(len(vs))
        if (n, h) not in {split(e) for e in result.trajectory[1].removed}
    ]
    assert any(calls[0][n][h] != calls[1][n][h] for n, h in kept_after_first)


def test_rounds_split_the_heads_to_remove_evenly_larger_steps_first(cals):
    # 8 -> 1 heads in 3 rounds: 7 heads to remove, ceil(7/3) = 3, then ceil(4/2) = 2, then 2 (TextPruner's n_iters)
    r = plan_prune(make_model(*BERT), cals(BERT), PruneConfig(method="michel", keep=1), {"rounds": 3})
    assert [p.heads for p in r.trajectory] == [8, 5, 3, 1] and r.scorings == 3
    assert r.mask.total() == 1
    # more rounds than heads to remove: one head a step, and the target is still met exactly
    r = plan_prune(make_model(*BERT), cals(BERT), PruneConfig(method="michel", keep=6), {"rounds": 5})
    assert [p.heads for p in r.trajectory] == [8, 7, 6]
    # a one-shot ranking cut in rounds keeps the same heads as cut at once (its ranking is fixed)
    once = plan_prune(make_model(*BERT), cals(BERT), PruneConfig(method="gradient", keep=3))
    rounds = plan_prune(make_model(*BERT), cals(BERT), PruneConfig(method="gradient", keep=3), {"rounds": 2})
    assert rounds.mask == once.mask and [p.heads for p in rounds.trajectory] == [8, 5, 3] and rounds.scorings == 1
    # with --uniform a round moves every block by whole levels, at most the round's heads: 8 -> 6 (3 allowed)
    # -> 2 (the last round takes what is left)
    r = plan_prune(make_model(*BERT), cals(BERT), PruneConfig(method="michel", keep=2, uniform=True), {"rounds": 2})
    assert [p.heads for p in r.trajectory] == [8, 6, 2] and r.heads_after == {"self.0": 1, "self.1": 1}


def test_one_shot_scores_once(cals, monkeypatch):
    calls = []
    real = scoring.score
    monkeypatch.setattr(scoring, "score", lambda *a, **k: calls.append(1) or real(*a, **k))
    r = plan_prune(make_model(*BERT), cals(BERT), PruneConfig(method="gradient", keep=2), {"step": 2})
    assert len(calls) == r.scorings == 1 and len(r.trajectory) == 4
    assert [p.rescored for p in r.trajectory] == [False, True, False, False]


def test_method_names():
    for name in (
        "gradient",
        "gnorm",
        "confidence",
        "entropy",
        "value-l1",
        "magnitude",
        "random",
        "michel",
        "greedy-gnorm",
        "inverse-gnorm",
        "inverse-gradient",
        "inverse-entropy",
        "pass",
        "dsp",
        "auber",
        "lottery",
    ):
        assert name in METHODS
    assert "inverse-random" not in METHODS  # one registry of the available methods
    with pytest.raises(HeadcutError, match="lottery trains on --data"):
        plan_prune(make_model(*BERT), None, PruneConfig(method="lottery", keep=2))
    with pytest.raises(HeadcutError, match="trains on a Calibration"):
        plan_prune(make_model(*BERT), None, PruneConfig(method="pass", keep=2))
    with pytest.raises(HeadcutError, match="unknown method 'nope'"):
        plan_prune(make_model(*BERT), None, PruneConfig(method="nope", keep=2))


# ---------------------------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, data_dir) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("prune-ckpt")
    return {
        "bert": save_tiny(d / "bert", *BERT),
        "albert": save_tiny(d / "albert", *ALBERT),
        "llama": save_tiny(d / "llama", *LLAMA),
    }


def prune_cli(model: Path, data_dir: Path, out: Path, *args: str):
    return run(
        "prune", model, "--data", data_dir / "cal.csv", "--out", out, "--seq-len", "16", "--batch-size", "8", *args
    )


def test_cli_report_matches_the_slimmed_model(ckpts, data_dir, tmp_path):
    out = tmp_path / "slim"
    result = prune_cli(
        ckpts["bert"],
        data_dir,
        out,
        "--method",
        "gradient",
        "--keep",
        "5",
        "--eval-data",
        data_dir / "dev.csv",
        "--seed",
        "4",
        "--json",
        "-",
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "headcut-report.json").read_text())
    assert json.loads(result.stdout) == report
    assert report["method"] == "gradient" and report["seed"] == 4 and report["arguments"]["keep"] == 5
    assert set(report["versions"]) >= {"headcut", "torch", "transformers"}
    assert "kept 5 of 8 heads" in result.stderr and "summary" in result.stderr
    # heads and parameters: what `headcut info` sees in the saved model
    info = json.loads(run("info", out, "--json", "-").stdout)
    assert {b["name"]: b["heads"] for b in info["blocks"]} == report["heads"]["per_block_after"]
    assert info["total_heads"] == report["heads"]["after"] == 5 and report["heads"]["before"] == 8
    assert info["params"] == report["params"]["after"] < report["params"]["before"]
    assert report["params"]["before"] == json.loads(run("info", ckpts["bert"], "--json", "-").stdout)["params"]
    assert report["size_bytes"] == {
        "before": (ckpts["bert"] / "model.safetensors").stat().st_size,
        "after": (out / "model.safetensors").stat().st_size,
    }
    # the mask replays with `headcut export --mask` to the same weights
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps(report["mask"]))
    assert run("export", ckpts["bert"], "--mask", mask, "--out", tmp_path / "replay").exit_code == 0
    a, b = load_file(out / "model.safetensors"), load_file(tmp_path / "replay" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # metric before/after: `headcut eval` of the input and of the saved model
    def accuracy(model: Path) -> float:
        res = run("eval", model, "--data", data_dir / "dev.csv", "--seq-len", "16", "--batch-size", "8", "--json", "-")
        return json.loads(res.stdout)["metrics"]["accuracy"]

    assert report["metric"]["name"] == "accuracy"
    assert report["metric"]["before"] == accuracy(ckpts["bert"])
    assert report["metric"]["after"] == accuracy(out)
    assert report["seconds"] > 0 and report["stopped"] == "budget"


def test_cli_shared_layers_stay_shared(ckpts, data_dir, tmp_path):
    out = tmp_path / "albert"
    result = prune_cli(ckpts["albert"], data_dir, out, "--method", "michel", "--sparsity", "0.5")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "headcut-report.json").read_text())
    assert report["heads"]["per_block_after"] == {"self.0": 2, "self.1": 2, "self.2": 2}
    assert report["params"]["unshared"] == 0
    assert json.loads((out / "config.json").read_text())["num_hidden_groups"] == 1
    keep = report["mask"]["keep"]
    assert keep["self.0"] == keep["self.1"] == keep["self.2"]


@pytest.mark.parametrize("gqa,keep,kv", [("group", 9, [1, 1, 1]), ("duplicate", 9, None)])
def test_cli_gqa_units(ckpts, data_dir, tmp_path, gqa, keep, kv):
    out = tmp_path / gqa
    result = prune_cli(
        ckpts["llama"], data_dir, out, "--method", "greedy-gnorm", "--keep", str(keep), "--gqa", gqa, "--uniform"
    )
    assert result.exit_code == 0, result.output
    info = json.loads(run("info", out, "--json", "-").stdout)
    assert [b["heads"] for b in info["blocks"]] == [3, 3, 3]
    if kv is not None:
        assert [b["kv_heads"] for b in info["blocks"]] == kv


def test_cli_rounds(ckpts, data_dir, tmp_path):
    out = tmp_path / "slim"
    result = prune_cli(
        ckpts["bert"],
        data_dir,
        out,
        "--method",
        "michel",
        "--keep",
        "2",
        "--rounds",
        "2",
        "--abs-per",
        "batch",
        "--normalize",
        "none",
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "headcut-report.json").read_text())
    assert [p["heads"] for p in report["trajectory"]] == [8, 5, 2] and report["scorings"] == 2
    assert report["options"]["rounds"] == 2 and report["options"]["step"] is None
    assert report["heads"]["after"] == 2


def test_cli_max_drop_with_trajectory(ckpts, data_dir, tmp_path):
    out, traj = tmp_path / "slim", tmp_path / "curve.csv"
    result = prune_cli(
        ckpts["bert"],
        data_dir,
        out,
        "--method",
        "greedy-gnorm",
        "--max-drop",
        "1",
        "--keep",
        "3",
        "--eval-data",
        data_dir / "dev.csv",
        "--trajectory",
        traj,
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "headcut-report.json").read_text())
    assert report["stopped"] == "floor" and report["heads"]["after"] == 3
    rows = list(csv.DictReader(traj.open()))
    assert list(rows[0]) == ["step", "heads", "metric", "within", "rescored", "removed"]
    assert [int(r["heads"]) for r in rows] == [8, 7, 6, 5, 4, 3]
    assert all(r["within"] == "true" for r in rows[1:]) and all(r["removed"] for r in rows[1:])
    assert [float(r["metric"]) for r in rows] == [p["metric"] for p in report["trajectory"]]
    png = traj.with_suffix(".png")
    if importlib.util.find_spec("matplotlib") is None:
        assert not png.exists() and "pip install" in result.stderr
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_data_free_method_needs_no_data(ckpts, tmp_path):
    result = run("prune", ckpts["bert"], "--method", "magnitude", "--keep", "4", "--out", tmp_path / "m")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "m" / "headcut-report.json").read_text())["heads"]["after"] == 4


REFUSALS = [
    (["--method", "nope", "--keep", "4"], ["unknown method 'nope'", "greedy-gnorm"]),
    (["--recipe", "nope", "--keep", "4"], ["no recipe 'nope'", "encoder"]),
    (["--method", "gradient", "--recipe", "encoder", "--keep", "4"], ["--method", "--recipe, not both"]),
    (["--method", "gradient"], ["no budget"]),
    (["--method", "gradient", "--keep", "4", "--sparsity", "0.5"], ["one budget"]),
    (["--method", "gradient", "--sparsity", "1.5"], ["--sparsity"]),
    (["--method", "gradient", "--keep", "9"], ["more than"]),
    (["--method", "gradient", "--keep", "5", "--uniform"], ["4 or 6"]),
    (["--method", "gradient", "--keep", "3", "--min-heads-per-block", "2"], ["--min-heads-per-block"]),
    (["--method", "gradient", "--max-drop", "0.01"], ["--max-drop needs --eval-data"]),
    (["--method", "gradient", "--keep", "4", "--trajectory", "{tmp}/t.csv"], ["--trajectory needs --eval-data"]),
    (["--method", "gradient", "--keep", "4", "--eval-data", "{dev}", "--trajectory", "{tmp}/t.txt"], [".csv"]),
    (["--method", "gradient", "--keep", "4", "--eval-data", "{cal}"], ["same data", "must differ"]),
    (["--method", "michel", "--keep", "4", "--objective", "loss"], ["--objective does not apply to michel"]),
    (["--method", "magnitude", "--keep", "4", "--abs-per", "batch"], ["--abs-per does not apply to magnitude"]),
    (["--method", "gradient", "--keep", "4", "--gqa", "x"], ["--gqa"]),
    (["--method", "gradient", "--keep", "4", "--step", "0"], ["--step"]),
    (["--method", "michel", "--keep", "4", "--rounds", "0"], ["--rounds must be an integer >= 1"]),
    (["--method", "michel", "--keep", "4", "--rounds", "2", "--step", "2"], ["--step and --rounds", "give one"]),
    (["--method", "dsp", "--keep", "4", "--rounds", "2"], ["--rounds does not apply to dsp"]),
    (["--method", "gradient", "--keep", "4", "--normalize", "x"], ["--normalize"]),
    (["--method", "gradient", "--keep", "4", "--max-drop", "-1", "--eval-data", "{dev}"], ["--max-drop"]),
]


@pytest.mark.parametrize("args,needles", REFUSALS, ids=[" ".join(a[:4]) for a, _ in REFUSALS])
def test_cli_refusals_write_nothing(ckpts, data_dir, tmp_path, args, needles):
    fill = {"{tmp}": str(tmp_path), "{dev}": str(data_dir / "dev.csv"), "{cal}": str(data_dir / "cal.csv")}
    args = [fill.get(a, a).replace("{tmp}", str(tmp_path)) for a in args]
    out = tmp_path / "out"
    one_line_error(prune_cli(ckpts["bert"], data_dir, out, *args), *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no --out folder, no trajectory


def test_cli_refuses_unreachable_units_and_no_data(ckpts, data_dir, tmp_path):
    one_line_error(
        prune_cli(ckpts["albert"], data_dir, tmp_path / "o", "--method", "gradient", "--keep", "7"),
        "6 or 9",
        "share weights",
    )
    one_line_error(
        prune_cli(ckpts["llama"], data_dir, tmp_path / "o", "--method", "gradient", "--keep", "7"),
        "KV groups",
        "6 or 9",
    )
    one_line_error(
        run("prune", ckpts["bert"], "--method", "gradient", "--keep", "4", "--out", tmp_path / "o"), "needs --data"
    )
    assert not any(tmp_path.iterdir())


def test_cli_same_contents_under_another_name_is_refused(ckpts, data_dir, tmp_path):
    copy = shutil.copy(data_dir / "cal.csv", tmp_path / "copy.csv")
    one_line_error(
        prune_cli(ckpts["bert"], data_dir, tmp_path / "o", "--method", "gradient", "--keep", "4", "--eval-data", copy),
        "identical contents",
    )
    assert not (tmp_path / "o").exists()


def test_cli_existing_output_needs_force(ckpts, data_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    traj = tmp_path / "t.csv"
    traj.write_text("old")
    one_line_error(prune_cli(ckpts["bert"], data_dir, out, "--method", "gradient", "--keep", "4"), "--force")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    one_line_error(
        prune_cli(
            ckpts["bert"],
            data_dir,
            tmp_path / "o2",
            "--method",
            "gradient",
            "--keep",
            "4",
            "--eval-data",
            data_dir / "dev.csv",
            "--trajectory",
            traj,
        ),
        "already exists",
    )
    assert traj.read_text() == "old" and not (tmp_path / "o2").exists()
    # --force replaces only what headcut wrote: the user's folder stays
    one_line_error(
        prune_cli(ckpts["bert"], data_dir, out, "--method", "gradient", "--keep", "4", "--force"),
        "headcut did not write it",
        "keep.txt",
    )
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    out2 = tmp_path / "o3"
    assert prune_cli(ckpts["bert"], data_dir, out2, "--method", "gradient", "--keep", "4").exit_code == 0
    result = prune_cli(ckpts["bert"], data_dir, out2, "--method", "gradient", "--keep", "5", "--force")
    assert result.exit_code == 0, result.output
    assert json.loads((out2 / "headcut-report.json").read_text())["heads"]["after"] == 5


def test_cli_interrupt_leaves_no_output_and_no_trajectory(ckpts, data_dir, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(headcut.model.saving, "write_checkpoint", interrupted)
    result = prune_cli(
        ckpts["bert"],
        data_dir,
        tmp_path / "out",
        "--method",
        "gradient",
        "--keep",
        "4",
        "--eval-data",
        data_dir / "dev.csv",
        "--trajectory",
        tmp_path / "t.csv",
    )
    assert result.exit_code == 130
    assert list(tmp_path.iterdir()) == []
