"""Resources under stress: a stop signal while the output is put in place, a run killed between the two renames
of its commit, a full disk (the output, spilled activations), temporaries a killed run left, and sizes past what a
machine can have. Each ends in one line that says what is on disk, and nothing of a dead run stays."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import one_line_error, run, save_tiny, sentence

import headcut
from headcut.devices import parse_size
from headcut.errors import HeadcutError
from headcut.files import atomic, names, space
from headcut.interrupts import Interrupted
from headcut.model import streamed

FAMILY, CLS = "llama", "LlamaForCausalLM"
DATA = ["--seq-len", "16", "--max-examples", "12"]
OPTIONS = {"seq_len": 16, "max_examples": 12}


@pytest.fixture()
def model(tmp_path):
    src = tmp_path / "model"
    save_tiny(src, FAMILY, CLS)
    rng = torch.Generator().manual_seed(0)
    (tmp_path / "cal.txt").write_text("\n".join(sentence(rng, 12) for _ in range(60)))
    return src


def _keep(out):
    return json.loads((out / "headcut-report.json").read_text())["arguments"]["keep"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if ".headcut-" in p.name)


# ---- a stop signal while the output is put in place ---------------------------------------------------------

#: runs the CLI with a SIGTERM sent to itself at SIG_AT: inside the commit (held until both renames are done),
#: right after it, or before it (while the model card is written)
SIGNALLER = textwrap.dedent("""
    import os, signal, sys
    from headcut.files import atomic
    at = os.environ["SIG_AT"]
    commit = atomic.OutputDir._commit

    def signalling(self, tmp, final):
        if at == "commit":
            os.kill(os.getpid(), signal.SIGTERM)
        commit(self, tmp, final)
        if at == "after":
            os.kill(os.getpid(), signal.SIGTERM)

    atomic.OutputDir._commit = signalling
    if at == "before":
        import headcut.outputs.modelcard as card
        write = card.write_card

        def signal_first(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return write(*args, **kwargs)

        card.write_card = signal_first
    from headcut.cli import main
    sys.argv = ["headcut", *sys.argv[1:]]
    main()
""")


@pytest.mark.parametrize("at", ["commit", "after", "before"])
@pytest.mark.parametrize("earlier", [False, True])
def test_a_signal_at_commit_says_what_is_on_disk(tmp_path, model, at, earlier):
    out = tmp_path / "out"
    if earlier:
        assert run("prune", model, "--method", "magnitude", "--keep", "6", "--out", out).exit_code == 0
    script = tmp_path / "signaller.py"
    script.write_text(SIGNALLER)
    proc = subprocess.run(
        [
            sys.executable,
            str(script),
            "prune",
            str(model),
            "--method",
            "magnitude",
            "--keep",
            "9",
            "--out",
            str(out),
            "--force",
        ],
        env=dict(os.environ, SIG_AT=at),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    if at == "before":
        told = (
            f"interrupted (SIGTERM): nothing was written: {out} still holds its earlier output"
            if earlier
            else "interrupted (SIGTERM): nothing was written"
        )
        assert line == told
        assert (_keep(out) == 6) if earlier else not out.exists()
    else:  # the new output is complete, and the line says so
        assert line == f"interrupted (SIGTERM): {out} was written completely before the signal came"
        assert _keep(out) == 9
        headcut.load(out)
    assert _leftovers(tmp_path) == []


def test_a_signal_at_commit_in_python(tmp_path, model, monkeypatch):
    commit = atomic.OutputDir._commit

    def signalling(self, tmp, final):
        os.kill(os.getpid(), signal.SIGTERM)
        commit(self, tmp, final)

    def stop(signum, frame):
        raise Interrupted(signum)

    monkeypatch.setattr(atomic.OutputDir, "_commit", signalling)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(Interrupted) as caught:
            headcut.prune(model, "magnitude", keep=9, out=tmp_path / "out")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert caught.value.hint == f"{tmp_path / 'out'} was written completely before the signal came"
    assert _keep(tmp_path / "out") == 9


def test_a_run_killed_between_the_renames_leaves_the_earlier_output(tmp_path, model):
    """SIGKILL cannot be held: a run killed after moving the earlier output aside and before moving the new one in
    leaves both beside the output's place; the next run writing there puts the earlier output back."""
    out = tmp_path / "out"
    assert run("prune", model, "--method", "magnitude", "--keep", "6", "--out", out).exit_code == 0
    dead = _dead_pid()
    out.rename(tmp_path / f".out{names.OLD_TAG}{dead}-0a1b2c3d")
    half = tmp_path / f".out{names.TMP_TAG}{dead}-x7"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"half")
    result = run("prune", model, "--method", "magnitude", "--keep", "9", "--out", out)
    one_line_error(result, "already exists and is not empty; pass --force")
    assert _keep(out) == 6  # the earlier output, back in place
    assert _leftovers(tmp_path) == []
    assert run("prune", model, "--method", "magnitude", "--keep", "9", "--out", out, "--force").exit_code == 0
    assert _keep(out) == 9


# ---- a full disk ----------------------------------------------------------------------------------------------


def test_an_output_larger_than_the_free_space_is_refused_before_writing(tmp_path, model, monkeypatch):
    monkeypatch.setattr(space, "free_space", lambda path: 1000)
    out = tmp_path / "out"
    for layerwise in ([], ["--layerwise"]):
        result = run("prune", model, "--method", "magnitude", "--keep", "6", "--out", out, *layerwise)
        one_line_error(
            result,
            f"cannot write {out}: no space left on the device in {tmp_path}",
            "(1000 bytes free, at least ",
            " KiB needed)",
        )
        assert not out.exists() and _leftovers(tmp_path) == []
    with pytest.raises(HeadcutError, match="no space left on the device"):
        headcut.prune(model, "magnitude", keep=6, out=out)


def test_safetensors_full_disk_error_is_one_line(tmp_path, model, monkeypatch):
    """safetensors' own error (not an OSError) when the disk fills up while the weights are written."""
    from safetensors import SafetensorError

    from headcut.model import saving

    write = saving.write_checkpoint

    def full(model, folder, *args, **kwargs):
        write(model, folder, *args, **kwargs)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(saving, "write_checkpoint", full)
    out = tmp_path / "out"
    result = run("prune", model, "--method", "magnitude", "--keep", "6", "--out", out)
    one_line_error(result, f"cannot write {out}: no space left on the device in {tmp_path}", "free before writing")
    assert not out.exists() and _leftovers(tmp_path) == []
    with pytest.raises(HeadcutError, match="no space left on the device"):
        headcut.prune(model, "magnitude", keep=6, out=out)


def test_spilled_activations_on_a_full_disk(tmp_path, model, monkeypatch):
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    args = (
        "prune",
        model,
        "--method",
        "fluctuation",
        "--keep",
        "6",
        "--data",
        tmp_path / "cal.txt",
        *DATA,
        "--layerwise",
        "--max-memory",
        "1KB",
        "--out",
        tmp_path / "out",
    )
    # too little room from the start: refused before scoring
    monkeypatch.setattr(space, "free_space", lambda path: 100)
    one_line_error(
        run(*args),
        f"cannot spill activations to {spill}: no space left on the device",
        "(100 bytes free, at least ",
        "set TMPDIR to a folder with more room",
    )
    monkeypatch.undo()
    monkeypatch.setenv("TMPDIR", str(spill))
    monkeypatch.setattr("tempfile.tempdir", None)
    # the disk fills up while the activations are written
    written = []
    write = streamed.write_safetensors

    def fill(path, tensors):
        if written:
            raise OSError(28, "No space left on device", str(path))
        written.append(path)
        return write(path, tensors)

    monkeypatch.setattr(streamed, "write_safetensors", fill)
    one_line_error(run(*args), f"cannot spill activations to {spill}: no space left on the device")
    assert list(spill.iterdir()) == [] and not (tmp_path / "out").exists()
    with pytest.raises(HeadcutError, match="cannot spill activations"):
        written.clear()
        headcut.prune(
            model,
            "fluctuation",
            keep=6,
            data=tmp_path / "cal.txt",
            data_options=OPTIONS,
            layerwise=True,
            max_memory="1KB",
            out=tmp_path / "out",
        )


def test_a_training_checkpoint_on_a_full_disk(tmp_path, monkeypatch):
    """torch.save turns the file's ENOSPC into a RuntimeError without an errno: the checkpoint writer keeps the
    file's own error and says what it is, in one line; no temporary stays."""
    from headcut.training import checkpoint

    opened = os.fdopen

    class Full:
        def __init__(self, file):
            self.file = file

        def write(self, data):
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    monkeypatch.setattr(checkpoint.os, "fdopen", lambda fd, mode: Full(opened(fd, mode)))
    with pytest.raises(
        HeadcutError,
        match=r"cannot write the checkpoint .*state.pt: no space left on the device in "
        r".*ck \(.* free before writing, at least 390.6 KiB needed\)",
    ):
        checkpoint.atomic_save({"x": torch.zeros(100000)}, tmp_path / "ck" / "state.pt")
    assert not (tmp_path / "ck").exists()  # the folder the write made is gone with it


def _tmpfs() -> bool:
    """Whether this machine lets a test mount a small tmpfs in a user namespace of its own."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _tmpfs(), reason="needs unshare and a tmpfs mount in a user namespace")
def test_a_real_full_disk(tmp_path, model):
    """On a real small file system: the output (whole-model and layer-wise; 150 KiB, the weights alone 125 KiB) and
    the spilled activations (12 KiB)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    commands = {
        "whole": ("150k", f"headcut prune {model} --method magnitude --keep 6 --out {disk}/out"),
        "layerwise": ("150k", f"headcut prune {model} --method magnitude --keep 6 --layerwise --out {disk}/out"),
        "spill": (
            "12k",
            f"TMPDIR={disk} headcut prune {model} --method fluctuation --keep 6 --data "
            f"{tmp_path}/cal.txt {' '.join(DATA)} --layerwise --max-memory 1KB --out {tmp_path}/out",
        ),
        "checkpoint": (
            "150k",
            f"headcut finetune {model} --data {tmp_path}/cal.txt {' '.join(DATA)} --max-steps 2 "
            f"--checkpoint-every 1 --out {disk}/out",
        ),
    }
    for name, (size, command) in commands.items():
        script = f"mount -t tmpfs -o size={size} tmpfs {disk} && {command}; echo rc=$?; ls -A {disk}"
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300)
        lines = proc.stderr.strip().splitlines()  # progress lines first on a slow machine, then the error
        assert [line for line in lines if line.startswith("error:")] == lines[-1:], (name, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert lines[-1].startswith("error: cannot "), (name, proc.stderr)
        assert "no space left on the device" in lines[-1] and "needed" in lines[-1], (name, lines[-1])
        rc, *left = proc.stdout.strip().splitlines()
        assert rc == "rc=2" and left == [], (name, proc.stdout)


# ---- temporaries a killed run left --------------------------------------------------------------------------


def test_spilled_activations_of_a_killed_run_are_removed_by_the_next(tmp_path, model, monkeypatch):
    spill = tmp_path / "spill"
    spill.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from headcut.scoring.layerwise import spill_folder
        with spill_folder(Path({str(spill)!r})) as folder:
            (Path(folder) / "0.safetensors").write_bytes(b"x" * 4096)
            print(folder, flush=True)
            time.sleep(600)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        folder = holder.stdout.readline().strip()
        assert os.path.basename(folder).startswith(f"headcut-activations-{holder.pid}-")
    finally:
        holder.kill()  # SIGKILL: nothing of the run's own cleanup runs
        holder.wait()
    assert os.path.isdir(folder)
    alive = spill / f"headcut-activations-{os.getpid()}-mine"  # this process's own: kept
    alive.mkdir()
    unrelated = spill / "headcut-activations-notapid"  # not a name headcut gives: kept
    unrelated.mkdir()
    monkeypatch.setenv("TMPDIR", str(spill))
    monkeypatch.setattr("tempfile.tempdir", None)
    headcut.prune(
        model,
        "fluctuation",
        keep=6,
        data=tmp_path / "cal.txt",
        data_options=OPTIONS,
        layerwise=True,
        max_memory="1KB",
        out=tmp_path / "out",
    )
    assert sorted(p.name for p in spill.iterdir()) == sorted([alive.name, unrelated.name])


# ---- sizes past any machine ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", ["1e999GB", "infGB", "nanGB", "²GB", "10000000EiB", "-1GB"])
def test_max_memory_past_any_machine_is_one_line(tmp_path, model, size):
    one_line_error(
        run(
            "prune",
            model,
            "--method",
            "fluctuation",
            "--keep",
            "6",
            "--data",
            tmp_path / "cal.txt",
            "--max-memory",
            size,
            "--out",
            tmp_path / "out",
        ),
        "--max-memory must be a size",
    )
    with pytest.raises(HeadcutError, match="max_memory must be a size"):
        headcut.prune(model, "fluctuation", keep=6, data=tmp_path / "cal.txt", max_memory=size)


def test_max_memory_as_a_huge_integer(tmp_path, model):
    with pytest.raises(HeadcutError, match=r"max_memory must be a size .*\(got <an integer of 1329 bits>\)"):
        headcut.prune(model, "fluctuation", keep=6, data=tmp_path / "cal.txt", max_memory=10**400)
    assert parse_size(2**63) == 2**63
