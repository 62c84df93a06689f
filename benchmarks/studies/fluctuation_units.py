"""Why the fluctuation rows of Gemma 3 270M's KV budgets differ by dtype: the scores of its KV groups.

FLAP's fluctuation standardises each block's metric over the block's channels (``(S - mean) / std``) and a head's
score is the mean of its channels; a GQA unit scores the mean of its query heads (``headcut.scoring.fluctuation``).
Gemma 3 270M has one KV head per layer, so its only unit in a layer holds every channel of the block: the unit's
score is the mean of a standardised vector, 0 up to rounding, in every layer. The ranking of the 18 units, and so
the layers a fluctuation cut empties, is then set by rounding: float32 and bfloat16 pick other layers.

``python -m benchmarks.studies.fluctuation_units`` (about 3 minutes on 2 CPU cores) writes
``benchmarks/results/fluctuation_units.json``: the head scores and unit means of every block (whole model, float32,
the kv_methods study's calibration blocks), and the perplexity of the float32 model cut by the mask the layer-wise
bf16 run chose at 4 KV groups removed (from ``kv_methods.json``), evaluated as that study evaluates; and the layers a
layer-wise run on the float32 checkpoint empties at 4, against the whole-model float32 row's.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import headcut
import headcut_offline as offline
from benchmarks.harness.measure_kv import KV_STUDIES
from benchmarks.harness.store import RESULTS, machine
from headcut.errors import HeadcutError


def main() -> None:
    spec = KV_STUDIES["gemma3"]
    src = spec.checkpoint()
    text = offline.hamlet_path().read_text()
    half = len(text) // 2
    batch = {"batch_size": spec.batch_size} if spec.batch_size else {}
    start = time.perf_counter()
    out: dict = {"model": "gemma3", "cal_examples": spec.cal_examples, "eval_examples": spec.eval_examples}
    kv = json.loads((RESULTS / "kv_methods.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        cal, held = Path(tmp) / "a.txt", Path(tmp) / "b.txt"
        cal.write_text(text[:half])
        held.write_text(text[half:])
        scores = headcut.score(
            str(src),
            scorer="fluctuation",
            data=str(cal),
            data_options={"seq_len": 256, "max_examples": spec.cal_examples, **batch},
        )
        blocks = {name: [float(x) for x in v] for name, v in scores.scores.blocks.items()}
        out["head_scores"] = blocks
        out["unit_means"] = {name: sum(v) / len(v) for name, v in blocks.items()}
        out["largest_unit_mean"] = max(abs(m) for m in out["unit_means"].values())
        out["smallest_head_spread"] = min(max(v) - min(v) for v in blocks.values())
        checks = {}
        for method in ("fluctuation", "fluctuation layer-wise bf16"):
            row = next(
                (r for r in kv["rows"] if r["study"] == "gemma3" and r["method"] == method and r["removed"] == 4), None
            )
            if row is None:
                continue
            folder = Path(tmp) / "cut"
            headcut.export(str(src), row["mask"], gqa="group").save(folder, force=True)
            ppl = headcut.evaluate(
                folder, held, data_options={"seq_len": 256, "max_examples": spec.eval_examples, **batch}
            ).value
            checks[method] = {
                "emptied": sorted(k for k, v in row["mask"]["keep"].items() if not v),
                "perplexity_float32": ppl,
                "perplexity_in_row": row["perplexity"],
            }
        out["float32_cut_by_mask_at_4"] = checks
        # the layer-wise path on the float32 checkpoint: the same scores' ranking as the whole model's?
        whole = next(
            (r for r in kv["rows"] if r["study"] == "gemma3" and r["method"] == "fluctuation" and r["removed"] == 4),
            None,
        )
        try:  # a headcut that refuses fluctuation where every block is one unit says so instead
            lw = headcut.prune(
                str(src),
                "fluctuation",
                keep=(18 - 4) * 4,
                gqa="group",
                data=str(cal),
                layerwise=True,
                data_options={"seq_len": 256, "max_examples": spec.cal_examples, **batch},
            )
        except HeadcutError as error:
            out["layerwise_float32_at_4"] = {"refused": str(error)}
        else:
            out["layerwise_float32_at_4"] = {
                "emptied": sorted(k for k, v in lw.mask.to_json()["keep"].items() if not v),
                "same_as_whole_model_float32": None if whole is None else lw.mask.to_json() == whole["mask"],
            }
    out["seconds"] = time.perf_counter() - start
    out["machine"] = machine()
    (RESULTS / "fluctuation_units.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k not in ("head_scores", "machine")}, indent=1))


if __name__ == "__main__":
    main()
