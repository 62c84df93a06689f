"""The Python API: the README's example runs as written, the command line and the API give the
same result for the same arguments, objects are accepted where paths are, and every registered method
implements the one method interface."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import torch
from helpers import cls_rows, make_tokenizer, run, write_rows

import headcut
from headcut.catalog import METHODS, SCORERS, method_entry, resolve
from headcut.errors import HeadcutError
from headcut.pruning import get_method, make_options

ROOT = Path(__file__).resolve().parent.parent
#: report fields that differ between two runs of the same job (time, where it was written, how it was called)
VOLATILE = {"seconds", "prune_seconds", "train_seconds", "out", "arguments", "versions"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """model/ (a tiny BERT classifier with 24 heads: 2 layers x 12), train.csv, dev.csv and cal.csv."""
    import transformers as T

    d = tmp_path_factory.mktemp("api")
    config = T.BertConfig(
        vocab_size=99,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=12,
        intermediate_size=37,
        num_labels=3,
        pad_token_id=0,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    T.BertForSequenceClassification(config).save_pretrained(d / "model")
    make_tokenizer().save_pretrained(d / "model")
    write_rows(d / "train.csv", cls_rows(64, seed=0))
    write_rows(d / "dev.csv", cls_rows(24, seed=1))
    write_rows(d / "cal.csv", cls_rows(32, seed=2))
    return d


def _stable(report: dict) -> dict:
    out = {k: v for k, v in report.items() if k not in VOLATILE}
    if isinstance(out.get("size_bytes"), dict):
        out["size_bytes"] = {k: v for k, v in out["size_bytes"].items() if k != "after"}
    if isinstance(out.get("training"), dict):
        out["training"] = {k: v for k, v in out["training"].items() if k != "seconds"}
    return out


def test_readme_api_example_runs_as_written(workdir, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)\n```", section, re.S).group(1)
    monkeypatch.chdir(workdir)
    namespace: dict = {}
    exec(compile(code, "README.md (Python API)", "exec"), namespace)
    res = namespace["res"]
    assert res.mask.total() == 16 and headcut.info(res.model).total_heads == 16
    assert (workdir / "slim" / "headcut-report.json").is_file()
    assert json.loads((workdir / "slim" / "headcut-report.json").read_text())["heads"]["after"] == 16


@pytest.mark.parametrize(
    "method,extra",
    [
        ("michel", {}),
        ("greedy-gnorm", {"step": 4}),
        ("pass", {"max_steps": 6, "lambda_step": 2}),
    ],
)
def test_cli_and_api_give_the_same_result(workdir, tmp_path, method, extra):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]
    data = "cal.csv" if method != "pass" else "train.csv"
    cli = run(
        "prune",
        workdir / "model",
        "--method",
        method,
        "--keep",
        "12",
        "--data",
        workdir / data,
        "--eval-data",
        workdir / "dev.csv",
        "--out",
        tmp_path / "cli",
        "--json",
        "-",
        *flags,
    )
    assert cli.exit_code == 0, cli.output
    api = headcut.prune(
        str(workdir / "model"), method, keep=12, data=str(workdir / data), eval_data=str(workdir / "dev.csv"), **extra
    )
    api.save(tmp_path / "api")
    from_cli = json.loads(cli.stdout)
    assert from_cli["mask"] == api.report["mask"] == api.mask.to_json()
    assert _stable(from_cli) == _stable(json.loads((tmp_path / "api" / "headcut-report.json").read_text()))
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "api" / name).read_bytes()


def test_objects_are_accepted_where_paths_are(workdir):
    import datasets

    rows = [dict(r) for r in cls_rows(32, seed=2)]
    by_path = headcut.prune(str(workdir / "model"), "gradient", keep=12, data=str(workdir / "cal.csv"))
    model = headcut.load(workdir / "model")
    by_object = headcut.prune(
        model, "gradient", keep=12, data=datasets.Dataset.from_list(rows), tokenizer=make_tokenizer()
    )
    assert by_object.model is model and by_object.mask.keep == by_path.mask.keep
    scores = headcut.score(model, "magnitude")
    assert set(scores.scores.blocks) == {"self.0", "self.1"}
    # a loaded model remembers its folder (its tokenizer comes from there); one built in memory needs tokenizer=
    by_model = headcut.evaluate(headcut.load(workdir / "model"), str(workdir / "dev.csv"))
    assert by_model.value == headcut.evaluate(str(workdir / "model"), str(workdir / "dev.csv")).value
    from helpers import make_model

    with pytest.raises(HeadcutError, match="tokenizer="):
        headcut.evaluate(make_model("bert", "BertForSequenceClassification"), str(workdir / "dev.csv"))


def test_finetune_evaluate_export_and_bench_mirror_their_commands(workdir, tmp_path):
    tuned = headcut.finetune(
        str(workdir / "model"),
        str(workdir / "train.csv"),
        eval_data=str(workdir / "dev.csv"),
        max_steps=3,
        data_options={"batch_size": 8},
    )
    tuned.save(tmp_path / "tuned")
    cli = run(
        "finetune",
        workdir / "model",
        "--data",
        workdir / "train.csv",
        "--eval-data",
        workdir / "dev.csv",
        "--max-steps",
        "3",
        "--batch-size",
        "8",
        "--out",
        tmp_path / "tuned-cli",
        "--json",
        "-",
    )
    assert cli.exit_code == 0, cli.output
    assert _stable(json.loads(cli.stdout)) == _stable(tuned.report)
    ev = headcut.evaluate(str(tmp_path / "tuned"), str(workdir / "dev.csv"))
    assert ev.value == pytest.approx(tuned.report["metric"]["after"])
    exported = headcut.export(str(workdir / "model"), {"drop": {"self.0": [0, 1]}})
    exported.save(tmp_path / "cut")
    assert headcut.info(str(tmp_path / "cut")).total_heads == 22
    timed = headcut.bench(
        [str(workdir / "model"), str(tmp_path / "cut")], runs=1, warmup=0, batch_size=1, seq_len=8, gen_tokens=0
    )
    assert [r.heads for r in timed.results] == [24, 22] and timed.results[1].speedup is not None
    with pytest.raises(HeadcutError, match="unknown bench setting"):
        headcut.bench([str(workdir / "model")], sped=2)


@pytest.mark.parametrize("name", list(METHODS))
def test_every_registered_method_implements_the_interface(name):
    entry = method_entry(name)
    method = get_method(name)
    assert method.name == name and method.entry == entry
    assert dataclasses.is_dataclass(method.Options)
    options = make_options(method, None)
    assert isinstance(options, method.Options)
    for attr in ("check", "step", "run"):
        assert callable(getattr(method, attr))
    assert entry.data in ("none", "calibration", "training") and entry.citation
    with pytest.raises(HeadcutError, match=f"nope does not apply to {re.escape(name)}"):
        make_options(method, {"nope": 1})


@pytest.mark.parametrize("name", list(SCORERS))
def test_every_registered_scorer_resolves(name):
    scorer = resolve(SCORERS[name].target)
    assert scorer.name == name and scorer.needs_data == SCORERS[name].needs_data


def test_package_import_is_light():
    code = "import sys, headcut; headcut.__version__; print('torch' in sys.modules)"
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
