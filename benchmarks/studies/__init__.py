"""The studies of the benchmark page that run on their own (``python -m benchmarks.studies.NAME`` from the
repository's root), each storing its rows in ``benchmarks/results/`` for the harness to render; see
``benchmarks/harness/registry.py``."""
