"""Every option is declared once (a field of its options dataclass) and reaches the command line, its help,
completion and the Python API with the same default; a bad request gets the same refusal from both, before
any model is loaded, naming the flag on the command line and the keyword in Python."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import cls_rows, one_line_error, run, save_tiny, write_rows

import headcut
import headcut.api
import headcut.jobs.prune.job
from headcut.catalog import METHODS, resolve
from headcut.errors import HeadcutError
from headcut.options import specs, static_specs
from headcut.pruning import get_method, make_options


@pytest.mark.parametrize("name", list(METHODS))
def test_declarations_read_from_source_match_the_classes(name):
    entry = METHODS[name]
    assert resolve(entry.options) is get_method(name).Options
    assert static_specs(entry.options) == specs(get_method(name).Options)


def _sample(spec):
    """A valid value of ``spec`` different from its default, as a flag argument and as a Python value."""
    if spec.kind == "bool":
        return [], True
    if spec.meta.choices:
        value = next(c for c in spec.meta.choices if c != spec.default)
        return [value], value
    if spec.kind == "int":
        value = max(int(spec.meta.low or 0), 1) + 2
        return [str(value)], value
    value = 0.25 if spec.meta.high is not None else 0.5
    return [str(value)], value


@pytest.mark.parametrize("name", list(METHODS))
def test_every_option_reaches_the_cli_and_the_api_with_the_same_default(name, monkeypatch, tmp_path):
    declared = [s for s in specs(get_method(name).Options) if s.meta.cli]
    options = make_options(get_method(name))  # the API's defaults: the declared ones
    for spec in declared:
        assert getattr(options, spec.name) == spec.default, spec.name
    shown = run("prune", "--method", name, "--help").stdout
    for spec in declared:
        assert spec.flag in shown, spec.flag
    seen = {}

    def fake_request(source, **kwargs):
        seen.update(kwargs["given"])  # the options the command line gives the request
        raise HeadcutError("stopped before any work")

    import headcut.jobs.prune.request

    monkeypatch.setattr(headcut.jobs.prune.request, "prune_request", fake_request)
    args = []
    expected = {}
    for spec in declared:
        if spec.name in ("epochs",) and any(s.name == "max_steps" for s in declared):
            continue  # one of epochs and max_steps
        flag_args, value = _sample(spec)
        args += [spec.flag, *flag_args]
        expected[spec.name] = value
    result = run("prune", tmp_path / "m", "--method", name, "--keep", 2, "--out", tmp_path / "o", *args)
    one_line_error(result, "stopped before any work")
    for key, value in expected.items():
        assert seen[key] == value, key


def _help(*args: str) -> str:
    """``headcut ARGS --help`` at 100 columns, off a terminal."""
    env = {**os.environ, "COLUMNS": "100"}
    command = [sys.executable, "-m", "headcut", *args, "--help"]
    return subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout


def test_method_help_is_short_and_scoped():
    text = _help("prune", "--method", "pass")
    # issue 69: under 100 lines at 100 columns, the options pass takes: its own in full, the shared ones by name
    assert len(text.splitlines()) < 100
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "--lambda-step" in text and "--episodes" not in text and "--reset-at" not in text
    for refused in ("--kv-budget", "--context", "--target-speedup", "--allocation", "--recipe", "--layerwise"):
        assert refused not in text, refused
    assert "--recover-steps" in text and "--refit" in text and "--keep" in text
    shared = text[text.index("Also the options every command shares") :]
    assert "--seq-len" in shared and "--format" in shared and "--text-col" in shared
    plain = _help("prune")
    assert "--lambda-step" not in plain and "headcut methods" in plain
    assert "--kv-budget" in plain and "--recipe" in plain and "Also the options" not in plain
    scored = _help("prune", "--method", "gnorm")
    assert "--kv-budget" in scored and "--layerwise" in scored  # the budget flags where they apply


def test_method_help_keeps_completing_the_shared_flags():
    env = {**os.environ, "COMP_WORDS": "headcut prune m --method pass --for", "COMP_CWORD": "5"}
    env["_HEADCUT_COMPLETE"] = "complete_bash"
    done = subprocess.run([sys.executable, "-m", "headcut"], capture_output=True, text=True, env=env)
    assert done.stdout.split() == ["--force", "--format"]


def test_completion_offers_the_method_options_without_torch():
    code = (
        "import os, sys\nos.environ.update(COMP_WORDS='headcut prune --method voita --lam', COMP_CWORD='4', "
        "_HEADCUT_COMPLETE='complete_bash')\nfrom headcut.cli import main\ntry:\n    main()\nexcept SystemExit:\n"
        "    pass\nprint('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["--lambda", "--lambda-trials"]
    assert done.stderr.strip().endswith("NO-TORCH")


def test_methods_command_lists_and_describes():
    listed = run("methods")
    assert listed.exit_code == 0 and all(name in listed.stdout for name in METHODS)
    one = run("methods", "voita", "--json", "-")
    assert one.exit_code == 0
    import json

    info = json.loads(one.stdout)
    flags = {o["keyword"]: o["flag"] for o in info["options"]}
    assert flags["lam"] == "--lambda" and info["paper"].startswith("Li, Cotterell & Sachan")
    one_line_error(run("methods", "nope"), "unknown method 'nope'")


# ---- the bad-request table ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("requests")
    model = save_tiny(root / "model", "bert", "BertForSequenceClassification")
    data = write_rows(root / "train.csv", cls_rows(12))
    dev = write_rows(root / "dev.csv", cls_rows(12, seed=1))
    return root, model, data, dev


#: (command-line arguments after MODEL, the same request in Python, what the refusal says (keyword form))
BAD = [
    (["--method", "gnorm", "--keep", "-1"], dict(method="gnorm", keep=-1), "{keep} must be an integer >= 0"),
    (
        ["--method", "gnorm", "--keep", "2", "--sparsity", "0.5"],
        dict(method="gnorm", keep=2, sparsity=0.5),
        "give one budget: {keep} or {sparsity}, not both",
    ),
    (["--method", "gnorm"], dict(method="gnorm"), "no budget: give {keep}, {sparsity} or {max_drop}"),
    (["--method", "gnorm", "--sparsity", "1.5"], dict(method="gnorm", sparsity=1.5), "{sparsity} must be in [0, 1]"),
    (
        ["--method", "michel", "--max-drop", "0.1", "DATA"],
        dict(method="michel", max_drop=0.1, data="DATA"),
        "{max_drop} needs {eval_data}",
    ),
    (
        ["--method", "voita", "--keep", "2", "--lambda", "-1", "DATA"],
        dict(method="voita", keep=2, lam=-1.0, data="DATA"),
        "{lam} must be >= 0 and finite",
    ),
    (
        ["--method", "gnorm", "--keep", "2", "--lambda", "0.1", "DATA"],
        dict(method="gnorm", keep=2, lam=0.1, data="DATA"),
        "{lam} does not apply to gnorm",
    ),
    (
        ["--method", "gnorm", "--keep", "2", "--step", "2", "--rounds", "2", "DATA"],
        dict(method="gnorm", keep=2, step=2, rounds=2, data="DATA"),
        "{step} and {rounds} both set",
    ),
    (
        ["--method", "pass", "--keep", "2", "--device", "cuda:x", "DATA"],
        dict(method="pass", keep=2, device="cuda:x", data="DATA"),
        "unknown {device} 'cuda:x'",
    ),
    (
        ["--method", "pass", "--keep", "2", "--device", "cuda:3", "DATA"],
        dict(method="pass", keep=2, device="cuda:3", data="DATA"),
        "{device} cuda:3:",
    ),
    (
        ["--method", "gnorm", "--keep", "2", "--device", "cpu", "DATA"],
        dict(method="gnorm", keep=2, device="cpu", data="DATA"),
        "{device} applies to the methods that train",
    ),
    (
        ["--method", "gnorm", "--keep", "2", "--resume", "DATA"],
        dict(method="gnorm", keep=2, resume=True, data="DATA"),
        "{resume} applies to the methods that keep checkpoints",
    ),
    (["--method", "pass", "--keep", "2"], dict(method="pass", keep=2), "method pass needs {data}"),
    (
        ["--method", "pass", "--keep", "2", "--mode", "sideways", "DATA"],
        dict(method="pass", keep=2, mode="sideways", data="DATA"),
        "unknown {mode} 'sideways'",
    ),
    (
        ["--method", "gnorm", "--keep", "2", "--trajectory", "t.txt", "DATA", "EVAL"],
        dict(method="gnorm", keep=2, trajectory="t.txt", data="DATA", eval_data="EVAL"),
        "{trajectory} must name a .csv",
    ),
    (
        ["--method", "gnorm", "--keep", "2", "DATA", "--out", "MODEL/inside"],
        dict(method="gnorm", keep=2, data="DATA", out="MODEL/inside"),
        "{out}",
    ),
]
FLAGS = {
    "keep": "--keep",
    "sparsity": "--sparsity",
    "max_drop": "--max-drop",
    "eval_data": "--eval-data",
    "lam": "--lambda",
    "step": "--step",
    "rounds": "--rounds",
    "device": "--device",
    "resume": "--resume",
    "data": "--data",
    "mode": "--mode",
    "trajectory": "--trajectory",
    "out": "--out",
}


@pytest.mark.parametrize("args,kwargs,says", BAD, ids=[" ".join(a[:4]) for a, _, _ in BAD])
def test_a_bad_request_gets_the_same_refusal_from_cli_and_python(folders, monkeypatch, args, kwargs, says):
    root, model, data, dev = folders
    where = {"DATA": str(data), "EVAL": str(dev), "MODEL": str(model)}

    def put(value):
        return re.sub("DATA|EVAL|MODEL", lambda m: where[m.group(0)], value) if isinstance(value, str) else value

    def no_loading(*a, **k):
        raise AssertionError("the request was not refused before loading the model")

    monkeypatch.setattr(headcut.jobs.prune.job, "load_model", no_loading)
    cli_args = []
    for a in args:
        if a in ("DATA", "EVAL"):
            cli_args += ["--data" if a == "DATA" else "--eval-data", where[a]]
        else:
            cli_args.append(put(a))
    if "--out" not in cli_args:
        cli_args += ["--out", str(root / "out")]
    cli_text = one_line_error(run("prune", model, *cli_args)).removeprefix("error: ")
    with pytest.raises(HeadcutError) as caught:
        headcut.prune(str(model), **{k: put(v) for k, v in kwargs.items()})
    py_text = str(caught.value)
    as_keywords = says.format(**{k: k for k in FLAGS})
    as_flags = says.format(**FLAGS)
    assert as_keywords in py_text, py_text
    assert as_flags in cli_text, cli_text
    assert caught.value.render(lambda n: FLAGS.get(n, "--" + n.replace("_", "-"))) == cli_text or "{out}" in says


def test_a_budget_the_model_cannot_meet_names_the_keyword_or_the_flag(folders):
    root, model, data, dev = folders
    with pytest.raises(HeadcutError) as caught:
        headcut.prune(str(model), "gnorm", keep=999, data=str(data))
    assert str(caught.value).startswith("keep 999 is more than the model's")
    cli = one_line_error(
        run("prune", model, "--method", "gnorm", "--keep", "999", "--data", data, "--out", root / "o999")
    )
    assert cli.startswith("error: --keep 999 is more than the model's")
    assert not (root / "o999").exists()


# ---- every command's declared flags come from their declarations -----------------------------------------


def _command_params(name, *args):
    """The click parameters of ``headcut NAME ARGS`` as --help sees them (a method's own with --method)."""
    import typer.main

    from headcut.cli import app

    command = typer.main.get_command(app).commands[name]
    ctx = command.make_context(name, [*map(str, args), "--help"], resilient_parsing=True)
    return [p for p in command.get_params(ctx) if p.param_type_name == "option" and p.name != "help"]


def _by_flag(params):
    return {flag: p for p in params for flag in [*p.opts, *p.secondary_opts]}


def _declared_help(spec):
    """The help text a declared option shows: its declaration's, then its default (see cli.common)."""
    from rich.markup import escape

    shown = spec.default_text()
    return escape(spec.help) + (f" Default: {escape(shown)}." if shown is not None else "")


def _assert_from_declaration(spec, param, where):
    assert param is not None, f"{where}: {spec.flag} is not offered"
    assert param.help == _declared_help(spec), f"{where}: {spec.flag}'s help drifted from its declaration"
    # None: not given, the library applies the declared default (which the help shows)
    assert param.default is None or param.default == spec.default, f"{where}: {spec.flag}'s default"
    assert param.metavar == spec.metavar or (spec.kind == "bool" and not param.metavar), f"{where}: {spec.flag}"


def _offered():
    """Which config classes each command offers on its command line (a method's options: with --method), each
    a class (every declared option) or (class, the fields it leaves out)."""
    from headcut.catalog import STAGES
    from headcut.cli.output import Reporting
    from headcut.config import (
        BenchConfig,
        Budget,
        CardOptions,
        DataSources,
        EvalOptions,
        FinetuneConfig,
        FinetuneInputs,
        LayerwiseConfig,
        MaskSource,
        ModelSource,
        OutputSettings,
        PlotOptions,
        RecipeChoice,
        RunSettings,
        ScheduleOptions,
        ScoreConfig,
        TrajectoryOptions,
    )
    from headcut.data.config import DataConfig
    from headcut.jobs.prune.stages import stage_class

    stages = [stage_class(kind) for kind in STAGES if kind != "choose"]  # every stage kind's options: prune's flags
    cut = stage_class("cut")

    shared = [Reporting, ModelSource]
    data_only = (DataSources, ("eval_data", "eval_split", "recover_data"))
    seed_only = (RunSettings, ("device", "resume"))
    return {
        "info": shared,
        "score": [ScoreConfig, PlotOptions, DataConfig, data_only, seed_only, *shared],
        "prune": [Budget, ScheduleOptions, RecipeChoice, LayerwiseConfig, TrajectoryOptions, DataConfig]
        + [*stages, DataSources]
        + [OutputSettings, RunSettings, *shared],
        "finetune": [
            FinetuneConfig,
            FinetuneInputs,
            DataConfig,
            (DataSources, ("recover_data",)),
            OutputSettings,
            RunSettings,
            *shared,
        ],
        "export": [
            MaskSource,
            (cut, tuple(s.name for s in specs(cut) if s.name != "gqa")),
            OutputSettings,
        ]
        + shared,  # prune's --gqa
        "eval": [EvalOptions, DataConfig, data_only, seed_only, *shared],
        "bench": [BenchConfig, CardOptions, seed_only, *shared],
        "methods": [(Reporting, ("quiet",))],
        "recipes": [(Reporting, ("quiet",))],
    }


def _offered_specs(command):
    """The declared options ``headcut COMMAND`` offers, as (class, spec)."""
    out = []
    for entry in _offered()[command]:
        cls, left_out = entry if isinstance(entry, tuple) else (entry, ())
        out += [(cls, s) for s in specs(cls) if s.meta.cli and s.name not in left_out]
    return out


def _offered_classes(command):
    return [entry[0] if isinstance(entry, tuple) else entry for entry in _offered()[command]]


def test_every_command_is_covered():
    import typer.main

    from headcut.cli import app

    assert set(typer.main.get_command(app).commands) == set(_offered())


def test_every_config_that_declares_options_is_offered_somewhere():
    import dataclasses

    import headcut.config

    offered = {klass for command in _offered() for cls in _offered_classes(command) for klass in cls.__mro__}
    offered |= {klass for entry in METHODS.values() for klass in resolve(entry.options).__mro__}
    for cls in vars(headcut.config).values():
        if (
            isinstance(cls, type)
            and dataclasses.is_dataclass(cls)
            and cls.__module__.startswith("headcut.config")
            and any(s.meta.cli for s in specs(cls))
        ):
            assert cls in offered, f"{cls.__name__} declares options no command offers (add it to _offered)"


@pytest.mark.parametrize("command", list(_offered()))
def test_every_declared_option_of_a_command_comes_from_its_declaration(command):
    by_flag = _by_flag(_command_params(command))
    for cls, spec in _offered_specs(command):
        _assert_from_declaration(spec, by_flag.get(spec.flag.split("/")[0]), f"{command} {cls.__name__}")


def _shared_classes():
    from headcut.cli.output import Reporting
    from headcut.config import DataSources, ModelSource, OutputSettings, RunSettings
    from headcut.data.config import DataConfig

    return [DataConfig, DataSources, ModelSource, OutputSettings, RunSettings, Reporting]


#: a flag of a shared declaration that a command takes from its own config instead, with another meaning:
#: (command, flag) -> the class that declares it there
OWN_MEANING = {
    ("bench", "--device"): "BenchConfig",  # the device the timing runs on (cpu by default), not a training device
    ("bench", "--batch-size"): "BenchConfig",  # the synthetic batch's size (8), not the data's batches
    ("bench", "--seq-len"): "BenchConfig",  # the synthetic inputs' length (and the prompt for generation)
    ("eval", "--device"): "EvalOptions",  # where the evaluation runs (default: where the model is)
}


@pytest.mark.parametrize("command", list(_offered()))
def test_a_shared_flag_has_one_declaration_in_every_command(command):
    """The data options and the shared flags (--seed, --json, --force, ...) come from one declaration each: the
    same help, metavar and default wherever they are offered (so --seed says the same in every command)."""
    by_flag = _by_flag(_command_params(command))
    for cls in _shared_classes():
        for spec in specs(cls):
            param = by_flag.get(spec.flag)
            if param is None or not spec.meta.cli:
                continue
            if (command, spec.flag) in OWN_MEANING:
                assert OWN_MEANING[command, spec.flag] in {c.__name__ for c in _offered_classes(command)}
                continue
            _assert_from_declaration(spec, param, f"{command} {cls.__name__}")


def test_the_shared_declarations_are_read_the_same_from_source():
    from headcut.cli.output import Reporting

    for cls in _shared_classes():
        assert static_specs(f"{cls.__module__}:{cls.__name__}") == specs(cls), cls.__name__
    assert [s.flag for s in specs(Reporting)] == ["--json", "--quiet"]


def test_the_data_options_keep_their_defaults():
    """DataConfig's declared defaults are what the commands have always used (the data options of score, prune,
    finetune and eval when not given)."""
    from headcut.data.config import DataConfig

    defaults = {s.name: s.default for s in specs(DataConfig) if s.meta.cli}
    assert defaults == {
        "split": "train",
        "text_col": None,
        "text_pair_col": None,
        "label_col": None,
        "source_col": None,
        "target_col": None,
        "max_examples": None,
        "seq_len": 128,
        "batch_size": 16,
        "data_format": None,
        "encoding": "utf-8",
    }


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_option_on_prune_comes_from_its_declaration(name):
    by_flag = _by_flag(_command_params("prune", "--method", name))
    for spec in specs(get_method(name).Options):
        if spec.meta.cli:
            _assert_from_declaration(spec, by_flag.get(spec.flag.split("/")[0]), f"prune --method {name}")


#: the flags each command still writes by hand, each with its reason; a new flag must be declared (a field with
#: option()), not added here
HAND_WRITTEN = {
    # required on the command line, and it decides which method options the command offers; PruneConfig.method's
    # Python default ("gradient") is not the command's, so a generated "Default: gradient." would be false
    "prune": ("--method",),
}


def _hand_written(command):
    declared = {s.flag.split("/")[0] for _, s in _offered_specs(command)}
    return sorted({p.opts[0] for p in _command_params(command)} - declared)


@pytest.mark.parametrize("command", list(_offered()))
def test_no_new_hand_written_flags(command):
    assert set(_hand_written(command)) <= set(HAND_WRITTEN.get(command, ())), (
        "declare the new flag with option() in its config class (headcut.options) instead of writing it by hand"
    )


@pytest.mark.parametrize("command", list(_offered()))
def test_the_hand_written_list_is_current(command):
    """A flag that gained a declaration leaves HAND_WRITTEN (the list says what is still typed by hand)."""
    assert set(_hand_written(command)) == set(HAND_WRITTEN.get(command, ()))


#: the API keywords whose default differs from their declaration's on purpose: (function, keyword) -> why
API_OWN_DEFAULT = {
    # None: the declared default (safetensors) as the API has always spelt it; a list of formats is also taken
    ("prune", "formats"): "None",
    ("finetune", "formats"): "None",
    ("export", "formats"): "None",
}


@pytest.mark.parametrize("function", ["prune", "score", "finetune", "evaluate", "export", "bench"])
def test_every_api_keyword_has_its_declarations_default(function):
    """A Python keyword that names a declared option (of the configs the function builds, or of the settings the
    commands share) defaults to the declaration's default: the command line and the API run alike when a flag or
    keyword is left out."""
    import inspect

    import headcut
    from headcut.arguments.table import BUILDS
    from headcut.config import DataSources, ModelSource, OutputSettings, RunSettings

    declared = {}
    for cls in (*BUILDS.get(function, ()), DataSources, ModelSource, OutputSettings, RunSettings):
        for spec in specs(cls):
            declared.setdefault(spec.name, spec)
    checked = 0
    for name, param in inspect.signature(getattr(headcut, function)).parameters.items():
        spec = declared.get(name)
        if spec is None or param.kind is inspect.Parameter.VAR_KEYWORD or (function, name) in API_OWN_DEFAULT:
            continue
        if param.default is inspect.Parameter.empty:
            continue  # a required keyword: the command line requires its flag too, or takes it as MODEL/--method
        assert param.default == spec.default, f"{function}({name}=...) defaults to {param.default!r}, its declaration"
        checked += 1
    assert checked, f"{function}: no keyword checked"
