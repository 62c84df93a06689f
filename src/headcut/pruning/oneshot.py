"""One-shot methods: rank every head once with a scorer of ``headcut score``, then remove the lowest.

``--method NAME`` for each scorer NAME (gradient, gnorm, confidence, entropy, value-l1, fluctuation,
magnitude, random): the scores are computed once, on the input model, after the scorer's normalisation, and
oriented with :meth:`HeadScores.importance` (higher = more important). Heads (units) are removed
lowest first; ``--uniform`` keeps the same number in every block instead (TextPruner's even
masking). With ``--max-drop`` or ``--trajectory`` the same ranking is cut in steps.

``--method inverse-NAME`` removes the *highest* first: the diagnostic "inverse pruning" of
Greedy-Gnorm (arXiv:2602.04491 §4.2, Inverse-AE: the static ranking reversed). ``random`` (seeded
uniform scores: Greedy-Gnorm's random-pruning baseline, §4.1) has no inverse, nor has ``gnorm``
(Greedy-Gnorm's inverse is the iterative ``inverse-gnorm``).
"""

from __future__ import annotations

from .ranked import ScoreMethod, ten_percent


def _one_shot(scorer: str, inverse: bool = False) -> ScoreMethod:
    name = f"inverse-{scorer}" if inverse else scorer
    return ScoreMethod(name, scorer, rescoring=False, inverse=inverse, default_step=ten_percent)


GRADIENT = _one_shot("gradient")
GNORM = _one_shot("gnorm")
CONFIDENCE = _one_shot("confidence")
ENTROPY = _one_shot("entropy")
VALUE_L1 = _one_shot("value-l1")
MAGNITUDE = _one_shot("magnitude")
FLUCTUATION = _one_shot("fluctuation")
RANDOM = _one_shot("random")
INVERSE_GRADIENT = _one_shot("gradient", inverse=True)
INVERSE_CONFIDENCE = _one_shot("confidence", inverse=True)
INVERSE_ENTROPY = _one_shot("entropy", inverse=True)
INVERSE_VALUE_L1 = _one_shot("value-l1", inverse=True)
INVERSE_MAGNITUDE = _one_shot("magnitude", inverse=True)
