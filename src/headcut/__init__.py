"""headcut: remove attention heads from transformer checkpoints, exactly.

Python API (the CLI is a thin layer over it)::

    import headcut
    model = headcut.load("model/")                       # safetensors only, unless allow_pickle
    print(headcut.info(model).total_heads)
    with headcut.gated(model, {"drop": {"self.0": [1, 2]}}):
        ...                                             # heads masked, nothing removed
    headcut.slim(model, {"drop": {"self.0": [1, 2]}})    # heads physically removed
    headcut.prune(model, calibration, headcut.PruneConfig(method="greedy-gnorm", keep=48))  # choose + slim
    headcut.save(model, "slim/", source="model/")       # loads back with headcut.load or transformers
    headcut.bench(["model/", "slim/"], headcut.BenchConfig(device="cpu"))
"""

__version__ = "0.1.0"

from .bench import BenchConfig, BenchResult, bench, bench_model  # noqa: E402
from .errors import HeadcutError  # noqa: E402
from .gating import HeadGates, gated  # noqa: E402
from .info import ModelInfo, info  # noqa: E402
from .io import load, save  # noqa: E402
from .masks import HeadMask, read_mask_file, resolve_mask  # noqa: E402
from .pruning import PruneConfig, PruneResult, plan_prune, prune  # noqa: E402
from .surgery import SlimResult, count_params, model_blocks, slim  # noqa: E402

__all__ = [
    "BenchConfig", "BenchResult", "bench", "bench_model", "HeadGates", "HeadMask", "HeadcutError", "ModelInfo", "SlimResult", "count_params", "gated", "info",
    "load", "model_blocks", "plan_prune", "prune", "PruneConfig", "PruneResult", "read_mask_file", "resolve_mask",
    "save", "slim", "__version__",
]
