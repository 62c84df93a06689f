"""The study registry: every study whose results are stored in ``benchmarks/results/``, in the page's order, with
the command that measures it and where the page shows it. A results file no study names is an error
(``tests/test_benchmarks.py``); a new study is an entry here, its rows in ``results/NAME.json`` and its section in
``render.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

HARNESS = "python -m benchmarks.harness --studies {name}"
SMALL_DATA = "python -m benchmarks.studies.small_data --results {name}"


@dataclass(frozen=True)
class Study:
    """A study: ``name`` (its results file, ``results/NAME.json``, or ``.jsonl`` for a check's raw lines), the command
    that measures it, where its numbers are shown, and whether the page's table of studies lists it (its machine,
    versions, date and time: the studies whose file records them)."""

    name: str
    measured_by: str
    shown: str
    listed: bool = True

    @property
    def command(self) -> str:
        return self.measured_by.format(name=self.name)


#: every study, in the page's order
STUDIES: tuple[Study, ...] = (
    Study("recipe", HARNESS, "Targets; Accuracy vs heads kept"),
    Study("oneshot", HARNESS, "Accuracy vs heads kept"),
    Study("iterative", HARNESS, "Accuracy vs heads kept; the peer"),
    Study("learned", HARNESS, "Accuracy vs heads kept; the papers' claims"),
    Study("voita", HARNESS, "Accuracy vs heads kept"),
    Study("peer", HARNESS + " --peer-python PEER/bin/python", "Accuracy vs heads kept (TextPruner)"),
    Study("levers", HARNESS, "Levers"),
    Study("claims", HARNESS, "The papers' claims"),
    Study("speed", HARNESS, "Speed-up vs heads kept"),
    Study("smollm", HARNESS, "SmolLM2-135M: KV groups removed"),
    Study("gemma3", HARNESS, "Gemma 3 270M: KV heads removed"),
    Study("convention", HARNESS, "A second task"),
    Study("review_plot", HARNESS, "Small data: review or plot"),
    Study("debates", HARNESS, "Small data: the 2016 debates"),
    Study("refit", HARNESS, "Refit without training"),
    Study("kv_methods", HARNESS, "One-shot methods at equal KV budgets"),
    Study("peer_llm", HARNESS, "An LLM peer, side by side"),
    Study("small_data_diagnosis", SMALL_DATA, "Small data: where the recipe loses accuracy"),
    Study("small_data_h200", SMALL_DATA + " (on an H200)", "Small data: more inputs for the recovery"),
    Study("small_data_h100", SMALL_DATA + " (on an H100)", "Small data: a smaller part of the model trained"),
    Study(
        "small_data_cli",
        "python -m benchmarks.studies.small_data --reports",
        "Small data: the recipe with another method's cut, and the default; Targets on every task",
    ),
    Study(
        "small_data_averaging",
        "benchmarks/archive/averaging.py (archived: see benchmarks/archive/README.md)",
        "Small data: weight averaging in the recovery",
    ),
    Study(
        "fluctuation_units",
        "python -m benchmarks.studies.fluctuation_units",
        "One-shot methods at equal KV budgets (Gemma 3's note)",
        listed=False,
    ),
    Study(
        "layerwise_memory",
        "python -m benchmarks.studies.layerwise_memory",
        "Layer-wise pruning: memory flat in depth",
        listed=False,
    ),
    Study(
        "kv8",
        "python -m benchmarks.studies.kv8 run --vllm-python V/bin/python",
        "Decoders: the default's cut against an 8-bit KV cache",
        listed=False,
    ),
    Study(
        "decoder_recipe",
        "python -m benchmarks.studies.decoder_recipe run",
        "Decoders: the default recipe and its candidates",
        listed=False,
    ),
    Study(
        "long_context",
        "python -m benchmarks.studies.long_context",
        "Long context: decode speed and KV cache",
        listed=False,
    ),
    Study(
        "serving",
        "python -m benchmarks.studies.serving run --vllm-python V/bin/python",
        "Serving in vLLM",
        listed=False,
    ),
    Study(
        "kv_budget",
        "python -m benchmarks.studies.kv_budget cuts && python -m benchmarks.studies.kv_budget speed",
        "KV-cache budgets: heads placed by cost",
        listed=False,
    ),
    Study(
        "refit_choice",
        "python -m benchmarks.studies.refit_choice",
        "What the measurements show (small data)",
        listed=False,
    ),
    Study(
        "engines_h200",
        "torchrun --nproc_per_node 2 benchmarks/engines.py --device cuda",
        "docs/distributed.md, Measured (not on this page)",
        listed=False,
    ),
)

BY_NAME = {study.name: study for study in STUDIES}
#: the studies ``python -m benchmarks.harness`` measures itself (the others name their own command)
MEASURED_HERE = [study.name for study in STUDIES if study.measured_by.startswith(HARNESS)]
