"""Hostile data inputs: pipes and devices read as streams (with --data-format), a pipe without a
writer waited for aloud and stoppable, one-line refusals with nothing printed before them (and the encoding
to pass), and huge lines read lazily with bounded memory and no temporary files left behind."""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers import cls_rows, make_model, make_tokenizer, one_line_error, run, save_tiny, write_rows

import headcut
from headcut.data import DataConfig, load_calibration
from headcut.data import files as data_files
from headcut.data import streams as data_streams
from headcut.data import text as data_text
from headcut.data.config import CHARS_PER_TOKEN
from headcut.errors import HeadcutError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hostile-data")
    return {
        "model": save_tiny(d / "bert", "bert", "BertForSequenceClassification"),
        "rows": write_rows(d / "rows.csv", cls_rows(16)),
        "root": d,
    }


def _env(tmp: Path) -> dict[str, str]:
    temp = tmp / "temp"
    temp.mkdir(exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO / "src"), HOME=str(tmp), TMPDIR=str(temp))
    env.pop("FORCE_COLOR", None)
    return env


def _feed(fd: int, data: bytes, delay: float = 0.0) -> threading.Thread:
    """Write ``data`` to the pipe's write end ``fd`` from a thread, then close it."""

    def write() -> None:
        time.sleep(delay)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def _fifo_writer(path: Path, data: bytes, delay: float) -> threading.Thread:
    """Connect to the named pipe ``path`` after ``delay`` seconds (once a reader has it open), write, close."""

    def write() -> None:
        time.sleep(delay)
        deadline = time.monotonic() + 30
        while True:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:  # ENXIO: no reader yet
                if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                    return
                time.sleep(0.05)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


# ---- pipes and devices ------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for process substitution")
def test_process_substitution_is_read_as_a_stream(tiny, tmp_path):
    packed = tmp_path / "rows.csv.gz"
    packed.write_bytes(gzip.compress(tiny["rows"].read_bytes()))
    want = run("eval", tiny["model"], "--data", tiny["rows"], "--json", "-")
    assert want.exit_code == 0, want.output
    # gzip bytes through a pipe: the compression is recognised from the bytes
    script = '"$PY" -m headcut eval "$M" --data <(cat "$Z") --data-format csv --json "$T/got.json"'
    env = dict(_env(tmp_path), PY=sys.executable, M=str(tiny["model"]), Z=str(packed), T=str(tmp_path))
    proc = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads((tmp_path / "got.json").read_text())
    assert got["data"]["examples"] == 16 and got["data"]["source"].startswith("/dev/fd/")
    assert got["metrics"] == pytest.approx(json.loads(want.stdout)["metrics"])
    assert list((tmp_path / "temp").iterdir()) == []  # the pipe's temporary copy is gone


def test_pipe_without_a_format_says_to_pass_data_format(tiny):
    r, w = os.pipe()
    try:
        _feed(w, tiny["rows"].read_bytes())
        result = run("eval", tiny["model"], "--data", f"/dev/fd/{r}")
        one_line_error(result, f"/dev/fd/{r}", "pipe", "--data-format")
    finally:
        os.close(r)


def test_python_api_reads_a_pipe(tiny):
    want = headcut.evaluate(tiny["model"], str(tiny["rows"]))
    r, w = os.pipe()
    try:
        _feed(w, tiny["rows"].read_bytes())
        got = headcut.evaluate(tiny["model"], f"/dev/fd/{r}", data_options={"data_format": "csv"})
    finally:
        os.close(r)
    assert got.data["examples"] == 16
    assert got.result.metrics == pytest.approx(want.result.metrics)


def test_text_from_a_pipe_for_a_causal_lm(tmp_path):
    model, tok = make_model("gpt2", "GPT2LMHeadModel"), make_tokenizer()
    text = ("the good movie was fun and the plot was great\n" * 40).encode()
    path = tmp_path / "book.txt"
    path.write_bytes(text)
    want = load_calibration(model, tok, DataConfig(str(path), seq_len=16))
    r, w = os.pipe()
    try:
        _feed(w, gzip.compress(text))
        got = load_calibration(model, tok, DataConfig(f"/dev/fd/{r}", seq_len=16, data_format="txt"))
    finally:
        os.close(r)
    assert got.examples == want.examples == 40 * 10 // 14
    assert [b["input_ids"].tolist() for b in got.batches] == [b["input_ids"].tolist() for b in want.batches]


def test_named_pipe_without_a_writer_is_waited_for_aloud(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(data_streams, "FIRST_NOTICE_S", 0.1)
    monkeypatch.setattr(data_streams, "WAIT_NOTICE_S", 0.1)
    fifo = tmp_path / "rows"
    os.mkfifo(fifo)
    rows = write_rows(tmp_path / "rows.csv", cls_rows(12))
    writer = _fifo_writer(fifo, rows.read_bytes(), delay=0.6)
    c = load_calibration(
        make_model("bert", "BertForSequenceClassification"), make_tokenizer(), DataConfig(str(fifo), data_format="csv")
    )
    writer.join(5)
    assert c.examples == 12
    err = capfd.readouterr().err
    assert f"waiting for data on {fifo} (nothing written to it yet); Ctrl-C to stop" in err


def test_sigterm_stops_the_wait_for_a_writer(tiny, tmp_path):
    fifo = tmp_path / "never"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "headcut", "eval", str(tiny["model"]), "--data", str(fifo), "--data-format", "csv"],
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _holds(proc.pid, fifo):  # until it has the pipe open and waits
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "headcut never opened the pipe"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    # a slow machine may print a plain "still loading ..." line first (a long step's progress)
    lines = err.strip().splitlines()
    assert lines[-1] == "interrupted (SIGTERM): nothing was written", err
    assert all(line.startswith("still ") for line in lines[:-1]), err
    assert list((tmp_path / "temp").iterdir()) == []


def _fds(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []


def _holds(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (a descriptor listed may close before it is read: skipped)."""
    target = str(path.resolve())
    for fd in _fds(pid):
        try:
            if os.path.realpath(f"/proc/{pid}/fd/{fd}", strict=True) == target:
                return True
        except OSError:
            continue
    return False


def test_devices_are_refused_in_one_line_not_read_forever(tiny):
    one_line_error(
        run("eval", tiny["model"], "--data", "/dev/zero", "--data-format", "csv"),
        "/dev/zero",
        "NUL characters",
        "not UTF-8 text",
    )
    with pytest.raises(HeadcutError, match="cannot read /dev/zero: it holds NUL characters"):
        load_calibration(
            make_model("gpt2", "GPT2LMHeadModel"),
            make_tokenizer(),
            DataConfig("/dev/zero", data_format="txt", seq_len=16),
        )
    one_line_error(
        run("eval", tiny["model"], "--data", "/dev/zero", "--data-format", "csv.gz"), "/dev/zero", "not gz data"
    )
    one_line_error(run("eval", tiny["model"], "--data", "/dev/null", "--data-format", "csv"), "/dev/null is empty")


def test_data_format_names_files_without_a_known_suffix(tmp_path):
    model, tok = make_model("bert", "BertForSequenceClassification"), make_tokenizer()
    plain = write_rows(tmp_path / "rows.jsonl", cls_rows(9))
    bare = tmp_path / "rows-export"
    bare.write_bytes(plain.read_bytes())
    assert load_calibration(model, tok, DataConfig(str(bare), data_format="jsonl")).examples == 9
    # a known suffix wins (one --data-format serves --data and --eval-data)
    assert load_calibration(model, tok, DataConfig(str(plain), data_format="csv")).examples == 9
    with pytest.raises(HeadcutError, match="rows-export is not a supported data file.*--data-format"):
        load_calibration(model, tok, DataConfig(str(bare)))


@pytest.mark.parametrize("value", ["xml", "parquet.gz", "csv.gz.gz", ""])
def test_bad_data_format_is_one_line(tiny, value):
    one_line_error(run("eval", tiny["model"], "--data", tiny["rows"], "--data-format", value), "--data-format")


# ---- one line means one line --------------------------------------------------------------------------------


def test_refusals_print_nothing_before_their_one_line(tiny, tmp_path):
    bad = {
        "latin.csv": "text,label\ncafé good,1\nthe movie,0\n".encode("latin-1"),
        "bad.jsonl": b'{"text": "good", "label": 1}\n{"text": oops\n',
        "scalar.json": b"42",
        "garbage.parquet": b"this is not parquet at all" * 10,
    }
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    # the real CLI with the real stderr (library log lines bypass a test runner's capture)
    code = (
        "import os, sys\nfrom headcut.cli import app\n"
        "for name in sys.argv[2:]:\n"
        "    os.write(2, ('=== ' + name + '\\n').encode())\n"
        "    try:\n"
        "        app(['eval', sys.argv[1], '--data', name], prog_name='headcut')\n"
        "    except SystemExit as exc:\n"
        "        sys.stderr.flush()\n"
        "        os.write(2, ('=== exit %s\\n' % exc.code).encode())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tiny["model"]), *bad],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    parts = proc.stderr.split("=== ")[1:]
    assert len(parts) == 2 * len(bad), proc.stderr
    for name, (head, tail) in zip(bad, zip(parts[::2], parts[1::2])):
        lines = head.splitlines()
        assert lines[0] == name
        assert len(lines) == 2 and lines[1].startswith("error: "), (name, head)
        assert tail.strip() == "exit 2", (name, tail)
    messages = dict(zip(bad, (p.splitlines()[1] for p in parts[::2])))
    assert messages["latin.csv"] == (
        "error: cannot read latin.csv: it is not UTF-8 text (byte 0xe9 at offset 14); "
        "pass --encoding latin-1 (or the file's encoding)"
    )
    assert "holds a JSON number, not records" in messages["scalar.json"]
    assert "JSON parse error" in messages["bad.jsonl"]
    assert "garbage.parquet" in messages["garbage.parquet"]


def test_encoding_reads_a_latin1_file(tiny, tmp_path):
    rows = cls_rows(10)
    rows[3]["text"] = "café " + rows[3]["text"]
    utf8 = write_rows(tmp_path / "utf8.csv", rows)
    latin = tmp_path / "latin.csv"
    latin.write_bytes(utf8.read_text(encoding="utf-8").encode("latin-1"))
    one_line_error(run("eval", tiny["model"], "--data", latin), "not UTF-8 text", "--encoding latin-1")
    a = run("eval", tiny["model"], "--data", utf8, "--json", "-")
    b = run("eval", tiny["model"], "--data", latin, "--encoding", "latin-1", "--json", "-")
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    assert json.loads(a.stdout)["metrics"] == pytest.approx(json.loads(b.stdout)["metrics"])
    one_line_error(run("eval", tiny["model"], "--data", utf8, "--encoding", "klingon"), "--encoding 'klingon'")
    one_line_error(run("eval", tiny["model"], "--data", utf8, "--encoding", "rot13"), "--encoding 'rot13'")


def test_not_utf8_text_file_names_the_offset_and_a_likely_encoding(tmp_path):
    model, tok = make_model("bert", "BertForMaskedLM"), make_tokenizer()
    p = tmp_path / "quotes.txt"
    p.write_bytes(b"the good movie\n" * 20_000 + "a \u201cfun\u201d plot\n".encode("cp1252"))  # past the first chunk
    with pytest.raises(HeadcutError, match=r"not UTF-8 text \(byte 0x93 at offset 300002\); pass --encoding cp1252"):
        load_calibration(model, tok, DataConfig(str(p)))
    c = load_calibration(model, tok, DataConfig(str(p), encoding="cp1252", seq_len=16, max_examples=5))
    assert c.examples == 5
    utf16 = tmp_path / "wide.csv"
    utf16.write_bytes("text,label\ngood movie,1\nbad plot,0\n".encode("utf-16"))
    with pytest.raises(HeadcutError, match="--encoding utf-16"):
        load_calibration(make_model("bert", "BertForSequenceClassification"), tok, DataConfig(str(utf16)))
    assert (
        load_calibration(
            make_model("bert", "BertForSequenceClassification"), tok, DataConfig(str(utf16), encoding="utf-16")
        ).examples
        == 2
    )


# ---- huge lines ---------------------------------------------------------------------------------------------


def _one_line(path: Path, megabytes: int) -> Path:
    unit = b"the good movie was fun " * 4096
    with gzip.open(path, "wb", compresslevel=1) as f:
        for _ in range(megabytes * 1_000_000 // len(unit)):
            f.write(unit)
        f.write(b"\n")
    return path


def test_huge_single_line_is_read_with_bounded_memory(tmp_path):
    big = _one_line(tmp_path / "big.txt.gz", 48)
    code = (
        "import resource, sys\n"
        f"sys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from helpers import make_model, make_tokenizer\n"
        "from headcut.data import DataConfig, load_calibration\n"
        "tok = make_tokenizer()\n"
        "for family, cls in (('gpt2', 'GPT2LMHeadModel'), ('bert', 'BertForMaskedLM')):\n"
        "    model = make_model(family, cls)\n"
        "    load_calibration(model, tok, DataConfig('', seq_len=16), dataset=[{'text': 'the good movie'}])\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "    c = load_calibration(model, tok, DataConfig(sys.argv[1], seq_len=16, max_examples=4))\n"
        "    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "    print(cls, c.examples, grown * 1024)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(big)],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    results = {cls: (int(n), int(grown)) for cls, n, grown in (ln.split() for ln in proc.stdout.splitlines())}
    assert results["GPT2LMHeadModel"][0] == 4 and results["BertForMaskedLM"][0] == 1
    for cls, (_, grown) in results.items():
        assert grown < 48_000_000 // 3, (cls, grown)  # far less than the text
    assert list((tmp_path / "temp").iterdir()) == []


class _Recorder:
    """A tokenizer that records the length of every text it is given."""

    def __init__(self, tok):
        self.tok, self.longest, self.chars = tok, 0, 0

    def __call__(self, text=None, *args, **kwargs):
        texts = [text] if isinstance(text, str) else list(text or kwargs.get("text_target") or [])
        for t in texts:
            self.longest = max(self.longest, len(t))
            self.chars += len(t)
        return self.tok(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def __len__(self):
        return len(self.tok)


def test_huge_texts_reach_the_tokenizer_in_bounded_pieces(tmp_path):
    line = "the good movie was fun " * 200_000  # 4.6 million characters
    txt = tmp_path / "one.txt"
    txt.write_text(line + "\n")
    rec = _Recorder(make_tokenizer())
    c = load_calibration(make_model("gpt2", "GPT2LMHeadModel"), rec, DataConfig(str(txt), seq_len=16, max_examples=3))
    assert c.examples == 3
    assert rec.longest <= data_text.PIECE_CHARS
    assert rec.chars < len(line) // 2  # read only as far as the blocks need
    assert any("read the first" in n for n in c.notes)
    rec = _Recorder(make_tokenizer())
    c = load_calibration(make_model("bert", "BertForMaskedLM"), rec, DataConfig(str(txt), seq_len=16))
    assert c.examples == 1 and rec.longest <= 16 * CHARS_PER_TOKEN
    table = write_rows(tmp_path / "cells.csv", [{"text": line, "label": 1}, {"text": "bad", "label": 0}])
    rec = _Recorder(make_tokenizer())
    c = load_calibration(make_model("bert", "BertForSequenceClassification"), rec, DataConfig(str(table), seq_len=16))
    assert c.examples == 2 and rec.longest <= 16 * CHARS_PER_TOKEN


def test_temporary_folders_carry_the_pid_and_stale_ones_are_removed(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = temp / f"headcut-data-{dead.pid}-abc123"
    (stale / "cache").mkdir(parents=True)
    (stale / "cache" / "data.arrow").write_bytes(b"x" * 1000)
    alive = temp / f"headcut-data-{os.getppid()}-def456"  # a running process's folder is kept
    alive.mkdir()
    rows = write_rows(tmp_path / "rows.csv", cls_rows(6))
    with data_files.open_data(DataConfig(str(rows))) as (ds, _, _):
        assert ds.num_rows == 6
        inside = sorted(p.name for p in temp.iterdir())
        assert not stale.exists() and alive.exists()
        assert [n for n in inside if n.startswith(f"headcut-data-{os.getpid()}-")], inside
    assert sorted(p.name for p in temp.iterdir()) == [alive.name]


@pytest.mark.parametrize(
    "name,content",
    [
        ("late.csv", b"text,label\n" + b"fine row,1\n" * 2000 + b"caf\xe9,0\n"),
        ("start.txt", b"caf\xe9 ol\xe9 and more words\n" * 20),
        ("empty.csv", b""),
    ],
)
def test_unreadable_data_is_refused_before_the_model_loads(tmp_path, monkeypatch, name, content):
    """A data file the run would refuse (not UTF-8 text, a byte deep in a table included; empty) is refused before
    any model is loaded, by every command that reads data, from the CLI and from Python."""
    from headcut.jobs import base, evaluate, finetune, score
    from headcut.jobs.prune import job as prune_job

    model = save_tiny(tmp_path / "model", "bert", "BertForSequenceClassification")
    data = tmp_path / name
    data.write_bytes(content)
    needle = f"{data} is empty" if not content else "it is not UTF-8 text"

    def loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the data was checked")

    for module in (base, evaluate, finetune, prune_job, score):
        monkeypatch.setattr(module, "load_model", loading)
    commands = [
        ("prune", model, "--method", "fluctuation", "--keep", "6", "--data", data, "--out", tmp_path / "out"),
        (
            "prune",
            model,
            "--method",
            "fluctuation",
            "--keep",
            "6",
            "--data",
            data,
            "--layerwise",
            "--out",
            tmp_path / "out",
        ),
        ("finetune", model, "--data", data, "--out", tmp_path / "out"),
        ("score", model, "--data", data),
        ("eval", model, "--data", data),
    ]
    for command in commands:
        one_line_error(run(*command), needle)
    for call in (
        lambda: headcut.prune(model, "fluctuation", keep=6, data=data),
        lambda: headcut.finetune(model, data=data),
        lambda: headcut.score(model, data=data),
        lambda: headcut.evaluate(model, data=data),
    ):
        with pytest.raises(HeadcutError, match=needle):
            call()
