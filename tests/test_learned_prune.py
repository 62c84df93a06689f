"""The learned-gate methods (pass, passconc, dsp, ste, voita, lag): exact budgets on every family, units,
resume, the methods' own mechanics (PASS clipping/re-opening and lambda, LAG's ascent, Voita's
adjustment, the concentrator), and the prune command with training flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import (
    CASES,
    FAMILIES,
    GQA_DECODERS,
    check_units,
    cls_rows,
    loss_class,
    make_batch,
    make_model,
    one_line_error,
    run,
    save_tiny,
    write_rows,
)

import headcut
from headcut.catalog import METHODS
from headcut.data import Calibration, detect_task
from headcut.errors import HeadcutError
from headcut.pruning import PruneConfig, plan_prune, prune
from headcut.pruning.gate_training import GateOptions, Slots
from headcut.pruning.pass_gates import PASS, PassOptions
from headcut.pruning.units import block_sets
from headcut.training.checkpoint import checkpoint_dir_for

LEARNED = [m.name for m in METHODS.values() if m.kind == "learned"]
#: every family once (with the learned methods in turn), and every method on BERT
FAMILY_METHOD = sorted(
    {(f, LEARNED[i % len(LEARNED)]) for i, f in enumerate(FAMILIES)} | {("bert", m) for m in LEARNED}
)


def calibration_for(model: torch.nn.Module, n: int = 3) -> Calibration:
    # image models: headcut reads no image files, but the library trains on any labelled batches
    task = "classification" if "ViT" in type(model).__name__ else detect_task(model)
    batches = [make_batch(model, seed=i) for i in range(n)]
    return Calibration(task=task, batches=batches, examples=3 * n, source="random", columns={})


def total_heads(model: torch.nn.Module) -> int:
    return sum(b.heads for b in headcut.model_blocks(model))


@pytest.mark.parametrize("family,method", FAMILY_METHOD)
def test_every_method_ends_with_exactly_k_heads_on_every_family(family, method):
    model = make_model(family, loss_class(family))
    cal = calibration_for(model)
    total = total_heads(model)
    keep = total // 2 if family != "albert" else 6  # ALBERT: 3 sharing layers lose a head together
    if family in GQA_DECODERS:
        keep = 9  # whole KV groups of 3 (--gqa auto)
    options = {"max_steps": 4, "mode": "pipelined" if method == "ste" else None}
    result = prune(model, cal, PruneConfig(method=method, keep=keep), options)
    assert result.total_after == keep == result.slim.total_after
    assert sum(b.heads for b in headcut.model_blocks(model)) == keep
    assert result.training.steps == 4 and len(result.training.history) == 4
    out = model(**{k: v for k, v in cal.batches[0].items()})
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("method", ["pass", "dsp", "voita"])
@pytest.mark.parametrize("case", ["albert-shared", "llama-group", "llama-uniform"])
def test_units_are_honoured(case, method):
    kind, gqa, keep = CASES[case]
    model = make_model(*kind)
    cal = calibration_for(model)
    result = prune(model, cal, PruneConfig(method=method, keep=keep, gqa=gqa), {"max_steps": 3})
    assert result.total_after == keep
    check_units(case, model, result.mask, result)


def test_slots_share_albert_heads_and_kv_groups():
    albert = make_model("albert", "AlbertForSequenceClassification")
    slots = Slots.from_sets(block_sets(headcut.model_blocks(albert)))
    assert slots.n == 4 and float(slots.weight[0]) == 3.0  # 4 head positions, each in 3 layers
    assert all(torch.equal(idx, torch.arange(4)) for idx in slots.index.values())
    llama = make_model("llama", "LlamaForSequenceClassification")
    grouped = Slots.from_sets(block_sets(headcut.model_blocks(llama), "group"))
    assert grouped.n == 6 and set(grouped.weight.tolist()) == {3.0}  # 3 layers x 2 KV groups of 3 heads
    assert grouped.index["self.0"].tolist() == [0, 0, 0, 1, 1, 1]
    assert grouped.target(9) == 3
    per_head = Slots.from_sets(block_sets(headcut.model_blocks(llama), "duplicate"))
    assert per_head.n == 18


def _bert_run(tmp_path: Path, method: str, steps: int):
    model = make_model("bert", "BertForSequenceClassification")
    cal = calibration_for(model, n=4)
    config = PruneConfig(method=method, keep=3, seed=3)
    return model, plan_prune(model, cal, config, {"max_steps": steps}, checkpoint_dir=tmp_path)


@pytest.mark.parametrize("method", ["pass", "passconc", "dsp", "lag"])
def test_resume_reproduces_an_uninterrupted_run(tmp_path, method):
    steps = 12
    full_model, full = _bert_run(tmp_path / "full", method, steps)
    assert torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)["step"] == steps
    # an interrupted run: killed during step 6 (the checkpoint of step 5 is on disk), then a fresh model
    # and learner resume from it
    partial_model = make_model("bert", "BertForSequenceClassification")
    cal = calibration_for(partial_model, n=4)
    config = PruneConfig(method=method, keep=3, seed=3)

    class Stop(Exception):
        pass

    def stop_after_five(phase: str, done: int, total: int | None) -> None:
        if phase == "train" and done == 6:  # before step 6's checkpoint
            raise Stop

    with pytest.raises(Stop):
        plan_prune(
            partial_model,
            cal,
            config,
            {"max_steps": steps, "checkpoint_every": 5},
            checkpoint_dir=tmp_path / "part",
            progress=stop_after_five,
        )
    assert torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)["step"] == 5
    resumed_model = make_model("bert", "BertForSequenceClassification")
    resumed = plan_prune(
        resumed_model,
        calibration_for(resumed_model, n=4),
        PruneConfig(method=method, keep=3, seed=3),
        {"max_steps": steps, "checkpoint_every": 5},
        checkpoint_dir=tmp_path / "part",
        resume=True,
    )
    assert resumed.training.resumed_from == 5 and resumed.training.steps == steps
    assert resumed.mask.keep == full.mask.keep
    assert [h["loss"] for h in resumed.training.history] == [h["loss"] for h in full.training.history]
    for a, b in zip(full_model.state_dict().values(), resumed_model.state_dict().values()):
        assert torch.equal(a, b)


def test_pipelined_leaves_the_model_weights_alone():
    model = make_model("bert", "BertForSequenceClassification")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan_prune(model, calibration_for(model), PruneConfig(method="dsp", keep=3), {"mode": "pipelined", "max_steps": 5})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    joint = make_model("bert", "BertForSequenceClassification")
    plan_prune(
        joint, calibration_for(joint), PruneConfig(method="dsp", keep=3), {"mode": "joint", "max_steps": 5, "lr": 1e-3}
    )
    assert any(not torch.equal(before[k], v) for k, v in joint.state_dict().items())


def test_dsp_mask_sums_to_k_and_anneals():
    model = make_model("bert", "BertForSequenceClassification")
    result = plan_prune(
        model, calibration_for(model), PruneConfig(method="dsp", keep=3), {"max_steps": 20, "cooldown": 10}
    )
    taus = [h["tau"] for h in result.training.history]
    assert taus[0] == pytest.approx(1000.0) and taus[10] == pytest.approx(1e-8) and taus[-1] == pytest.approx(1e-8)
    assert all(a > b for a, b in zip(taus[:10], taus[1:11]))  # log-linear cooling (eq. 24)
    assert result.training.history[-1]["open"] == 3  # noise-free soft mask is the hard top-K at tau_end
    assert result.training.hyperparameters["n_cooldown"] == 10


def test_dsp_cooldown_fits_short_runs():
    from headcut.pruning.dsp import temperature_schedule

    assert temperature_schedule("classification", 100_000, None).n_cooldown == 25000
    assert temperature_schedule("classification", 3682, None).n_cooldown == 2500
    assert temperature_schedule("seq2seq", 100_000, None).tau_ini == 0.1


def _pass_learner(phi: list[float], k: int, lambda_step: int = 2) -> PASS:
    from headcut.pruning.gate_training import Context

    model = make_model("bert", "BertForSequenceClassification")
    slots = Slots.from_sets(block_sets(headcut.model_blocks(model)))
    ctx = Context(model=model, batches=[make_batch(model)], task="classification", total_steps=100, seed=0)
    learner = PASS(slots, k, PassOptions(lambda_step=lambda_step, gate_lr=0.5), ctx)
    with torch.no_grad():
        learner.phi.copy_(torch.tensor(phi))
    return learner


def test_pass_clips_and_reopens_closed_gates_at_the_events(monkeypatch):
    learner = _pass_learner([-9.0, -9.0, 7.0, 0.5, 0.0, -6.0, 9.0, 1.0], k=4)
    assert [s for s in range(1, 12) if learner.event(s)] == [4, 6, 8]  # 2, 3, 4 x n_step
    monkeypatch.setattr(learner, "confidence", lambda: torch.tensor([1.0, 0.0, 1, 1, 1, 1.0, 1, 1]))
    with torch.no_grad():
        logs = learner.after_step(3)
        assert "reopened" not in logs and float(learner.phi[0]) == -9.0  # no event: no clipping
        logs = learner.after_step(4)
    # clipped to [-5, 5]; closed gates re-opened with probability = confidence (1: always, 0: never)
    assert learner.phi.tolist() == [5.0, -5.0, 5.0, 0.5, 0.0, 5.0, 5.0, 1.0]
    assert logs["reopened"] == 2


def test_pass_lambda_grows_only_while_the_target_is_missed():
    learner = _pass_learner([0.0] * 8, k=4, lambda_step=2)
    with torch.no_grad():
        learner.after_step(1)
        learner.after_step(2)
    assert learner.itr == 2 and learner.lam == pytest.approx(1e-5 * 1000.0)  # eq. 16 at train_itr = n_step
    with torch.no_grad():
        learner.phi.copy_(torch.tensor([-6.0, -6, -6, -6, 6, 6, 6, 6]))
        learner.after_step(3)
    assert learner.itr == 2  # almost-sure sparsity met: lambda stays
    assert learner.target_met()


def test_pass_drives_gates_to_almost_sure_sparsity():
    model = make_model("bert", "BertForSequenceClassification")
    result = plan_prune(
        model,
        calibration_for(model),
        PruneConfig(method="pass", keep=3),
        {"mode": "pipelined", "max_steps": 60, "lambda_step": 4},
    )
    hist = result.training.history
    assert result.training.hyperparameters["n_step"] == 4
    assert hist[-1]["lambda"] > hist[0]["lambda"]
    assert sum(h.get("reopened", 0) for h in hist) > 0 and max(h["open"] for h in hist) > 3  # re-opening
    assert hist[-1]["open"] == 3  # then exactly K deterministic gates open again at the end


def test_passconc_weight_is_eq_17_and_r_conc_vanishes_on_closed_layers():
    from headcut.learned import HardConcrete
    from headcut.learned.objectives import concentrator_weight, r_conc, r_pass

    hc = HardConcrete()
    layers = [torch.arange(0, 3), torch.arange(3, 6)]
    closed = torch.tensor([-40.0, -40, -40, 2.0, -1.0, 0.5])
    layer_1 = 1 - float(hc.prob_closed(closed[3:]).prod())
    assert float(r_conc(closed, layers)) == pytest.approx(layer_1, abs=1e-6)  # layer 0 closed: its term is 0
    assert float(r_conc(torch.full((6,), -40.0), layers)) == pytest.approx(0.0, abs=1e-6)
    phi = torch.tensor([0.3, -1.2, 2.0, 0.1, -0.4, 1.5], dtype=torch.float64, requires_grad=True)
    (gp,) = torch.autograd.grad(r_pass(phi, 0.5, hc), phi)
    (gc,) = torch.autograd.grad(r_conc(phi, layers, hc), phi)
    expected = 2.5 * float((gp.abs() / gc.abs()).min())
    assert concentrator_weight(phi, 0.5, layers, 2.5) == pytest.approx(expected)
    skip = torch.tensor([True, False, False, False, False, False])
    assert concentrator_weight(phi, 0.5, layers, 1.0, skip=skip) == pytest.approx(
        float((gp.abs() / gc.abs())[1:].min())
    )


def test_passconc_concentrates_in_its_window():
    model = make_model("bert", "BertForSequenceClassification")
    result = plan_prune(
        model,
        calibration_for(model),
        PruneConfig(method="passconc", keep=3),
        {"mode": "pipelined", "max_steps": 30, "lambda_step": 4},
    )
    hist = result.training.history
    assert result.training.hyperparameters["conc_window"] == [8, 20]
    active = [h["step"] for h in hist if h["lambda_c"] > 0]
    assert active and min(active) > 8 and max(active) <= 20  # the weight set at step 8 acts from step 9
    assert all(h["lambda_c"] == 0 for h in hist if h["step"] <= 8 or h["step"] > 20)


def test_lag_multipliers_ascend():
    from headcut.pruning.gate_training import Context
    from headcut.pruning.lag import LAG

    model = make_model("bert", "BertForSequenceClassification")
    slots = Slots.from_sets(block_sets(headcut.model_blocks(model)))
    ctx = Context(model=model, batches=[make_batch(model)], task="classification", total_steps=10, seed=0)
    learner = LAG(slots, 2, GateOptions(), ctx)  # target sparsity 0.75, gates start half open
    _, reg, logs = learner.gates(0)
    assert logs["expected_sparsity"] < 0.75
    reg.backward()
    # the gradient reaching lambda_1 is -(s_hat - s) > 0: a descent step lowers lambda_1 (ascent on R_lag)
    assert float(learner.lambdas.grad[0]) == pytest.approx(-(logs["expected_sparsity"] - 0.75), rel=1e-5)


def test_voita_reports_the_adjustment():
    model = make_model("bert", "BertForSequenceClassification")
    result = plan_prune(
        model, calibration_for(model), PruneConfig(method="voita", keep=2), {"max_steps": 5, "lam": 0.0}
    )
    run = result.training
    assert run.own_kept is not None and run.moved == abs(run.own_kept - 2)


def test_ste_forward_is_exactly_k_heads():
    model = make_model("bert", "BertForSequenceClassification")
    result = plan_prune(model, calibration_for(model), PruneConfig(method="ste", keep=3), {"max_steps": 6})
    assert all(h["open"] == 3 for h in result.training.history)


def test_learned_methods_refuse_score_flags():
    model = make_model("bert", "BertForSequenceClassification")
    cal = calibration_for(model)
    from headcut.errors import HeadcutError

    for config in (
        PruneConfig(method="pass", keep=3, max_drop=0.1),
        PruneConfig(method="voita", keep=3, trajectory=True),
    ):
        with pytest.raises(HeadcutError, match="score-based"):
            plan_prune(model, cal, config)
    with pytest.raises(HeadcutError, match="step does not apply to dsp"):
        plan_prune(model, cal, PruneConfig(method="dsp", keep=3), {"step": 2})
    with pytest.raises(HeadcutError, match="keeps every head"):
        plan_prune(model, cal, PruneConfig(method="pass", keep=8))
    with pytest.raises(HeadcutError, match="trains on a Calibration"):
        plan_prune(model, None, PruneConfig(method="pass", keep=3))


# ------------------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("learned-cli")
    save_tiny(d / "model", "bert", "BertForSequenceClassification")
    write_rows(d / "train.csv", cls_rows(32, seed=0))
    write_rows(d / "dev.csv", cls_rows(16, seed=1))
    return d


def test_cli_prune_pass_end_to_end(tiny_dir, tmp_path):
    out = tmp_path / "slim"
    res = run(
        *[
            "prune",
            str(tiny_dir / "model"),
            "--method",
            "pass",
            "--keep",
            "3",
            "--data",
            str(tiny_dir / "train.csv"),
            "--eval-data",
            str(tiny_dir / "dev.csv"),
            "--max-steps",
            "6",
            "--eval-every",
            "3",
            "--lambda-step",
            "2",
            "--seq-len",
            "16",
            "--batch-size",
            "8",
            "--out",
            str(out),
            "--json",
            "-",
        ]
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["heads"]["after"] == 3 and report["method"] == "pass"
    training = report["training"]
    assert training["steps"] == 6 and training["mode"] == "joint" and training["hyperparameters"]["n_step"] == 2
    assert [c["step"] for c in training["curve"]] == [1, 2, 3, 4, 5, 6]
    assert [c["step"] for c in training["curve"] if "eval" in c] == [3, 6]
    assert json.loads((out / "headcut-report.json").read_text())["training"]["steps"] == 6
    assert not checkpoint_dir_for(out).exists()
    reloaded = headcut.load(out)
    assert sum(b.heads for b in headcut.model_blocks(reloaded)) == 3
    # metric_after is what `headcut eval` measures on the saved model
    ev = run(
        *["eval", str(out), "--data", str(tiny_dir / "dev.csv"), "--seq-len", "16", "--batch-size", "8", "--json", "-"]
    )
    assert json.loads(ev.stdout)["metrics"]["accuracy"] == pytest.approx(report["metric"]["after"])


def test_cli_resume_finishes_an_interrupted_prune(tiny_dir, tmp_path, monkeypatch):
    args = [
        "prune",
        str(tiny_dir / "model"),
        "--method",
        "dsp",
        "--keep",
        "3",
        "--data",
        str(tiny_dir / "train.csv"),
        "--max-steps",
        "8",
        "--checkpoint-every",
        "2",
        "--seq-len",
        "16",
        "--batch-size",
        "8",
    ]
    full = run(*[*args, "--out", str(tmp_path / "full"), "--json", "-"])
    assert full.exit_code == 0, full.output
    import headcut.training.engine as engine

    original = engine.Trainer.save_checkpoint

    def crash_at_four(self):
        path = original(self)
        if self.step == 4:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(engine.Trainer, "save_checkpoint", crash_at_four)
    cut = run(*[*args, "--out", str(tmp_path / "cut")])
    assert cut.exit_code == 130 and not (tmp_path / "cut").exists()
    assert (checkpoint_dir_for(tmp_path / "cut") / "checkpoint.pt").is_file()
    monkeypatch.setattr(engine.Trainer, "save_checkpoint", original)
    again = run(*[*args, "--out", str(tmp_path / "cut")])
    assert again.exit_code == 2 and "--resume" in one_line_error(again)
    resumed = run(*[*args, "--out", str(tmp_path / "cut"), "--resume", "--json", "-"])
    assert resumed.exit_code == 0, resumed.output
    a, b = json.loads(full.stdout), json.loads(resumed.stdout)
    assert b["training"]["resumed_from"] == 4
    assert a["mask"] == b["mask"]
    assert [c["loss"] for c in a["training"]["curve"]] == [c["loss"] for c in b["training"]["curve"]]


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--method", "pass", "--keep", "3", "--max-drop", "0.1", "--eval-data", "DEV"], "score-based"),
        (["--method", "pass", "--keep", "3", "--lambda", "0.1"], "--lambda does not apply to pass"),
        (["--method", "dsp", "--keep", "3", "--lambda-step", "5"], "--lambda-step does not apply to dsp"),
        (["--method", "michel", "--keep", "3", "--max-steps", "5"], "--max-steps does not apply to michel"),
        (["--method", "pass", "--keep", "3", "--normalize", "layer"], "--normalize does not apply to pass"),
        (["--method", "pass", "--keep", "3", "--mode", "both"], "unknown --mode 'both'"),
        (["--method", "michel", "--keep", "3", "--resume"], "--resume applies to the methods that keep checkpoints"),
        (["--method", "pass", "--keep", "3", "--resume"], "no checkpoint"),
        (["--method", "pass", "--keep", "3", "--epochs", "1", "--max-steps", "3"], "not both"),
        (["--method", "pass", "--keep", "3", "--eval-every", "2"], "--eval-every needs --eval-data"),
        (["--method", "lottery", "--keep", "3", "--resume"], "no checkpoint"),
    ],
)
def test_cli_refusals(tiny_dir, tmp_path, extra, needle):
    extra = [str(tiny_dir / "dev.csv") if e == "DEV" else e for e in extra]
    out = tmp_path / "never"
    res = run(*["prune", str(tiny_dir / "model"), "--data", str(tiny_dir / "train.csv"), "--out", str(out), *extra])
    assert res.exit_code == 2, res.output
    assert needle in one_line_error(res)
    assert not out.exists() and not checkpoint_dir_for(out).exists()


def test_help_lists_learned_methods():
    res = run("prune", "--help")
    for name in LEARNED:
        assert name in res.output


def test_voita_searches_lambda_towards_k():
    from headcut.pruning.voita import DEFAULT_LAMBDA, next_lambda

    # too many heads kept: raise lambda until bracketed, then the geometric middle
    assert next_lambda(1e-3, kept=10, k=4, low=None, high=None) == (4e-3, 1e-3, None)
    assert next_lambda(4e-3, kept=2, k=4, low=1e-3, high=None) == pytest.approx((2e-3, 1e-3, 4e-3))
    assert next_lambda(1e-3, kept=1, k=4, low=None, high=None) == (2.5e-4, None, 1e-3)
    model = make_model("bert", "BertForSequenceClassification")
    result = plan_prune(
        model, calibration_for(model), PruneConfig(method="voita", keep=4), {"max_steps": 4, "lambda_trials": 3}
    )
    run = result.training
    trials = run.hyperparameters["lambda_search"]
    assert 1 <= len(trials) <= 3 and trials[0]["lambda"] == DEFAULT_LAMBDA
    assert result.total_after == 4
    best = min(abs(t["own_kept"] - 4) for t in trials)
    assert abs(run.own_kept - 4) == best and run.moved == abs(run.own_kept - 4)
    with pytest.raises(headcut.HeadcutError, match="--resume needs --lambda"):
        plan_prune(
            model,
            calibration_for(model),
            PruneConfig(method="voita", keep=4),
            {"max_steps": 2},
            resume=True,
            checkpoint_dir="unused",
        )


def test_gates_first_gives_the_model_no_learning_rate_for_its_steps():
    """--gates-first N: the model's learning rate is 0 for the first N steps, then follows the schedule (the
    gates' does throughout); N >= the run's steps is refused."""
    model = make_model("bert", "BertForSequenceClassification")
    result = plan_prune(
        model,
        calibration_for(model),
        PruneConfig(method="pass", keep=3),
        {"max_steps": 3, "gates_first": 2, "lr": 1e-3},
    )
    history = result.training.history
    assert [e["lr"] for e in history] == [0.0, 0.0, pytest.approx(1e-3 / 3)]
    assert all(e["gate_lr"] > 0 for e in history)
    with pytest.raises(HeadcutError, match="--gates-first 3 leaves no joint step"):
        plan_prune(
            make_model("bert", "BertForSequenceClassification"),
            calibration_for(model),
            PruneConfig(method="pass", keep=3),
            {"max_steps": 3, "gates_first": 3},
        )


def test_gates_first_steps_leave_the_weights_alone():
    model = make_model("bert", "BertForSequenceClassification")
    start = {k: v.clone() for k, v in model.state_dict().items()}
    seen: list[bool] = []

    def on_step(entry):  # after each optimizer step: are the weights still the starting ones?
        seen.append(all(torch.equal(start[k], v) for k, v in model.state_dict().items()))

    plan_prune(
        model,
        calibration_for(model),
        PruneConfig(method="dsp", keep=3),
        {"max_steps": 4, "gates_first": 2, "lr": 1e-3},
        on_step=on_step,
    )
    assert seen == [True, True, False, False]


def test_lag_sparsity_warmup_raises_the_target_linearly():
    from headcut.pruning.gate_training import Context
    from headcut.pruning.lag import LAG, LAGOptions

    model = make_model("bert", "BertForSequenceClassification")
    slots = Slots.from_sets(block_sets(headcut.model_blocks(model)))
    ctx = Context(model=model, batches=[make_batch(model)], task="classification", total_steps=10, seed=0)
    learner = LAG(slots, 2, LAGOptions(sparsity_warmup=4), ctx)  # target sparsity 0.75
    targets = [learner.gates(step)[2]["target_sparsity"] for step in range(6)]
    assert targets == pytest.approx([0.1875, 0.375, 0.5625, 0.75, 0.75, 0.75])
    plain = LAG(slots, 2, LAGOptions(), ctx)
    assert plain.gates(0)[2]["target_sparsity"] == 0.75
    with pytest.raises(HeadcutError, match="sparsity_warmup"):
        LAGOptions(sparsity_warmup=-1).validate()
    result = run(
        "prune", "x", "--method", "pass", "--keep", "2", "--sparsity-warmup", "3", "--data", "d.csv", "--out", "o"
    )
    one_line_error(result, "--sparsity-warmup does not apply to pass")
