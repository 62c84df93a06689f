"""A kind of stage defined outside headcut (issue 69): a subclass of PruneStage in this test module, registered at
run time, listed by ``headcut recipes``, its options flags of ``headcut prune``, keywords of ``headcut.prune`` and
keys of a recipe file, each checked by the same request check, and run by the prune job from a YAML recipe; no
file of src/ knows it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
from helpers import one_line_error, run, save_tiny
from safetensors.torch import load_file

import headcut
from headcut.errors import HeadcutError
from headcut.jobs.prune.stages import PruneStage, PruneState, RoundRun, register, unregister
from headcut.options import option


@dataclass
class Scale(PruneStage):
    """Multiplies every floating-point weight of the cut model by ``gain`` (observable in the written weights)."""

    kind: ClassVar[str] = "scale"
    summary: ClassVar[str] = "weights times a gain"
    after: ClassVar[tuple[str, ...]] = ("cut",)

    gain: float = option(1.0, low=0.0, high=4.0, metavar="G", panel="Scale", help="The factor of every weight.")

    def run(self, state: PruneState, run: RoundRun) -> None:
        scaled = 0
        with torch.no_grad():
            for tensor in state.model.state_dict().values():
                if tensor.is_floating_point():
                    tensor.mul_(self.gain)
                    scaled += 1
        run.outputs[self.kind] = scaled

    def report(self, state: PruneState, run: RoundRun, report: dict[str, Any]) -> None:
        report["scale"] = {"gain": self.gain, "tensors": run.outputs[self.kind]}


@pytest.fixture
def scale_stage():
    register(Scale)
    try:
        yield Scale
    finally:
        unregister("scale")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage-kinds")
    return {"src": save_tiny(root / "bert", "bert", "BertForSequenceClassification"), "root": root}


def _recipe(path, gain: Any = 0.5):
    path.write_text(
        f"name: scaled\nstages:\n  - choose: {{method: magnitude}}\n  - cut: {{}}\n  - scale: {{gain: {gain}}}\n",
        encoding="utf-8",
    )
    return path


def _weights(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_a_registered_stage_kind_is_listed_with_its_options(scale_stage):
    listed = run("recipes")
    assert listed.exit_code == 0, listed.output
    assert "scale" in listed.stdout and "gain=1.0" in listed.stdout and "weights times a gain" in listed.stdout
    helped = run("prune", "--help")
    assert "--gain" in helped.stdout and "The factor of every weight" in helped.stdout


def test_a_registered_stage_kind_runs_from_a_yaml_recipe(scale_stage, tiny, tmp_path):
    plain = tmp_path / "plain"
    done = run("prune", tiny["src"], "--method", "magnitude", "--keep", 5, "--out", plain, "-q")
    assert done.exit_code == 0, done.output
    recipe = _recipe(tmp_path / "scaled.yaml")
    shown = run("recipes", recipe)
    assert shown.exit_code == 0, shown.output
    assert "scale" in shown.stdout and "gain=0.5" in shown.stdout

    # from the CLI: the recipe, and a flag on top of it
    scaled = tmp_path / "scaled"
    done = run("prune", tiny["src"], "--recipe", recipe, "--keep", 5, "--gain", 0.25, "--out", scaled, "-q")
    assert done.exit_code == 0, done.output
    before, after = _weights(plain), _weights(scaled)
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        if tensor.is_floating_point():
            torch.testing.assert_close(after[name], tensor * 0.25, rtol=1e-6, atol=1e-7)
    report = json.loads((scaled / "headcut-report.json").read_text())
    assert report["scale"] == {"gain": 0.25, "tensors": len([t for t in before.values() if t.is_floating_point()])}
    assert [s["scale"] for s in report["recipe"]["stages"] if "scale" in s] == [{"gain": 0.25}]

    # from Python: the recipe file's own gain, the stage's report entry
    api = tmp_path / "api"
    result = headcut.prune(str(tiny["src"]), recipe=str(recipe), keep=5, out=str(api))
    assert result.report["scale"]["gain"] == 0.5
    for name, tensor in before.items():
        if tensor.is_floating_point():
            torch.testing.assert_close(_weights(api)[name], tensor * 0.5, rtol=1e-6, atol=1e-7)

    # replayed from the recipe the run saved: the same weights
    replay = tmp_path / "replay"
    done = run("prune", tiny["src"], "--recipe", scaled, "--keep", 5, "--out", replay, "-q")
    assert done.exit_code == 0, done.output
    for name, tensor in after.items():
        torch.testing.assert_close(_weights(replay)[name], tensor)


def test_a_registered_stage_kinds_options_are_checked_alike_from_flag_keyword_and_file(scale_stage, tiny, tmp_path):
    bad = _recipe(tmp_path / "bad.yaml", gain=9)
    from_file = one_line_error(run("prune", tiny["src"], "--recipe", bad, "--keep", 5, "--out", tmp_path / "a"))
    from_flag = one_line_error(
        run(
            "prune",
            tiny["src"],
            "--recipe",
            _recipe(tmp_path / "ok.yaml"),
            "--keep",
            5,
            "--gain",
            9,
            "--out",
            tmp_path / "b",
        )
    )
    with pytest.raises(HeadcutError) as from_api:
        headcut.prune(str(tiny["src"]), recipe=str(tmp_path / "ok.yaml"), keep=5, gain=9, out=str(tmp_path / "c"))
    for text in (from_file, from_flag, str(from_api.value)):
        assert "gain must be in [0, 4] (got 9" in text, text
    assert "--gain" in from_flag and "gain" in str(from_api.value)
    # shown the same way by headcut recipes, which checks a file as prune does
    assert one_line_error(run("recipes", bad)) == from_file
    assert not any((tmp_path / name).exists() for name in ("a", "b", "c"))


def test_registration_refuses_a_clash_and_ends(scale_stage):
    @dataclass
    class Again(PruneStage):
        kind: ClassVar[str] = "scale"

    @dataclass
    class Stealer(PruneStage):
        kind: ClassVar[str] = "stealer"
        recover_steps: int = option(0, help="Taken.")

    with pytest.raises(HeadcutError, match="registered already"):
        register(Again)
    with pytest.raises(HeadcutError, match="belongs to stage recover"):
        register(Stealer)
    unregister("scale")
    assert "scale" not in run("recipes").stdout
    register(Scale)  # the fixture's unregister finds it again
