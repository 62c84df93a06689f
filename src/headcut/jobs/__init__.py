"""headcut's commands as jobs: one module per command over a shared skeleton (:mod:`.base`). Users call
them through :mod:`headcut.api` (``headcut.prune`` and the others)."""
