"""Processes of one run that disagree or fail (``torchrun --nproc_per_node 2``, CPU, gloo): every process stops
within seconds with one line, instead of waiting in a collective for a process that will never come.

Each run starts through a small launcher that gives each process its own arguments (``@RANKED@`` in the
command is replaced by that rank's list), as two machines with their own copies of the files would. A run that
hangs fails its test after :data:`HANG_S` seconds (its agent and processes are killed then). torchrun's agent SIGTERMs
the other processes when one exits, and SIGKILLs those still there 30 s later, saying so ("forcefully
exiting"): a run where that line appears had a process that did not answer SIGTERM.

Also: :meth:`headcut.training.distributed.Dist.agree` and a barrier, in two plain processes (no launcher)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cls_rows, save_tiny, write_rows

ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
#: seconds a run may take before its test fails as a hang (a run here takes about 20 s on 2 busy cores)
HANG_S = 150

LAUNCHER = """
import json, os, runpy, sys
rank = int(os.environ["RANK"])
pids = os.environ.get("HEADCUT_TEST_PIDS")
if pids:
    with open(os.path.join(pids, f"rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
ranked = json.loads(sys.argv[1])
args = []
for a in sys.argv[2:]:
    args += ranked[rank] if a == "@RANKED@" else [a]
sys.argv = ["headcut", *args]
runpy.run_module("headcut", run_name="__main__")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("processes")
    save_tiny(
        d / "model", "bert", "BertForSequenceClassification", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    write_rows(d / "train.csv", cls_rows(64, seed=0))
    write_rows(d / "other.csv", cls_rows(64, seed=5))  # another file of as many rows
    write_rows(d / "longer.csv", cls_rows(96, seed=7))  # more rows: more steps in an epoch
    (d / "empty.csv").write_text("text,label\n")
    (d / "launch.py").write_text(LAUNCHER)
    return d


def start(tiny: Path, ranked: list[list[str]], *args: str, pids: Path) -> subprocess.Popen:
    """The run under torchrun; each process writes its pid into ``pids`` (a hung run's processes are killed by
    it: torchrun starts each process in a session of its own)."""
    pids.mkdir(exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(tiny / "launch.py"),
        json.dumps(ranked),
        *args,
    ]
    return subprocess.Popen(
        cmd,
        cwd=tiny,
        env=dict(ENV, HEADCUT_TEST_PIDS=str(pids)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill(proc: subprocess.Popen, pids: Path) -> str:
    """Kill a run that hung (its agent's session and each process) and return its stderr."""
    for ours in [proc.pid, *(int(f.read_text()) for f in pids.glob("rank*"))]:
        try:
            os.killpg(ours, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return proc.communicate()[1]


def finish(proc: subprocess.Popen, pids: Path, timeout: float = HANG_S) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        err = kill(proc, pids)
        pytest.fail(f"the run hung for {timeout:.0f} s; its stderr ends:\n{err[-3000:]}")
    return proc.returncode, err


def two(tiny: Path, ranked: list[list[str]], *args: str) -> tuple[int, str]:
    pids = tiny / f"pids-{free_port()}"
    return finish(start(tiny, ranked, *args, pids=pids), pids)


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def assert_stopped(code: int, stderr: str, line: str | re.Pattern[str]) -> None:
    """The run failed, every process on its own (no SIGKILL), with ``line`` (a string or pattern) as the one line
    the run prints (its main process's: the others stop alike, silently), and no traceback of a process or gloo
    message."""
    assert code != 0
    assert "forcefully exiting" not in stderr, stderr[-3000:]
    shown = errors(stderr)
    assert len(shown) == 1, stderr[-3000:]  # one line for the run
    for got in shown:
        assert line.fullmatch(got) if isinstance(line, re.Pattern) else got == line, (got, stderr[-3000:])
    assert "[rank" not in stderr, stderr[-3000:]  # a process's traceback
    assert "gloo" not in stderr.lower(), stderr[-3000:]


COMMON = ["--seq-len", "16", "--batch-size", "8", "-q"]
SAME = "every process of a run must read the same model and data and be given the same settings"


def test_other_data_with_more_steps_stops_every_process(tiny):
    """The issue's hang: process 1 reads another file (more rows: more steps in its epoch), so the processes
    would wait for each other in different collectives forever."""
    code, err = two(
        tiny,
        [["--data", "train.csv"], ["--data", "longer.csv"]],
        "finetune",
        "model",
        "@RANKED@",
        "--epochs",
        "1",
        "--out",
        "out-longer",
        *COMMON,
    )
    assert_stopped(
        code,
        err,
        re.compile(
            rf"error: process 1 read --data with 96 examples \(digest [0-9a-f]{{16}}\), process 0 64 examples "
            rf"\(digest [0-9a-f]{{16}}\): {SAME}"
        ),
    )
    assert not (tiny / "out-longer").exists()


def test_other_copy_of_the_data_is_refused_in_prune(tiny):
    """Another file of as many rows: the runs would not hang but train on different data; a learned method's
    run refuses it before any step."""
    code, err = two(
        tiny,
        [["--data", "train.csv"], ["--data", "other.csv"]],
        "prune",
        "model",
        "--method",
        "pass",
        "--keep",
        "3",
        "@RANKED@",
        "--max-steps",
        "2",
        "--out",
        "out-other",
        *COMMON,
    )
    assert_stopped(
        code,
        err,
        re.compile(
            rf"error: process 1 read --data with 64 examples \(digest ([0-9a-f]{{16}})\), "
            rf"process 0 64 examples \(digest (?!\1)[0-9a-f]{{16}}\): {SAME}"
        ),
    )
    assert not (tiny / "out-other").exists()


def test_other_settings_stop_every_process(tiny):
    code, err = two(
        tiny,
        [["--max-steps", "2"], ["--max-steps", "3"]],
        "finetune",
        "model",
        "--data",
        "train.csv",
        "@RANKED@",
        "--out",
        "out-steps",
        *COMMON,
    )
    assert_stopped(code, err, f"error: process 1 was given --max-steps 3, process 0 2: {SAME}")


def test_missing_file_on_one_process_stops_the_others(tiny):
    """Process 1 fails before it joins the process group (its data file is not there): it joins to tell the
    others, who stop at once with its error instead of waiting for it (torchrun's SIGKILL, 30 s later)."""
    code, err = two(
        tiny,
        [["--data", "train.csv"], ["--data", "missing.csv"]],
        "finetune",
        "model",
        "@RANKED@",
        "--max-steps",
        "2",
        "--out",
        "out-missing",
        *COMMON,
    )
    assert_stopped(code, err, "error: process 1: data file not found: missing.csv")


def test_empty_data_on_one_process_stops_the_others(tiny):
    """Process 1 fails while it reads its data, after joining the group, in a learned method's prune."""
    code, err = two(
        tiny,
        [["--data", "train.csv"], ["--data", "empty.csv"]],
        "prune",
        "model",
        "--method",
        "pass",
        "--keep",
        "3",
        "@RANKED@",
        "--max-steps",
        "2",
        "--out",
        "out-empty",
        *COMMON,
    )
    assert_stopped(code, err, "error: process 1: empty.csv has no examples")


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def _wait_idle(pid: int, deadline: float) -> None:
    """Until process ``pid`` has used (almost) no CPU for a second: blocked, waiting for the other process."""
    last = _cpu_ticks(pid)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = _cpu_ticks(pid)
        if now - last <= 3:
            return
        last = now
    pytest.fail("process 0 never became idle")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_stops_a_process_waiting_for_another(tiny, tmp_path):
    """Process 0 waits in the agreement for process 1, which waits for data on a pipe: a SIGTERM to process 0
    (what torchrun sends when a process fails, or a scheduler cancelling the job) stops it within seconds, and
    the run ends without a SIGKILL. Before, process 0 waited in a C++ barrier that held its signal handler off."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = start(
        tiny,
        [["--data", "train.csv"], ["--data", str(fifo), "--data-format", "csv"]],
        "finetune",
        "model",
        "@RANKED@",
        "--max-steps",
        "2",
        "--out",
        "out-term",
        *COMMON,
        pids=pids,
    )
    writer = None
    try:
        deadline = time.monotonic() + HANG_S
        while writer is None and time.monotonic() < deadline and proc.poll() is None:
            try:  # succeeds once process 1 has the pipe open (it then waits for data that never comes)
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.2)
        assert writer is not None, "process 1 never opened the pipe"
        rank0 = int((pids / "rank0").read_text())
        _wait_idle(rank0, deadline)
        os.kill(rank0, signal.SIGTERM)
        sent = time.monotonic()
        while time.monotonic() - sent < 10:
            try:
                if ") Z " in Path(f"/proc/{rank0}/stat").read_text():  # exited, not yet reaped by the agent
                    break
            except FileNotFoundError:  # exited and reaped
                break
            time.sleep(0.1)
        assert time.monotonic() - sent < 10, "process 0 did not answer SIGTERM"
        code, err = finish(proc, pids, 60)
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            kill(proc, pids)
    assert code != 0
    assert "forcefully exiting" not in err, err[-3000:]
    assert "interrupted (SIGTERM)" in err, err[-3000:]
    assert "[rank" not in err and "gloo" not in err.lower(), err[-3000:]
    assert not (tiny / "out-term").exists()


# ---- the agreement itself, in two processes without a launcher ---------------------------------------------------

AGREEMENT = r"""
import json, os, signal, sys, time
from pathlib import Path
from headcut.errors import HeadcutError, label
from headcut.training.distributed import from_env

rank, out = int(os.environ["RANK"]), sys.argv[1]
dist = from_env(cpu=True)
mine = {"ran headcut": "1", f"was given {label('max_steps')}": str(2 + rank), "read --data with": "x"}
same = {"ran headcut": "1", "read \N{SNOWMAN} with": "\x00data\x00"}
cases = {
    "same": lambda: dist.agree(same),
    "differ": lambda: dist.agree(mine),
    "missing": lambda: dist.agree(same if rank == 0 else {"ran headcut": "1"}),
    "one failed": lambda: dist.agree(same, error="boom" if rank == 1 else None),
    "both failed alike": lambda: dist.agree(error="no data"),
    "both failed apart": lambda: dist.agree(error=f"failed {rank}"),
    "exchange": lambda: dist.exchange({"rank": rank, "text": "\u00e9" * (rank * 1000)}),
}
results = {}
for name, case in cases.items():
    try:
        results[name] = case()
    except HeadcutError as exc:
        results[name] = "error: " + str(exc)
# a barrier that process 1 never reaches: process 0's signal handler runs while it waits (it used to run only
# once the barrier was over), and process 0 then exits at once, while process 1 is still there
if rank == 0:
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    began = time.monotonic()
    try:
        dist.barrier()
        results["barrier"] = "passed"
    except KeyboardInterrupt:
        results["barrier"] = round(time.monotonic() - began, 1)
    Path(out, "rank0.json").write_text(json.dumps(results))
else:
    Path(out, "rank1.json").write_text(json.dumps(results))
    time.sleep(4)
"""


def test_agree_in_two_processes(tmp_path):
    script = tmp_path / "agree.py"
    script.write_text(AGREEMENT)
    env = dict(ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path)],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        _, err0 = procs[0].communicate(timeout=60)
        rank0_done = time.monotonic()
        alive = procs[1].poll() is None  # process 0 exited while process 1 was still there (its 4 s sleep)
        _, err1 = procs[1].communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert procs[0].returncode == procs[1].returncode == 0, (err0[-2000:], err1[-2000:])
    assert alive, time.monotonic() - rank0_done
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for name in ("same", "differ", "missing", "one failed", "both failed alike", "both failed apart"):
        assert r0[name] == r1[name], name  # every process raises the same line
    assert r0["same"] is None
    assert r0["differ"] == f"error: process 1 was given max_steps 3, process 0 2: {SAME}"
    assert r0["missing"] == f"error: process 1 read \N{SNOWMAN} with nothing, process 0 data: {SAME}"
    assert r0["one failed"] == "error: process 1: boom"
    assert r0["both failed alike"] == "error: no data"  # what a single process would say
    assert r0["both failed apart"] == "error: process 0: failed 0"
    assert r0["exchange"] == r1["exchange"] == [{"rank": 0, "text": ""}, {"rank": 1, "text": "\u00e9" * 1000}]
    assert isinstance(r0["barrier"], float) and r0["barrier"] < 2, r0["barrier"]


def test_agree_in_one_process_is_nothing_but_the_error():
    from headcut.errors import HeadcutError
    from headcut.training.distributed import Dist

    Dist().agree({"read --data with": "x"})
    assert Dist().exchange([1]) == [[1]]
    with pytest.raises(HeadcutError, match="^boom$"):
        Dist().agree(error="boom")
