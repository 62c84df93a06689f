"""A recipe: a prune job's stages as data, with the schedule of its rounds.

A recipe names the stages every round runs, in their order (``choose`` the heads with a method and its options,
``cut`` them with the cut's options, ``refit`` the kept heads' output projections, ``recover`` by distilled
fine-tuning with its options), how the data is read, and its schedule: the rounds a cut runs in, each with the
heads it leaves and its own recovery options. Every option is a declared option of the configuration that owns
it (a method's options, :class:`~headcut.config.PruneConfig`, :class:`~headcut.config.RecoveryConfig`,
:class:`~headcut.data.DataConfig`) under the Python keyword of ``headcut.prune``; a recipe is written as YAML or
JSON (:meth:`Recipe.to_dict`, :func:`headcut.recipes.files.read_recipe`)::

    name: encoder
    stages:
      - choose: {method: fluctuation}
      - cut: {}
      - refit: {}
      - recover: {recover_steps: 500, recover_hidden_weight: 2, recover_average: 0.5}
    data: {batch_size: 8, max_examples: 4000}
    schedule:
      - below: 1/3            # a budget under a third of the model's heads ...
        rounds:               # ... is cut in two rounds: to a third first, then to the budget
          - {keep: 1/3}
          - {keep: budget}

A round's ``keep`` is a number of heads, a share of the model's heads (``1/3``: the nearest count the model can
keep at or above it), or ``budget`` (the last round). The schedule's first case whose ``below`` the budget is under
(no ``below``: every budget) gives the rounds; none: one round. A resolved recipe (a prune report's ``recipe``)
has its budget, its seed and one case of whole numbers: it replays the run it records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from ..catalog import METHODS
from ..config import PruneConfig, RecoveryConfig
from ..data.config import DataConfig
from ..errors import HeadcutValueError
from ..options import OptionError, check_fields, static_specs
from .limits import check_size

#: the stages of a round, in the order they run (:data:`headcut.jobs.prune.stages.STAGES`)
STAGES = ("choose", "cut", "refit", "recover")
#: the stages every recipe has
REQUIRED = ("choose", "cut")
#: each stage's options: declared fields of the configuration that owns them (``choose``: the method's)
CUT_FIELDS = ("uniform", "gqa", "min_heads_per_block", "allocation")
RECOVER_FIELDS = ("recover_steps", "recover_hidden_weight", "recover_average")
BUDGET_FIELDS = ("keep", "sparsity", "max_drop", "kv_budget", "context", "target_speedup")
DATA_FIELDS = ("max_examples", "seq_len", "batch_size", "mlm_probability")
#: a recipe's keys, in the order it is written
KEYS = ("name", "about", "default_for", "stages", "data", "budget", "seed", "schedule", "measured")
#: the models a built-in recipe is the default of (``default_for``): transformers' task of the model's class
KINDS = ("sequence-classification", "causal-lm")
#: a round's keep that means the final budget
BUDGET = "budget"


@dataclass(frozen=True)
class Stage:
    """One stage and its options (``choose``: ``method`` and the method's options)."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundPlan:
    """One round of a schedule: ``keep`` the heads it leaves (a count, a share of the model's heads, or None: the
    budget) and ``recovery`` its own recovery options (over the ``recover`` stage's)."""

    keep: int | Fraction | None
    recovery: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    """A case of a schedule: the rounds of a budget under ``below`` (a share of the model's heads; None: any)."""

    rounds: tuple[RoundPlan, ...]
    below: Fraction | None = None


@dataclass(frozen=True)
class Recipe:
    """A prune job as data (see the module's doc): ``stages`` in order, ``data`` options, ``budget`` and ``seed``
    (a resolved recipe's; a built-in one leaves them to the command), the ``schedule``, what it is
    (``about``), the models it is the default of (``default_for``) and the ``measured`` results behind it."""

    name: str
    stages: tuple[Stage, ...]
    about: str = ""
    default_for: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    budget: Mapping[str, Any] = field(default_factory=dict)
    seed: int | None = None
    schedule: tuple[Case, ...] = ()
    measured: tuple[Mapping[str, Any], ...] = ()
    #: the file the recipe was read from (None: built in, or given as a mapping); an input no run writes
    source: str | None = field(default=None, compare=False)

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    @property
    def method(self) -> str:
        choose = self.stage("choose")
        assert choose is not None  # every recipe has one (checked when read)
        return str(choose.options["method"])

    @property
    def method_options(self) -> dict[str, Any]:
        choose = self.stage("choose")
        return {k: v for k, v in (choose.options if choose else {}).items() if k != "method"}

    @property
    def cut(self) -> dict[str, Any]:
        cut = self.stage("cut")
        return dict(cut.options) if cut else {}

    @property
    def refit(self) -> bool:
        return self.stage("refit") is not None

    @property
    def recover(self) -> dict[str, Any]:
        recover = self.stage("recover")
        return dict(recover.options) if recover else {}

    @property
    def rounds_vary(self) -> bool:
        """Whether some budget is cut in more than one round."""
        return any(len(case.rounds) > 1 for case in self.schedule)

    def case(self, total: int, target: int) -> Case | None:
        """The schedule's case of a budget of ``target`` heads of ``total`` (None: one round)."""
        for case in self.schedule:
            if case.below is None or target < case.below * total:
                return case
        return None

    def changed(
        self,
        *,
        method_options: Mapping[str, Any] | None = None,
        cut: Mapping[str, Any] | None = None,
        refit: bool = False,
        recover: Mapping[str, Any] | None = None,
        data: Mapping[str, Any] | None = None,
        budget: Mapping[str, Any] | None = None,
        seed: int | None = None,
        schedule: Sequence[Case] | None = None,
    ) -> Recipe:
        """This recipe with options given on top (a command's flags, ``prune``'s keywords): the method's options,
        the cut's, the recovery's (a recovery option given holds in every round: the rounds' own values of it are
        dropped; ``recover_steps`` 0 drops the recovery), the data options, a whole ``budget`` (replacing the
        recipe's), the ``seed``, a ``schedule`` (replacing the recipe's); ``refit`` adds the refit stage."""
        stages = list(self.stages)

        def put(name: str, options: Mapping[str, Any]) -> None:
            at = next((i for i, s in enumerate(stages) if s.name == name), None)
            if at is None:
                order = STAGES.index(name)
                at = next((i for i, s in enumerate(stages) if STAGES.index(s.name) > order), len(stages))
                stages.insert(at, Stage(name, dict(options)))
            else:
                stages[at] = Stage(name, {**stages[at].options, **options})

        if method_options:
            put("choose", method_options)
        if cut:
            put("cut", cut)
        if refit:
            put("refit", {})
        plan = tuple(schedule) if schedule is not None else self.schedule
        if recover and recover.get("recover_steps") == 0:  # no recovery: the stage and its options go
            stages = [s for s in stages if s.name != "recover"]
            recover = {k: None for k in RECOVER_FIELDS}
        elif recover:
            put("recover", recover)
        if recover:
            plan = tuple(
                replace(
                    case,
                    rounds=tuple(
                        replace(r, recovery={k: v for k, v in r.recovery.items() if k not in recover})
                        for r in case.rounds
                    ),
                )
                for case in plan
            )
        return replace(
            self,
            stages=tuple(stages),
            data={**self.data, **(data or {})},
            budget=dict(budget) if budget else self.budget,
            seed=self.seed if seed is None else seed,
            schedule=plan,
        )

    def to_dict(self) -> dict[str, Any]:
        """The recipe as its YAML or JSON file holds it (``from_dict`` reads it back)."""
        out: dict[str, Any] = {"name": self.name}
        if self.about:
            out["about"] = self.about
        if self.default_for:
            out["default_for"] = self.default_for
        out["stages"] = [{s.name: dict(s.options)} for s in self.stages]
        for key in ("data", "budget"):
            if getattr(self, key):
                out[key] = dict(getattr(self, key))
        if self.seed is not None:
            out["seed"] = self.seed
        if self.schedule:
            out["schedule"] = [
                {
                    **({"below": _share_text(case.below)} if case.below is not None else {}),
                    "rounds": [{"keep": _keep_text(r.keep), **r.recovery} for r in case.rounds],
                }
                for case in self.schedule
            ]
        if self.measured:
            out["measured"] = [dict(m) for m in self.measured]
        return out


def from_dict(raw: Any, where: str) -> Recipe:
    """A recipe from its YAML or JSON form, every key and value checked (``where`` names the recipe in the
    messages): the stages and their order, each option a declared one of its stage with a value its declaration
    allows, the schedule's shares and rounds; nothing larger or deeper than a recipe can be
    (:func:`headcut.recipes.limits.check_size`)."""
    check_size(raw, where)
    mapping = _mapping(raw, where)
    unknown = [k for k in mapping if k not in KEYS]
    if unknown:
        raise HeadcutValueError(f"{where}: unknown key {unknown[0]!r}; a recipe has {', '.join(KEYS)}")
    name = mapping.get("name")
    if not isinstance(name, str) or not name.strip():
        raise HeadcutValueError(f"{where}: 'name' must be a non-empty string")
    if not name.isprintable():
        raise HeadcutValueError(f"{where}: 'name' must be printable text (no control characters or line ends)")
    about = mapping.get("about", "")
    if not isinstance(about, str):
        raise HeadcutValueError(f"{where}: 'about' must be a string")
    default_for = mapping.get("default_for")
    if default_for is not None and default_for not in KINDS:
        raise HeadcutValueError(f"{where}: 'default_for' must be one of {', '.join(KINDS)}")
    stages = _stages(mapping.get("stages"), where)
    data = _options(mapping.get("data", {}), DATA_FIELDS, f"{where}, data")
    _check(DataConfig(path="-", **data), data, f"{where}, data")
    budget = _options(mapping.get("budget", {}), BUDGET_FIELDS, f"{where}, budget")
    if budget:
        _check(PruneConfig(**budget), budget, f"{where}, budget")
        if "keep" in budget and "sparsity" in budget:
            raise HeadcutValueError(f"{where}, budget: give keep or sparsity, not both")
        given = [k for k in ("keep", "sparsity", "max_drop", "kv_budget", "target_speedup") if k in budget]
        if len(given) > 1 and given != ["keep", "max_drop"] and given != ["sparsity", "max_drop"]:
            raise HeadcutValueError(f"{where}, budget: give one of {', '.join(given)}")
        if "context" in budget and not {"kv_budget", "target_speedup"} & set(budget):
            raise HeadcutValueError(f"{where}, budget: context is where kv_budget or target_speedup is counted")
    seed = mapping.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise HeadcutValueError(f"{where}: 'seed' must be an integer >= 0")
    schedule = _schedule(mapping.get("schedule", []), where)
    measured = mapping.get("measured", [])
    if not isinstance(measured, list) or not all(isinstance(m, dict) for m in measured):
        raise HeadcutValueError(f"{where}: 'measured' must be a list of mappings")
    recipe = Recipe(
        name=name.strip(),
        stages=stages,
        about=about,
        default_for=default_for,
        data=data,
        budget=budget,
        seed=seed,
        schedule=schedule,
        measured=tuple(measured),
    )
    if recipe.rounds_vary and METHODS[recipe.method].kind != "score":
        scored = ", ".join(m.name for m in METHODS.values() if m.kind == "score")
        raise HeadcutValueError(
            f"{where}: its schedule cuts in rounds, each scored on the model the one before left: the score-based "
            f"methods ({scored}) do that, not {recipe.method}"
        )
    return recipe


def _mapping(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) for k in raw):
        raise HeadcutValueError(f"{where}: a recipe is a mapping of names to values, got {type(raw).__name__}")
    return dict(raw)


def _options(raw: Any, allowed: Sequence[str], where: str) -> dict[str, Any]:
    """``raw``: a mapping of names in ``allowed`` (the message lists them)."""
    if raw is None:
        return {}
    options = _mapping(raw, where)
    for key in options:
        if key not in allowed:
            listed = ", ".join(allowed) if allowed else "none"
            raise HeadcutValueError(f"{where}: unknown option {key!r}; its options: {listed}")
    return options


def _check(obj: Any, given: Mapping[str, Any], where: str) -> None:
    """The declarations' checks (kind, choices, range) of the fields ``given`` on ``obj``."""
    try:
        check_fields(obj, tuple(given))
    except OptionError as exc:
        raise HeadcutValueError(f"{where}: {exc.render()}") from None


def _stages(raw: Any, where: str) -> tuple[Stage, ...]:
    if not isinstance(raw, list) or not raw:
        raise HeadcutValueError(f"{where}: 'stages' must be a list of stages ({', '.join(STAGES)}), in that order")
    stages: list[Stage] = []
    for item in raw:
        entry = {item: {}} if isinstance(item, str) else item
        if not isinstance(entry, Mapping) or len(entry) != 1:
            raise HeadcutValueError(f"{where}: each stage is one name with its options, e.g. '- recover: {{...}}'")
        ((name, options),) = entry.items()
        if name not in STAGES:
            raise HeadcutValueError(f"{where}: unknown stage {name!r}; the stages: {', '.join(STAGES)}")
        if any(s.name == name for s in stages):
            raise HeadcutValueError(f"{where}: stage {name} is given twice")
        if stages and STAGES.index(name) < STAGES.index(stages[-1].name):
            raise HeadcutValueError(f"{where}: the stages run in the order {', '.join(STAGES)}; {name} is out of it")
        stages.append(Stage(name, _stage_options(name, options, f"{where}, stage {name}")))
    missing = [n for n in REQUIRED if all(s.name != n for s in stages)]
    if missing:
        raise HeadcutValueError(
            f"{where}: every recipe has the stages {' and '.join(REQUIRED)}; {missing[0]} is missing"
        )
    return tuple(stages)


def _stage_options(name: str, raw: Any, where: str) -> dict[str, Any]:
    if name == "choose":
        options = _mapping(raw if raw is not None else {}, where)
        method = options.get("method")
        if not isinstance(method, str) or method not in METHODS:
            raise HeadcutValueError(f"{where}: 'method' must name a method: {', '.join(METHODS)}")
        declared = {s.name: s for s in static_specs(METHODS[method].options)}
        _options({k: v for k, v in options.items() if k != "method"}, tuple(declared), f"{where} ({method})")
        return options  # the values: the method's own check (make_options), when the recipe runs
    allowed = {"cut": CUT_FIELDS, "recover": RECOVER_FIELDS, "refit": ()}[name]
    options = _options(raw, allowed, where)
    if name == "cut":
        _check(PruneConfig(**options), options, where)
    if name == "recover":
        _check(RecoveryConfig(**options), options, where)
    return options


def _share(raw: Any, where: str) -> Fraction:
    """A share of the model's heads: ``a/b`` or a number in (0, 1)."""
    try:
        share = Fraction(raw) if isinstance(raw, str) else Fraction(str(raw)) if isinstance(raw, float) else None
    except (ValueError, ZeroDivisionError):
        share = None
    if share is None or not 0 < share < 1:
        raise HeadcutValueError(f"{where}: a share of the model's heads is a fraction a/b or a number in (0, 1)")
    return share


def _keep(raw: Any, where: str) -> int | Fraction | None:
    if raw == BUDGET:
        return None
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 1:
            raise HeadcutValueError(f"{where}: keep must be at least 1 head")
        return raw
    return _share(raw, f"{where}, keep")


def _schedule(raw: Any, where: str) -> tuple[Case, ...]:
    if not isinstance(raw, list):
        raise HeadcutValueError(f"{where}: 'schedule' must be a list of cases (each: below, rounds)")
    cases = []
    for i, item in enumerate(raw):
        at = f"{where}, schedule case {i + 1}"
        case = _options(item, ("below", "rounds"), at)
        below = _share(case["below"], f"{at}, below") if case.get("below") is not None else None
        rounds_raw = case.get("rounds")
        if not isinstance(rounds_raw, list) or not rounds_raw:
            raise HeadcutValueError(f"{at}: 'rounds' must be a list of rounds (each: keep, and recovery options)")
        rounds = []
        for j, r in enumerate(rounds_raw):
            rat = f"{at}, round {j + 1}"
            options = _options(r, ("keep", *RECOVER_FIELDS), rat)
            if "keep" not in options:
                raise HeadcutValueError(f"{rat}: 'keep' is missing (heads, a share a/b, or {BUDGET})")
            recovery = {k: v for k, v in options.items() if k != "keep"}
            _check(RecoveryConfig(**recovery), recovery, rat)
            rounds.append(RoundPlan(_keep(options["keep"], rat), recovery))
        if rounds[-1].keep is not None or any(r.keep is None for r in rounds[:-1]):
            raise HeadcutValueError(f"{at}: the last round, and only it, keeps the budget (keep: {BUDGET})")
        cases.append(Case(tuple(rounds), below))
    return tuple(cases)


def _share_text(share: Fraction) -> str:
    return f"{share.numerator}/{share.denominator}"


def _keep_text(keep: int | Fraction | None) -> int | str:
    if keep is None:
        return BUDGET
    return _share_text(keep) if isinstance(keep, Fraction) else keep
