"""What ``headcut eval`` measures besides the task metric: :class:`EvalOptions` (perplexity windows,
lm-evaluation-harness tasks) and :func:`eval_options`, the API's reading of them."""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..devices import check_device
from ..errors import HeadcutTypeError, Shown, ascii_whole
from ..options import OptionError, check_fields, option

#: ``--lm-eval default``: the seven zero-shot tasks the pruning papers report (LLM-Pruner, FLAP, SliceGPT, Wanda ...)
LM_EVAL_DEFAULT = ("boolq", "piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge", "openbookqa")
#: the most digits of a ``--windows`` length (longer than any model's positions)
WINDOW_DIGITS = 9
WINDOWS_RULE = (
    "{windows} takes window lengths of at least 2 tokens (and at most %d) in ASCII digits, "
    "comma-separated (e.g. 128,2048); got {v!r}" % (10**WINDOW_DIGITS - 1)
)
#: the --help sections of ``headcut eval``'s own options
PERPLEXITY_PANEL = "Perplexity"
LM_EVAL_PANEL = "lm-evaluation-harness (extra \\[lm-eval])"


@dataclass
class EvalOptions:
    """What ``headcut eval`` (:func:`headcut.evaluate`) measures besides the task metric of ``--data``.

    ``windows``: causal-LM perplexity as the pruning papers measure it, one result per window length
    (``"128,2048"``): the whole text of the data (a table's or a ``datasets`` split's text rows joined by blank
    lines, as wikitext-2 is read) tokenized once and cut into non-overlapping windows of that many tokens
    (:mod:`headcut.data.windows`). ``lm_eval``: lm-evaluation-harness tasks, comma-separated (``default``: the
    seven of :data:`LM_EVAL_DEFAULT`), run on the loaded model (:mod:`headcut.model.harness`), with
    ``lm_eval_include`` (a folder of custom task YAML files), ``lm_eval_fewshot``, ``lm_eval_limit`` and
    ``lm_eval_batch_size``. ``device``: where the evaluation runs (None: where the model is)."""

    windows: str | None = option(
        None,
        metavar="N[,N...]",
        panel=PERPLEXITY_PANEL,
        help="Causal LM: perplexity over "
        "non-overlapping N-token windows of the whole --data text (rows joined by blank "
        "lines), one result per N; 128,2048 gives both conventions of the pruning papers.",
    )
    lm_eval: str | None = option(
        None,
        metavar="TASKS",
        panel=LM_EVAL_PANEL,
        help="Run lm-evaluation-harness tasks "
        "(comma-separated) on the model; 'default': boolq, piqa, hellaswag, winogrande, "
        "arc_easy, arc_challenge, openbookqa, the pruning papers' zero-shot seven (their "
        "datasets come from the Hub).",
    )
    lm_eval_include: str | None = option(
        None,
        metavar="DIR",
        panel=LM_EVAL_PANEL,
        help="A folder of custom task YAML files, found beside the harness's own tasks.",
    )
    lm_eval_fewshot: int | None = option(
        None,
        low=0,
        metavar="N",
        panel=LM_EVAL_PANEL,
        help="Few-shot examples per task; default: each task's own (0 for the seven).",
    )
    lm_eval_limit: int | None = option(
        None,
        low=1,
        metavar="N",
        panel=LM_EVAL_PANEL,
        help="At most N examples per task (a quick look: the papers use them all).",
    )
    lm_eval_batch_size: int = option(
        8, low=1, metavar="N", panel=LM_EVAL_PANEL, help="Requests per forward in the harness."
    )
    device: str | None = option(
        None,
        metavar="DEVICE",
        panel="Options",
        help="Evaluate on this device: auto (CUDA "
        "when available), cpu, cuda, cuda:N or mps; default: where the model is loaded (the "
        "CPU).",
    )

    def window_sizes(self) -> tuple[int, ...]:
        """The window lengths of ``windows`` in the order given, each once; one-line errors."""
        if self.windows is None:
            return ()
        sizes: list[int] = []
        for part in str(self.windows).split(","):
            size = ascii_whole(part.strip(), WINDOW_DIGITS)
            if size is None or size < 2:
                raise OptionError(WINDOWS_RULE, v=Shown(self.windows))
            if size not in sizes:
                sizes.append(size)
        return tuple(sizes)

    def task_names(self) -> tuple[str, ...]:
        """The harness tasks of ``lm_eval`` in the order given, ``default`` spelled out, each once."""
        if self.lm_eval is None:
            return ()
        names: list[str] = []
        for part in str(self.lm_eval).split(","):
            name = part.strip()
            for one in LM_EVAL_DEFAULT if name == "default" else (name,):
                if one and one not in names:
                    names.append(one)
        if not names:
            raise OptionError("{lm_eval} names no task; give task names, comma-separated, or 'default'")
        return tuple(names)

    def validate(self) -> None:
        """One-line errors (naming the options) for values that cannot work; reads nothing but the include folder."""
        check_fields(self)
        self.window_sizes()
        self.task_names()
        if self.lm_eval is None:
            alone = [
                name
                for name in ("lm_eval_include", "lm_eval_fewshot", "lm_eval_limit")
                if getattr(self, name) is not None
            ]
            if self.lm_eval_batch_size != EvalOptions.lm_eval_batch_size:
                alone.append("lm_eval_batch_size")
            if alone:
                raise OptionError("{%s} applies to {lm_eval} TASKS" % alone[0])
        if self.lm_eval_include is not None:
            folder = os.path.expanduser(self.lm_eval_include)
            if not os.path.isdir(folder):
                raise OptionError(
                    "{lm_eval_include} {p}: not a folder (give the folder of the task YAML files)",
                    p=self.lm_eval_include,
                )
        if self.device is not None:
            check_device(self.device)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def eval_options(given: Mapping[str, Any]) -> EvalOptions:
    """The :class:`EvalOptions` of :func:`headcut.evaluate`'s keyword options, validated: ``windows`` also as an
    int or a list of ints (``[128, 2048]``), ``lm_eval`` also as a list of task names; an unknown name is a
    :class:`~headcut.errors.HeadcutTypeError` listing the options."""
    known = [f.name for f in fields(EvalOptions)]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise HeadcutTypeError(f"evaluate() got an unknown option {unknown[0]!r}; its options: {', '.join(known)}")
    values = dict(given)
    windows = values.get("windows")
    whole = [windows] if isinstance(windows, numbers.Integral) else windows
    if (
        isinstance(whole, (list, tuple))
        and whole
        and all(isinstance(w, numbers.Integral) and not isinstance(w, bool) for w in whole)
    ):
        for w in whole:
            if abs(int(w)) >= 10**WINDOW_DIGITS:  # window_sizes refuses the rest; str() of a long one fails
                raise OptionError(WINDOWS_RULE, v=Shown(w))
        values["windows"] = ",".join(str(int(w)) for w in whole)
    tasks = values.get("lm_eval")
    if isinstance(tasks, (list, tuple)) and all(isinstance(t, str) for t in tasks):
        values["lm_eval"] = ",".join(tasks)
    options = EvalOptions(**values)
    options.validate()
    return options
