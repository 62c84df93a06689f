"""The Python API's argument checks, applied by :func:`checked` before a public function does anything (reads,
loads or writes): every argument of :func:`headcut.prune`, ``score``, ``finetune``, ``evaluate``, ``export``,
``bench``, ``info``, ``load`` and ``save`` (and of the results' ``save`` / ``write_trajectory``) is checked, in the
signature's order, by

* the declaration of the configuration field of the same name, when the function builds that configuration
  (:data:`BUILDS`: ``prune(keep=...)`` is :class:`~headcut.config.PruneConfig`'s ``keep``), and the fields of its
  ``**`` parameter's class (:data:`SPREAD`: a method's options, the bench settings); see
  :mod:`headcut.arguments.fields`. A field a configuration declares later is checked with no change here;
* else its rule in :data:`RULES`: the kinds no declaration states (:mod:`headcut.arguments.kinds`: models, data,
  masks, output paths, a tokenizer, formats ...), and the few fields the API takes in more forms than the field
  (:data:`WIDER`);

then the checks that read several arguments (:data:`AFTER`). The refusals name the keyword the caller passed. The
choices, ranges and combinations of the configurations' fields are checked once, further in, where the request
is checked (the configurations' ``validate``), before any work.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .. import catalog
from ..catalog import method_entry, scorer_entry
from ..config import BenchConfig, FinetuneConfig, LayerwiseConfig, PruneConfig, ScoreConfig
from ..config.prune import Budget, ScheduleOptions
from ..data.config import DataConfig
from ..errors import HeadcutTypeError, HeadcutValueError
from ..files.space import file_error
from .fields import bench_config, check_given, data_options, field_rules, spec_rules
from .kinds import (
    Rule,
    a_dict,
    a_list,
    anything,
    bool_or_path,
    boolean,
    checkpoint,
    checkpoint_dir,
    checkpoint_form,
    choice,
    data,
    dtype,
    formats,
    function,
    head_counts,
    mask,
    model,
    model_list,
    optional,
    output,
    output_file,
    path,
    recipe,
    registered,
    reporter,
    size,
    strings,
    text,
    tokenizer,
    transformers_model,
)

F = TypeVar("F", bound=Callable[..., Any])


def _catalog(name: str) -> Callable[[], Any]:
    def read() -> Any:

        return getattr(catalog, name)

    return read


def _method(value: str) -> Any:

    return method_entry(value)


def _scorer(value: str) -> Any:

    return scorer_entry(value)


#: function -> the configurations it builds from its keywords: a keyword that names a field of one of them (the
#: first that has it) is checked by the field's declaration
BUILDS: dict[str, tuple[type, ...]] = {
    "prune": (Budget, ScheduleOptions, LayerwiseConfig, DataConfig),
    "score": (ScoreConfig, DataConfig),
    "finetune": (FinetuneConfig, DataConfig),
    "evaluate": (DataConfig,),
    "export": (PruneConfig,),
}


def _method_options(given: Mapping[str, Any]) -> type | None:
    """The method's options class (None without a method: a recipe's method, whose options its run checks)."""
    from ..pruning import get_method  # the method's module (torch) only when its options are checked

    return get_method(given["method"]).Options if given.get("method") is not None else None


def _bench_settings(given: Mapping[str, Any]) -> type | None:

    return BenchConfig


#: function -> its ``**`` parameter and the configuration class whose fields it takes (from the other arguments)
SPREAD: dict[str, tuple[str, Callable[[Mapping[str, Any]], type | None]]] = {
    "prune": ("options", _method_options),
    "bench": ("settings", _bench_settings),
}

_MODEL_IN = {"task": optional(choice(_catalog("TASKS"))), "allow_pickle": boolean, "trust_remote_code": boolean}
_DATA_IN = {"tokenizer": optional(tokenizer), "data_options": optional(data_options), "progress": optional(reporter)}
_WRITES = {"formats": optional(formats), "gguf_type": text, "arguments": optional(a_dict)}
_TRAINS = {
    "device": optional(text),
    "checkpoint_dir": optional(checkpoint_dir),
    "resume": boolean,
    "restart": boolean,
    "eval_data": optional(data),
    "eval_split": text,
}

#: the keywords that name a field of a configuration the function builds but take more than the field: a method
#: or scorer name the registry knows, a trajectory that may be a .csv path, recovery data that may be rows or a
#: DataConfig, a memory size that may be a number of bytes, a schedule that may be a list of heads counts
WIDER = ("method", "scorer", "trajectory", "recover_data", "max_memory", "schedule")

#: function -> argument -> rule, for the arguments that are no field of a configuration in :data:`BUILDS`
#: (and :data:`WIDER`); tests/test_hostile_api.py checks every parameter is covered
RULES: dict[str, dict[str, Rule]] = {
    "prune": {
        "model": model,
        "method": optional(registered(_method)),
        "recipe": optional(recipe),
        "data": optional(data),
        "trajectory": bool_or_path,
        "recover_data": optional(data),
        "max_memory": optional(size),
        "schedule": optional(head_counts),
        "out": optional(output),
        "force": boolean,
        **_MODEL_IN,
        **_DATA_IN,
        **_WRITES,
        **_TRAINS,
    },
    "score": {"model": model, "scorer": registered(_scorer), "data": optional(data), **_MODEL_IN, **_DATA_IN},
    "finetune": {
        "model": model,
        "data": data,
        "teacher": optional(model),
        "labels": optional(strings),
        "out": optional(output),
        "force": boolean,
        **_MODEL_IN,
        **_DATA_IN,
        **_WRITES,
        **_TRAINS,
    },
    # options: EvalOptions' fields, also in the forms eval_options takes (windows=2048), checked there first
    "evaluate": {"model": model, "data": optional(data), "options": anything, **_MODEL_IN, **_DATA_IN},
    "export": {"model": model, "mask": mask, "out": optional(output), "force": boolean, **_MODEL_IN, **_WRITES},
    "bench": {
        "models": model_list,
        "config": optional(bench_config),
        "names": optional(strings),
        "progress": optional(reporter),
        "update_cards": boolean,
        "on_warning": optional(function),
        **_MODEL_IN,
    },
    "info": {"model": model, **_MODEL_IN},
    "load": {
        "path": checkpoint,
        "dtype": optional(dtype),
        "device": optional(text),
        "attn_implementation": optional(text),
        "notes": optional(a_list),
        "labels": optional(strings),
        **_MODEL_IN,
    },
    "save": {
        "model": transformers_model,
        "out": output,
        "source": optional(path),
        "force": boolean,
        "extra": optional(function),
        "trust_remote_code": boolean,
        "form": optional(checkpoint_form),
    },
    "Written.save": {
        "self": anything,
        "out": output,
        "force": boolean,
        "formats": optional(formats),
        "gguf_type": optional(text),
    },
    "Pruned.write_trajectory": {"self": anything, "csv_path": output_file, "png": boolean, "force": boolean},
}


def bench_models(models: Any, names: Any) -> None:
    """``models`` (a non-empty list of models) and ``names`` (None, or one string per model): the checks of
    :func:`headcut.bench` and :func:`headcut.jobs.bench.run.bench`."""
    model_list("models", models)
    if names is not None:
        strings("names", names)
        if len(names) != len(models):
            raise HeadcutValueError(
                f"names must match models one to one: {len(names)} name(s) for {len(models)} model(s)"
            )


#: checks that read several arguments, after each argument's own
AFTER: dict[str, list[Callable[[Mapping[str, Any]], None]]] = {
    "bench": [lambda given: bench_models(given.get("models"), given.get("names"))],
}


def declared(function: str) -> dict[str, Rule]:
    """The rules of ``function``'s keywords that name a field of a configuration it builds (:data:`BUILDS`; the
    first configuration that has the field) or, for ``prune``, an option of a stage kind (every kind registered
    now, :data:`headcut.catalog.STAGES`), but for those :data:`RULES` has."""
    rules: dict[str, Rule] = {}
    if function == "prune":
        from ..recipes.recipe import stage_options

        for kind in catalog.STAGES:
            rules.update(spec_rules(stage_options(kind)))
    rules.update(_built(function))
    return {name: rule for name, rule in rules.items() if name not in RULES[function]}


@functools.cache
def _built(function: str) -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for cls in reversed(BUILDS.get(function, ())):
        rules.update(field_rules(cls))
    return rules


def check(function: str, given: Mapping[str, Any]) -> None:
    """Check ``function``'s arguments ``given`` (name -> value, in the signature's order)."""
    rules = {**declared(function), **RULES[function]}
    spread, settings_of = SPREAD.get(function, ("", None))
    for name, value in given.items():
        if name == spread and settings_of is not None and value:
            settings = settings_of(given)
            if settings is not None:
                check_given(settings, value, lambda key: key)
            continue
        rule = rules.get(name)
        if rule is not None:
            rule(name, value)
    for after in AFTER.get(function, []):
        after(given)


def checked(function: str) -> Callable[[F], F]:
    """Decorate a public function: its arguments are checked (:func:`check`) before it runs, and a call that does
    not fit its signature (a missing or unknown argument) is a HeadcutTypeError."""

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise HeadcutTypeError(f"{function.split('.')[-1]}(): {exc}") from None
            bound.apply_defaults()
            check(function, bound.arguments)
            try:
                return fn(*args, **kwargs)
            except OSError as exc:  # a file the checks did not foresee: a headcut error naming it, still
                error = file_error(exc)
                if error is None:
                    raise
                raise HeadcutValueError(Exception.__str__(error)) from None

        return wrapper  # type: ignore[return-value]

    return decorate
