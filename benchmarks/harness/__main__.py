"""Measure the benchmark page's studies and render the page, ``docs/benchmarks.md``, and its plots (``docs/img/*.png``):

    pip install -e '.[plots]'                       # matplotlib, for the PNG plots
    python -m benchmarks.harness [--studies all|none|NAME,...] [--rerun NAME,...] [--extend NAME,...]
                                 [--peer-python PEER/bin/python]
    python -m benchmarks.harness --check            # is the committed page the one the stored results give?

Each study keeps its measurements in ``benchmarks/results/<study>.json`` (with the machine, the versions and
the date), row by row: an interrupted study goes on from its last finished row on the next call, and a
finished one is not measured again unless named in ``--rerun`` (from scratch) or ``--extend`` (only the rows
it lacks, after a K or a variant was added); given alone, these two measure only the studies they name.
The page is then rendered from every results file (``--studies none`` only renders). Progress goes to stderr.
A task study can be measured in parts: ``--methods``/``--ks`` restrict it (run each part in a copy of this
folder, on this machine or a GPU one), and ``--merge COPY/results/STUDY.json`` adds the copy's rows (each row keeps
its machine; the study's own time is not changed: add a part's CPU time by hand).
All the studies took 13.9 hours on 2 CPU cores (the sum of the times each study records); each can be run on its
own. The studies of ``benchmarks/studies/`` run on their own (``benchmarks/harness/registry.py`` names their
commands); this command renders their stored results.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from benchmarks.harness.registry import MEASURED_HERE
from benchmarks.harness.render import page, render
from benchmarks.harness.store import DOCS, RESULTS, load_results, log, merge


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.harness",
        description="Measure the benchmark page's studies and render the page, docs/benchmarks.md.",
    )
    ap.add_argument(
        "--studies",
        default=None,
        help="studies to measure: all (the default, unless --extend or --rerun names some), none (only "
        "render) or names",
    )
    ap.add_argument("--rerun", default="", help="studies to measure again although their results exist")
    ap.add_argument(
        "--extend",
        default="",
        help="complete studies to go on with: only the rows they lack are measured (after a K or a "
        "variant was added to the harness)",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="measure nothing: exit 1 when docs/benchmarks.md is not the page the stored results give",
    )
    ap.add_argument("--peer-python", default=None, help="python of the TextPruner environment")
    ap.add_argument("--peer-iters", type=int, default=16, help="TextPruner's n_iters (its best in its README: 16)")
    ap.add_argument(
        "--peer-variants",
        default="uneven",
        help="uneven (heads per layer may differ: TextPruner's best) and/or even, comma-separated",
    )
    ap.add_argument(
        "--llm-peer-python",
        default=None,
        help="python of the Torch-Pruning environment (peer_llm; default: made by benchmarks/studies/peer_llm.py)",
    )
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the recipe's targets")
    ap.add_argument(
        "--methods",
        default=None,
        help="the task studies (convention, review_plot, debates): measure only these methods' rows "
        "(comma-separated; the study stays incomplete)",
    )
    ap.add_argument("--ks", default=None, help="the task studies: measure only at these K (comma-separated)")
    ap.add_argument(
        "--merge",
        nargs="*",
        default=[],
        type=Path,
        help="results files of a study measured in part elsewhere: add their rows this one lacks",
    )
    ap.add_argument(
        "--copied",
        default=None,
        help="with --merge: how the classifier was carried to the machine the rows ran on (the page "
        "says it), e.g. 'fp16'",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.check:
        committed = DOCS / "benchmarks.md"
        if committed.read_text() != page(load_results(RESULTS)):
            print(
                f"{committed} is not the page benchmarks/results/ gives: run python -m benchmarks.harness "
                "--studies none",
                file=sys.stderr,
            )
            return 1
        return 0
    if args.studies is None:  # --extend/--rerun alone measure only what they name; --merge alone nothing
        args.studies = "none" if args.extend or args.rerun or args.merge else "all"
    if args.studies == "all":
        names = list(MEASURED_HERE)
        if not args.peer_python:
            names.remove("peer")
            log("no --peer-python: the peer study is skipped")
    else:
        names = [] if args.studies == "none" else [s for s in args.studies.split(",") if s]
    wrong = [s for s in [*names, *args.extend.split(","), *args.rerun.split(",")] if s and s not in MEASURED_HERE]
    if wrong:
        ap.error(f"unknown study {wrong[0]!r}; studies: {', '.join(MEASURED_HERE)}")
    extend = frozenset(s for s in args.extend.split(",") if s)
    rerun = {s for s in args.rerun.split(",") if s}
    merge(args.merge, args.copied)
    todo = list(dict.fromkeys([*names, *extend, *rerun]))
    if todo:
        from benchmarks.harness.measure import (
            run_studies,  # torch and headcut: only when measuring
        )

        run_studies(todo, rerun, args, extend)
    draw = importlib.util.find_spec("matplotlib") is not None
    if not draw:
        log("matplotlib is not installed: the page is written, its plots are not (pip install 'headcut[plots]')")
    print(render(RESULTS, DOCS, draw=draw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
