"""A hostile or broken ``--vllm-python`` (``headcut bench --runtime vllm``, :func:`headcut.jobs.bench.vllm_rows.serve`):
an interpreter that passes the probe and then never answers, sleeps with a child process, prints what is not JSON
or exits at once; one that is no Python at all (``/bin/true``); a worker whose answers and log hold escape bytes;
Ctrl-C and SIGTERM while headcut waits for it. Every case ends in one line naming the interpreter (or the
interruption's exit code), within seconds, and leaves no process behind.

The fakes are shell scripts written into ``tmp_path``: they answer headcut's probe (``-c``) with its marker, then, run
as the worker, write their own process id (and their child's) into files the tests check. The real worker script
also runs, under this interpreter with a fake ``vllm`` package (one that takes seconds to import): its heartbeat
keeps it alive past the silence deadline, the total deadline stops it. The deadlines are lowered to seconds here."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import one_line_error, run, save_tiny

import headcut
from headcut import extras
from headcut.errors import HeadcutError
from headcut.jobs.bench import vllm_rows
from headcut.jobs.bench.vllm_worker import reason

#: seconds headcut may take to exit after the signal (it stops the worker's group: SIGTERM, then SIGKILL after
#: TERM_S, 3 s; its start-up is before the signal)
PROMPT_S = 12.0
#: a test that hangs fails after this many seconds (headcut without deadlines would wait forever)
WATCHDOG_S = 120

#: what each fake does once it runs as the worker (``$PIDS``: the folder of its process id files)
BEHAVIOURS = {
    # reads its commands and never answers
    "silent": "note worker $$\nwhile read -r line; do :; done\n",
    # never answers, and waits for a child process of its own
    "sleepy": "note worker $$\nsleep 1000 &\nnote child $!\nwait\n",
    # answers a line that is not JSON (with escape bytes) and waits for a child
    "junk": "note worker $$\nsleep 1000 &\nnote child $!\nread -r line\n"
    "printf 'Loading \\033[31mweights\\033[0m\\007 ... done\\n'\nwait\n",
    # exits at once with status 3, leaving a child behind (its output elsewhere, so the pipe closes)
    "exits": "note worker $$\nsleep 1000 >/dev/null 2>&1 &\nnote child $!\n"
    'echo "worker: cannot start: no \\033[1mGPU\\033[0m" >&2\nexit 3\n',
    # answers every command with an error that holds escape bytes (JSON-escaped), quit with ok
    "failing": 'note worker $$\nprintf "\\033]0;pwned\\007\\033[2J log line\\n" >&2\n'
    "while read -r line; do\n"
    '  case "$line" in\n'
    "    *quit*) echo '{\"ok\": true}'; exit 0;;\n"
    '    *) printf "%s\\n" \'{"ok": false, "error": "ValueError: bad \\u001b[2J\\u0007model\\nsecond line"}\';;\n'
    "  esac\n"
    "done\n",
    # answers load with JSON that is not the facts of an engine, quit with ok
    "odd": "note worker $$\n"
    "while read -r line; do\n"
    '  case "$line" in\n'
    "    *quit*) echo '{\"ok\": true}'; exit 0;;\n"
    '    *) echo \'{"ok": true, "attention": "\\u001b[2Jall of them"}\';;\n'
    "  esac\n"
    "done\n",
}


def fake_python(folder: Path, behaviour: str) -> tuple[Path, Path]:
    """An executable that answers headcut's probe and then behaves as ``BEHAVIOURS[behaviour]``; the folder its
    process id files go to."""
    pids = folder / f"pids-{behaviour}"
    pids.mkdir(parents=True, exist_ok=True)
    script = folder / f"python-{behaviour}"
    script.write_text(
        "#!/bin/sh\n"
        f"PIDS='{pids}'\n"
        # a process id file appears whole (written aside, then renamed): the test may stop the fake between the two
        'note() { echo "$2" > "$PIDS/.$1"; mv "$PIDS/.$1" "$PIDS/$1"; }\n'
        'if [ "$1" = "-c" ]; then\n  echo "headcut-vllm-probe 0.0-fake"\n  exit 0\nfi\n' + BEHAVIOURS[behaviour]
    )
    script.chmod(0o755)
    return script, pids


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting for its parent to reap it has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def assert_gone(pids: Path, names: tuple[str, ...] = ("worker", "child"), within: float = 5.0) -> None:
    """Every process whose id the fake wrote has ended (within a few seconds: a reparented child is reaped by its
    new parent)."""
    found = {name: int((pids / name).read_text()) for name in names if (pids / name).is_file()}
    assert set(found) == set(names), f"the fake wrote {sorted(found)}, not {names}"
    deadline = time.monotonic() + within
    while any(running(pid) for pid in found.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = {name: pid for name, pid in found.items() if running(pid)}
    for pid in left.values():  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"left running: {left}"


@pytest.fixture(autouse=True)
def watchdog():
    """Fail a test that hangs instead of hanging the suite (again every few seconds: the code under test may block
    again while it handles the first failure)."""

    def expired(signum, frame):
        signal.alarm(5)
        raise AssertionError(f"the test hung for {WATCHDOG_S} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(WATCHDOG_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def short(monkeypatch):
    """The worker's deadlines in seconds, not minutes."""
    for name, value in (("HEARTBEAT_S", 0.2), ("SILENCE_S", 1.5), ("QUIT_S", 3.0), ("EXIT_S", 1.0), ("TERM_S", 1.0)):
        monkeypatch.setattr(vllm_rows, name, value)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("vllm-hostile") / "llama", "llama", "LlamaForCausalLM")


#: bench's flags for a short vLLM row of the tiny model
SMALL = ("--runtime", "vllm", "--seq-len", "8", "--gen-tokens", "2", "--runs", "1", "--gen-runs", "1", "--warmup", "0")


def bench(model: Path, python: Path, *extra: str):
    return run("bench", model, *SMALL, "--vllm-python", python, *extra)


# ---- an interpreter that passes the probe, then does not answer ---------------------------------------------------


@pytest.mark.parametrize("behaviour", ["silent", "sleepy"])
def test_a_worker_that_never_answers_is_stopped_with_its_children(llama, tmp_path, short, behaviour):
    """No answer and no heartbeat for the silence deadline: one line naming the interpreter and what it was doing;
    the worker and its child are gone."""
    python, pids = fake_python(tmp_path, behaviour)
    start = time.monotonic()
    result = bench(llama, python)
    text = one_line_error(result, str(python), "sent nothing for 1.5 s while it ran load", "hung")
    assert time.monotonic() - start < 30, text
    assert_gone(pids, ("worker",) if behaviour == "silent" else ("worker", "child"))


def test_a_worker_that_prints_what_is_not_json_is_quoted_printable(llama, tmp_path, short):
    """A line that is not JSON: one line naming the interpreter and quoting it without its escape bytes; no
    traceback; the worker and its child are gone."""
    python, pids = fake_python(tmp_path, "junk")
    result = bench(llama, python)
    one_line_error(result, str(python), "printed 'Loading weights ... done'", "answer to load")
    assert "\x1b" not in result.output and "\x07" not in result.output and "Traceback" not in result.output
    assert_gone(pids)


def test_a_worker_that_exits_at_once_names_the_interpreter_its_status_and_its_log(llama, tmp_path, short):
    python, pids = fake_python(tmp_path, "exits")
    result = bench(llama, python)
    text = one_line_error(result, str(python), "exited (status 3) before answering load", "its log ends")
    assert "worker: cannot start: no GPU" in text and "\x1b" not in result.output
    assert_gone(pids)


def test_a_worker_answer_and_log_reach_the_terminal_without_control_bytes(llama, tmp_path, short):
    """vLLM's reason for a failure, quoted from its answer: printable, one line; the worker answers quit and
    exits (the normal close)."""
    python, pids = fake_python(tmp_path, "failing")
    result = bench(llama, python)
    one_line_error(result, "vLLM fails to load: ValueError: bad", "model second line")
    assert not any(ord(ch) < 32 for ch in result.stderr.strip()), repr(result.stderr)
    assert_gone(pids, ("worker",))


def test_an_answer_that_is_not_an_engines_facts_is_one_line(llama, tmp_path, short):
    python, pids = fake_python(tmp_path, "odd")
    result = bench(llama, python)
    one_line_error(result, str(python), "answered load without its attention layers ('\\x1b[2Jall of them')")
    assert "\x1b" not in result.stderr
    assert_gone(pids, ("worker",))


def test_the_python_api_stops_a_silent_worker_too(llama, tmp_path, short):
    python, pids = fake_python(tmp_path, "sleepy")
    with pytest.raises(HeadcutError, match="sent nothing for 1.5 s while it ran load"):
        headcut.bench([llama], runtime="vllm", vllm_python=str(python), seq_len=8, gen_tokens=2, runs=1, warmup=0)
    assert_gone(pids)
    python, pids = fake_python(tmp_path / "serve", "junk")
    with pytest.raises(HeadcutError, match=f"{python}.*printed 'Loading weights ... done'"):
        vllm_rows.serve(llama, [[1, 2, 3]], 2, python=str(python))
    assert_gone(pids)


# ---- the probe -------------------------------------------------------------------------------------------------


def test_a_program_that_is_not_python_is_refused_by_the_probe(llama):
    """/bin/true exits 0 and prints nothing; /bin/echo prints the probe's code: neither is a Python with vLLM."""
    for program in ("true", "echo"):
        found = shutil.which(program)
        if found is None:
            continue
        result = run("bench", llama, *SMALL, "--vllm-python", found)
        one_line_error(result, f"--vllm-python {found} is not a Python interpreter with vLLM")


def test_a_probe_that_sleeps_is_stopped_with_its_children(llama, tmp_path, monkeypatch):
    """An interpreter that does not answer the probe: refused after the probe's timeout, its child gone too."""
    monkeypatch.setattr(extras, "PROBE_TIMEOUT_S", 2.0)
    pids = tmp_path / "pids"
    pids.mkdir()
    python = tmp_path / "python"
    python.write_text(
        f"#!/bin/sh\necho $$ > {pids}/.w; mv {pids}/.w {pids}/worker\nsleep 1000 &\n"
        f"echo $! > {pids}/.c; mv {pids}/.c {pids}/child\nwait\n"
    )
    python.chmod(0o755)
    start = time.monotonic()
    result = bench(llama, python)
    one_line_error(result, f"--vllm-python {python} did not answer headcut's probe", "within 2 s")
    assert time.monotonic() - start < 20
    assert_gone(pids)


def test_the_probe_reads_vllms_version_without_importing_it(tmp_path):
    """The probe's answer from a real interpreter: a fake ``vllm`` package that fails on import still passes (the
    probe looks it up, imports nothing), and one without vLLM is refused with the install line."""
    package = tmp_path / "site" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('imported')\n")
    env = dict(os.environ, PYTHONPATH=str(package.parent))
    done = subprocess.run(
        [sys.executable, "-c", extras.VLLM_PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.split()[0] == extras.PROBE_MARKER, done


# ---- the real worker script, with a fake vllm package ---------------------------------------------------------------


def fake_vllm(folder: Path, import_s: float) -> Path:
    """A folder holding a ``vllm`` package that takes ``import_s`` seconds to import, writes the importing process's
    id and starts a child process (``sleep``), and has no ``LLM``."""
    site = folder / "site"
    (site / "vllm").mkdir(parents=True)
    pids = folder / "pids"
    pids.mkdir()
    (site / "vllm" / "__init__.py").write_text(
        "import os, subprocess, time\n"
        "def note(name, pid):\n"
        f"    aside = os.path.join({str(pids)!r}, '.' + name)\n"
        "    with open(aside, 'w') as f:\n"
        "        f.write(str(pid))\n"
        f"    os.replace(aside, os.path.join({str(pids)!r}, name))\n"
        "note('worker', os.getpid())\n"
        "child = subprocess.Popen(['sleep', '1000'])\n"
        "note('child', child.pid)\n"
        f"time.sleep({import_s})\n"
        "__version__ = '0.0-fake'\n"
    )
    return site


def test_the_heartbeat_keeps_a_slow_load_alive_and_the_failure_is_one_line(llama, tmp_path, short, monkeypatch):
    """The real worker importing a vLLM that takes 3 s (twice the silence deadline): its heartbeat keeps it alive;
    then the load fails (no ``LLM`` in that package) and the answer's reason is the line; the worker quits, its
    child is gone."""
    site = fake_vllm(tmp_path, 3.0)
    monkeypatch.setenv("PYTHONPATH", str(site))
    result = bench(llama, Path(sys.executable))
    one_line_error(result, "vLLM fails to load: ImportError: cannot import name 'LLM' from 'vllm'")
    assert_gone(tmp_path / "pids")


def test_a_worker_that_beats_but_never_answers_meets_the_total_deadline(llama, tmp_path, short, monkeypatch):
    site = fake_vllm(tmp_path, 1000.0)
    monkeypatch.setenv("PYTHONPATH", str(site))
    start = time.monotonic()
    result = bench(llama, Path(sys.executable), "--vllm-timeout", "3")
    one_line_error(result, str(sys.executable), "did not answer load within 3 s (raise --vllm-timeout)")
    assert time.monotonic() - start < 30
    assert_gone(tmp_path / "pids")


# ---- signals ---------------------------------------------------------------------------------------------------


def _bench_waiting(llama: Path, python: Path, pids: Path, preexec: Any) -> subprocess.Popen:
    """``headcut bench --runtime vllm`` with the fake ``python``, once its worker and the worker's child run
    (headcut then waits for the answer to load); ``preexec``: the signal dispositions it starts with."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "headcut", "bench", str(llama), *SMALL, "--vllm-python", str(python)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        preexec_fn=preexec,
    )
    deadline = time.monotonic() + 90
    while not (pids / "child").is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not (pids / "child").is_file():
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the worker never started: {proc.communicate(timeout=30)}")
    return proc


def _default_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def test_an_ignored_hangup_is_left_ignored(llama, tmp_path):
    """``nohup headcut ...``: SIGHUP ignored by the caller stays ignored (closing the terminal does not stop the
    run); SIGTERM still stops it, with its worker."""
    python, pids = fake_python(tmp_path, "sleepy")

    def nohup() -> None:
        _default_signals()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = _bench_waiting(llama, python, pids, nohup)
    try:
        os.kill(proc.pid, signal.SIGHUP)
        time.sleep(2)
        assert proc.poll() is None  # still running
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert_gone(pids)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_bench_and_its_worker_at_once(llama, tmp_path, signum):
    """``headcut bench --runtime vllm`` waiting for a worker that never answers: SIGTERM (to headcut) or Ctrl-C (SIGINT
    to headcut's process group, as a terminal sends it; the worker has a session of its own) ends it within seconds
    with 128 + the signal, the worker and its child gone."""
    python, pids = fake_python(tmp_path, "sleepy")
    # as a terminal's foreground job has them: a shell's background job (CI started with &) ignores SIGINT
    proc = _bench_waiting(llama, python, pids, _default_signals)
    try:
        time.sleep(0.2)  # headcut is waiting for the answer to load
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signum, err
    assert took < PROMPT_S, took
    assert f"interrupted ({signal.Signals(signum).name})" in err and "Traceback" not in err, err
    assert_gone(pids)


def _started(python: Path, pids: Path) -> vllm_rows.VllmEngine:
    engine = vllm_rows.VllmEngine(str(python), "test")
    deadline = time.monotonic() + 30
    while not (pids / "child").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    return engine


def test_an_interrupted_engine_is_stopped_at_once_without_quit(tmp_path):
    """An interruption that lands while the engine is being made (the signal held while the worker starts, raised
    as the constructor ends: its owner never holds it) leaves it to the exit hook, and a Ctrl-C being handled
    closes it: both stop the worker's group at once, without the polite ``quit`` an interrupted worker never answers
    (it waited 20 s for the answer and 20 s more for the exit: bench outlived Ctrl-C by a minute under load)."""
    python, pids = fake_python(tmp_path, "sleepy")
    _started(python, pids)  # left open, as by the interruption
    start = time.monotonic()
    vllm_rows._close_open()
    assert time.monotonic() - start < PROMPT_S and not vllm_rows._OPEN
    assert_gone(pids)
    python, pids = fake_python(tmp_path / "again", "sleepy")
    engine = _started(python, pids)
    start = time.monotonic()
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        engine.close()
    assert time.monotonic() - start < PROMPT_S
    assert_gone(pids)


# ---- what the worker reports, and what is refused before it starts ---------------------------------------------------

#: pydantic's text of a validator's failure (vLLM's ModelConfig over a prompt longer than the model's positions)
PYDANTIC_VALUE = (
    "1 validation error for ModelConfig\n"
    "  Value error, User-specified max_model_len (161) is greater than the derived max_model_len "
    "(max_position_embeddings=64 or model_max_length=None in model's config.json).\n"
    "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. [type=value_error, "
    "input_value=ArgsKwargs((), {'model': '/m', 'max_model_len': 161}), input_type=ArgsKwargs]\n"
    "    For further information visit https://errors.pydantic.dev/2.14/v/value_error"
)
#: pydantic's text of a field's failure
PYDANTIC_FIELD = (
    "2 validation errors for ModelConfig\n"
    "max_model_len\n"
    "  Input should be a valid integer, unable to parse string as an integer [type=int_parsing, input_value='x', "
    "input_type=str]\n"
    "    For further information visit https://errors.pydantic.dev/2.14/v/int_parsing\n"
    "  Value error, Model architectures ['NopeForCausalLM'] are not supported for now. [type=value_error, "
    "input_value=ArgsKwargs(()), input_type=ArgsKwargs]\n"
    "    For further information visit https://errors.pydantic.dev/2.14/v/value_error"
)


def test_the_worker_reports_the_meaningful_lines_of_an_exception():
    assert reason(PYDANTIC_VALUE) == (
        "User-specified max_model_len (161) is greater than the derived max_model_len (max_position_embeddings=64 "
        "or model_max_length=None in model's config.json). To allow overriding this maximum, set the env var "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
    )
    assert reason(PYDANTIC_FIELD) == (
        "max_model_len: Input should be a valid integer, unable to parse string as an integer Model architectures "
        "['NopeForCausalLM'] are not supported for now."
    )
    assert reason("Engine failed.\nSee https://docs.vllm.ai/en/latest/faq\n\n  details here  ") == (
        "Engine failed. details here"
    )
    assert reason("https://errors.pydantic.dev/2.14/v/value_error") == ""
    long = reason("x" * 5000)
    assert len(long) == 600 and long.endswith("...")


def test_a_prompt_over_gpt2s_positions_is_refused_before_vllm_starts(tmp_path, short):
    """GPT-2 states its positions as ``n_positions`` (64 in the tiny one): --seq-len 100 is refused with what fits,
    before the worker starts (its process id file never appears); serve() refuses such prompts too."""
    folder = save_tiny(tmp_path / "gpt2", "gpt2", "GPT2LMHeadModel")
    python, pids = fake_python(tmp_path, "exits")
    result = run("bench", folder, "--runtime", "vllm", "--vllm-python", python, "--seq-len", "100")
    one_line_error(
        result, "--seq-len 100 and --gen-tokens 32", "exceed the model's 64 positions", "--seq-len 31 at most"
    )
    with pytest.raises(HeadcutError, match="exceed the model's 64 positions"):
        headcut.bench([folder], runtime="vllm", vllm_python=str(python), seq_len=100)
    with pytest.raises(HeadcutError, match="a prompt of 60 tokens and 8 new ones .* exceed the model's 64 positions"):
        vllm_rows.serve(folder, [list(range(60))], 8, python=str(python))
    assert not (pids / "worker").exists()
    vllm_rows.check_length(folder, "tiny", 31, 32)
