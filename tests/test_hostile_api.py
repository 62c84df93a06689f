"""The Python API refuses bad arguments with headcut's own errors: every public function checks
its arguments at the edge (:mod:`headcut.arguments`) and raises a :class:`HeadcutError` that is also a
``TypeError`` (wrong kind of value) or ``ValueError`` (a value that cannot work), on one line naming the
keyword the caller passed, before anything is loaded, read or written.

Each case of the table runs with ``headcut.model.loading.load``/``headcut.model.saving.save`` replaced by functions that fail the test, and
checks afterwards that the input checkpoint and the loaded model are unchanged and nothing was written."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import cls_rows, make_tokenizer, save_tiny, write_rows

import headcut
from headcut import api
from headcut.arguments.table import BUILDS, RULES, SPREAD, WIDER, check, declared
from headcut.errors import HeadcutError, HeadcutTypeError, HeadcutValueError
from headcut.model import loading as hio
from headcut.model import saving

CLS = "BertForSequenceClassification"
MASK = {"drop": {"self.0": [0]}}
NAN = float("nan")


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def params_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def ctx(tmp_path_factory) -> dict[str, Any]:
    """M: a checkpoint folder; model: it loaded; train: a data file; a_file: a regular file."""
    root = tmp_path_factory.mktemp("hostile_api")
    folder = save_tiny(root / "models" / "m", "bert", CLS)
    (root / "a_file").write_text("not a folder\n")
    return {
        "M": str(folder),
        "model": headcut.load(folder),
        "train": str(write_rows(root / "train.csv", cls_rows(16))),
        "a_file": root / "a_file",
        "root": root,
    }


@pytest.fixture(scope="module")
def exported(ctx):
    return headcut.export(ctx["M"], MASK)


def _fail(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("an argument check let the call reach loading or saving")


# (id, call(ctx, out), expected subclass, the keyword the message names)
CASES: list[tuple[str, Any, type, str]] = [
    # ---- the forms of the issue
    ("evaluate-data-None", lambda c, out: headcut.evaluate(c["model"], None), HeadcutTypeError, "data"),
    ("export-mask-None", lambda c, out: headcut.export(c["model"], None), HeadcutTypeError, "mask"),
    ("export-mask-list", lambda c, out: headcut.export(c["model"], [["self.0", [1]]]), HeadcutTypeError, "mask"),
    (
        "prune-sparsity-str",
        lambda c, out: headcut.prune(c["M"], "magnitude", sparsity="0.5"),
        HeadcutTypeError,
        "sparsity",
    ),
    (
        "evaluate-tokenizer-int",
        lambda c, out: headcut.evaluate(c["M"], c["train"], tokenizer=42),
        HeadcutTypeError,
        "tokenizer",
    ),
    (
        "finetune-checkpoint-dir-in-a-file",
        lambda c, out: headcut.finetune(c["M"], c["train"], max_steps=1, checkpoint_dir=c["a_file"] / "ck"),
        HeadcutValueError,
        "checkpoint_dir",
    ),
    ("info-linear", lambda c, out: headcut.info(torch.nn.Linear(2, 2)), HeadcutTypeError, "model"),
    ("save-linear", lambda c, out: headcut.save(torch.nn.Linear(2, 2), out), HeadcutTypeError, "model"),
    # ---- prune
    ("prune-keep-bool", lambda c, out: headcut.prune(c["M"], "magnitude", keep=True), HeadcutTypeError, "keep"),
    ("prune-keep-float", lambda c, out: headcut.prune(c["M"], "magnitude", keep=4.0), HeadcutTypeError, "keep"),
    (
        "prune-sparsity-nan",
        lambda c, out: headcut.prune(c["M"], "magnitude", sparsity=NAN),
        HeadcutValueError,
        "sparsity",
    ),
    (
        "prune-max-drop-inf",
        lambda c, out: headcut.prune(c["M"], "michel", max_drop=float("inf"), data=c["train"]),
        HeadcutValueError,
        "max_drop",
    ),
    ("prune-method-int", lambda c, out: headcut.prune(c["M"], 3, keep=4), HeadcutTypeError, "method"),
    ("prune-method-unknown", lambda c, out: headcut.prune(c["M"], "nope", keep=4), HeadcutValueError, "method"),
    # no method: the default recipe of the model's kind, which reads training data
    ("prune-recipe-without-data", lambda c, out: headcut.prune(c["M"], keep=4), HeadcutValueError, "data"),
    (
        "prune-option-str",
        lambda c, out: headcut.prune(c["M"], "pass", keep=4, data=c["train"], max_steps="5"),
        HeadcutTypeError,
        "max_steps",
    ),
    (
        "prune-checkpoint-dir-is-a-file",
        lambda c, out: headcut.prune(c["M"], "pass", keep=4, data=c["train"], checkpoint_dir=c["a_file"]),
        HeadcutValueError,
        "checkpoint_dir",
    ),
    (
        "prune-uniform-str",
        lambda c, out: headcut.prune(c["M"], "magnitude", keep=4, uniform="yes"),
        HeadcutTypeError,
        "uniform",
    ),
    ("prune-data-int", lambda c, out: headcut.prune(c["M"], "gradient", keep=4, data=42), HeadcutTypeError, "data"),
    (
        "prune-data-rows-not-dicts",
        lambda c, out: headcut.prune(c["M"], "gradient", keep=4, data=[1, 2]),
        HeadcutTypeError,
        "data",
    ),
    (
        "prune-data-option-str",
        lambda c, out: headcut.prune(c["M"], "gradient", keep=4, data=c["train"], data_options={"seq_len": "128"}),
        HeadcutTypeError,
        "seq_len",
    ),
    (
        "prune-task-unknown",
        lambda c, out: headcut.prune(c["M"], "magnitude", keep=4, task="nope"),
        HeadcutValueError,
        "task",
    ),
    (
        "prune-module-not-transformers",
        lambda c, out: headcut.prune(torch.nn.Linear(2, 2), "magnitude", keep=4),
        HeadcutTypeError,
        "model",
    ),
    (
        "prune-formats-int",
        lambda c, out: headcut.prune(c["M"], "magnitude", keep=4, formats=3),
        HeadcutTypeError,
        "formats",
    ),
    (
        "prune-progress-str",
        lambda c, out: headcut.prune(c["M"], "magnitude", keep=4, progress="bars"),
        HeadcutTypeError,
        "progress",
    ),
    ("prune-seed-str", lambda c, out: headcut.prune(c["M"], "magnitude", keep=4, seed="0"), HeadcutTypeError, "seed"),
    # ---- score
    ("score-scorer-int", lambda c, out: headcut.score(c["M"], 3), HeadcutTypeError, "scorer"),
    ("score-scorer-unknown", lambda c, out: headcut.score(c["M"], "nope"), HeadcutValueError, "scorer"),
    (
        "score-split-None",
        lambda c, out: headcut.score(c["M"], "gradient", data=c["train"], split=None),
        HeadcutTypeError,
        "split",
    ),
    ("score-model-empty", lambda c, out: headcut.score("", "magnitude"), HeadcutValueError, "model"),
    # ---- finetune
    ("finetune-lr-str", lambda c, out: headcut.finetune(c["M"], c["train"], lr="1e-3"), HeadcutTypeError, "lr"),
    (
        "finetune-weight-decay-nan",
        lambda c, out: headcut.finetune(c["M"], c["train"], weight_decay=NAN),
        HeadcutValueError,
        "weight_decay",
    ),
    (
        "finetune-labels-str",
        lambda c, out: headcut.finetune(c["M"], c["train"], labels="neg,pos"),
        HeadcutTypeError,
        "labels",
    ),
    (
        "finetune-teacher-int",
        lambda c, out: headcut.finetune(c["M"], c["train"], teacher=7),
        HeadcutTypeError,
        "teacher",
    ),
    ("finetune-data-None", lambda c, out: headcut.finetune(c["M"], None), HeadcutTypeError, "data"),
    (
        "finetune-max-steps-float",
        lambda c, out: headcut.finetune(c["M"], c["train"], max_steps=2.5),
        HeadcutTypeError,
        "max_steps",
    ),
    ("finetune-resume-int", lambda c, out: headcut.finetune(c["M"], c["train"], resume=1), HeadcutTypeError, "resume"),
    (
        "finetune-eval-data-dict",
        lambda c, out: headcut.finetune(c["M"], c["train"], eval_data={"text": "a"}),
        HeadcutTypeError,
        "eval_data",
    ),
    # ---- evaluate
    (
        "evaluate-data-options-list",
        lambda c, out: headcut.evaluate(c["M"], c["train"], data_options=[("seq_len", 8)]),
        HeadcutTypeError,
        "data_options",
    ),
    ("evaluate-data-empty", lambda c, out: headcut.evaluate(c["M"], "  "), HeadcutValueError, "data"),
    ("evaluate-data-no-rows", lambda c, out: headcut.evaluate(c["M"], []), HeadcutValueError, "data"),
    ("evaluate-data-missing", lambda c, out: headcut.evaluate(c["M"]), HeadcutTypeError, "data"),
    (
        "evaluate-tokenizer-path",
        lambda c, out: headcut.evaluate(c["M"], c["train"], tokenizer=c["M"]),
        HeadcutTypeError,
        "tokenizer",
    ),
    # ---- export
    ("export-gguf-type-int", lambda c, out: headcut.export(c["M"], MASK, gguf_type=16), HeadcutTypeError, "gguf_type"),
    (
        "export-allow-pickle-str",
        lambda c, out: headcut.export(c["M"], MASK, allow_pickle="no"),
        HeadcutTypeError,
        "allow_pickle",
    ),
    ("export-gqa-None", lambda c, out: headcut.export(c["M"], MASK, gqa=None), HeadcutTypeError, "gqa"),
    # ---- bench
    ("bench-models-str", lambda c, out: headcut.bench(c["M"]), HeadcutTypeError, "models"),
    ("bench-models-empty", lambda c, out: headcut.bench([]), HeadcutValueError, "models"),
    ("bench-runs-str", lambda c, out: headcut.bench([c["M"]], runs="3"), HeadcutTypeError, "runs"),
    ("bench-names-count", lambda c, out: headcut.bench([c["M"], c["M"]], names=["a"]), HeadcutValueError, "names"),
    ("bench-config-dict", lambda c, out: headcut.bench([c["M"]], config={"runs": 3}), HeadcutTypeError, "config"),
    (
        "bench-config-field",
        lambda c, out: headcut.bench([c["M"]], config=headcut.BenchConfig(runs="3")),
        HeadcutTypeError,
        "config.runs",
    ),
    (
        "bench-module-not-transformers",
        lambda c, out: headcut.bench([torch.nn.Linear(2, 2)]),
        HeadcutTypeError,
        "models[0]",
    ),
    # ---- info, load, save
    ("info-None", lambda c, out: headcut.info(None), HeadcutTypeError, "model"),
    ("info-task-int", lambda c, out: headcut.info(c["M"], task=3), HeadcutTypeError, "task"),
    ("load-None", lambda c, out: headcut.load(None), HeadcutTypeError, "path"),
    ("load-a-loaded-model", lambda c, out: headcut.load(c["model"]), HeadcutTypeError, "path"),
    ("load-dtype-int", lambda c, out: headcut.load(c["M"], dtype=32), HeadcutTypeError, "dtype"),
    ("load-labels-str", lambda c, out: headcut.load(c["M"], labels="neg,pos"), HeadcutTypeError, "labels"),
    ("save-out-None", lambda c, out: headcut.save(c["model"], None), HeadcutTypeError, "out"),
    ("save-force-str", lambda c, out: headcut.save(c["model"], out, force="yes"), HeadcutTypeError, "force"),
    ("save-source-int", lambda c, out: headcut.save(c["model"], out, source=3), HeadcutTypeError, "source"),
]


@pytest.mark.parametrize("call,kind,keyword", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_is_a_headcut_error_naming_the_keyword(ctx, tmp_path, monkeypatch, call, kind, keyword):
    monkeypatch.setattr(hio, "load", _fail)
    monkeypatch.setattr(saving, "save", _fail)
    out = tmp_path / "out"
    before_files = sorted(p.name for p in ctx["root"].iterdir())
    before_ckpt, before_model = tree_digest(Path(ctx["M"])), params_digest(ctx["model"])
    with pytest.raises(HeadcutError) as info:
        call(ctx, out)
    exc = info.value
    assert isinstance(exc, kind)
    assert isinstance(exc, ValueError if kind is HeadcutValueError else TypeError)
    message = str(exc)
    assert "\n" not in message
    # the keyword the Python caller passed, not the command line's flag
    assert re.search(rf"(?<![\w-]){re.escape(keyword)}(?![\w-])", message), message
    assert not out.exists() and not list(tmp_path.iterdir())
    assert sorted(p.name for p in ctx["root"].iterdir()) == before_files
    assert tree_digest(Path(ctx["M"])) == before_ckpt
    assert params_digest(ctx["model"]) == before_model


@pytest.mark.parametrize(
    "call,kind,keyword",
    [
        (lambda r, out: r.save(None), HeadcutTypeError, "out"),
        (lambda r, out: r.save(out, force=1), HeadcutTypeError, "force"),
        (lambda r, out: r.save(out, formats=["onnx", 3]), HeadcutTypeError, "formats[1]"),
        (lambda r, out: r.save(out, gguf_type=8), HeadcutTypeError, "gguf_type"),
    ],
    ids=["out-None", "force-int", "formats-item", "gguf-type-int"],
)
def test_a_results_save_checks_its_arguments(exported, tmp_path, monkeypatch, call, kind, keyword):
    monkeypatch.setattr(saving, "save", _fail)
    out = tmp_path / "out"
    with pytest.raises(kind, match=rf"^{re.escape(keyword)} must be"):
        call(exported, out)
    assert not out.exists()


def test_a_checked_refusal_is_caught_as_pythons_own_kind(ctx):
    """Callers may catch ValueError/TypeError as for any library, or HeadcutError as the CLI does."""
    with pytest.raises(TypeError):
        headcut.prune(ctx["M"], "magnitude", sparsity="0.5")
    with pytest.raises(ValueError):
        headcut.prune(ctx["M"], "magnitude", sparsity=NAN)
    assert issubclass(headcut.HeadcutValueError, headcut.HeadcutError)
    assert issubclass(headcut.HeadcutTypeError, headcut.HeadcutError)


def test_value_refusals_of_the_configurations_are_value_errors(ctx, monkeypatch):
    """A range the configurations check (in the command line's words) reaches Python callers as a ValueError."""
    monkeypatch.setattr(hio, "load", _fail)
    for call in (
        lambda: headcut.prune(ctx["M"], "magnitude", sparsity=1.5),
        lambda: headcut.prune(ctx["M"], "magnitude", keep=4, sparsity=0.5),
        lambda: headcut.finetune(ctx["M"], ctx["train"], lr=-1.0),
        lambda: headcut.export(ctx["M"], MASK, gqa="nope"),
        lambda: headcut.bench([ctx["M"]], runs=0),
        lambda: headcut.export(ctx["M"], MASK, formats="tiff"),
    ):
        with pytest.raises(HeadcutValueError):
            call()


def test_every_public_argument_has_a_rule():
    """Each parameter of each public function is checked: by the declaration of the configuration field it names
    (BUILDS; its ``**`` parameter: SPREAD) or by a rule of the table (a new parameter needs one or the other)."""
    functions = {
        "prune": api.prune,
        "score": api.score,
        "finetune": api.finetune,
        "evaluate": api.evaluate,
        "export": api.export,
        "bench": api.bench,
        "info": api.info,
        "load": hio.load,
        "save": saving.save,
        "Written.save": api.Written.save,
        "Pruned.write_trajectory": api.Pruned.write_trajectory,
    }
    assert set(functions) == set(RULES)
    for name, fn in functions.items():
        covered = set(RULES[name]) | set(declared(name)) | {SPREAD.get(name, ("",))[0]} - {""}
        assert set(inspect.signature(fn).parameters) <= covered, name
        unused = set(RULES[name]) - set(inspect.signature(fn).parameters)
        assert not unused, (name, unused)
    for name in ("prune", "score", "finetune", "evaluate", "export", "bench", "info", "load", "save"):
        assert getattr(headcut, name).__wrapped__ is not None  # the checked entry point


def test_the_table_keeps_no_rule_a_declaration_gives():
    """A keyword that names a field of a configuration the function builds is checked by the field's declaration:
    the table keeps a rule for it only where the API takes more than the field (WIDER)."""
    for name, classes in BUILDS.items():
        fields = {f.name for cls in classes for f in dataclasses.fields(cls)}
        assert set(RULES[name]) & fields <= set(WIDER), name


def test_a_declared_field_is_checked_with_no_rule_of_its_own():
    """The check of a field comes from its declaration: a field declared later is checked with no change to the
    table (here a method option, a bench setting, a DataConfig entry and a PruneConfig keyword)."""
    assert "keep" not in RULES["prune"] and "keep" in declared("prune")
    with pytest.raises(HeadcutTypeError, match=r"^keep must be an integer, got True$"):
        check("prune", {"model": "m", "method": "magnitude", "keep": True})
    with pytest.raises(HeadcutTypeError, match=r"^max_steps must be an integer, got str '5'$"):
        check("prune", {"model": "m", "method": "pass", "options": {"max_steps": "5"}})
    with pytest.raises(HeadcutTypeError, match=r"^runs must be an integer, got str '3'$"):
        check("bench", {"models": ["m"], "settings": {"runs": "3"}})
    with pytest.raises(HeadcutTypeError, match=r"^data_options\['seq_len'\] must be an integer"):
        check("score", {"model": "m", "scorer": "magnitude", "data_options": {"seq_len": "8"}})
    with pytest.raises(HeadcutValueError, match=r"^recover_average must be a finite number, got nan$"):
        check("prune", {"model": "m", "method": "magnitude", "recover_average": NAN})


def test_good_arguments_of_every_accepted_kind_pass(ctx, tmp_path):
    """The checks refuse nothing valid: paths as str and Path, loaded models, in-memory rows, a tokenizer."""
    import datasets

    rows = cls_rows(8, seed=3)
    tok = make_tokenizer()
    for data in (
        rows,
        tuple(rows),
        datasets.Dataset.from_list(rows),
        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}),
    ):
        ev = headcut.evaluate(ctx["model"], data, tokenizer=tok, data_options={"seq_len": 16})
        assert ev.report["data"]["examples"] == 8
    assert headcut.info(Path(ctx["M"])).total_heads == headcut.info(ctx["model"]).total_heads
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps(MASK))
    cut = headcut.export(Path(ctx["M"]), mask)
    saved = cut.save(tmp_path / "cut", formats=("safetensors",))
    assert headcut.info(headcut.load(saved.path)).total_heads == cut.slim.total_after
    fresh = tmp_path / "ck-parent" / "deeper" / "ck"  # folders still to be made are fine
    tuned = headcut.finetune(ctx["M"], ctx["train"], max_steps=1, checkpoint_every=None, checkpoint_dir=fresh)
    assert tuned.result.steps == 1
