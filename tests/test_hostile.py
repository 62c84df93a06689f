"""Hostile and damaged input: every case gives a one-line ``error: ...`` and exit code 2 (or
does the safe thing), never touches the input and leaves nothing half-written.

The module-wide fixture ``model_dir`` is a tiny BERT classifier with a tokenizer; an autouse fixture
checks after every test that its bytes are unchanged."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import cls_rows, one_line_error, run, save_tiny, write_rows
from safetensors.torch import load_file, save_file

import headcut
from headcut.errors import HeadcutError
from headcut.files import atomic as outputs
from headcut.files.lock import RunLock
from headcut.model import saving as hio
from headcut.training.checkpoint import checkpoint_dir_for

CLS = "BertForSequenceClassification"
REPO = Path(__file__).resolve().parent.parent


def tree_digest(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (links listed as links) and its SHA-256."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(scope="module")
def model_dir(root) -> Path:
    return save_tiny(root / "models" / "m", "bert", CLS)


@pytest.fixture(scope="module")
def data(root) -> dict[str, Path]:
    return {
        "train": write_rows(root / "train.csv", cls_rows(16, seed=0)),
        "dev": write_rows(root / "dev.csv", cls_rows(8, seed=5)),
    }


@pytest.fixture(autouse=True)
def input_untouched(request, root):
    """The shared input checkpoint (and the folder around it) is byte-for-byte unchanged by every test."""
    folder = root / "models"
    before = tree_digest(folder) if folder.exists() else None
    yield
    if before is not None:
        assert tree_digest(folder) == before


@pytest.fixture()
def mask(tmp_path) -> Path:
    p = tmp_path / "mask.json"
    p.write_text(json.dumps({"drop": {"self.0": [0, 1]}}))
    return p


def leftovers(folder: Path) -> list[str]:
    """headcut temporaries and locks anywhere below ``folder``."""
    return sorted(
        str(p)
        for p in folder.rglob("*")
        if ".headcut-tmp-" in p.name or ".headcut-old-" in p.name or p.name.endswith(".headcut-lock")
    )


def slimmed(tmp_path: Path, model_dir: Path, name: str = "slim") -> Path:
    model = headcut.load(model_dir)
    headcut.slim(model, {"drop": {"self.0": [0, 1], "self.1": [0, 1, 2, 3]}})
    return Path(headcut.save(model, tmp_path / name, source=model_dir))


def edit_record(folder: Path, change) -> None:
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    change(cfg["headcut"])
    cfg_path.write_text(json.dumps(cfg))


# ---- 1. data loss: --out and the inputs --------------------------------------------------------------------


def test_export_out_is_the_input_refused_even_with_force(model_dir, mask):
    one_line_error(run("export", model_dir, "--mask", mask, "--out", model_dir, "--force"), "input itself")


def test_export_out_is_the_inputs_parent_refused_even_with_force(model_dir, mask):
    one_line_error(
        run("export", model_dir, "--mask", mask, "--out", model_dir.parent, "--force"), "contains the MODEL input"
    )
    assert (model_dir / "model.safetensors").is_file()


def test_prune_out_is_the_input_refused_even_with_force(model_dir, data):
    one_line_error(
        run("prune", model_dir, "--method", "magnitude", "--keep", "4", "--out", model_dir, "--force"), "input itself"
    )


def test_out_inside_the_input_refused(model_dir, mask):
    one_line_error(run("export", model_dir, "--mask", mask, "--out", model_dir / "slim"), "lies inside the MODEL input")


def test_out_reached_through_a_symlink_is_compared_as_its_target(model_dir, mask, tmp_path):
    link = tmp_path / "alias"
    link.symlink_to(model_dir, target_is_directory=True)
    one_line_error(run("export", model_dir, "--mask", mask, "--out", link, "--force"), "input itself")
    one_line_error(run("export", link, "--mask", mask, "--out", model_dir.parent / "m", "--force"), "input itself")


@pytest.mark.parametrize("flag", ["--data", "--eval-data", "--mask", "--distill-from", "--json"])
def test_inputs_and_json_inside_the_replaced_out_refused(flag, model_dir, data, tmp_path, mask):
    out = slimmed(tmp_path, model_dir, "out")  # a folder headcut wrote: --force would replace it
    before = tree_digest(out)
    inner = out / "inner.csv"
    shutil.copy(data["dev"], inner)
    if flag == "--mask":
        shutil.copy(mask, out / "mask.json")
        args = ["export", model_dir, "--mask", out / "mask.json", "--out", out, "--force"]
        why = "contains the --mask input"
    elif flag == "--json":
        args = ["export", model_dir, "--mask", mask, "--out", out, "--force", "--json", out / "r.json"]
        why = "overlap"
    elif flag == "--distill-from":
        args = ["finetune", model_dir, "--data", data["train"], "--distill-from", out, "--out", out, "--force"]
        why = "input itself"
    elif flag == "--data":
        args = ["finetune", model_dir, "--data", inner, "--out", out, "--force", "--max-steps", "1"]
        why = "contains the --data input"
    else:
        args = [
            "prune",
            model_dir,
            "--method",
            "gradient",
            "--keep",
            "4",
            "--data",
            data["train"],
            "--eval-data",
            inner,
            "--out",
            out,
            "--force",
        ]
        why = "contains the --eval-data input"
    one_line_error(run(*args), why)
    inner.unlink()
    (out / "mask.json").unlink(missing_ok=True)
    assert tree_digest(out) == before


def test_json_inside_the_input_refused(model_dir):
    one_line_error(run("info", model_dir, "--json", model_dir / "info.json"), "lies inside the MODEL input")


def test_json_over_the_data_file_refused(model_dir, data):
    one_line_error(run("eval", model_dir, "--data", data["dev"], "--json", data["dev"]), "--data input itself")


# ---- 2. what --force replaces ----------------------------------------------------------------------------


def test_force_refuses_a_folder_headcut_did_not_write_and_names_its_content(model_dir, mask, tmp_path):
    out = tmp_path / "photos"
    out.mkdir()
    for name in ("a.jpg", "b.jpg", "notes.txt"):
        (out / name).write_text(name)
    before = tree_digest(out)
    one_line_error(
        run("export", model_dir, "--mask", mask, "--out", out, "--force"),
        "headcut did not write it",
        "a.jpg, b.jpg, notes.txt",
    )
    assert tree_digest(out) == before


def test_force_replaces_an_empty_folder_and_a_headcut_folder(model_dir, mask, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run("export", model_dir, "--mask", mask, "--out", empty).exit_code == 0
    assert (empty / "headcut-report.json").is_file()
    again = run("export", model_dir, "--mask", mask, "--out", empty, "--force")
    assert again.exit_code == 0, again.output
    assert leftovers(tmp_path) == []


def test_force_refuses_a_file(model_dir, mask, tmp_path):
    f = tmp_path / "out"
    f.write_text("precious")
    one_line_error(run("export", model_dir, "--mask", mask, "--out", f, "--force"), "not a folder")
    assert f.read_text() == "precious"


# ---- 3. concurrent runs --------------------------------------------------------------------------------


def _cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "headcut", *map(str, args)]


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO / "src"), HOME=str(tmp_path))


def test_two_runs_on_one_out_exactly_one_wins(model_dir, mask, tmp_path):
    out = tmp_path / "out"
    procs = [
        subprocess.Popen(
            _cli("export", model_dir, "--mask", mask, "--out", out),
            env=_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2).strip().splitlines()[-1]
    assert loser.startswith("error:") and ("another headcut run" in loser or "already exists" in loser), loser
    assert headcut.info(headcut.load(out)).total_heads == 6
    assert leftovers(tmp_path) == []


def test_a_run_that_finishes_first_is_never_replaced(model_dir, mask, tmp_path, monkeypatch):
    """No check-then-rename window: an --out that appears while this run works is not replaced."""
    out = tmp_path / "out"
    winner = slimmed(tmp_path, model_dir, "winner")
    real = hio.write_checkpoint

    def meanwhile(*args, **kwargs):
        notes = real(*args, **kwargs)
        os.rename(winner, out)  # another writer (one that takes no lock) finishes first
        return notes

    monkeypatch.setattr(hio, "write_checkpoint", meanwhile)
    one_line_error(run("export", model_dir, "--mask", mask, "--out", out), str(out))
    assert headcut.info(headcut.load(out)).total_heads == 2
    assert leftovers(tmp_path) == []


def test_a_run_holding_the_lock_refuses_a_second(model_dir, mask, tmp_path):
    out = tmp_path / "out"
    with RunLock(out):
        one_line_error(run("export", model_dir, "--mask", mask, "--out", out), "another headcut run", str(os.getpid()))
    assert not out.exists()
    assert run("export", model_dir, "--mask", mask, "--out", out).exit_code == 0


def test_two_finetunes_sharing_a_checkpoint_folder_refused(model_dir, data, tmp_path):
    out = tmp_path / "ft"
    with RunLock(out):  # the first run holds its output (and so its checkpoint folder)
        one_line_error(
            run("finetune", model_dir, "--data", data["train"], "--out", out, "--max-steps", "2"), "another headcut run"
        )
    assert not checkpoint_dir_for(out).exists()


def test_trainer_refuses_a_checkpoint_folder_in_use(model_dir, data, tmp_path):
    from headcut.config import FinetuneConfig
    from headcut.data import DataConfig, load_calibration, load_tokenizer
    from headcut.training.finetuning import finetune

    model = headcut.load(model_dir)
    cal = load_calibration(model, load_tokenizer(str(model_dir)), DataConfig(path=str(data["train"]), batch_size=8))
    ckpt = tmp_path / "ckpt"
    with RunLock(ckpt, "training into"), pytest.raises(HeadcutError, match="another headcut run"):
        finetune(model, cal, FinetuneConfig(max_steps=2), checkpoint_dir=ckpt)


# ---- 4. outputs checked before the work ------------------------------------------------------------------


@pytest.mark.parametrize("where", ["missing folder", "a folder", "under a file"])
def test_unwritable_json_is_refused_before_any_work(where, model_dir, mask, tmp_path):
    target = {"missing folder": tmp_path / "nope" / "r.json", "a folder": tmp_path, "under a file": mask / "r.json"}[
        where
    ]
    out = tmp_path / "out"
    one_line_error(run("export", model_dir, "--mask", mask, "--out", out, "--json", target), "--json")
    assert not out.exists() and leftovers(tmp_path) == []


# ---- 5. and 6. foreign code and links in the source ----------------------------------------------------


def test_foreign_code_and_auto_map_are_not_carried(model_dir, mask, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(model_dir, src)
    (src / "tokenization_evil.py").write_text("import os\nos.system('touch /tmp/headcut-pwned')\n")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    (src / "README.md").write_text("a model card")
    out = tmp_path / "out"
    result = run("export", src, "--mask", mask, "--out", out)
    assert result.exit_code == 0, result.output
    names = {p.name for p in out.iterdir()}
    assert "tokenization_evil.py" not in names
    assert {p.name for p in out.glob("*.py")} == {"modeling_headcut.py", "headcut_runtime.py"}
    assert "auto_map" not in json.loads((out / "tokenizer_config.json").read_text())
    assert "dropped auto_map" in result.stderr and "tokenization_evil.py" in result.stderr
    # with --trust-remote-code a Hub reference stays, a local code file does not come along
    cfg["auto_map"] = {"AutoTokenizer": ["org/repo--tok.T", None], "AutoProcessor": "proc.P"}
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    out2 = tmp_path / "out2"
    assert run("export", src, "--mask", mask, "--out", out2, "--trust-remote-code").exit_code == 0
    kept = json.loads((out2 / "tokenizer_config.json").read_text())["auto_map"]
    assert kept == {"AutoTokenizer": ["org/repo--tok.T", None]}
    assert not list(out2.glob("tok*.py"))


def test_links_outside_the_checkpoint_are_not_followed(model_dir, mask, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("my private key")
    src = tmp_path / "src"
    shutil.copytree(model_dir, src)
    (src / "vocab.txt").symlink_to(secret)
    (src / "merges.txt").symlink_to(src / "tokenizer.json")  # inside: followed, copied as a file
    out = tmp_path / "out"
    result = run("export", src, "--mask", mask, "--out", out)
    assert result.exit_code == 0, result.output
    assert not (out / "vocab.txt").exists()
    assert (out / "merges.txt").read_text() == (src / "tokenizer.json").read_text()
    assert not [p for p in out.rglob("*") if p.is_symlink()]
    assert "vocab.txt not copied" in result.stderr
    # weights or config that point outside are refused outright
    (src / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    (src / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    one_line_error(run("info", src), "symbolic link", "outside the checkpoint")


def test_hugging_face_cache_snapshots_keep_working(model_dir, mask, tmp_path):
    repo = tmp_path / "hub" / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in model_dir.iterdir():
        blob = blobs / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    out = tmp_path / "out"
    result = run("export", snap, "--mask", mask, "--out", out)
    assert result.exit_code == 0, result.output
    assert (out / "tokenizer.json").is_file() and not (out / "tokenizer.json").is_symlink()
    assert not [p for p in out.rglob("*") if p.is_symlink()]


# ---- 7. crafted records ------------------------------------------------------------------------------

CRAFTED = {
    "huge head_dim": (lambda r: r["ops"][0].update(head_dim=10**10), "ops are not the ones"),
    "head out of range": (lambda r: r["blocks"]["self.0"].update(q=[2, 9], kv=[2, 9]), "out of range"),
    "unknown format": (lambda r: r.update(format="v2"), "not a version number"),
    "newer format": (lambda r: r.update(format=7, headcut_version="9.1.0"), "headcut 9.1.0"),
    "dunder attribute": (
        lambda r: r["ops"].append({"op": "set", "path": "", "attrs": {"__class__": 1}}),
        "ops are not the ones",
    ),
    "path through a non-module": (
        lambda r: r["ops"][0].update(path="encoder.layer.0.attention.self.query.weight"),
        "ops are not the ones",
    ),
    "unknown key": (lambda r: r.update(run="rm -rf /"), "unknown key"),
    "wrong family": (lambda r: r.update(family="gpt2"), "family"),
    "not an object": (lambda r: r["blocks"].update({"self.0": [1, 2]}), "self.0"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_record_is_refused_before_allocation(case, model_dir, tmp_path):
    slim = slimmed(tmp_path, model_dir)
    change, why = CRAFTED[case]
    edit_record(slim, change)
    one_line_error(run("info", slim), why)
    with pytest.raises(HeadcutError, match=why.split()[0]):
        headcut.load(slim)


def test_crafted_config_size_is_refused_before_allocation(model_dir, tmp_path):
    src = tmp_path / "big"
    shutil.copytree(model_dir, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(hidden_size=4 * 10**6, intermediate_size=10**7)  # ~10^14 values in config, 10^4 in the weights
    (src / "config.json").write_text(json.dumps(cfg))
    one_line_error(run("info", src), "config.json describes", "does not match the weights")


def test_runtime_refuses_crafted_ops_on_its_own():
    """The runtime copied beside saved models (run under trust_remote_code) checks what it is given."""
    from helpers import make_model

    from headcut.adapters import runtime

    model = make_model("bert", "BertModel")
    for op in (
        {"op": "set", "path": "encoder", "attrs": {"__class__": int}},
        {"op": "rows", "path": "encoder.__dict__", "heads": [0], "head_dim": 8},
        {"op": "rows", "path": "encoder.layer.0.attention.self.query", "heads": [0], "head_dim": 10**10},
        {"op": "exec", "path": ""},
    ):
        with pytest.raises(runtime.CutError):
            runtime.apply_ops(model, [op])


# ---- 8. damaged weights ------------------------------------------------------------------------------


def test_truncated_safetensors_is_a_one_line_error(model_dir, tmp_path):
    src = tmp_path / "t"
    shutil.copytree(model_dir, src)
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    one_line_error(run("info", src), "damaged", "model.safetensors")


@pytest.mark.parametrize("damage", ["missing", "unexpected"])
def test_missing_or_unexpected_tensors_are_refused(damage, model_dir, tmp_path):
    src = slimmed(tmp_path, model_dir)
    tensors = load_file(str(src / "model.safetensors"))
    if damage == "missing":
        del tensors["bert.encoder.layer.1.attention.self.query.weight"]
    else:
        tensors["bert.encoder.layer.9.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    why = "missing from its weights" if damage == "missing" else "unexpected tensor"
    one_line_error(run("info", src), why, "layer.")
    with pytest.raises(HeadcutError, match=why):
        headcut.load(src)


def test_a_new_task_head_is_reported_not_refused(model_dir, tmp_path):
    base = save_tiny(tmp_path / "base", "bert", "BertModel")
    notes: list[str] = []
    model = headcut.load(base, "sequence-classification", notes=notes)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert any("classifier.weight" in n and "random" in n for n in notes)


# ---- 9. unwritable outputs, full disks, damaged resumes, pickles --------------------------------------------


def test_read_only_out_folder(model_dir, mask, tmp_path, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    if os.geteuid() != 0:
        parent.chmod(0o555)
    else:  # root writes anywhere: simulate what a read-only folder answers
        real = outputs.tempfile.mkstemp

        def refuse(*args, **kwargs):
            if Path(kwargs.get("dir", "")).resolve() == parent.resolve():
                raise OSError(errno.EROFS, "Read-only file system")
            return real(*args, **kwargs)

        monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)
    try:
        one_line_error(run("export", model_dir, "--mask", mask, "--out", parent / "out"), "cannot write")
    finally:
        parent.chmod(0o755)
    assert list(parent.iterdir()) == []


def test_full_disk_while_saving(model_dir, mask, tmp_path, monkeypatch):
    real = hio.write_checkpoint

    def full(*args, **kwargs):
        real(*args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hio, "write_checkpoint", full)
    one_line_error(run("export", model_dir, "--mask", mask, "--out", tmp_path / "out"), "no space left")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mask.json"]


def test_damaged_resume_checkpoint(model_dir, data, tmp_path):
    out = tmp_path / "ft"
    ckpt = checkpoint_dir_for(out)
    ckpt.mkdir()
    (ckpt / "checkpoint.pt").write_bytes(b"PK\x03\x04 this is not a checkpoint")
    one_line_error(
        run("finetune", model_dir, "--data", data["train"], "--out", out, "--max-steps", "4", "--resume"), "is damaged"
    )
    assert not out.exists()


def _interrupted_finetune(model_dir, data, out, monkeypatch, *extra: str) -> None:
    from headcut.training import engine

    real = engine.Trainer.save_checkpoint

    def stop_after_first(self):
        real(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.Trainer, "save_checkpoint", stop_after_first)
    result = run(
        "finetune",
        model_dir,
        "--data",
        data["train"],
        "--out",
        out,
        "--max-steps",
        "6",
        "--checkpoint-every",
        "2",
        "--batch-size",
        "4",
        *extra,
    )
    assert result.exit_code == 130, result.output
    assert "--resume" in result.stderr
    monkeypatch.setattr(engine.Trainer, "save_checkpoint", real)


def test_resume_checkpoint_of_another_run_refused(model_dir, data, tmp_path, monkeypatch):
    out = tmp_path / "ft"
    _interrupted_finetune(model_dir, data, out, monkeypatch)
    other = write_rows(tmp_path / "other.csv", cls_rows(16, seed=9))
    one_line_error(
        run(
            "finetune",
            model_dir,
            "--data",
            other,
            "--out",
            out,
            "--max-steps",
            "6",
            "--checkpoint-every",
            "2",
            "--batch-size",
            "4",
            "--resume",
        ),
        "belongs to a run",
        "data.digest",
    )
    other_model = save_tiny(tmp_path / "other-model", "bert", CLS, seed=3)
    one_line_error(
        run(
            "finetune",
            other_model,
            "--data",
            data["train"],
            "--out",
            out,
            "--max-steps",
            "6",
            "--checkpoint-every",
            "2",
            "--batch-size",
            "4",
            "--resume",
        ),
        "belongs to a run",
        "model",
    )


def test_resume_with_changed_hyper_parameters_refused_and_listed(model_dir, data, tmp_path, monkeypatch):
    out = tmp_path / "ft"
    _interrupted_finetune(model_dir, data, out, monkeypatch)
    one_line_error(
        run(
            "finetune",
            model_dir,
            "--data",
            data["train"],
            "--out",
            out,
            "--max-steps",
            "6",
            "--checkpoint-every",
            "2",
            "--batch-size",
            "4",
            "--resume",
            "--lr",
            "1e-3",
        ),
        "config.lr 5e-05 -> 0.001",
    )
    # the run's length may change; the report then holds what was used
    ok = run(
        "finetune",
        model_dir,
        "--data",
        data["train"],
        "--out",
        out,
        "--max-steps",
        "8",
        "--checkpoint-every",
        "2",
        "--batch-size",
        "4",
        "--resume",
        "--json",
        "-",
    )
    assert ok.exit_code == 0, ok.output
    report = json.loads(ok.stdout)
    assert report["resumed_from"] == 2 and report["steps"] == 8 and report["config"]["lr"] == 5e-5


def test_malicious_pickle_under_allow_pickle(model_dir, tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    src = tmp_path / "pickled"
    src.mkdir()
    shutil.copy(model_dir / "config.json", src)
    with (src / "pytorch_model.bin").open("wb") as f:
        pickle.dump({"bert.embeddings.word_embeddings.weight": Evil()}, f)
    one_line_error(run("info", src), "--allow-pickle")
    one_line_error(run("info", src, "--allow-pickle"), "refused", "pickle")
    assert not marker.exists()


# ---- 10. signals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_stops_like_ctrl_c_and_keeps_the_resume_checkpoint(sig, model_dir, tmp_path):
    train = write_rows(tmp_path / "train.csv", cls_rows(64, seed=1))
    out = tmp_path / "ft"
    ckpt = checkpoint_dir_for(out)
    args = (
        "finetune",
        model_dir,
        "--data",
        train,
        "--out",
        out,
        "--max-steps",
        "100000",
        "--checkpoint-every",
        "2",
        "--batch-size",
        "4",
    )
    proc = subprocess.Popen(_cli(*args), env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (ckpt / "checkpoint.pt").is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert (ckpt / "checkpoint.pt").is_file(), proc.communicate()
    proc.send_signal(sig)
    code = proc.wait(timeout=120)
    err = proc.stderr.read()
    assert code == 128 + sig, err
    last = err.strip().splitlines()[-1]
    assert f"interrupted ({signal.Signals(sig).name})" in last and "--resume" in last, err
    assert not out.exists() and (ckpt / "checkpoint.pt").is_file()
    assert leftovers(tmp_path) == [], leftovers(tmp_path)
    assert proc.stdout.read() == ""


def test_a_killed_writer_leaves_temporaries_the_next_run_removes(model_dir, mask, tmp_path):
    out = tmp_path / "out"
    code = (
        f"import os, signal\nfrom headcut.files.atomic import atomic_dir\nwith atomic_dir({str(out)!r}) as tmp:\n"
        "    (tmp / 'half.bin').write_bytes(b'x' * 1000)\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert leftovers(tmp_path), "the killed writer should have left its temporary folder"
    assert not out.exists()
    result = run("export", model_dir, "--mask", mask, "--out", out)
    assert result.exit_code == 0, result.output
    assert leftovers(tmp_path) == []


# ---- the property test ------------------------------------------------------------------------------

PROPERTY = r"""
import copy, json, random, resource, shutil, sys
from pathlib import Path
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
sys.path.insert(0, {tests!r})
from helpers import make_inputs, make_model
import headcut
from headcut.errors import HeadcutError

root = Path({root!r})
model = make_model("llama", "LlamaForCausalLM")
headcut.slim(model, {{"drop": {{"self.0": [0, 1, 2, 3, 4, 5], "self.1": [3, 4, 5]}}}})
good = root / "good"
headcut.save(model, good)
inputs = make_inputs("llama", model)
with torch.no_grad():
    want = model(**inputs).logits
config = json.loads((good / "config.json").read_text())
record = config["headcut"]

# from here on, allocating more than 1.5 GiB beyond the process's current size fails
with open("/proc/self/status") as f:
    size = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize"))
limit = size + (3 << 29)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

def paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from paths(v, prefix + (i,))

PATHS = list(paths(record))
values = st.one_of(st.none(), st.booleans(), st.integers(-3, 12), st.sampled_from([10**10, -10**10, 2**63]),
                   st.text(max_size=8), st.sampled_from(["__class__", "_modules", "encoder", "rows", "mixin"]),
                   st.lists(st.integers(-2, 10), max_size=6), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))

@st.composite
def mutations(draw):
    rec = copy.deepcopy(record)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        if not path:
            continue
        parent = rec
        try:
            for key in path[:-1]:
                parent = parent[key]
            kind = draw(st.sampled_from(["replace", "delete", "add", "nudge"]))
            last = path[-1]
            if kind == "replace":
                parent[last] = draw(values)
            elif kind == "delete":
                del parent[last]
            elif kind == "add" and isinstance(parent, dict):
                parent[draw(st.text(max_size=6))] = draw(values)
            elif kind == "add" and isinstance(parent, list):
                parent.insert(last, draw(values))
            elif isinstance(parent[last], int) and not isinstance(parent[last], bool):
                parent[last] += draw(st.sampled_from([-1, 1, 10**9]))
        except (KeyError, IndexError, TypeError):
            continue
    return rec

seen = {{"refused": 0, "exact": 0}}

@settings(max_examples={examples}, deadline=20000, suppress_health_check=list(HealthCheck), database=None, derandomize=True)
@given(mutations())
def check(rec):
    folder = root / "case"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(good, folder)
    (folder / "config.json").write_text(json.dumps(dict(config, headcut=rec)))
    try:
        loaded = headcut.load(folder)
    except HeadcutError as exc:
        assert len(str(exc).splitlines()) == 1
        seen["refused"] += 1
        return
    with torch.no_grad():
        got = loaded(**inputs).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    seen["exact"] += 1

check()
print(json.dumps(seen))
"""


def test_mutated_records_give_a_headcut_error_or_the_exact_model(tmp_path):
    """Random mutations of a real record: headcut.load gives a HeadcutError or the exact model, never another
    exception, a hang (deadline) or a big allocation (an address-space limit in the child process)."""
    code = PROPERTY.format(tests=str(Path(__file__).parent), root=str(tmp_path), examples=120)
    proc = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["refused"] > 50 and seen["refused"] + seen["exact"] >= 120, seen
