"""``headcut bench`` on tiny random checkpoints: what it reports, not how fast anything is.

No timing is asserted (timings belong in benchmarks); FLOPs, parameters, heads and KV-cache bytes
are deterministic and checked exactly, against analytic values where they are simple."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers import make_model
from typer.testing import CliRunner

import headcut
from headcut.cli import app
from headcut.config import BenchConfig
from headcut.errors import HeadcutError
from headcut.jobs.bench.results import BenchResult, compare, report_json
from headcut.jobs.bench.rows import bench_model
from headcut.jobs.bench.run import ALL_MODELS, bench
from headcut.model.inputs import make_inputs
from headcut.model.measure import count_flops, time_rounds
from headcut.stats import paired_speedup, percentile, round_order

FAST = dict(batch_size=2, seq_len=8, runs=2, warmup=1, gen_tokens=4, gen_runs=1)
MODEL_KEYS = {
    "name",
    "architecture",
    "model_type",
    "dtype",
    "attn_implementation",
    "device",
    "threads",
    "inputs",
    "heads",
    "kv_heads",
    "params",
    "weights_bytes",
    "flops",
    "flops_by_op",
    "runs_ms",
    "median_ms",
    "p90_ms",
    "p25_ms",
    "p75_ms",
    "examples_per_s",
    "tokens_per_s",
    "peak_memory_bytes",
    "peak_memory_kind",
    "generation",
    "speedup",
    "flop_ratio",
    "notes",
    "runtime",
    "speedup_p25",
    "speedup_p75",
    "within_noise",
}
GEN_KEYS = {
    "new_tokens",
    "runs_ms",
    "median_ms",
    "p25_ms",
    "p75_ms",
    "tokens_per_s",
    "kv_cache_bytes",
    "kv_cache_positions",
    "kv_bytes_per_token",
    "cross_kv_cache_bytes",
    "cross_kv_cache_positions",
    "cross_kv_bytes_per_token",
    "speedup",
    "speedup_p25",
    "speedup_p75",
    "within_noise",
    "prefill_included",
    "bytes_per_token",
    "ideal_speedup",
}
# tiny Llama (helpers.make_model): 3 layers, hidden 48, 6 query heads and 2 KV heads of size 8
LLAMA = dict(layers=3, hidden=48, heads=6, kv_heads=2, head_dim=8, ffn=37, vocab=99)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    """Tiny BERT and Llama checkpoints, each also slimmed (layer 0 keeps a few heads) and emptied."""
    root = tmp_path_factory.mktemp("bench")
    out = {}
    for family, cls, keep in (
        ("bert", "BertForSequenceClassification", [0]),
        ("llama", "LlamaForCausalLM", [0, 1, 2]),  # one whole KV group of layer 0
    ):
        model = make_model(family, cls)
        out[family] = str(headcut.save(model, root / family))
        headcut.slim(model, {"keep": {"self.0": keep}})
        out[f"{family}-slim"] = str(headcut.save(model, root / f"{family}-slim"))
        headcut.slim(model, {"keep": {"self.0": []}})
        out[f"{family}-empty"] = str(headcut.save(model, root / f"{family}-empty"))
    return out


def llama_flops(batch: int, seq: int, heads: list[int], kv_heads: list[int]) -> int:
    """Analytic matmul FLOPs of one tiny-Llama forward (2 per multiply-add), per layer head counts."""
    h, d, f, v = LLAMA["hidden"], LLAMA["head_dim"], LLAMA["ffn"], LLAMA["vocab"]
    tokens = batch * seq
    total = 2 * tokens * h * v  # lm head
    for q, kv in zip(heads, kv_heads):
        total += 2 * tokens * h * q * d * 2  # q and o projections
        total += 2 * tokens * h * kv * d * 2  # k and v projections
        total += 2 * 2 * batch * q * seq * seq * d  # scores and weighted values
        total += 3 * 2 * tokens * h * f  # gate, up, down
    return total


def test_json_structure(ckpts):
    config = BenchConfig(**FAST)
    results = bench([ckpts["llama"], ckpts["bert"]], config)
    data = json.loads(json.dumps(report_json(results, config)))
    assert set(data) >= {"config", "device", "device_name", "torch", "transformers", "headcut", "warnings", "models"}
    assert data["config"]["runs"] == 2 and data["device"] == "cpu" and data["torch"] == torch.__version__
    assert data["config"]["interleave"] is True and data["schedule"] == "interleaved"
    llama, bert = data["models"]
    assert set(llama) == MODEL_KEYS and set(bert) == MODEL_KEYS
    assert set(llama["generation"]) == GEN_KEYS and bert["generation"] is None
    assert llama["name"] == ckpts["llama"] and llama["architecture"] == "LlamaForCausalLM"
    assert llama["inputs"] == {"input_ids": [2, 8], "attention_mask": [2, 8]}
    assert len(llama["runs_ms"]) == 2 and llama["generation"]["new_tokens"] == 4
    assert llama["peak_memory_kind"] in ("cpu_peak_rss_increase", "unavailable")
    assert llama["speedup"] == 1.0 and llama["flop_ratio"] == 1.0
    assert llama["heads"] == LLAMA["layers"] * LLAMA["heads"]
    assert llama["kv_heads"] == LLAMA["layers"] * LLAMA["kv_heads"]
    # the baseline has no interval of its own; the next row gets one from the two paired rounds
    assert llama["speedup_p25"] is None and llama["within_noise"] is None
    assert 0 < bert["speedup_p25"] <= bert["speedup_p75"] and isinstance(bert["within_noise"], bool)
    assert llama["generation"]["speedup_p25"] is None and llama["generation"]["within_noise"] is None
    # bytes read per new token: the weights once per step for the batch of 2, plus each sequence's cache at the
    # mean cached length of the 4 decoding steps (8 prompt + 4 new - 1 cached at the end)
    gen = llama["generation"]
    assert gen["prefill_included"] is True and gen["kv_cache_positions"] == 11
    assert gen["bytes_per_token"] == pytest.approx((llama["weights_bytes"] + 2 * gen["kv_bytes_per_token"] * 9) / 2)
    for m in data["models"]:
        assert m["median_ms"] > 0 and m["p90_ms"] > 0 and m["examples_per_s"] > 0
        assert m["p25_ms"] <= m["median_ms"] <= m["p75_ms"]
        assert m["tokens_per_s"] == pytest.approx(m["examples_per_s"] * 8)
        assert m["flops"] == sum(m["flops_by_op"].values()) > 0


def test_flop_ratio_against_itself_is_one(ckpts):
    a, b = bench([ckpts["bert"], ckpts["bert"]], BenchConfig(**FAST))
    assert a.flops == b.flops and a.params == b.params
    assert a.flop_ratio == b.flop_ratio == 1.0
    assert a.speedup == 1.0 and b.speedup is not None and b.speedup > 0


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_slimmed_has_fewer_flops_params_heads(ckpts, family):
    full, slim, empty = bench([ckpts[family], ckpts[f"{family}-slim"], ckpts[f"{family}-empty"]], BenchConfig(**FAST))
    assert full.flops > slim.flops > empty.flops
    assert full.params > slim.params > empty.params
    assert full.heads > slim.heads > empty.heads
    assert 1.0 < slim.flop_ratio < empty.flop_ratio
    assert slim.flop_ratio == full.flops / slim.flops
    if family == "llama":  # the ideal decode speed-up: the ratio of bytes read per new token
        assert full.generation.ideal_speedup == 1.0
        assert slim.generation.ideal_speedup == full.generation.bytes_per_token / slim.generation.bytes_per_token
        assert 1.0 < slim.generation.ideal_speedup < empty.generation.ideal_speedup


def test_llama_flops_are_the_analytic_count(ckpts):
    full, slim = bench([ckpts["llama"], ckpts["llama-slim"]], BenchConfig(**FAST))
    assert full.flops == llama_flops(2, 8, [6, 6, 6], [2, 2, 2])
    assert slim.flops == llama_flops(2, 8, [3, 6, 6], [1, 2, 2])


@pytest.mark.parametrize("family,cls", [("bert", "BertModel"), ("llama", "LlamaForCausalLM")])
def test_flops_same_with_eager_and_sdpa(family, cls):
    # CPU sdpa runs a fused kernel torch's counter does not know; headcut counts it like eager's matmuls
    counts = {}
    for impl in ("eager", "sdpa"):
        model = make_model(family, cls)
        model.set_attn_implementation(impl)
        counts[impl] = count_flops(model, make_inputs(model, BenchConfig(batch_size=2, seq_len=8)))[0]
    assert counts["eager"] == counts["sdpa"]


def test_kv_bytes_per_token_of_llama(ckpts):
    full, slim, empty = bench([ckpts["llama"], ckpts["llama-slim"], ckpts["llama-empty"]], BenchConfig(**FAST))
    fp32 = 4
    expected = LLAMA["layers"] * 2 * LLAMA["kv_heads"] * LLAMA["head_dim"] * fp32
    gen = full.generation
    assert gen.kv_bytes_per_token == expected == 384
    assert gen.kv_cache_positions == 8 + 4 - 1  # prompt + new tokens, the last one never fed back
    assert gen.kv_cache_bytes == expected * 2 * gen.kv_cache_positions
    assert gen.cross_kv_cache_bytes is None
    # layer 0 keeps one KV head
    assert slim.generation.kv_bytes_per_token == (1 + 2 + 2) * 2 * LLAMA["head_dim"] * fp32
    # layer 0 has no heads left: only the one-feature placeholder that keeps positions right
    assert empty.generation.kv_bytes_per_token < slim.generation.kv_bytes_per_token
    assert slim.generation.speedup is not None


def test_dtype_halves_kv_bytes(ckpts):
    (result,) = bench([ckpts["llama"]], BenchConfig(**FAST, dtype="bfloat16"))
    assert result.dtype == "bfloat16"
    assert result.generation.kv_bytes_per_token == 192
    assert result.flops == llama_flops(2, 8, [6, 6, 6], [2, 2, 2])  # FLOPs do not depend on the dtype


def test_encoder_decoder_reports_cross_cache():
    model = make_model("t5", "T5ForConditionalGeneration")  # 2 layers, 4 heads of size 8
    result = bench_model(model, BenchConfig(**FAST))
    assert result.inputs["decoder_input_ids"] == [2, 8]
    gen = result.generation
    assert gen.new_tokens == 4
    assert gen.kv_bytes_per_token == 2 * 2 * 4 * 8 * 4
    assert gen.cross_kv_cache_positions == 8
    assert gen.cross_kv_bytes_per_token == 2 * 2 * 4 * 8 * 4


def test_image_model_inputs():
    model = make_model("vit", "ViTForImageClassification")
    result = bench_model(model, BenchConfig(**FAST))
    assert result.inputs == {"pixel_values": [2, 3, 16, 16]}
    assert result.tokens_per_s is None and result.generation is None and result.flops > 0


def test_inputs_are_deterministic_and_avoid_special_tokens():
    model = make_model("llama", "LlamaForCausalLM")
    a = make_inputs(model, BenchConfig(batch_size=4, seq_len=64, seed=3))
    b = make_inputs(model, BenchConfig(batch_size=4, seq_len=64, seed=3))
    c = make_inputs(model, BenchConfig(batch_size=4, seq_len=64, seed=4))
    assert torch.equal(a["input_ids"], b["input_ids"]) and not torch.equal(a["input_ids"], c["input_ids"])
    assert not torch.isin(a["input_ids"], torch.tensor([0, 1, 2])).any()
    assert bool(a["attention_mask"].all())


def test_threads_are_restored():
    before = torch.get_num_threads()
    result = bench_model(make_model("bert", "BertModel"), BenchConfig(**FAST, threads=1))
    assert result.threads == 1 and torch.get_num_threads() == before


def test_percentile():
    assert percentile([5.0], 90) == 5.0
    assert percentile([float(i) for i in range(1, 11)], 90) == pytest.approx(9.1)
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


# ---------------------------------------------------------------------------------------------- interleaving


def test_round_order_rotates():
    assert [round_order(3, r) for r in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    assert [round_order(2, r) for r in range(3)] == [[0, 1], [1, 0], [0, 1]]  # two rows alternate
    assert round_order(1, 5) == [0] and round_order(0, 1) == []
    # over as many rounds as rows, every row runs once in every position
    for n in (2, 3, 5):
        for position in range(n):
            assert sorted(round_order(n, r)[position] for r in range(n)) == list(range(n))


def test_time_rounds_calls_in_rotated_order():
    calls = []
    fns = [lambda name=name: calls.append(name) for name in "ABC"]
    steps = []
    times = time_rounds(fns, 4, [torch.device("cpu")] * 3, steps.append)
    assert "".join(calls) == "ABCBCACABABC"
    assert steps == [1, 2, 3, 4]
    assert [len(t) for t in times] == [4, 4, 4] and all(ms >= 0 for t in times for ms in t)
    with pytest.raises(ValueError):
        time_rounds(fns, 1, [torch.device("cpu")])


def _recording(models: dict[str, torch.nn.Module], calls: list[str]) -> None:
    """Record each model's forwards (and generate calls, as ``gen NAME``) in ``calls``."""
    for name, model in models.items():
        model.register_forward_pre_hook(lambda module, args, name=name: calls.append(name))
        if model.can_generate():
            real = model.generate

            def generate(*args, name=name, real=real, **kwargs):
                calls.append(f"gen {name}")
                return real(*args, **kwargs)

            model.generate = generate


def test_bench_times_the_models_interleaved_in_rotated_rounds():
    models = {name: make_model("bert", "BertModel", seed=i) for i, name in enumerate("ABC")}
    calls: list[str] = []
    _recording(models, calls)
    seen = []
    results = bench(
        list(models.values()),
        BenchConfig(**dict(FAST, runs=4, warmup=1)),
        names=list(models),
        progress=lambda *args: seen.append(args),
    )
    # every model is prepared (its FLOPs counted) and warmed up before any timed forward
    assert calls[:6] == ["A", "B", "C", "A", "B", "C"]
    assert "".join(calls[6:]) == "ABCBCACABABC"
    assert [len(r.runs_ms) for r in results] == [4, 4, 4]
    # the rounds are reported once for all the models, each model's own stages under its index
    rounds = [(done, total) for index, name, stage, done, total in seen if stage == "rounds"]
    assert rounds[-1] == (4, 4) and all(i == -1 for i, n, stage, *_ in seen if stage == "rounds")
    assert {(i, n) for i, n, stage, *_ in seen if stage == "rounds"} == {(-1, ALL_MODELS)}
    assert {(i, stage) for i, n, stage, *_ in seen if i >= 0} >= {(0, "flops"), (2, "warmup")}
    assert all(r.speedup_p25 is not None and r.within_noise is not None for r in results[1:])


def test_generation_is_interleaved_too():
    models = {name: make_model("llama", "LlamaForCausalLM", seed=i) for i, name in enumerate("AB")}
    calls: list[str] = []
    _recording(models, calls)
    results = bench(list(models.values()), BenchConfig(**dict(FAST, runs=2, warmup=0, gen_runs=3)), names=list(models))
    # FLOPs A, B; two rounds A B, B A; then the memory forward of each (no warmup) before any generation
    assert calls[:9] == ["A", "B", "A", "B", "B", "A", "A", "B", "gen A"]
    generations = [c for c in calls if c.startswith("gen")]
    # one untimed call each (the KV cache), then three rounds alternating the order
    assert generations == ["gen A", "gen B", "gen A", "gen B", "gen B", "gen A", "gen A", "gen B"]
    first, second = results
    assert len(first.generation.runs_ms) == len(second.generation.runs_ms) == 3
    assert second.generation.speedup_p25 <= second.generation.speedup_p75
    assert isinstance(second.generation.within_noise, bool) and first.generation.within_noise is None
    assert first.peak_memory_kind in ("cpu_peak_rss_increase", "unavailable")


def test_no_interleave_times_one_model_after_the_other():
    models = {name: make_model("bert", "BertModel", seed=i) for i, name in enumerate("AB")}
    calls: list[str] = []
    _recording(models, calls)
    seen = []
    results = bench(
        list(models.values()),
        BenchConfig(**dict(FAST, runs=3, warmup=1), interleave=False),
        names=list(models),
        progress=lambda *args: seen.append(args),
    )
    assert "".join(calls) == "AAAAABBBBB"  # FLOPs, warmup, runs; then the next model
    assert [len(r.runs_ms) for r in results] == [3, 3]
    assert results[1].speedup is not None and results[1].speedup > 0
    # no pairs, so no interval and no verdict
    assert results[1].speedup_p25 is None and results[1].speedup_p75 is None and results[1].within_noise is None
    assert all(i >= 0 for i, *_ in seen) and any(stage == "runs" for _, _, stage, *_ in seen)
    assert report_json(results, BenchConfig(interleave=False))["schedule"] == "back to back"


def test_paired_speedup_on_controlled_times():
    # every round 20 % faster: the interval is a point away from 1, however much the rounds differ
    low, high, within = paired_speedup([10.0, 20.0, 30.0, 40.0], [8.0, 16.0, 24.0, 32.0])
    assert low == pytest.approx(1.25) and high == pytest.approx(1.25) and within is False
    # the per-round ratios 1.25, 0.8, 1.0, 1.1, 0.9: quartiles 0.9 and 1.1, which hold 1
    low, high, within = paired_speedup([10.0, 8.0, 10.0, 11.0, 9.0], [8.0, 10.0, 10.0, 10.0, 10.0])
    assert (low, high, within) == (pytest.approx(0.9), pytest.approx(1.1), True)
    # slower in every round: the interval lies below 1
    low, high, within = paired_speedup([10.0, 10.0, 10.0], [11.0, 12.0, 13.0])
    assert high < 1.0 and within is False
    assert low == pytest.approx(percentile([10 / 11, 10 / 12, 10 / 13], 25))
    # generation: the ratio of tokens/s, scaled by the new tokens of each call
    low, high, _ = paired_speedup([10.0, 10.0], [10.0, 10.0], scale=2.0)
    assert low == high == 2.0
    # one round tells nothing of the noise; rounds without a positive time are left out
    assert paired_speedup([10.0], [9.0]) == (pytest.approx(10 / 9), pytest.approx(10 / 9), None)
    assert paired_speedup([10.0, 0.0], [5.0, 5.0]) == (2.0, 2.0, None)
    assert paired_speedup([0.0], [0.0]) is None
    with pytest.raises(ValueError):
        paired_speedup([1.0, 2.0], [1.0])


def test_compare_fills_the_paired_interval_only_for_paired_runs():
    base = bench_model(make_model("bert", "BertModel"), BenchConfig(**FAST))
    other = bench_model(make_model("bert", "BertModel", seed=1), BenchConfig(**FAST))
    base.runs_ms, base.median_ms = [10.0, 10.0, 10.0, 10.0], 10.0
    other.runs_ms, other.median_ms = [9.0, 9.5, 10.5, 8.0], 9.25
    compare([base, other], paired=True)
    assert other.speedup == pytest.approx(10 / 9.25)
    assert other.speedup_p25 == pytest.approx(percentile([10 / 9, 10 / 9.5, 10 / 10.5, 10 / 8], 25))
    assert other.speedup_p75 == pytest.approx(percentile([10 / 9, 10 / 9.5, 10 / 10.5, 10 / 8], 75))
    assert other.within_noise is (other.speedup_p25 <= 1.0 <= other.speedup_p75)
    assert base.speedup == 1.0 and base.speedup_p25 is None and base.within_noise is None
    other.speedup_p25 = other.speedup_p75 = other.within_noise = None
    compare([base, other])  # back to back: nothing to pair
    assert other.speedup_p25 is None and other.within_noise is None and other.speedup is not None


def test_interleave_must_be_a_bool():
    with pytest.raises(HeadcutError, match="interleave must be True or False"):
        BenchConfig(interleave="no").validate()


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(runs=0), "runs must"),
        (dict(warmup=-1), "warmup must"),
        (dict(batch_size=0), "batch_size must"),
        (dict(seq_len=0), "seq_len must"),
        (dict(threads=0), "threads must"),
        (dict(dtype="float64"), "unknown dtype"),
        (dict(device="tpu"), "unknown device"),
        (dict(attn_implementation="flash"), "unknown attn_implementation"),
        (dict(gen_tokens=-1), "gen_tokens must"),
    ],
)
def test_bad_config_is_refused(change, message):
    with pytest.raises(HeadcutError, match=message):
        BenchConfig(**change).validate()


def test_too_long_for_the_model_is_refused():
    model = make_model("llama", "LlamaForCausalLM")  # 64 positions
    with pytest.raises(HeadcutError, match="positions"):
        bench_model(model, BenchConfig(**dict(FAST, seq_len=65, gen_tokens=0)))
    with pytest.raises(HeadcutError, match="--gen-tokens"):
        bench_model(model, BenchConfig(**dict(FAST, seq_len=62)))  # 62 + 4 new tokens > 64
    # the forward alone fits when generation is off
    assert isinstance(bench_model(model, BenchConfig(**dict(FAST, seq_len=64, gen_tokens=0))), BenchResult)


# ---------------------------------------------------------------------------------------------- CLI

runner = CliRunner()
CLI_FAST = [
    "--runs",
    "2",
    "--warmup",
    "1",
    "--batch-size",
    "2",
    "--seq-len",
    "8",
    "--gen-tokens",
    "4",
    "--gen-runs",
    "1",
]


def test_cli_json_on_stdout_is_clean(ckpts):
    # a real process: anything any library prints to stdout would break the JSON
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from headcut.cli import main; main()",
            "bench",
            ckpts["llama"],
            ckpts["llama-slim"],
            *CLI_FAST,
            "--json",
            "-",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [m["name"] for m in data["models"]] == [ckpts["llama"], ckpts["llama-slim"]]
    assert data["models"][1]["flop_ratio"] > 1.0 and data["models"][1]["heads"] == 15
    assert "KV B/" in proc.stderr and "speed-" in proc.stderr  # the table is on stderr


def test_cli_json_file(ckpts, tmp_path):
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", ckpts["bert"], *CLI_FAST, "--json", str(out)])
    assert result.exit_code == 0, result.stderr
    # the result table on stdout (a single model: no speed-up or FLOP ratio, they need a baseline)
    assert "median" in result.stdout and "speed-" not in result.stdout and "ratio" not in result.stdout
    assert "{" not in result.stdout
    data = json.loads(out.read_text())
    assert data["models"][0]["heads"] == 8
    assert data["models"][0]["speedup"] is None and data["models"][0]["flop_ratio"] is None


INTERVAL = r"\((\d+\.\d\d)-(\d+\.\d\d)\)"  # a speed-up's interval, the line under it in the table


def test_cli_interleaved_table_and_json(ckpts, tmp_path):
    import re

    out = tmp_path / "bench.json"
    result = runner.invoke(
        app,
        ["bench", ckpts["llama"], ckpts["llama-slim"], *CLI_FAST, "--runs", "3", "--gen-runs", "2", "--json", str(out)],
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["schedule"] == "interleaved" and data["config"]["interleave"] is True
    base, slim = data["models"]
    assert slim["speedup_p25"] <= slim["speedup_p75"] and isinstance(slim["within_noise"], bool)
    assert isinstance(slim["generation"]["within_noise"], bool)
    assert "\x1b[" not in result.stdout  # plain text off a terminal
    assert "p25-p75" in result.stdout and "timed interleaved" in result.stdout
    # the slim model's speed-up and generation speed-up, each over the interval of its per-round ratios
    intervals = [(float(a), float(b)) for a, b in re.findall(INTERVAL, result.stdout)]
    assert intervals == [
        (pytest.approx(slim["speedup_p25"], abs=0.006), pytest.approx(slim["speedup_p75"], abs=0.006)),
        (
            pytest.approx(slim["generation"]["speedup_p25"], abs=0.006),
            pytest.approx(slim["generation"]["speedup_p75"], abs=0.006),
        ),
    ]
    # the words say what the JSON says
    verdicts = [slim["within_noise"], slim["generation"]["within_noise"]]
    assert result.stdout.split("peak MiB:")[0].count("within noise") == sum(verdicts)
    assert "back to back" not in result.stderr


def test_cli_no_interleave(ckpts, tmp_path):
    import re

    out = tmp_path / "bench.json"
    result = runner.invoke(
        app, ["bench", ckpts["bert"], ckpts["bert-slim"], *CLI_FAST, "--no-interleave", "--json", str(out)]
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["schedule"] == "back to back" and data["config"]["interleave"] is False
    slim = data["models"][1]
    assert slim["speedup"] > 0 and slim["speedup_p25"] is None and slim["within_noise"] is None
    assert not re.findall(INTERVAL, result.stdout) and "timed back to back" in result.stdout
    notes = " ".join(line for line in result.stderr.splitlines() if line.startswith("note:"))
    assert "back to back (--no-interleave)" in notes and "not comparable" in notes
    assert "--no-interleave" in runner.invoke(app, ["bench", "--help"]).stdout


def test_table_marks_speedups_within_noise(ckpts):
    import io

    from rich.console import Console

    from headcut.cli.render.bench import bench_table

    config = BenchConfig(**FAST)
    base, fast, same = bench([ckpts["bert"], ckpts["bert-slim"], ckpts["bert-empty"]], config)
    base.speedup, base.speedup_p25, base.speedup_p75, base.within_noise = 1.0, None, None, None
    fast.speedup, fast.speedup_p25, fast.speedup_p75, fast.within_noise = 1.16, 1.10, 1.21, False
    same.speedup, same.speedup_p25, same.speedup_p75, same.within_noise = 1.03, 0.97, 1.08, True
    stream = io.StringIO()
    Console(file=stream, width=160).print(bench_table([base, fast, same], config, "a CPU"))
    text = stream.getvalue()
    assert "\x1b[" not in text  # plain text off a terminal
    lines = text.splitlines()
    row = next(
        i for i, line in enumerate(lines) if line.lstrip().startswith(ckpts["bert-slim"][:8]) and "1.16x" in line
    )
    assert lines[row + 1].rstrip().endswith("(1.10-1.21)") and "within noise" not in lines[row + 2]
    row = next(i for i, line in enumerate(lines) if "1.03x" in line)
    assert lines[row + 1].rstrip().endswith("(0.97-1.08)") and lines[row + 2].rstrip().endswith("within noise")
    body, caption = text.split("peak MiB:")  # the table, and its caption under it
    assert body.count("within noise") == 1 and "interval contains 1" in " ".join(caption.split())
    assert "gen" not in text and "KV" not in text  # no model generates: no generation columns


@pytest.mark.parametrize(
    "args",
    [
        ["--runs", "0"],
        ["--warmup", "-1"],
        ["--batch-size", "0"],
        ["--dtype", "float64"],
        ["--device", "tpu"],
        ["--attn", "flash"],
        ["--threads", "0"],
        ["--seq-len", "1000"],
    ],
)
def test_cli_bad_flags_exit_2(ckpts, args):
    result = runner.invoke(app, ["bench", ckpts["bert"], *args])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr


def test_cli_missing_model_exit_2(ckpts, tmp_path):
    result = runner.invoke(app, ["bench", ckpts["bert"], str(tmp_path / "nope"), "--runs", "1"])
    assert result.exit_code == 2 and "not found" in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cli_cuda_unavailable_exit_2(ckpts):
    result = runner.invoke(app, ["bench", ckpts["bert"], "--device", "cuda"])
    assert result.exit_code == 2 and "CUDA is not available" in result.stderr


# ---------------------------------------------------------------------------------------------- onnxruntime


def _needs_onnx() -> None:
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name)


def test_cli_onnxruntime_rows_beside_torch(ckpts, tmp_path):
    _needs_onnx()
    import shutil

    from headcut.outputs.formats.onnx import export_onnx

    slim = tmp_path / "bert-slim"  # a folder that holds its model.onnx (no export for this one)
    shutil.copytree(ckpts["bert-slim"], slim)
    export_onnx(headcut.load(slim), slim)
    out = tmp_path / "bench.json"
    result = runner.invoke(
        app, ["bench", ckpts["bert"], str(slim), *CLI_FAST, "--runtime", "torch,onnxruntime", "--json", str(out)]
    )
    assert result.exit_code == 0, result.stderr
    cells = [w for line in result.stdout.splitlines() for w in line.split()]
    assert "runtime" in cells  # the column appears with onnxruntime
    assert [w for w in cells if w in ("torch", "onnxruntime")] == ["torch", "onnxruntime"] * 2
    # the folder without model.onnx was exported for the run (a note on stderr), the other was not
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert any(ckpts["bert"] in n and "temporary folder" in n for n in notes), result.stderr
    assert not any(str(slim) in n and "temporary" in n for n in notes), result.stderr
    models = json.loads(out.read_text())["models"]
    assert [(m["name"], m["runtime"]) for m in models] == [
        (ckpts["bert"], "torch"),
        (ckpts["bert"], "onnxruntime"),
        (str(slim), "torch"),
        (str(slim), "onnxruntime"),
    ]
    for m in models:
        assert set(m) == MODEL_KEYS and len(m["runs_ms"]) == 2 and m["median_ms"] > 0 and m["speedup"] > 0
    torch_row, ort_row = models[2], models[3]
    assert torch_row["inputs"] == {"input_ids": [2, 8], "attention_mask": [2, 8]}
    assert ort_row["inputs"] == dict(torch_row["inputs"], token_type_ids=[2, 8])  # zeros, as BERT's default
    for key in ("flops", "params", "heads", "architecture"):
        assert ort_row[key] == torch_row[key], key
    assert ort_row["dtype"] == "float32" and ort_row["attn_implementation"] is None
    assert ort_row["weights_bytes"] == (slim / "model.onnx").stat().st_size
    assert models[0]["speedup"] == 1.0 and models[1]["flop_ratio"] == 1.0 and models[3]["flop_ratio"] > 1.0


def test_onnxruntime_generation_and_kv_cache_match_torch(ckpts):
    _needs_onnx()
    torch_row, ort_row = bench([ckpts["llama-empty"]], BenchConfig(**FAST, runtime="torch,onnxruntime"))
    assert (torch_row.runtime, ort_row.runtime) == ("torch", "onnxruntime")
    assert ort_row.inputs == {"input_ids": [2, 8], "attention_mask": [2, 8], "position_ids": [2, 8]}
    gen, ref = ort_row.generation, torch_row.generation
    assert gen.new_tokens == ref.new_tokens == 4 and len(gen.runs_ms) == 1
    # layer 0 keeps only the placeholder, layers 1 and 2 their two KV heads: the same bytes as PyTorch's cache
    assert gen.kv_cache_positions == ref.kv_cache_positions == 8 + 4 - 1
    assert gen.kv_bytes_per_token == ref.kv_bytes_per_token == 2 * 1 * 1 * 4 + 2 * (2 * 2 * 8 * 4)
    assert gen.speedup is not None and ort_row.flops == torch_row.flops
    assert any("temporary folder" in n for n in ort_row.notes)


def test_onnxruntime_only_in_memory_model():
    _needs_onnx()
    model = make_model("distilbert", "DistilBertModel")
    (row,) = bench([model], BenchConfig(**FAST, runtime="onnxruntime"))
    assert row.runtime == "onnxruntime" and row.generation is None and row.speedup is None
    assert row.flops == count_flops(model, make_inputs(model, BenchConfig(**FAST)))[0]
    assert row.notes and "no ONNX file" in row.notes[0]


def test_runtime_flag_is_documented_and_checked(ckpts, monkeypatch):
    result = runner.invoke(app, ["bench", "--help"])
    assert "--runtime" in result.stdout and "onnxruntime" in result.stdout
    assert BenchConfig(runtime="onnxruntime , torch").runtimes() == ("torch", "onnxruntime")
    bad = runner.invoke(app, ["bench", ckpts["bert"], "--runtime", "tensorrt"])
    assert bad.exit_code == 2 and "unknown --runtime 'tensorrt'" in bad.stderr
    assert len([line for line in bad.stderr.splitlines() if line.strip()]) == 1
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    missing = runner.invoke(app, ["bench", ckpts["bert"], "--runtime", "torch,onnxruntime"])
    assert missing.exit_code == 2 and missing.stdout == ""
    lines = [line for line in missing.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs onnxruntime: pip install 'headcut[onnx]'" in lines[0], missing.stderr
    BenchConfig(runtime="torch").validate()  # torch alone does not need it


def test_onnxruntime_on_cuda_needs_its_provider(monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(HeadcutError, match="CUDAExecutionProvider.*onnxruntime-gpu"):
        BenchConfig(device="cuda", runtime="onnxruntime").validate()
    BenchConfig(device="cuda", runtime="torch").validate()
