"""A refusal is one line: the warnings and library log lines a command raised before it was refused are
dropped with it; a command that finishes still shows them (after its work). Run in a subprocess: pytest
captures warnings and log records itself."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import logging, sys, warnings
    import typer
    from headcut.cli.failures import handle_errors
    from headcut.errors import HeadcutError

    app = typer.Typer()

    @app.command()
    @handle_errors
    def work(refuse: bool = False) -> None:
        warnings.warn("a library's warning", UserWarning)
        logging.getLogger("transformers.modeling_utils").warning("a transformers log line")
        logging.getLogger("some.library").error("a root-propagated log line")
        if refuse:
            raise HeadcutError("the request is refused")
        print("result")

    app()
""")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=120)


def test_refusal_drops_earlier_warnings_and_log_lines():
    result = _run("--refuse")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: the request is refused"]
    assert result.stdout == ""


def test_finished_command_still_shows_them():
    result = _run()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "result"
    assert "a library's warning" in result.stderr
    assert "a transformers log line" in result.stderr
    assert "a root-propagated log line" in result.stderr


def test_loggers_restored_after_a_command():
    from helpers import run

    root_before = list(logging.getLogger().handlers)
    tf_before = list(logging.getLogger("transformers").handlers)
    run("info", "/nonexistent/model")
    assert logging.getLogger().handlers == root_before
    assert logging.getLogger("transformers").handlers == tf_before


LONG = "y" * 300  # longer than any file system's name limit (255 bytes on most)


def test_input_names_too_long_are_one_line_errors(tmp_path):
    from helpers import one_line_error, run, save_tiny

    model = save_tiny(tmp_path / "m", "bert", "BertForSequenceClassification")
    one_line_error(run("info", tmp_path / LONG), "longer than the file system allows")
    one_line_error(run("eval", model, "--data", tmp_path / f"{LONG}.csv"), "longer than the file system allows")
    one_line_error(
        run("export", model, "--mask", tmp_path / f"{LONG}.json", "--out", tmp_path / "o"),
        "longer than the file system allows",
    )
    assert not (tmp_path / "o").exists()


def test_input_name_too_long_from_python_is_a_headcut_error(tmp_path):
    import pytest

    import headcut

    with pytest.raises(headcut.HeadcutError, match="longer than the file system allows") as caught:
        headcut.info(str(tmp_path / LONG))
    assert isinstance(caught.value, ValueError)
