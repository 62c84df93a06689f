"""The stages of a prune (:mod:`.base`: what a stage is, the registry's functions; one module per kind: :mod:`.choose`,
:mod:`.cut`, :mod:`.refit`, :mod:`.distill`, :mod:`.recover`). A kind defined elsewhere joins with :func:`register`."""

from .base import PruneStage, PruneState, RoundRun, make_stage, register, stage_class, unregister

__all__ = ["PruneStage", "PruneState", "RoundRun", "make_stage", "register", "stage_class", "unregister"]
