"""The interface every pruning method implements, and the lookup from a name to a method.

A method is an object with

* ``name``: its registry name (:data:`headcut.catalog.METHODS` holds its summary, paper reference
  and the data it reads; :attr:`Method.entry` returns that entry);
* ``Options``: its own small options dataclass (defaults and ``validate()``); :func:`make_options`
  builds one from a dict, refusing options that are not the method's;
* ``check(config, options)``: the method's refusals that need no model or data (e.g. a learned-gate
  method has no ``--max-drop``);
* ``step(total, options)``: heads per search step and whether the search goes step by step (the
  budget check needs it before any data is read);
* ``check_units(sets, budget, config, options)``: refusals that need the model's prune units but no
  data (e.g. AUBER's bound below one head per layer);
* ``run(problem, options) -> PruneResult``: the one entry point. It returns the exact-budget mask
  (the model's current head numbering) and the method's report section (``result.section()``).

Adding a method is one module defining such an object plus one entry in the catalog.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from ..adapters import Block
from ..catalog import MethodEntry, method_entry, resolve
from ..config import PruneConfig
from ..data import Calibration
from ..errors import HeadcutError
from ..options import OptionError, specs
from ..training.distributed import Dist
from .base import Metric, PruneProgress, PruneResult
from .search import Budget
from .units import BlockSet

#: ``on_step(history entry)`` after every training step of a learned method
StepLog = Callable[[dict[str, Any]], None]


@dataclass
class Problem:
    """What a method works on.

    ``model``: in eval mode (learned methods in joint mode train it in place); ``blocks``/``sets``: its
    attention blocks and the prune units (:mod:`headcut.pruning.units`); ``budget``: the resolved
    budget; ``data``: calibration data (score-based methods; a Calibration or batches) or labelled
    training data (learned methods; a Calibration); ``metric``: the quality measure of ``--max-drop``,
    the trajectory and the before/after report (None without evaluation data); ``progress(phase,
    done, total)``; ``on_step``: each training step's history entry; ``checkpoint_dir``/``resume``/
    ``dist``/``identity``: the training engine's checkpoints, data-parallel place and run identity;
    ``device``: where the training steps run (None: where the model is; with ``--engine fsdp`` the model stays
    whole in CPU memory and its shards train there); ``protected``: blocks (with their measured cost) a score-based
    method removes heads from only when the budget cannot be met otherwise (their heads rank above every other
    head, the block of least cost lowest)."""

    model: nn.Module
    config: PruneConfig
    blocks: list[Block]
    sets: list[BlockSet]
    budget: Budget
    data: Calibration | Sequence[Any] | None = None
    eval_data: Calibration | None = None
    metric: Metric | None = None
    progress: PruneProgress | None = None
    on_step: StepLog | None = None
    checkpoint_dir: str | Path | None = None
    resume: bool = False
    dist: Dist | None = None
    identity: dict[str, Any] | None = None
    device: Any = None
    protected: Mapping[str, float] = field(default_factory=dict)


class Method(Protocol):
    name: str
    Options: type

    @property
    def entry(self) -> MethodEntry: ...

    def check(self, config: PruneConfig, options: Any) -> None: ...

    def step(self, total: int, config: PruneConfig, options: Any) -> tuple[int, bool]: ...

    def check_units(self, sets: list[BlockSet], budget: Budget, config: PruneConfig, options: Any) -> None: ...

    def run(self, problem: Problem, options: Any) -> PruneResult: ...


@dataclass
class Summary:
    """A method's own part of ``headcut prune``'s end-of-run summary: ``items`` (rich tables and lines),
    ``lead`` (what comes before "N s in all; saved to ...") and whether the step-by-step ``trajectory`` table
    is shown too."""

    items: list[Any]
    lead: str = ""
    trajectory: bool = True


class MethodBase:
    """Shared parts of the method classes (their registry entry and options handling)."""

    name: str = ""
    Options: type = object

    @property
    def entry(self) -> MethodEntry:
        return method_entry(self.name)

    def check(self, config: PruneConfig, options: Any) -> None:
        return None

    def check_units(self, sets: list[BlockSet], budget: Budget, config: PruneConfig, options: Any) -> None:
        return None

    def summary(self, report: dict[str, Any], result: PruneResult) -> Summary | None:
        """The method's own lines in the end-of-run summary (None: the shared scoring or training lines)."""
        return None


def get_method(name: str) -> Method:
    """The method registered as ``name`` (a one-line error lists the available ones)."""
    entry = method_entry(name)
    method = resolve(entry.target)
    return method  # type: ignore[return-value]


def make_options(method: Method, given: Any = None) -> Any:
    """``method``'s options from None (defaults), a dict of option fields, or an Options instance;
    validated. Fields that are not the method's are refused with the ones it has."""
    cls = method.Options
    if given is None:
        options = cls()
    elif is_dataclass(given) and not isinstance(given, type):
        if not isinstance(given, cls):
            raise HeadcutError(f"{type(given).__name__} are not the options of {method.name} ({cls.__name__})")
        options = given
    elif isinstance(given, dict):
        names = {f.name for f in fields(cls) if f.init}
        hidden = getattr(cls, "HIDDEN", ())
        wrong = [k for k in given if k not in names or k in hidden]
        if wrong:
            own = ", ".join("{%s}" % s.name for s in specs(cls) if s.meta.cli) or "none"
            raise OptionError("{%s} does not apply to %s (its options: %s)" % (wrong[0], method.name, own))
        options = cls(**given)
    else:
        raise HeadcutError(f"options of {method.name} must be a dict or {cls.__name__}, not {type(given).__name__}")
    validate = getattr(options, "validate", None)
    if validate is not None:
        validate()
    return options
