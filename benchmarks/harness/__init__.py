"""The benchmark page's harness: the study registry (:mod:`.registry`), the result store (:mod:`.store`), the studies'
measurements (:mod:`.measure`, torch and headcut), the verdicts' declared rules (:mod:`.verdicts`) and the renderer
(:mod:`.render`) that writes ``docs/benchmarks.md`` from ``benchmarks/results/``.

    python -m benchmarks.harness --help                 # from the repository's root
    python -m benchmarks.harness --studies none         # only render the page from the stored results

Rendering reads the store alone: no model runs, no torch (``tests/test_benchmarks.py`` renders it on every test run).
"""
