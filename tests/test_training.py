"""The shared training engine: loss goes down, accumulation, modes, LR groups and schedule, eval hook,
bit-exact checkpoint/resume and atomic checkpoint files."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers as T
from helpers import V, make_config

from headcut.errors import HeadcutError
from headcut.model.gating import HeadGates
from headcut.training import CHECKPOINT_NAME, TrainConfig, Trainer, lr_factor


def tiny_classifier(seed: int = 0, dropout: float = 0.1) -> torch.nn.Module:
    cfg = make_config("bert")
    cfg.hidden_dropout_prob = dropout
    cfg.attention_probs_dropout_prob = dropout
    torch.manual_seed(seed)
    return T.BertForSequenceClassification(cfg)


def make_batches(n: int = 4, size: int = 2, length: int = 6, seed: int = 3) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(3, V, (size, length), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % 3})
    return out


def mean_loss(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> float:
    model.eval()
    with torch.no_grad():
        return sum(float(model(**b).loss) for b in batches) / len(batches)


def gated_loss(gates: HeadGates, noise: bool = False) -> Any:
    """A method-like loss: the model under the gates, plus a regulariser (and random noise, to use the RNG)."""

    def loss_fn(model: torch.nn.Module, batch: dict[str, Any], step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        with gates.installed():
            loss = model(**batch).loss
        reg = sum(g.abs().sum() for g in gates.parameters())
        if noise:
            reg = reg * (1 + 0.01 * torch.rand(()))
        return loss + 0.01 * reg, {"reg": reg, "open": sum(int((g > 0.5).sum()) for g in gates.parameters())}

    return loss_fn


def test_loss_decreases() -> None:
    model, batches = tiny_classifier(), make_batches()
    before = mean_loss(model, batches)
    result = Trainer(model, None, batches, TrainConfig(epochs=8, lr=3e-3, schedule="constant", seed=1)).train()
    assert result.steps == 32 and len(result.history) == 32 and result.seconds > 0
    assert [h["step"] for h in result.history] == list(range(1, 33))
    assert mean_loss(model, batches) < 0.5 * before
    assert model.training is False  # mode restored (it was in eval mode before train())


class TinyMLP(torch.nn.Module):
    """Embeddings, mean pooling, an MLP: no dropout, and (unlike attention's key bias) no parameter whose
    true gradient is 0, where Adam would blow rounding noise up to a full step."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(V, 16)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
        logits = self.mlp(self.embed(input_ids).mean(dim=1))
        return SimpleNamespace(logits=logits, loss=torch.nn.functional.cross_entropy(logits, labels))


def test_grad_accum_matches_larger_batch() -> None:
    small = make_batches(n=4, size=2)
    big = [{k: torch.cat([small[i][k], small[i + 1][k]]) for k in small[i]} for i in (0, 2)]
    cfg = {"max_steps": 6, "lr": 1e-2, "shuffle": False, "max_grad_norm": 1.0, "warmup_steps": 1, "weight_decay": 0.01}
    a, b = TinyMLP(), TinyMLP()
    ha = Trainer(a, None, small, TrainConfig(grad_accum=2, **cfg)).train().history
    hb = Trainer(b, None, big, TrainConfig(grad_accum=1, **cfg)).train().history
    assert [h["loss"] for h in ha] == pytest.approx([h["loss"] for h in hb], abs=1e-6)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0), name
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), TinyMLP().parameters()))
    assert moved > 1e-3  # training did change the weights


def test_pipelined_freezes_model_and_trains_gates() -> None:
    model, batches = tiny_classifier(), make_batches()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gates = HeadGates(model, requires_grad=True)
    start = [g.detach().clone() for g in gates.parameters()]
    modes: list[bool] = []

    def loss_fn(m: torch.nn.Module, batch: dict[str, Any], step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        modes.append(m.training)
        return gated_loss(gates)(m, batch, step)

    trainer = Trainer(
        model, gates.parameters(), batches, TrainConfig(max_steps=5, mode="pipelined", gate_lr=0.05), loss_fn
    )
    assert trainer.model_params == []
    history = trainer.train().history
    assert modes == [False] * 5  # dropout off while frozen
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(not torch.equal(g, s) for g, s in zip(gates.parameters(), start))
    assert all(p.requires_grad for p in model.parameters()) and model.training  # restored
    assert "reg" in history[0] and history[0]["open"] == 8 and "gate_lr" in history[0]


def test_parameter_groups_learning_rates() -> None:
    model, batches = tiny_classifier(), make_batches()
    gates = HeadGates(model, requires_grad=True)
    cfg = TrainConfig(max_steps=3, lr=2e-4, gate_lr=0.3, weight_decay=0.01, schedule="constant")
    trainer = Trainer(model, gates.parameters(), batches, cfg, gated_loss(gates))
    model_group, gate_group = trainer.optimizer.param_groups
    assert model_group["initial_lr"] == 2e-4 and gate_group["initial_lr"] == 0.3
    assert model_group["weight_decay"] == 0.01 and gate_group["weight_decay"] == 0.0
    assert {id(p) for p in gate_group["params"]} == {id(g) for g in gates.parameters()}
    assert {id(p) for p in model_group["params"]} == {id(p) for p in model.parameters()}
    history = trainer.train().history
    assert all(h["lr"] == 2e-4 and h["gate_lr"] == 0.3 for h in history)

    with pytest.raises(HeadcutError, match="pipelined"):
        Trainer(model, None, batches, TrainConfig(max_steps=1, mode="pipelined"))
    with pytest.raises(HeadcutError, match="not both"):
        Trainer(model, None, batches, TrainConfig(max_steps=1, epochs=1))


def test_schedule_values() -> None:
    model, batches = tiny_classifier(), make_batches()
    history = Trainer(model, None, batches, TrainConfig(max_steps=10, lr=1e-3, warmup_steps=4)).train().history
    lrs = [h["lr"] for h in history]
    assert lrs[0] == pytest.approx(1e-3 / 4)
    assert lrs[3] == pytest.approx(1e-3)  # warmup's last step: the full LR
    assert lrs[4] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-3 / 6)  # linear decay: last step 1/(total - warmup)
    assert all(x > y for x, y in itertools.pairwise(lrs[4:]))  # strictly decreasing after warmup
    const = Trainer(
        model, None, batches, TrainConfig(max_steps=10, lr=1e-3, warmup_ratio=0.2, schedule="constant")
    ).train()
    assert [h["lr"] for h in const.history][1:] == pytest.approx([1e-3] * 9)
    assert const.history[0]["lr"] == pytest.approx(5e-4)
    assert lr_factor(1, 5, 0, "linear") == 1.0 and lr_factor(5, 5, 0, "linear") == pytest.approx(0.2)


def test_eval_fn_every_n_steps() -> None:
    model, batches = tiny_classifier(), make_batches()
    calls: list[tuple[int, bool]] = []

    def eval_fn(step: int) -> dict[str, Any]:
        calls.append((step, model.training))
        return {"loss": torch.tensor(1.5), "step_seen": step}

    progress: list[tuple[int, int | None]] = []
    cfg = TrainConfig(max_steps=10, eval_every=3)
    history = (
        Trainer(model, None, batches, cfg, eval_fn=eval_fn, progress=lambda d, t: progress.append((d, t)))
        .train()
        .history
    )
    assert calls == [(3, False), (6, False), (9, False)]
    assert [h["step"] for h in history if "eval" in h] == [3, 6, 9]
    assert history[2]["eval"] == {"loss": 1.5, "step_seen": 3}
    assert progress == [(i, 10) for i in range(1, 11)]


def _resume_setup(seed: int) -> tuple[torch.nn.Module, HeadGates]:
    model = tiny_classifier(seed=seed)
    return model, HeadGates(model, requires_grad=True)


def _assert_same_run(
    a: torch.nn.Module,
    ga: HeadGates,
    ha: list[dict[str, Any]],
    b: torch.nn.Module,
    gb: HeadGates,
    hb: list[dict[str, Any]],
) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    for x, y in zip(ga.parameters(), gb.parameters()):
        assert torch.equal(x, y)
    assert ha == hb


def test_resume_after_interruption_is_bit_exact(tmp_path: Path) -> None:
    """Linear schedule, dropout, accumulation over epoch boundaries, random noise in the loss: a run
    killed mid-step and resumed from its last checkpoint ends exactly like an uninterrupted run."""
    batches = make_batches(n=5)
    cfg = TrainConfig(
        max_steps=9, lr=1e-3, gate_lr=0.05, warmup_steps=2, grad_accum=2, checkpoint_every=3, eval_every=4, seed=7
    )
    model, gates = _resume_setup(0)
    straight = Trainer(
        model, gates.parameters(), batches, cfg, gated_loss(gates, noise=True), eval_fn=lambda s: {"s": s}
    ).train()

    m1, g1 = _resume_setup(0)
    inner = gated_loss(g1, noise=True)

    def crashing(m: torch.nn.Module, batch: dict[str, Any], step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        if step == 7:
            raise KeyboardInterrupt
        return inner(m, batch, step)

    with pytest.raises(KeyboardInterrupt):
        Trainer(
            m1, g1.parameters(), batches, cfg, crashing, eval_fn=lambda s: {"s": s}, checkpoint_dir=tmp_path
        ).train()
    assert torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)["step"] == 6

    m2, g2 = _resume_setup(123)  # different starting weights: everything must come from the checkpoint
    rng_before = torch.get_rng_state()
    trainer = Trainer(
        m2,
        g2.parameters(),
        batches,
        cfg,
        gated_loss(g2, noise=True),
        eval_fn=lambda s: {"s": s},
        checkpoint_dir=tmp_path,
    )
    trainer.resume(tmp_path)
    resumed = trainer.train()
    assert resumed.steps == 9
    assert torch.equal(torch.get_rng_state(), rng_before)  # the caller's RNG is untouched
    _assert_same_run(model, gates, straight.history, m2, g2, resumed.history)


def test_resume_from_shorter_run(tmp_path: Path) -> None:
    """The brief's recipe: run max_steps=k with checkpoints, then resume with max_steps=n."""
    batches = make_batches(n=3)
    base = {"lr": 1e-3, "warmup_steps": 2, "schedule": "constant", "checkpoint_every": 2, "seed": 11}
    model, gates = _resume_setup(0)
    straight = Trainer(model, gates.parameters(), batches, TrainConfig(max_steps=8, **base), gated_loss(gates)).train()

    m1, g1 = _resume_setup(0)
    first = Trainer(
        m1, g1.parameters(), batches, TrainConfig(max_steps=4, **base), gated_loss(g1), checkpoint_dir=tmp_path
    )
    assert first.train().steps == 4
    m2, g2 = _resume_setup(5)
    second = Trainer(
        m2, g2.parameters(), batches, TrainConfig(max_steps=8, **base), gated_loss(g2), checkpoint_dir=tmp_path
    )
    second.resume()
    _assert_same_run(model, gates, straight.history, m2, g2, second.train().history)

    other = Trainer(m2, g2.parameters(), batches, TrainConfig(max_steps=8, **{**base, "seed": 12}), gated_loss(g2))
    with pytest.raises(HeadcutError, match="seed"):
        other.resume(tmp_path)


def test_checkpoint_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, batches = tiny_classifier(), make_batches()
    real_save = torch.save
    calls = []

    def flaky_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 2:
            f.write(b"partial checkpoint bytes")
            raise OSError("disk full")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", flaky_save)
    trainer = Trainer(model, None, batches, TrainConfig(max_steps=6, checkpoint_every=2), checkpoint_dir=tmp_path)
    with pytest.raises(HeadcutError, match=r"cannot write the checkpoint .*checkpoint\.pt: disk full"):
        trainer.train()
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]  # no temporary file left behind
    state = torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)
    assert state["step"] == 2 and len(state["history"]) == 2


class Stop(Exception):
    pass


def test_a_stop_signal_during_a_checkpoint_write_waits_for_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SIGTERM arriving in the middle of torch.save (what a cancelled CI job does) used to cut the zip
    writer in two: a RuntimeError instead of a clean stop, and a temporary file left behind."""
    import os
    import signal

    model, batches = tiny_classifier(), make_batches()
    real_save = torch.save
    saves: list[int] = []

    def interrupted_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        saves.append(1)
        if len(saves) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered while the checkpoint is being written
        real_save(obj, f, *args, **kwargs)

    def handler(signum: int, frame: Any) -> None:
        raise Stop(signum)

    monkeypatch.setattr(torch, "save", interrupted_save)
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        trainer = Trainer(model, None, batches, TrainConfig(max_steps=8, checkpoint_every=2), checkpoint_dir=tmp_path)
        with pytest.raises(Stop):
            trainer.train()
        assert signal.getsignal(signal.SIGTERM) is handler  # the run's own handler is back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]
    state = torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)
    assert state["step"] == 4 and len(state["history"]) == 4  # the second checkpoint, whole


def test_deferred_signals_hold_then_deliver_the_first_signal() -> None:
    import os
    import signal

    from headcut.interrupts import deferred_signals

    seen: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        seen.append(signum)
        raise Stop(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        steps = []
        with pytest.raises(Stop):
            with deferred_signals():
                os.kill(os.getpid(), signal.SIGTERM)
                steps.append("after the signal")  # the block goes on
                with deferred_signals():  # nested: the inner block hands it to the outer one
                    os.kill(os.getpid(), signal.SIGTERM)
                steps.append("after the inner block")
        assert steps == ["after the signal", "after the inner block"]
        assert seen == [signal.SIGTERM]  # delivered once, at the end of the outer block
        with deferred_signals():
            steps.append("quiet")
        assert seen == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_average_last_ends_with_the_mean_of_the_last_steps_weights(tmp_path: Path) -> None:
    """average_last F: the weights at the end are the mean of the weights after each of the last F x N steps
    (stochastic weight averaging), the steps themselves unchanged."""
    batches = make_batches(n=4)
    config = TrainConfig(max_steps=8, lr=1e-2, schedule="constant", seed=1)
    plain = TinyMLP()
    after: list[dict[str, torch.Tensor]] = []
    Trainer(
        plain,
        None,
        batches,
        config,
        on_step=lambda e: after.append({k: v.detach().clone() for k, v in plain.state_dict().items()}),
    ).train()
    averaged = TinyMLP()
    Trainer(
        averaged, None, batches, TrainConfig(max_steps=8, lr=1e-2, schedule="constant", seed=1, average_last=0.5)
    ).train()
    for name, value in averaged.state_dict().items():
        expected = torch.stack([a[name] for a in after[4:]]).mean(0)
        torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(value, after[-1][name])  # not simply the last step's weights
    with pytest.raises(HeadcutError, match="averages its weights .* keeps no resume checkpoints"):
        Trainer(TinyMLP(), None, batches, TrainConfig(max_steps=2, average_last=0.5), checkpoint_dir=tmp_path)
    with pytest.raises(HeadcutError, match="averages its weights .* cannot resume"):
        Trainer(TinyMLP(), None, batches, TrainConfig(max_steps=2, average_last=0.5)).resume(tmp_path)
    with pytest.raises(HeadcutError, match="average_last"):
        TrainConfig(max_steps=2, average_last=1.5).validate()
