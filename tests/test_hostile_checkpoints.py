"""Hostile checkpoints and masks: crafted config.json numbers and architectures, unreadable
checkpoint files, and malformed masks. Every case is one ``error:`` line (exit 2) from the CLI and a
HeadcutError from Python, before any model is built or anything is written."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import transformers
from helpers import make_model, one_line_error, run, save_tiny

import headcut
from headcut.errors import HeadcutError

CLS = "BertForSequenceClassification"

#: family -> the class of its tiny checkpoint
TINY = {
    "bert": CLS,
    "t5": "T5ForConditionalGeneration",
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "bart": "BartForConditionalGeneration",
    "albert": "AlbertForSequenceClassification",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {family: save_tiny(root / family, family, cls, tokenizer=family == "bert") for family, cls in TINY.items()}


def crafted(tiny: dict[str, Path], tmp_path: Path, family: str, **changes) -> Path:
    """A copy of a tiny checkpoint whose config.json has ``changes`` (a value of ``...`` removes the key)."""
    folder = tmp_path / f"crafted-{family}"
    shutil.copytree(tiny[family], folder)
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is ...:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def refused(folder: Path, *needles: str, command: tuple[str, ...] = ("info",)) -> None:
    """The CLI and Python both refuse ``folder`` with a message holding every needle."""
    one_line_error(run(*command, folder), *needles)
    with pytest.raises(HeadcutError) as caught:
        headcut.load(folder)
    for needle in needles:
        assert needle in str(caught.value)


# ---- crafted configs ------------------------------------------------------------------------------------------


def test_a_million_layers_is_refused_from_the_headers_without_building_the_model(tiny, tmp_path, monkeypatch):
    folder = crafted(tiny, tmp_path, "bert", num_hidden_layers=1_000_000)
    built = []

    def spy(self, config, *args, **kwargs):
        built.append(config.num_hidden_layers)
        raise AssertionError(f"a model of {config.num_hidden_layers} layers was built")

    monkeypatch.setattr(transformers.BertForSequenceClassification, "__init__", spy)
    refused(folder, "config.json describes", "does not match the weights")
    assert built == []


def test_a_huge_label_count_is_refused_before_the_config_is_built(tiny, tmp_path, monkeypatch):
    """transformers' config would make a label name for each of them (minutes, gigabytes)."""
    folder = crafted(tiny, tmp_path, "bert", num_labels=50_000_000, id2label=..., label2id=...)

    def no_config(*args, **kwargs):
        raise AssertionError("the config was built")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_config)
    refused(folder, "config.json describes", "does not match the weights")


BAD_NUMBERS = {
    "no heads": ("bert", {"num_attention_heads": 0}, "num_attention_heads is 0"),
    "negative heads": ("bert", {"num_attention_heads": -8}, "num_attention_heads is -8"),
    "heads not dividing the width": (
        "bert",
        {"num_attention_heads": 5},
        "hidden_size 32 is not a multiple of num_attention_heads 5",
    ),
    "width as a string": ("bert", {"hidden_size": "32"}, "hidden_size is '32'"),
    "layers as a float": ("bert", {"num_hidden_layers": 2.0}, "num_hidden_layers is 2.0"),
    "layers as a boolean": ("bert", {"num_hidden_layers": True}, "num_hidden_layers is true"),
    "heads null": ("bert", {"num_attention_heads": None}, "num_attention_heads is null"),
    "classifier without labels": ("bert", {"num_labels": 0, "id2label": ..., "label2id": ...}, "num_labels is 0"),
    "t5 without heads": ("t5", {"num_heads": 0}, "num_heads is 0"),
    "gpt2 without heads": ("gpt2", {"n_head": 0}, "n_head is 0"),
    "gpt2 field and alias disagree": ("gpt2", {"num_hidden_layers": 7}, "n_layer and num_hidden_layers"),
    "llama kv heads not dividing the heads": (
        "llama",
        {"num_key_value_heads": 4},
        "num_attention_heads 6 is not a multiple of num_key_value_heads 4",
    ),
    "bart negative decoder heads": ("bart", {"decoder_attention_heads": -4}, "decoder_attention_heads is -4"),
    "albert without groups": ("albert", {"num_hidden_groups": 0}, "num_hidden_groups is 0"),
}


@pytest.mark.parametrize("case", list(BAD_NUMBERS))
def test_config_numbers_are_checked_in_one_place(case, tiny, tmp_path):
    family, changes, needle = BAD_NUMBERS[case]
    folder = crafted(tiny, tmp_path, family, **changes)
    refused(folder, needle, str(folder / "config.json"))


def test_unknown_architecture_is_refused_not_loaded_as_the_bare_encoder(tiny, tmp_path):
    folder = crafted(tiny, tmp_path, "bert", architectures=["FooForSequenceClassification"])
    refused(folder, "'FooForSequenceClassification'", "--task")
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"drop": {"self.0": [0]}}))
    one_line_error(run("export", folder, "--mask", mask, "--out", tmp_path / "slim"), "FooForSequenceClassification")
    assert not (tmp_path / "slim").exists()
    # the model class chosen with --task keeps the task head's weights
    model = headcut.load(folder, "sequence-classification")
    assert type(model).__name__ == CLS
    assert headcut.load(tiny["bert"]).state_dict()["classifier.weight"].equal(model.state_dict()["classifier.weight"])


@pytest.mark.parametrize("architectures", [["GPT2LMHeadModel"], ["__class__"]])
def test_architectures_of_another_family_or_not_a_class_are_refused(architectures, tiny, tmp_path):
    folder = crafted(tiny, tmp_path, "bert", architectures=architectures)
    refused(folder, f"{architectures[0]!r}, which is not a bert model class")


def test_weights_the_loaded_class_does_not_use_are_an_error(tiny, tmp_path):
    """Without "architectures" the bare encoder is loaded: the classifier's weights are not dropped silently."""
    folder = crafted(tiny, tmp_path, "bert", architectures=...)
    refused(folder, "unexpected tensor", "classifier.weight")


def test_mis_shaped_tensors_are_named_not_left_to_an_unseen_report(tiny, tmp_path):
    folder = crafted(tiny, tmp_path, "bert", num_labels=5, id2label=..., label2id=...)
    result = run("info", folder)
    text = one_line_error(result, "wrong shape", "classifier.weight", "(3, 32)", "(5, 32)")
    assert "above report" not in text
    with pytest.raises(HeadcutError, match="classifier.weight"):
        headcut.load(folder)


# ---- unreadable files -----------------------------------------------------------------------------------------


def _denied(path: Path) -> PermissionError:
    return PermissionError(errno.EACCES, "Permission denied", str(path))


def deny_open(monkeypatch, target: Path) -> None:
    """Opening ``target`` (by open(), Path.open/read_bytes or io.open) fails as for a file of mode 000."""
    real = builtins.open

    def guarded(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and Path(file).resolve() == target.resolve():
            raise _denied(target)
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)


def test_unreadable_checkpoint_folder(tiny, tmp_path, monkeypatch):
    folder = tmp_path / "m"
    shutil.copytree(tiny["bert"], folder)
    real = Path.iterdir

    def iterdir(self):
        if self.resolve() == folder.resolve():
            raise _denied(self)
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    refused(folder, f"cannot read {folder}: permission denied")


def test_unreadable_weights_file_is_not_called_damaged(tiny, tmp_path, monkeypatch):
    folder = tmp_path / "m"
    shutil.copytree(tiny["bert"], folder)
    deny_open(monkeypatch, folder / "model.safetensors")
    one_line_error(run("info", folder), f"cannot read {folder / 'model.safetensors'}: permission denied")
    with pytest.raises(HeadcutError, match="permission denied"):
        headcut.load(folder)


def test_unreadable_tokenizer_file_is_a_read_error_before_any_work(tiny, tmp_path, monkeypatch):
    folder = tmp_path / "m"
    shutil.copytree(tiny["bert"], folder)
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"drop": {"self.0": [0]}}))
    deny_open(monkeypatch, folder / "tokenizer.json")
    out = tmp_path / "slim"
    text = one_line_error(
        run("export", folder, "--mask", mask, "--out", out),
        f"cannot read {folder / 'tokenizer.json'}: permission denied",
    )
    assert "write" not in text
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".slim")]


def test_unreadable_side_file_while_saving_is_a_read_error(tiny, tmp_path, monkeypatch):
    """A file that turns unreadable after the checks is still named as a read error, not as ``cannot write OUT``."""
    folder = tmp_path / "m"
    shutil.copytree(tiny["bert"], folder)
    model = headcut.load(folder)
    deny_open(monkeypatch, folder / "tokenizer_config.json")
    with pytest.raises(HeadcutError, match=r"cannot read .*tokenizer_config\.json: permission denied"):
        headcut.save(model, tmp_path / "out", source=folder)
    assert not (tmp_path / "out").exists()


#: run as the user nobody: everything is imported first (the interpreter's own files may be out of reach then)
NOBODY = textwrap.dedent("""
    import os, sys
    import safetensors, safetensors.torch
    import headcut.api, headcut.model.loading, headcut.model.masks, headcut.files.atomic
    from headcut.errors import HeadcutError
    os.setgid(65534)
    os.setuid(65534)
    try:
        if len(sys.argv) > 2:
            headcut.api.export(sys.argv[1], sys.argv[2])
        else:
            headcut.api.info(sys.argv[1])
    except HeadcutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
""")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to become nobody")
def test_unreadable_files_as_an_unprivileged_user(tiny):
    """The real thing: mode 000 files and folders read by the user nobody (a subprocess that drops root)."""
    base = Path(tempfile.mkdtemp(prefix="headcut-nobody-", dir="/tmp"))
    try:
        base.chmod(0o777)
        cases = {}
        for name, denied in (("folder", "."), ("weights", "model.safetensors"), ("tokenizer", "tokenizer.json")):
            folder = base / name
            shutil.copytree(tiny["bert"], folder)
            for p in [folder, *folder.iterdir()]:
                p.chmod(0o755 if p.is_dir() else 0o644)
            (folder / denied).chmod(0o000)
            cases[name] = folder / denied if denied != "." else folder
        mask = base / "mask.json"
        mask.write_text(json.dumps({"drop": {"self.0": [0]}}))
        mask.chmod(0o644)
        env = dict(os.environ, HOME=str(base), HF_HOME=str(base / "hf"), HF_HUB_OFFLINE="1")
        for name, denied in cases.items():
            folder = base / name
            args = [str(folder)] if name != "tokenizer" else [str(folder), str(mask)]
            proc = subprocess.run(
                [sys.executable, "-c", NOBODY, *args],
                capture_output=True,
                text=True,
                env=env,
                cwd=str(base),
                timeout=120,
            )
            if proc.returncode != 2 and any(
                why in proc.stderr for why in ("Operation not permitted", "No module named")
            ):
                pytest.skip(f"cannot run as nobody here: {proc.stderr.strip().splitlines()[-1]}")
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2, (name, proc.stderr)
            assert lines == [f"error: cannot read {denied}: permission denied"], (name, proc.stderr)
    finally:
        for p in [base, *base.rglob("*")]:
            if not p.is_symlink():
                p.chmod(0o755 if p.is_dir() else 0o644)
        shutil.rmtree(base, ignore_errors=True)


# ---- malformed masks ----------------------------------------------------------------------------------------

BAD_MASKS = {
    "null entry in keep": ({"keep": {"self.0": None}}, "self.0 is null"),
    "null entry in drop": ({"drop": {"self.0": None}}, "self.0 is null"),
    "keep null": ({"keep": None}, '"keep" must map'),
    "a list": ([["drop", {"self.0": [0]}]], "must be a JSON object"),
    "string index": ({"drop": {"self.0": ["1"]}}, "block self.0"),
    "boolean index": ({"drop": {"self.0": [True]}}, "found true"),
    "float index": ({"drop": {"self.0": [1.0]}}, "found 1.0"),
    "a number for the list": ({"keep": {"self.0": 1}}, "block self.0"),
    "repeated index": ({"drop": {"self.1": [2, 2]}}, "repeated"),
    "keep and drop": ({"keep": {"self.0": [0]}, "drop": {"self.1": [0]}}, 'one of "keep" or "drop"'),
    "neither": ({"self.0": [0]}, 'one of "keep" or "drop"'),
}


@pytest.mark.parametrize("case", list(BAD_MASKS))
def test_malformed_masks_are_refused_before_the_model_is_loaded(case, tiny, tmp_path, monkeypatch):
    raw, needle = BAD_MASKS[case]
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps(raw))
    model = make_model("bert", CLS)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(HeadcutError, match=needle.replace("(", r"\(")):
        headcut.slim(model, raw)
    assert all(v.equal(before[k]) for k, v in model.state_dict().items()) and model.state_dict().keys() == before.keys()

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded for a malformed mask")

    monkeypatch.setattr(headcut.model.loading, "load", no_load)
    out = tmp_path / "slim"
    one_line_error(run("export", tiny["bert"], "--mask", mask, "--out", out), needle, str(mask))
    assert not out.exists()
    with pytest.raises(HeadcutError, match=needle.replace("(", r"\(")):
        headcut.export(tiny["bert"], mask)


def test_mask_nested_too_deeply_is_one_line(tiny, tmp_path):
    mask = tmp_path / "deep.json"
    mask.write_text('{"keep": {"self.0": ' + "[" * 60_000 + "]" * 60_000 + "}}")
    one_line_error(run("export", tiny["bert"], "--mask", mask, "--out", tmp_path / "slim"), "nested too deeply")
    with pytest.raises(HeadcutError, match="nested too deeply"):
        headcut.read_mask_file(mask)
    assert not (tmp_path / "slim").exists()


def test_unreadable_mask_file(tiny, tmp_path, monkeypatch):
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"drop": {"self.0": [0]}}))
    deny_open(monkeypatch, mask)
    one_line_error(
        run("export", tiny["bert"], "--mask", mask, "--out", tmp_path / "slim"),
        f"cannot read {mask}: permission denied",
    )


def test_python_masks_may_use_tuples_and_empty_lists(tiny):
    model = make_model("bert", CLS)
    result = headcut.slim(model, {"keep": {"self.0": (0, 2), "self.1": []}})
    assert result.heads_after == {"self.0": 2, "self.1": 0}
