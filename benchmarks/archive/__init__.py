"""Earlier one-off benchmark scripts, kept for the record and not maintained: see ``benchmarks/archive/README.md``."""
