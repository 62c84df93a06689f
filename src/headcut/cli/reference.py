"""The option reference of the docs, generated from the same declarations as ``--help`` (so the two cannot
drift): every method's options (``docs/methods.md``) and every command's flags (``docs/commands.md``).

``python -m headcut.cli.reference`` rewrites the regions between ``<!-- generated: NAME -->`` and
``<!-- end generated: NAME -->`` in those pages; a test checks they are current."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ..catalog import METHODS
from ..options import static_specs
from . import app


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def method_options() -> str:
    """A table of each method's options: flag, Python keyword, default, what it does."""
    out = []
    for entry in METHODS.values():
        out.append(
            f"### {entry.name}\n\n{entry.summary} ({entry.short_citation}); "
            f"`headcut methods {entry.name}` shows the same.\n"
        )
        rows = [s for s in static_specs(entry.options) if s.meta.cli]
        out.append("| flag | Python keyword | default | what |\n|---|---|---|---|")
        for s in rows:
            value = f" {s.metavar}" if s.metavar else ""
            default = "-" if s.default is None else f"`{s.default}`"
            out.append(f"| {_cell(f'`{s.flag}{value}`')} | `{s.name}` | {_cell(default)} | {_cell(s.help)} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def command_options(name: str) -> str:
    """A table of the flags of ``headcut NAME`` as ``--help`` shows them (a method's own: see methods.md)."""
    import typer.main

    command = typer.main.get_command(app).commands[name]
    ctx = command.make_context(name, ["--help"], resilient_parsing=True)
    rows = ["| flag | value | default | what |", "|---|---|---|---|"]
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False) or param.name == "help":
            continue
        if getattr(param, "param_type_name", "") == "argument":
            flag = param.metavar or param.name.upper()
            metavar = ""
        else:
            flag = ", ".join(param.opts)
            metavar = "" if getattr(param, "is_flag", False) else (param.metavar or "")
        what = _cell((param.help or "").replace("\\[", "["))  # rich markup's escaped brackets, as --help shows them
        value = _cell(f"`{metavar}`") if metavar else ""
        default = param.default
        shown = "" if default in (None, False) or getattr(param, "is_flag", False) else _cell(f"`{default}`")
        rows.append(f"| `{flag}` | {value} | {shown} | {what} |")
    return "\n".join(rows) + "\n"


def regions() -> dict[str, str]:
    """Region name -> its generated text."""
    import typer.main

    out = {"methods": method_options()}
    for name in typer.main.get_command(app).commands:
        out[f"command {name}"] = command_options(name)
    return out


def update(root: Path, check: bool = False) -> list[str]:
    """Rewrite the generated regions of ``root/docs/*.md`` (or, with ``check``, only list the stale ones)."""
    generated = regions()
    stale = []
    for page in sorted((root / "docs").glob("*.md")):
        text = page.read_text()

        def fill(m: re.Match[str]) -> str:
            body = generated.get(m.group(1))
            if body is None:
                raise SystemExit(f"{page}: no generator for region {m.group(1)!r}")
            return f"<!-- generated: {m.group(1)} -->\n{body}<!-- end generated: {m.group(1)} -->"

        new = re.sub(r"<!-- generated: (.+?) -->\n.*?<!-- end generated: \1 -->", fill, text, flags=re.S)
        if new != text:
            stale.append(str(page.relative_to(root)))
            if not check:
                page.write_text(new)
    return stale


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    for page in update(root):
        print(f"updated {page}")
