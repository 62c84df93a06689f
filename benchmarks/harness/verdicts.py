"""The page's verdicts as declared rules: each target and each paper's claim says, as data, what it compares and by
how much; the renderer only measures the values from the store and asks the rule. A new verdict is a new entry
here (and the values it compares in ``render.py``), never a hard-coded sentence in the renderer.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

_OPS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge, "<=": operator.le}


@dataclass(frozen=True)
class Rule:
    """``value`` against ``reference``: holds when ``value - reference`` is ``op`` ``margin`` (``>``, ``>=``, ``<=``)."""

    op: str
    margin: float = 0.0

    def holds(self, value: float, reference: float) -> bool:
        return _OPS[self.op](value - reference, self.margin)


@dataclass(frozen=True)
class Target:
    """At ``heads`` kept: at most ``points`` below the unpruned model (or the test set's standard error, where
    ``standard_error`` and that is larger) in at most ``steps`` training steps of batch 8 and, where given, ``minutes``
    on the study's machine."""

    heads: int
    points: float
    steps: int
    minutes: float | None = None
    standard_error: bool = False

    def limit(self, standard_error: float = 0.0) -> float:
        """The most points below the unpruned model a run may end."""
        return max(self.points, standard_error) if self.standard_error else self.points

    def holds(self, drop: float, steps: int, seconds: float | None = None, standard_error: float = 0.0) -> bool:
        """Whether a run that ended ``drop`` points below the unpruned model after ``steps`` steps (and ``seconds``,
        None: its time is not judged) meets the target."""
        in_time = self.minutes is None or seconds is None or seconds <= 60 * self.minutes
        return drop <= self.limit(standard_error) and steps <= self.steps and in_time


#: issue 16's targets for the gradient recipe on the README's classifier (one row per seed)
TARGETS = {16: Target(16, 1.0, 500), 8: Target(8, 3.0, 1000)}
#: issue 33's targets on every task (seed 0): within the points or the test set's standard error, whichever is larger
TASK_TARGETS = {
    16: Target(16, 1.0, 1000, minutes=15, standard_error=True),
    8: Target(8, 2.0, 1000, minutes=15, standard_error=True),
}


@dataclass(frozen=True)
class Claim:
    """A paper's claim checked on the page: who says it, what, the paper's own figure, and the rule that decides it
    (``rule.holds(headcut's value, its reference)``)."""

    paper: str
    claim: str
    figure: str
    rule: Rule


#: run-to-run variation of a CPU timing on the 2-core machines the page is measured on (about 10 % in the
#: earlier studies, the page's "Earlier studies"; more in the speed study's rounds)
TIMING_NOISE = 0.10

#: the papers' claims, with their own figures quoted from their text (shared/papers)
CLAIMS = {
    "pass>=dsp": Claim(
        "PASS (TMLR 2024)",
        "PASS >= DSP at the same budget",
        "BERT-base, GLUE average, 16 of 144 heads: PASS 86.27 %, DSP 84.47 % (Table 1); DSP ahead at 32 and 64 heads, "
        "and on MNLI and QQP at 16 (Table 7)",
        Rule(">="),
    ),  # PASS's accuracy against DSP's, at 16 heads
    "passconc": Claim(
        "PASS",
        "PASSCONC faster than PASS at equal K (it empties layers)",
        "16 of 144 heads: attention speed-up 185.2 % against PASS's 114.4 % (Table 2, P100 GPU, attention only); "
        "accuracy 85.25 % against 86.27 %",
        Rule(">", TIMING_NOISE),
    ),  # 1 - PASSCONC's time / PASS's against 0: faster by more than the timing noise
    "dsp>michel": Claim(
        "DSP (TACL 2021)",
        "joint DSP far above Michel et al. at high sparsity",
        "BERT-base, MNLI-mm, 12 of 144 heads: joint DSP 79.74 %, Michel et al. 40.59 % (24 heads: 81.54 % vs 47.54 %; "
        "Table 3a)",
        Rule(">", 3.0),
    ),  # DSP's accuracy against Michel et al.'s: "far above" is more than 3 points
    "gnorm": Claim(
        "Greedy-Gnorm (arXiv 2026)",
        "Greedy-Gnorm above attention entropy and random pruning",
        "no number in the text (Figures 3-4): attention entropy below Greedy-Gnorm on all four models; BERT keeps about "
        "90 % accuracy with under 20 % of its heads (§4.2.2)",
        Rule(">"),
    ),  # at each K, against both: yes at every K, partly at some
    "lottery": Claim(
        "Lottery (EMNLP 2020)",
        "the ticket above the same structure re-initialised",
        "En-De student, 75 % of 48 encoder heads removed: the ticket 37.0 average BLEU, the same structure "
        "re-initialised 36.6, unpruned 37.2 (Tables 4, 5)",
        Rule(">"),
    ),  # the ticket's accuracy against its control's
    "auber": Claim(
        "AUBER (PLOS ONE 2021)",
        "no loss (a gain) on small data",
        "bert-base-cased, MRPC, CoLA, RTE, WNLI dev sets: gains on all four, up to 9.58 % on MRPC and CoLA (Results)",
        Rule(">="),
    ),  # the pruned accuracy against the unpruned one (else within AUBER_ERROR: one standard error)
}
#: AUBER's loss still called "within one standard error" of the 2,808 held-out snippets (points)
AUBER_ERROR = 0.8


@dataclass(frozen=True)
class Verdict:
    """One line of the page's summary: what was judged and how it came out."""

    section: str
    what: str
    outcome: str
