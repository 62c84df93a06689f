"""A recipe: a prune job's stages as data, with the schedule of its rounds.

A recipe names the stages every round runs, in their order (the kinds of :data:`headcut.catalog.STAGES`:
``choose`` the heads with a method and its options, ``cut`` them with the cut's options, ``refit`` the kept heads'
output projections, ``recover`` by distilled fine-tuning with its options, and any kind registered besides), its
budget, how the data is read, and its schedule: the rounds a cut runs in, each with the heads it leaves and the
stage options it sets for itself. Every option is one its owner declares (a stage kind, a method's options,
:class:`~headcut.config.prune.Budget`, the data options a recipe holds of :class:`~headcut.data.DataConfig`) under
the Python keyword of ``headcut.prune``; a recipe is written as YAML or JSON (:meth:`Recipe.to_dict`,
:func:`headcut.recipes.files.read_recipe`)::

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

from ..catalog import METHODS, REQUIRED_STAGES, STAGES, method_entry
from ..config.prune import Budget, check_budget_rules, check_rounds
from ..data.config import DataConfig
from ..errors import HeadcutValueError
from ..options import OptionError, OptionSpec, check_value, specs, static_specs
from .limits import check_size

#: the budget's options (:class:`~headcut.config.prune.Budget`) and the data options a recipe holds
BUDGET_FIELDS = tuple(s.name for s in specs(Budget))
DATA_FIELDS = tuple(s.name for s in specs(DataConfig) if s.meta.recipe)
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
    budget) and the stage ``options`` it sets for itself (over the stages' own, e.g. its ``recover_steps``)."""

    keep: int | Fraction | None
    options: Mapping[str, Any] = field(default_factory=dict)


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

    def options_of(self, kind: str) -> dict[str, Any]:
        """The options the recipe gives stage ``kind`` ({} where it has no such stage)."""
        stage = self.stage(kind)
        return dict(stage.options) if stage else {}

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
        options: Mapping[str, Any] | None = None,
        data: Mapping[str, Any] | None = None,
        budget: Mapping[str, Any] | None = None,
        seed: int | None = None,
        schedule: Sequence[Case] | None = None,
    ) -> Recipe:
        """This recipe with options given on top (a command's flags, ``prune``'s keywords): each of ``options`` goes
        to the stage kind that declares it (:func:`option_owners`; any other is the method's, the ``choose``
        stage's), adding that stage where the recipe has none (after the kinds it runs after), and holds in every
        round (the rounds' own values of it are dropped); a stage's switch given false or 0 drops the stage and the
        rounds' values of its options. Then the data options, a whole ``budget`` (replacing the recipe's), the
        ``seed``, a ``schedule`` (replacing the recipe's)."""
        owners = option_owners()
        by_kind: dict[str, dict[str, Any]] = {}
        for name, value in (options or {}).items():
            by_kind.setdefault(owners.get(name, "choose"), {})[name] = value
        stages = list(self.stages)
        plan = tuple(schedule) if schedule is not None else self.schedule
        for kind, given in by_kind.items():
            switch = STAGES[kind].switch
            if switch is not None and switch in given and not given[switch]:  # the stage and its options go
                stages = [s for s in stages if s.name != kind]
                gone = {spec.name for spec in stage_options(kind)}
            else:
                defaults = {spec.name: spec.default for spec in stage_options(kind)}
                kept = {k: v for k, v in given.items() if not (k == switch and v == defaults.get(k))}
                stages = _put(stages, kind, kept)
                gone = set(given)
            plan = tuple(
                replace(
                    case,
                    rounds=tuple(
                        replace(r, options={k: v for k, v in r.options.items() if k not in gone}) for r in case.rounds
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
                    "rounds": [{"keep": _keep_text(r.keep), **r.options} for r in case.rounds],
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
    _check(specs(DataConfig), data, f"{where}, data")
    budget = _options(mapping.get("budget", {}), BUDGET_FIELDS, f"{where}, budget")
    if budget:
        _check(specs(Budget), budget, f"{where}, budget")
        try:
            check_budget_rules(Budget(**budget), method_entry(_method(stages)), required=False)
        except OptionError as exc:
            raise HeadcutValueError(f"{where}, budget: {exc}") from None
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
    if recipe.rounds_vary:
        try:
            check_rounds(METHODS[recipe.method], "its schedule cuts in rounds")
        except OptionError as exc:
            raise HeadcutValueError(f"{where}: {exc}") from None
    _round_options(recipe, where)
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


def _check(declared: Sequence[OptionSpec], given: Mapping[str, Any], where: str) -> None:
    """The declarations' checks (kind, choices, range) of the values ``given`` (names among ``declared``)."""
    by_name = {spec.name: spec for spec in declared}
    try:
        for name, value in given.items():
            check_value(by_name[name], value)
    except OptionError as exc:
        raise HeadcutValueError(f"{where}: {exc.render()}") from None


def stage_options(kind: str) -> list[OptionSpec]:
    """The declared options of stage kind ``kind`` (a built-in kind's read from its source, without importing it;
    the ``choose`` stage's ``method`` included: the method's own options are its options class's)."""
    target = STAGES[kind].target
    return static_specs(target) if isinstance(target, str) else specs(target)


def recipe_options(kind: str) -> list[OptionSpec]:
    """The options a recipe gives stage ``kind``: its declared ones but a boolean switch (a stage a recipe lists is
    on: the switch is how a flag or keyword adds it)."""
    switch = STAGES[kind].switch
    return [s for s in stage_options(kind) if not (s.name == switch and s.kind == "bool")]


def _round_options(recipe: Recipe, where: str) -> None:
    """A schedule's rounds set options of the recipe's own stages only."""
    owners = option_owners()
    for i, case in enumerate(recipe.schedule):
        for j, plan in enumerate(case.rounds):
            for name in plan.options:
                if recipe.stage(owners[name]) is None:
                    raise HeadcutValueError(
                        f"{where}, schedule case {i + 1}, round {j + 1}: {name} is an option of stage "
                        f"{owners[name]}, which this recipe does not have"
                    )


def option_owners() -> dict[str, str]:
    """Option name -> the stage kind that declares it (the ``choose`` stage's ``method`` aside)."""
    return {spec.name: kind for kind in STAGES if kind != "choose" for spec in stage_options(kind)}


def _method(stages: Sequence[Stage]) -> str:
    return str(next(s for s in stages if s.name == "choose").options["method"])


def _put(stages: list[Stage], kind: str, options: Mapping[str, Any]) -> list[Stage]:
    """``stages`` with ``options`` given to stage ``kind``, which is added where missing: before the first stage
    that runs after it, and after every stage it runs after."""
    at = next((i for i, s in enumerate(stages) if s.name == kind), None)
    if at is not None:
        stages[at] = Stage(kind, {**stages[at].options, **options})
        return stages
    after = STAGES[kind].after
    behind = [i + 1 for i, s in enumerate(stages) if s.name in after]
    followers = [i for i, s in enumerate(stages) if kind in STAGES[s.name].after]
    at = max(behind) if behind else min(followers) if followers else len(stages)
    stages.insert(at, Stage(kind, dict(options)))
    return stages


def _stages(raw: Any, where: str) -> tuple[Stage, ...]:
    if not isinstance(raw, list) or not raw:
        raise HeadcutValueError(f"{where}: 'stages' must be a list of stages ({', '.join(STAGES)}), in their order")
    stages: list[Stage] = []
    for item in raw:
        entry = {item: {}} if isinstance(item, str) else item
        if not isinstance(entry, Mapping) or len(entry) != 1:
            raise HeadcutValueError(f"{where}: each stage is one name with its options, e.g. '- recover: {{...}}'")
        ((name, options),) = entry.items()
        if not isinstance(name, str) or name not in STAGES:
            raise HeadcutValueError(f"{where}: unknown stage {name!r}; the stages: {', '.join(STAGES)}")
        if any(s.name == name for s in stages):
            raise HeadcutValueError(f"{where}: stage {name} is given twice")
        before = next((s.name for s in stages if name in STAGES[s.name].after), None)
        if before is not None:
            raise HeadcutValueError(f"{where}: stage {before} runs after {name}; {name} is out of it")
        stages.append(Stage(name, _stage_options(name, options, f"{where}, stage {name}")))
    missing = [n for n in REQUIRED_STAGES if all(s.name != n for s in stages)]
    if missing:
        raise HeadcutValueError(
            f"{where}: every recipe has the stages {' and '.join(REQUIRED_STAGES)}; {missing[0]} is missing"
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
    declared_options = recipe_options(name)
    options = _options(raw, tuple(s.name for s in declared_options), where)
    _check(declared_options, options, where)
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
    """A recipe's schedule: its cases, each round's ``keep`` and the stage options it sets (checked against the
    recipe's stages by :func:`_round_options`)."""
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
            declared = [spec for kind in STAGES if kind != "choose" for spec in recipe_options(kind)]
            options = _options(r, ("keep", *(spec.name for spec in declared)), rat)
            if "keep" not in options:
                raise HeadcutValueError(f"{rat}: 'keep' is missing (heads, a share a/b, or {BUDGET})")
            own = {k: v for k, v in options.items() if k != "keep"}
            _check(declared, own, rat)
            rounds.append(RoundPlan(_keep(options["keep"], rat), own))
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
