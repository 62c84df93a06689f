"""Outputs onto special files and over-long names: a device, a named pipe, a descriptor of the
process (``/dev/stdout``, ``/dev/fd/N``) or a symbolic link to one is written through, never replaced;
sockets and block devices are refused in one line, and so is an ``--out`` that is any of them; a name
longer than the file system takes is refused up front, and a long legal one works (its temporaries fit)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import cls_rows, one_line_error, run, save_tiny, write_rows

import headcut
from headcut.errors import HeadcutError
from headcut.files import names as outputs
from headcut.files.atomic import OutputDir, OutputFile
from headcut.files.lock import RunLock
from headcut.training.checkpoint import CHECKPOINT_SUFFIX, checkpoint_dir_for

CLS = "BertForSequenceClassification"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("special") / "m", "bert", CLS)


@pytest.fixture(scope="module")
def mask_file(model_dir) -> Path:
    blocks = [b.name for b in headcut.model_blocks(headcut.load(model_dir))]
    path = model_dir.parent / "mask.json"
    path.write_text(json.dumps({"drop": {blocks[0]: [0]}}))
    return path


def null_device(path: Path) -> Path:
    """A character device node like /dev/null (major 1, minor 3) at ``path``; skips where mknod is not allowed."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    return path


def is_null_device(path: Path | str) -> bool:
    st = os.stat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


def headcut_leftovers(folder: Path | str) -> list[str]:
    """Temporaries, locks and probe files of headcut in ``folder``."""
    return [n for n in os.listdir(folder) if ".headcut-" in n or n.startswith("headcut-")]


@contextlib.contextmanager
def fifo_reader(path: Path) -> Iterator[dict[str, bytes]]:
    """A named pipe at ``path`` with a thread that reads everything written to it (``got["data"]``)."""
    os.mkfifo(path)
    got: dict[str, bytes] = {}

    def read() -> None:
        with open(path, "rb") as f:
            got["data"] = f.read()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        thread.join(5)
        if thread.is_alive():  # nothing wrote: let a reader still waiting in open() go
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            thread.join(5)


# ---- character devices, and symbolic links to them --------------------------------------------------------


def test_info_json_onto_dev_null_keeps_it_a_device(model_dir, tmp_path):
    # first a device node of our own, so that a regression fails here without damaging the real /dev/null
    own = null_device(tmp_path / "null")
    result = run("info", model_dir, "--json", own)
    assert result.exit_code == 0, result.output
    assert is_null_device(own) and os.listdir(tmp_path) == ["null"]

    before = os.stat("/dev/null")
    result = run("info", model_dir, "--json", "/dev/null")
    assert result.exit_code == 0, result.output
    after = os.stat("/dev/null")
    assert is_null_device("/dev/null") and after.st_ino == before.st_ino
    assert headcut_leftovers("/dev") == []


def test_json_through_a_symlink_to_a_device(model_dir, tmp_path):
    dev = null_device(tmp_path / "dev")
    link = tmp_path / "report.json"
    link.symlink_to(dev)
    result = run("info", model_dir, "--json", link)
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(dev) and is_null_device(dev)
    assert sorted(os.listdir(tmp_path)) == ["dev", "report.json"]


def test_library_writes_through_a_device(tmp_path):
    dev = null_device(tmp_path / "dev")
    link = tmp_path / "plot.png"
    link.symlink_to(dev)
    OutputFile(dev, "--json").check().write_text("{}\n")
    target = OutputFile(link, "--plot").check()
    tmp = target.temp()  # what score --plot and the trajectory PNG use: the temporary is not beside the device
    assert tmp.parent != tmp_path and tmp.parent != Path("/dev")
    tmp.write_bytes(b"\x89PNG")
    target.commit(tmp)
    assert not tmp.exists() and is_null_device(dev) and link.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["dev", "plot.png"]


def test_device_needs_no_force(tmp_path):
    dev = null_device(tmp_path / "dev")
    OutputFile(dev, "--trajectory", force=False).check().write_text("step,heads\n")
    assert is_null_device(dev)


# ---- named pipes and descriptors ---------------------------------------------------------------------------


def test_json_into_a_named_pipe(model_dir, tmp_path):
    fifo = tmp_path / "report.json"
    with fifo_reader(fifo) as got:
        result = run("info", model_dir, "--json", fifo)
    assert result.exit_code == 0, result.output
    assert json.loads(got["data"])["total_heads"] == 8
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["report.json"]


def test_score_json_into_a_named_pipe(model_dir, tmp_path):
    fifo = tmp_path / "scores"
    with fifo_reader(fifo) as got:
        result = run("score", model_dir, "--scorer", "magnitude", "--json", fifo)
    assert result.exit_code == 0, result.output
    assert json.loads(got["data"])["scorer"] == "magnitude"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="--plot needs matplotlib")
def test_score_plot_into_a_named_pipe_and_a_device(model_dir, tmp_path):
    fifo = tmp_path / "heat.png"
    with fifo_reader(fifo) as got:
        result = run("score", model_dir, "--scorer", "magnitude", "--plot", fifo)
    assert result.exit_code == 0, result.output
    assert got["data"][:8] == b"\x89PNG\r\n\x1a\n" and stat.S_ISFIFO(os.stat(fifo).st_mode)
    dev = null_device(tmp_path / "dev")
    result = run("score", model_dir, "--scorer", "magnitude", "--plot", dev)
    assert result.exit_code == 0, result.output
    assert is_null_device(dev) and sorted(os.listdir(tmp_path)) == ["dev", "heat.png"]


def test_trajectory_into_a_named_pipe(model_dir, tmp_path):
    dev = write_rows(tmp_path / "dev.csv", cls_rows(12))
    fifo, out = tmp_path / "curve.csv", tmp_path / "slim"
    with fifo_reader(fifo) as got:
        result = run(
            "prune",
            model_dir,
            "--method",
            "magnitude",
            "--keep",
            "6",
            "--eval-data",
            dev,
            "--seq-len",
            "16",
            "--out",
            out,
            "--trajectory",
            fifo,
        )
    assert result.exit_code == 0, result.output
    assert got["data"].decode().splitlines()[0].startswith("step,heads")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and (out / "config.json").is_file()


def test_named_pipe_without_a_reader_waits_and_says_so(tmp_path, capsys):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            OutputFile(fifo, "--json").check().write_text('{"a": 1}\n')
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    seen, deadline = "", time.monotonic() + 20
    while "waiting for a reader" not in seen and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
        seen += capsys.readouterr().err
    assert "waiting for a reader" in seen and str(fifo) in seen and "--json" in seen, (seen, errors)
    assert len(seen.strip().splitlines()) == 1
    with open(fifo, "rb") as f:
        data = f.read()
    thread.join(5)
    assert not errors and json.loads(data) == {"a": 1}
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["p"]


#: a command's output in a real process (no model: the CLI's Out and write_json, as ``info`` uses them)
COMMAND = (
    "from headcut.cli.output import Out; import sys; out = Out(sys.argv[1]); out.show('the table'); "
    "out.json({'total_heads': 8}); out.close()"
)


def test_json_to_dev_stdout_in_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, "-c", COMMAND, "/dev/stdout"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("the table\n{") and json.loads(proc.stdout[len("the table\n") :]) == {
        "total_heads": 8
    }
    # stdout a regular file (`> out.txt`): written through the descriptor, after the table, the file kept
    path = tmp_path / "out.txt"
    with path.open("w") as f:
        inode = os.fstat(f.fileno()).st_ino
        proc = subprocess.run(
            [sys.executable, "-c", COMMAND, "/dev/stdout"], stdout=f, stderr=subprocess.PIPE, text=True, timeout=60
        )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    text = path.read_text()
    assert text.startswith("the table\n{") and json.loads(text[len("the table\n") :]) == {"total_heads": 8}
    assert path.stat().st_ino == inode and os.listdir(tmp_path) == ["out.txt"]


def test_json_to_dev_fd_of_a_pipe_and_of_a_file(model_dir, tmp_path):
    # a shell's >(jq .) hands the command /dev/fd/N, a pipe
    r, w = os.pipe()
    try:
        result = run("info", model_dir, "--json", f"/dev/fd/{w}")
        os.close(w)
        with os.fdopen(r, "rb") as f:
            data = f.read()
    finally:
        with contextlib.suppress(OSError):
            os.close(w)
    assert result.exit_code == 0, result.output
    assert json.loads(data)["total_heads"] == 8
    # a descriptor on a regular file (`3>report.txt`): written through it, after what it already holds
    path = tmp_path / "report.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        inode = os.fstat(fd).st_ino
        os.write(fd, b"before\n")
        result = run("info", model_dir, "--json", f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    assert result.exit_code == 0, result.output
    text = path.read_text()
    assert text.startswith("before\n{") and json.loads(text[len("before\n") :])["total_heads"] == 8
    assert path.stat().st_ino == inode and os.listdir(tmp_path) == ["report.txt"]


def test_closed_or_read_only_descriptor_refused(model_dir):
    r, w = os.pipe()
    os.close(w)
    try:
        one_line_error(run("info", model_dir, "--json", f"/dev/fd/{w}"), "--json", f"/dev/fd/{w}", "not open")
        one_line_error(run("info", model_dir, "--json", f"/dev/fd/{r}"), "--json", "reading only")
    finally:
        os.close(r)


# ---- what is refused -----------------------------------------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path (a Unix socket's path has at most 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="hc-", dir="/tmp"))
    yield folder
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()


def test_socket_and_block_device_refused(model_dir, short_dir):
    sock_path = short_dir / "s"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(sock_path))
        one_line_error(run("info", model_dir, "--json", sock_path), "--json", str(sock_path), "socket")
        with pytest.raises(HeadcutError, match="socket"):
            OutputFile(sock_path, "--json").write_text("{}")
        assert stat.S_ISSOCK(os.stat(sock_path).st_mode)
    finally:
        sock.close()
    block = short_dir / "b"
    try:
        os.mknod(block, 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    except OSError as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    one_line_error(run("score", model_dir, "--scorer", "magnitude", "--json", block), "--json", "block device")
    assert stat.S_ISBLK(os.stat(block).st_mode)
    assert sorted(os.listdir(short_dir)) == ["b", "s"]


@pytest.mark.parametrize("kind", ["fifo", "device", "link"])
def test_out_onto_a_special_file_refused(kind, model_dir, mask_file, tmp_path):
    dev = None if kind == "fifo" else null_device(tmp_path / "dev")
    out = tmp_path / "slim"
    if kind == "fifo":
        os.mkfifo(out)
    elif kind == "device":
        out = dev
    else:
        out.symlink_to(dev)
    listing = sorted(os.listdir(tmp_path))
    what = "named pipe" if kind == "fifo" else "character device"
    one_line_error(run("export", model_dir, "--mask", mask_file, "--out", out), "--out", str(out), what)
    one_line_error(run("export", model_dir, "--mask", mask_file, "--out", out, "--force"), "--out", what)
    with pytest.raises(HeadcutError, match=what):
        headcut.export(model_dir, json.loads(mask_file.read_text())).save(out, force=True)
    assert sorted(os.listdir(tmp_path)) == listing
    assert stat.S_ISFIFO(os.stat(out).st_mode) if kind == "fifo" else is_null_device(out)
    if kind == "link":
        assert out.is_symlink()


# ---- names longer than the file system takes ---------------------------------------------------------------


def test_name_too_long_refused_in_one_line(model_dir, mask_file, tmp_path):
    long = tmp_path / ("x" * 300)
    one_line_error(run("export", model_dir, "--mask", mask_file, "--out", long), "--out", "300 bytes", "shorter")
    one_line_error(run("info", model_dir, "--json", long), "--json", "300 bytes")
    one_line_error(run("info", model_dir, "--json", long / "report.json"), "--json", "300 bytes")
    with pytest.raises(HeadcutError, match="300 bytes"):
        headcut.export(model_dir, json.loads(mask_file.read_text())).save(long)
    with pytest.raises(HeadcutError, match="300 bytes"):
        OutputFile(long, "--json").write_text("{}")
    with pytest.raises(HeadcutError, match="300 bytes"):
        OutputDir(long).check()
    assert os.listdir(tmp_path) == []


def test_long_legal_names_work(model_dir, mask_file, tmp_path):
    out = tmp_path / ("o" * 250)
    report = tmp_path / ("r" * 245 + ".json")
    result = run("export", model_dir, "--mask", mask_file, "--out", out, "--json", report)
    assert result.exit_code == 0, result.output
    assert (out / "config.json").is_file() and json.loads(report.read_text())["heads_after"] == 7
    # again with --force: the old copy moved aside has a name that fits too
    result = run("export", model_dir, "--mask", mask_file, "--out", out, "--json", report, "--force")
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tmp_path)) == sorted([out.name, report.name])


def test_long_names_of_temporaries_fit_and_are_swept(tmp_path):
    name = "n" * 250
    target = tmp_path / name
    embedded = outputs.embedded_name(name)
    assert embedded != name and len(embedded.encode()) <= outputs.EMBED_MAX
    assert outputs.embedded_name(name) == embedded and outputs.embedded_name("n" * 251) != embedded
    # a temporary a killed run left (its pid is not alive) is recognised and removed
    stale = tmp_path / f".{embedded}{outputs.TMP_TAG}999999999-abcdefgh"
    stale.write_text("half")
    OutputFile(target, "--json").check()
    assert not stale.exists()
    tmp = OutputFile(target, "--json").temp()
    assert len(tmp.name.encode()) <= 255
    OutputFile(target, "--json").write_text("{}\n")
    assert target.read_text() == "{}\n"
    with RunLock(target) as lock:
        assert lock.path.exists() and len(lock.path.name.encode()) <= 255
    ckpt = checkpoint_dir_for(target)
    assert ckpt.parent == tmp_path and ckpt.name.endswith(CHECKPOINT_SUFFIX)
    assert len(ckpt.name.encode()) <= 255 and checkpoint_dir_for(target) == ckpt
    short = tmp_path / "slim"
    assert checkpoint_dir_for(short).name == "slim" + CHECKPOINT_SUFFIX
    assert os.listdir(tmp_path) == [name]
