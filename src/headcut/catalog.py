"""What headcut offers, by name: pruning methods, scorers, tasks and policies.

This module imports nothing but the standard library, so the command line's ``--help`` and shell
completion read every name and summary from here without loading torch. It is the one registry of
methods and scorers: an entry names the module and object that implement it, and
:func:`headcut.pruning.get_method` / :func:`headcut.scoring.get_scorer` import that module on first
use. Adding a method is one module plus one entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from .errors import HeadcutError

#: the papers headcut implements, cited by venue and arXiv id (or DOI)
PAPERS: dict[str, str] = {
    "michel": "Michel, Levy & Neubig, Are Sixteen Heads Really Better than One?, NeurIPS 2019 (arXiv:1905.10650)",
    "voita": "Voita et al., Analyzing Multi-Head Self-Attention, ACL 2019 (arXiv:1905.09418)",
    "dsp": "Li, Cotterell & Sachan, Differentiable Subset Pruning of Transformer Heads, TACL 2021 (arXiv:2108.04657)",
    "gnorm": "Guo & Sheridan, Greedy-Gnorm: A Gradient Matrix Norm-Based Alternative to Attention Entropy for "
    "Head Pruning, 2026 (arXiv:2602.04491)",
    "pass": "Ding, Jawahar & Lakshmanan, PASS: Pruning Attention Heads with Almost-sure Sparsity Targets, TMLR 2024 "
    "(openreview.net/forum?id=S4duStTKGL)",
    "auber": "Lee, Lee & Kang, AUBER: Automated BERT Regularization, PLOS ONE 2021 (arXiv:2009.14409)",
    "lottery": "Behnke & Heafield, Losing Heads in the Lottery: Pruning Transformer Attention in Neural Machine "
    "Translation, EMNLP 2020 (doi:10.18653/v1/2020.emnlp-main.211)",
    "flap": "An et al., Fluctuation-based Adaptive Structured Pruning for Large Language Models, AAAI 2024 "
    "(arXiv:2312.11983)",
    "headcut": "headcut's own baseline (no paper)",
}

#: the same, short (for ``--help``)
SHORT: dict[str, str] = {
    "michel": "Michel et al., NeurIPS 2019",
    "voita": "Voita et al., ACL 2019",
    "dsp": "Li et al., TACL 2021",
    "gnorm": "Greedy-Gnorm, arXiv:2602.04491",
    "pass": "PASS, TMLR 2024",
    "auber": "AUBER, PLOS ONE 2021",
    "lottery": "Behnke & Heafield, EMNLP 2020",
    "flap": "FLAP, AAAI 2024",
    "headcut": "headcut's baseline",
}

#: ``--task`` values and the transformers Auto class each one loads with
TASKS: dict[str, str] = {
    "base": "AutoModel",
    "sequence-classification": "AutoModelForSequenceClassification",
    "masked-lm": "AutoModelForMaskedLM",
    "causal-lm": "AutoModelForCausalLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
}

#: grouped-query attention policies of ``--gqa`` (see :mod:`headcut.model.masks`)
GQA_POLICIES = ("auto", "group", "uniform", "duplicate")
#: how --kv-budget places the heads it removes (headcut.pruning.costs)
ALLOCATIONS = ("cost", "count")
#: ``--format`` values of the commands that write a model (``safetensors,onnx`` writes both)
OUTPUT_FORMATS = ("safetensors", "onnx", "gguf", "decilm")
#: ``--gguf-type`` values: the GGUF tensor type of the weight matrices
GGUF_TYPES = ("f16", "f32", "q8_0")
#: ``--dtype`` values of ``headcut bench``
DTYPE_NAMES = ("float32", "float16", "bfloat16")
#: ``--attn`` values of ``headcut bench``
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
#: scorer options
NORMALIZE = ("none", "layer")
ABS_PER = ("example", "batch")
OBJECTIVES = ("logits-norm", "loss")
GNORM_PER = ("batch", "example")
#: learned-gate training modes
MODES = ("joint", "pipelined")
#: how several processes train one model (``--engine``): auto (fsdp when ``accelerate launch --use_fsdp`` set it,
#: else ddp), ddp (DistributedDataParallel), fsdp (FSDP2 ``fully_shard``)
ENGINES = ("auto", "ddp", "fsdp")


@dataclass(frozen=True)
class ScorerEntry:
    """A scorer of ``headcut score``: ``target`` is ``module:object`` of its :class:`~headcut.scoring.Scorer`."""

    name: str
    target: str
    summary: str
    needs_data: bool


@dataclass(frozen=True)
class MethodEntry:
    """A pruning method of ``headcut prune``.

    ``target``: ``module:object`` of its :class:`~headcut.pruning.Method`; ``paper``: a key of
    :data:`PAPERS` and the section; ``data``: ``none`` (data-free), ``calibration`` (scoring data) or
    ``training`` (labelled training data); ``kind``: ``score`` (ranked by a scorer, once or again at
    every step), ``learned`` (gates trained with the model), ``agent`` (a reinforcement-learning
    agent chooses the heads, layer by layer) or ``rewind`` (trained, pruned and rewound to an early
    checkpoint, round after round); ``budget``: ``required`` (--keep/--sparsity/--max-drop)
    or ``optional`` (the method decides how many heads go; --keep/--sparsity is an upper bound on the
    heads kept); ``options``: ``module:Class`` of its options dataclass (read without importing the module,
    see :mod:`headcut.options`: its flags, ``--help`` and completion come from it)."""

    name: str
    target: str
    summary: str
    paper: str
    data: str
    kind: str
    options: str = ""
    budget: str = "required"

    @property
    def resumable(self) -> bool:
        """Whether the method keeps resume checkpoints (``--resume``)."""
        return self.kind in ("learned", "rewind")

    @property
    def citation(self) -> str:
        """The paper, by venue and arXiv id, and the section."""
        key, _, section = self.paper.partition(" ")
        return PAPERS[key] + (f", {section}" if section else "")

    @property
    def short_citation(self) -> str:
        key, _, section = self.paper.partition(" ")
        return SHORT[key] + (f" {section}" if section else "")


SCORERS: dict[str, ScorerEntry] = {
    s.name: s
    for s in (
        ScorerEntry(
            "gradient",
            "headcut.scoring.gradient:SCORER",
            "mean |dL/dg| of each head's gate (Michel et al.); --abs-per example|batch",
            True,
        ),
        ScorerEntry(
            "gnorm",
            "headcut.scoring.gnorm:SCORER",
            "product of the norms of each head's Q, K, V weight gradients (Greedy-Gnorm); --objective logits-norm|loss",
            True,
        ),
        ScorerEntry(
            "confidence",
            "headcut.scoring.confidence:SCORER",
            "mean of each head's maximum attention weight over real query tokens (Voita et al.)",
            True,
        ),
        ScorerEntry(
            "entropy",
            "headcut.scoring.entropy:SCORER",
            "epsilon-rectified attention entropy over real query tokens (Greedy-Gnorm's AE); low = important",
            True,
        ),
        ScorerEntry(
            "value-l1",
            "headcut.scoring.value_l1:SCORER",
            "L1 norm of each head's value matrix (AUBER); data-free",
            False,
        ),
        ScorerEntry(
            "fluctuation",
            "headcut.scoring.fluctuation:SCORER",
            "variance of each head's output-projection input times its columns' squared norms, standardised "
            "per layer (FLAP's WIFV); forward only",
            True,
        ),
        ScorerEntry(
            "magnitude",
            "headcut.scoring.magnitude:SCORER",
            "L2 norm of each head's q, k, v and output-projection weights; data-free baseline",
            False,
        ),
        ScorerEntry(
            "random",
            "headcut.scoring.random_baseline:SCORER",
            "uniform random scores from a seeded generator (--seed); baseline",
            False,
        ),
    )
}


def _rank_options(scorer: str) -> str:
    """The options class of a method ranked by ``scorer``."""
    own = {"gradient": "GradientOptions", "gnorm": "GnormOptions", "fluctuation": "FluctuationOptions"}
    return f"headcut.pruning.ranked:{own.get(scorer, 'RankOptions')}"


def _one_shot(scorer: str, paper: str) -> MethodEntry:
    what = "a seeded random mask (--seed)" if scorer == "random" else f"remove the heads {scorer} ranks least important"
    data = "calibration" if SCORERS[scorer].needs_data else "none"
    return MethodEntry(
        scorer,
        f"headcut.pruning.oneshot:{scorer.replace('-', '_').upper()}",
        f"one-shot: {what}",
        paper,
        data,
        "score",
        _rank_options(scorer),
    )


def _inverse(scorer: str) -> MethodEntry:
    data = "calibration" if SCORERS[scorer].needs_data else "none"
    return MethodEntry(
        f"inverse-{scorer}",
        f"headcut.pruning.oneshot:INVERSE_{scorer.replace('-', '_').upper()}",
        f"one-shot, reversed: remove the heads {scorer} ranks most important first (diagnostic)",
        "gnorm §4.1, §4.2.2",
        data,
        "score",
        _rank_options(scorer),
    )


#: every method, in the order ``headcut prune --help`` lists them
METHODS: dict[str, MethodEntry] = {
    m.name: m
    for m in (
        _one_shot("gradient", "dsp §4.2.1 (eq. 21, Michel et al.'s score)"),
        _one_shot("gnorm", "gnorm §3.1.2"),
        _one_shot("confidence", "lottery §4.2 (after Voita et al.)"),
        _one_shot("entropy", "gnorm §2.2.1, §3.3"),
        _one_shot("value-l1", 'auber "State representation"'),
        _one_shot("fluctuation", "flap §3.2-3.3"),
        _one_shot("magnitude", "headcut"),
        _one_shot("random", "gnorm §4.1"),
        *(_inverse(s) for s in ("gradient", "confidence", "entropy", "value-l1", "magnitude")),
        MethodEntry(
            "michel",
            "headcut.pruning.michel:METHOD",
            "iterative: remove the lowest |dL/dg| heads in steps of 10 %, re-scoring each step (Michel et al.)",
            "michel (as DSP §4.2.1 states it)",
            "calibration",
            "score",
            _rank_options("gradient"),
        ),
        MethodEntry(
            "greedy-gnorm",
            "headcut.pruning.greedy_gnorm:METHOD",
            "iterative: remove the lowest-Gnorm head, re-compute, repeat (Greedy-Gnorm, Algorithm 1)",
            "gnorm §3.1",
            "calibration",
            "score",
            _rank_options("gnorm"),
        ),
        MethodEntry(
            "greedy-entropy",
            "headcut.pruning.greedy_entropy:METHOD",
            "iterative: remove the highest-entropy head, re-compute, repeat (Greedy-Gnorm's loop over attention entropy; headcut's variant)",
            "gnorm §3.1, §3.3",
            "calibration",
            "score",
            "headcut.pruning.greedy_entropy:GreedyEntropyOptions",
        ),
        MethodEntry(
            "inverse-gnorm",
            "headcut.pruning.greedy_gnorm:INVERSE",
            "iterative, reversed: remove the highest-Gnorm head, re-compute, repeat (diagnostic)",
            "gnorm §4.1",
            "calibration",
            "score",
            _rank_options("gnorm"),
        ),
        MethodEntry(
            "pass",
            "headcut.pruning.pass_gates:METHOD",
            "learned: Hard Concrete gates driven to almost-sure sparsity by R_pass, with clipping and re-opening "
            "(PASS)",
            "pass §3.2, §3.4",
            "training",
            "learned",
            "headcut.pruning.pass_gates:PassOptions",
        ),
        MethodEntry(
            "passconc",
            "headcut.pruning.passconc:METHOD",
            "learned: PASS plus the concentrator, which gathers the kept heads in few layers (PASSCONC)",
            "pass §3.3",
            "training",
            "learned",
            "headcut.pruning.pass_gates:PassOptions",
        ),
        MethodEntry(
            "dsp",
            "headcut.pruning.dsp:METHOD",
            "learned: Gumbel soft top-K gates with an annealed temperature, exactly K heads (DSP)",
            "dsp §3",
            "training",
            "learned",
            "headcut.pruning.dsp:DSPOptions",
        ),
        MethodEntry(
            "ste",
            "headcut.pruning.ste:METHOD",
            "learned: hard top-K gates with straight-through gradients, exactly K heads (DSP's STE baseline)",
            "dsp §4.2.3",
            "training",
            "learned",
            "headcut.pruning.gate_training:GateOptions",
        ),
        MethodEntry(
            "voita",
            "headcut.pruning.voita:METHOD",
            "learned: Hard Concrete gates with an L0 penalty whose lambda is searched to reach K (Voita et al.)",
            "dsp §4.2.2",
            "training",
            "learned",
            "headcut.pruning.voita:VoitaOptions",
        ),
        MethodEntry(
            "auber",
            "headcut.pruning.auber.method:METHOD",
            "agent: a DQN prunes each layer in turn, rewarded by the change of a held-out metric, and decides "
            "how many heads go; fine-tunes after each layer (AUBER; for small data)",
            "auber §4, §5.1",
            "training",
            "agent",
            "headcut.pruning.auber.options:AuberOptions",
            budget="optional",
        ),
        MethodEntry(
            "lottery",
            "headcut.pruning.lottery:METHOD",
            "iterative with late resetting: train, remove the least confident heads (encoder, decoder and cross "
            "ranked together), rewind to an early checkpoint, repeat; then converge (lottery ticket)",
            "lottery §4, §7",
            "training",
            "rewind",
            "headcut.pruning.lottery:LotteryOptions",
        ),
        MethodEntry(
            "lag",
            "headcut.pruning.lag:METHOD",
            "learned: Hard Concrete gates with trainable Lagrangian multipliers on the expected sparsity (LAG)",
            "pass §4.1.2",
            "training",
            "learned",
            "headcut.pruning.lag:LAGOptions",
        ),
    )
}


@dataclass(frozen=True)
class StageEntry:
    """A kind of stage a recipe's rounds run (:mod:`headcut.jobs.prune.stages`): ``name`` (its key in a recipe),
    ``target`` (``module:Class`` of a built-in kind, read without importing it; or the class of a kind registered
    at run time), a one-line ``summary``, the kinds it runs ``after`` when the recipe has them, and its
    ``switch``: the option that, given false or 0, drops the stage from a recipe (None: none does)."""

    name: str
    target: str | type
    summary: str
    after: tuple[str, ...] = ()
    switch: str | None = None


#: the stage kinds, by name (built in; :func:`headcut.jobs.prune.stages.register` adds more): a recipe's rounds run
#: the stages it lists, in its order
STAGES: dict[str, StageEntry] = {
    entry.name: entry
    for entry in (
        StageEntry(
            "choose",
            "headcut.jobs.prune.stages.choose:Choose",
            "the method chooses the heads to keep (scoring them, or training gates)",
        ),
        StageEntry(
            "protect",
            "headcut.jobs.prune.stages.protect:Protect",
            "each block's cut measured alone; a block costing more kept whole, the heads chosen again",
            after=("choose",),
            switch="protect",
        ),
        StageEntry(
            "allocate",
            "headcut.jobs.prune.stages.allocate:Allocate",
            "per block, keep, merge KV heads or remove KV groups, by measured cost per byte saved",
            after=("choose", "protect"),
            switch="allocate",
        ),
        StageEntry(
            "cut",
            "headcut.jobs.prune.stages.cut:Cut",
            "the chosen heads removed from the weights (FLAP's bias compensation when the method asks)",
            after=("choose", "protect", "allocate"),
        ),
        StageEntry(
            "refit",
            "headcut.jobs.prune.stages.refit:Refit",
            "the kept heads' output projections refitted by least squares to the uncut model's outputs",
            after=("cut",),
            switch="refit",
        ),
        StageEntry(
            "merge",
            "headcut.jobs.prune.stages.merge:Merge",
            "the KV heads of the blocks measured cheapest merged into fewer, every query head kept",
            after=("cut", "refit"),
            switch="merge_layers",
        ),
        StageEntry(
            "distill",
            "headcut.jobs.prune.stages.distill:Distill",
            "each changed attention block trained alone to reproduce the unpruned model's block",
            after=("cut", "refit", "merge"),
            switch="distill_steps",
        ),
        StageEntry(
            "recover",
            "headcut.jobs.prune.stages.recover:Recover",
            "recovery fine-tuning of the cut model, distilled from the unpruned one",
            after=("cut", "refit", "merge", "distill"),
            switch="recover_steps",
        ),
    )
}
#: the stage kinds every recipe has
REQUIRED_STAGES = ("choose", "cut")


def stage_entry(name: str) -> StageEntry:
    """The registry entry of stage kind ``name``, or a one-line error listing the kinds."""
    entry = STAGES.get(name) if isinstance(name, str) else None
    if entry is None:
        raise HeadcutError(f"unknown stage {name!r}; the stages: {', '.join(STAGES)}")
    return entry


def method_entry(name: str) -> MethodEntry:
    """The registry entry of method ``name``, or a one-line error listing the available methods."""
    entry = METHODS.get(name)
    if entry is not None:
        return entry
    raise HeadcutError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}")


def scorer_entry(name: str) -> ScorerEntry:
    """The registry entry of scorer ``name``, or a one-line error listing the scorers."""
    entry = SCORERS.get(name)
    if entry is None:
        raise HeadcutError(f"unknown scorer {name!r}; choose one of: {', '.join(SCORERS)}")
    return entry


def resolve(target: str) -> object:
    """The object a registry ``target`` (``module:name``) names, importing its module."""

    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
