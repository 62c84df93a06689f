"""Render the benchmark page, ``docs/benchmarks.md``, from the stored results (and draw ``docs/img/*.png``).

Every number on the page is read from a results file; a study without results is named as not measured, and
one still running is marked so; every verdict comes from a rule declared in :mod:`benchmarks.harness.verdicts`;
the hand-written parts (the main job, what the measurements show, the earlier studies) are the files of
``benchmarks/harness/notes/``, included as they are. The page's text does not depend on matplotlib, which only
draws the plots (``pip install 'headcut[plots]'``).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.harness.curves import (
    DEFAULT_SAID,
    absent_methods,
    all_curves,
    curve_table,
    default_curve,
    plot_curves,
    training_free_curves,
)
from benchmarks.harness.formatting import fmt, pyplot
from benchmarks.harness.kv8 import render_markdown as kv8_markdown
from benchmarks.harness.kv_budget import render_markdown as kv_budget_markdown
from benchmarks.harness.levers import LEVERS, RECOVERY_LOSSES
from benchmarks.harness.long_context import render_markdown as long_context_markdown
from benchmarks.harness.registry import STUDIES
from benchmarks.harness.render_decoder_default import decoder_default_section
from benchmarks.harness.render_decoders import (
    KV_SECTIONS,
    kv_methods_section,
    kv_section,
    layerwise_section,
    peer_llm_section,
)
from benchmarks.harness.render_tasks import (
    DIAGNOSES,
    TASK_SECTIONS,
    diagnosis,
    refit_section,
    small_data_targets,
    task_section,
)
from benchmarks.harness.serving import render_markdown as serving_markdown
from benchmarks.harness.store import load_results
from benchmarks.harness.verdicts import (
    AUBER_ERROR,
    CLAIMS,
    TARGETS,
    TIMING_NOISE,
    Claim,
    Verdict,
)

NOTES = Path(__file__).resolve().parent / "notes"


def _machine_line(name: str, study: dict[str, Any]) -> str:
    m = study["machine"]
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    state = "" if study.get("complete", True) else " (partial)"
    return (
        f"| `{name}`{state} | {m['date']} | {m['cpu']} ({m['cores']} cores{gpu}) | torch {m['torch']}, "
        f"transformers {m['transformers']}, headcut {m['headcut']} | {study['seconds'] / 60:.0f} min |"
    )


# ---- curves ---------------------------------------------------------------------------------------------


# ---- sections -------------------------------------------------------------------------------------------


def _targets(recipe: dict[str, Any], verdicts: list[Verdict]) -> list[str]:
    lines = [
        "",
        "## Targets",
        "",
        "The gradient recipe, the README main job's until issue 33 (its default now: [targets on every "
        "task](#targets-on-every-task)) (`headcut prune MODEL --method gradient --keep K --data train.csv "
        "--max-examples 4000 --batch-size 8 --recover-steps N`: one-shot gradient scores of the 4,000 training "
        "snippets, the cut, then N steps of batch 8 of recovery fine-tuning distilled from the unpruned model), "
        "per seed (accuracy in %, on the held-out snippets):",
        "",
        "| heads | recovery steps | seed | unpruned | after the cut | after recovery | below unpruned | target |"
        " time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k, target in TARGETS.items():
        rows = [r for r in recipe["rows"] if r["k"] == k]
        held = 0
        for row in sorted(rows, key=lambda r: r["seed"]):
            drop = row["before"] - row["after"]
            ok = target.holds(drop, row["recover_steps"] + row.get("train_steps", 0))
            held += ok
            lines.append(
                f"| {k} | {row['recover_steps']} | {row['seed']} | {row['before']:.2f} | "
                f"{fmt(row.get('after_pruning'))} | {row['after']:.2f} | {drop:.2f} | "
                f"{'holds' if ok else 'missed'} (<= {target.points:g} in <= {target.steps} steps) | "
                f"{row['seconds'] / 60:.1f} min |"
            )
        if rows:
            drops = [r["before"] - r["after"] for r in rows]
            verdicts.append(
                Verdict(
                    "The gradient recipe on the README's classifier (issue 16's targets, [targets](#targets))",
                    f"{k} heads within {target.points:g} point{'' if target.points == 1 else 's'} in at most {target.steps} steps",
                    f"holds in {held} of {len(rows)} seeds (mean {statistics.mean(drops):.2f} points below, worst "
                    f"{max(drops):.2f})",
                )
            )
            lines.append(
                f"| {k} | | mean of {len(rows)} | | | | {statistics.mean(drops):.2f} (worst {max(drops):.2f}) | | |"
            )
    return lines


def _peer_at(peer: dict[str, Any], k: int) -> dict[str, Any] | None:
    """The peer's best run asked for ``k`` heads (of its variants), or None when none was."""
    runs = [r["ks"][str(k)] for r in peer["runs"].values() if str(k) in r["ks"]]
    return max(runs, key=lambda r: r["accuracy"]) if runs else None


def _peer_table(data: dict[str, dict[str, Any]], curves: dict[str, dict[int, float]]) -> list[str]:
    peer = data["peer"]
    run = next(iter(peer["runs"].values()))
    lines = [
        "",
        "**Against the peer** (TextPruner's iterative pruning, "
        f"{run['n_iters']} iterations, textpruner {run['textpruner']} with transformers {run['transformers']}, "
        "in its own virtual environment; nothing trained), on the same 512 calibration snippets, at every K it "
        "reaches (multiples of the 6 layers; its last iteration can keep more heads than asked). Beside it, "
        "headcut's best training-free method at the heads TextPruner kept, and headcut's best at as many heads "
        "or fewer (a smaller model at least as accurate). TextPruner's masks are evaluated by headcut (its own "
        "figure in the last column):",
        "",
        "| TextPruner asked | TextPruner kept | TextPruner | headcut, same heads: best method | accuracy | "
        "`michel` (defaults) | difference | headcut, as many heads or fewer: best | difference | "
        "TextPruner's own figure |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    training_free = training_free_curves(data)
    schedule = next((m for m in training_free if m.startswith(f"michel --rounds {run['n_iters']} ")), None)
    diffs = []  # that one configuration (TextPruner's schedule) at every K
    for k in sorted({int(k) for r in peer["runs"].values() for k in r["ks"]}, reverse=True):
        theirs = _peer_at(peer, k)
        kept = theirs.get("kept", k)
        if schedule and kept in training_free[schedule]:
            ours = training_free[schedule][kept]
            diffs.append(f"{kept} heads {ours:.2f} vs {theirs['accuracy']:.2f} ({ours - theirs['accuracy']:+.2f})")
        fewer = [(acc, q, m) for m, c in training_free.items() for q, acc in c.items() if q <= kept]
        if not fewer:
            continue
        same = {m: c[kept] for m, c in training_free.items() if kept in c}
        acc, q, m = max(fewer)
        cells = [str(k), str(kept), f"{theirs['accuracy']:.2f}"]
        if same:
            best = max(same, key=lambda name: same[name])
            cells += [
                best,
                f"{same[best]:.2f}",
                fmt(training_free.get("michel", {}).get(kept)),
                f"{same[best] - theirs['accuracy']:+.2f}",
            ]
        else:
            cells += ["(not measured at this K)", "", "", ""]
        cells += [
            f"{m}, {q} heads: {acc:.2f}",
            f"{acc - theirs['accuracy']:+.2f}",
            f"{theirs['accuracy_textpruner']:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if diffs:
        lines += [
            "",
            f"One configuration, not the best of many: `{schedule}` (TextPruner's own "
            f"schedule, {run['n_iters']} rounds to each K, and its way of scoring), one run per K, against "
            "TextPruner: " + "; ".join(diffs) + ".",
        ]
    recipe = curves.get("headcut recipe (gradient + distilled recovery)")
    if recipe:
        pairs = []
        for k in sorted(recipe, reverse=True):
            theirs = _peer_at(peer, k)
            if theirs:
                kept = theirs.get("kept", k)
                pairs.append(
                    f"{k} heads {recipe[k]:.1f} vs {theirs['accuracy']:.1f}"
                    + (f" (TextPruner kept {kept})" if kept != k else "")
                )
        lines += [
            "",
            "With training (the recipe's distilled recovery), headcut against TextPruner: " + "; ".join(pairs) + ".",
        ]
    return lines


def _wall_times(data: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Prune wall time",
        "",
        "Seconds on this machine's CPU for one run to K heads (scoring or training included, the final "
        "evaluation not):",
        "",
        "| method | what | seconds |",
        "|---|---|---|",
    ]
    rows = [
        r
        for name in ("oneshot", "iterative")
        for r in data.get(name, {}).get("rows", [])
        if r.get("seconds") is not None
    ]
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        if method == "greedy-gnorm" or method.startswith("michel --step"):
            lines.append(
                f"| {method} | all K in one run down to {mine[0]['k']} (512 snippets) | {mine[0]['seconds']:.0f} |"
            )
        else:
            lines.append(
                f"| {method} | mean over K (512 snippets) | {statistics.mean(r['seconds'] for r in mine):.1f} |"
            )
    learned = [
        r for r in data.get("learned", {}).get("rows", []) + data.get("voita", {}).get("rows", []) if "method" in r
    ]
    for method in dict.fromkeys(r["method"] for r in learned):
        mine = [r["seconds"] for r in learned if r["method"] == method]
        what = "its lambda search (up to 5 runs of 500 steps)" if method == "voita" else "500 training steps"
        lines.append(f"| {method} | {what}, mean over K | {statistics.mean(mine):.0f} |")
    recipe = [r for r in data.get("recipe", {}).get("rows", []) if r["recover_steps"] == 500]
    if recipe:
        lines.append(
            f"| headcut recipe | scores of 4,000 snippets + 500 recovery steps, mean | "
            f"{statistics.mean(r['seconds'] for r in recipe):.0f} |"
        )
    for row in data.get("claims", {}).get("rows", []):
        extra = ", with the control, early stopping on 500 other training snippets" if row["run"] == "lottery" else ""
        lines.append(f"| {row['run']} | its defaults{extra} | {row['seconds']:.0f} |")
    return lines


def _levers(levers: dict[str, Any], recipe: dict[str, Any] | None) -> list[str]:
    lines = [
        "",
        "## Levers",
        "",
        "Each lever of the training methods measured alone at 16 heads (seed 0 unless the row says otherwise; "
        "one run each, so differences under about 0.8 points are within one standard error of the "
        "2,808-snippet accuracy):",
        "",
        "| lever | training steps | accuracy | below unpruned |",
        "|---|---|---|---|",
    ]
    for row in levers["rows"]:
        steps = row.get("train_steps", 0) + row.get("recover_steps", 0)
        lines.append(f"| {row['lever']} | {steps} | {row['after']:.2f} | {row['before'] - row['after']:.2f} |")
    missing = [name for name in LEVERS if name not in {r["lever"] for r in levers["rows"]}]
    if missing:
        lines += ["", "Not measured yet: " + "; ".join(missing) + "."]
    return lines + _recovery_losses(levers, recipe)


def _recovery_losses(levers: dict[str, Any], recipe: dict[str, Any] | None) -> list[str]:
    """The recovery's loss over the targets' seeds: the recipe's distilled rows beside the levers' others."""
    after = {r["lever"]: r["after"] for r in levers["rows"]}
    mine = {(r["k"], r["seed"]): r["after"] for r in (recipe or {}).get("rows", [])}
    table = {"distilled logits (the recipe, the default)": [[mine.get((k, s)) for s in range(3)] for k in (16, 8)]}
    for loss, names in RECOVERY_LOSSES.items():
        table[loss] = [[after.get(name) if name else None for name in seeds] for seeds in names]
    if sum(v is not None for runs in table.values() for seeds in runs for v in seeds) < 5:
        return []
    lines = [
        "",
        "The recovery's loss over seeds (one-shot gradient scores, the cut, then the recovery, all with the "
        "same seed): 16 heads after 500 steps, 8 heads after 1,000 (accuracy in %):",
        "",
        "| recovery loss | 16 heads: seed 0 | seed 1 | seed 2 | mean | 8 heads: seed 0 | seed 1 | seed 2 | mean |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for loss, runs in table.items():
        cells = [
            v for seeds in runs for v in [*seeds, statistics.mean(seeds) if all(v is not None for v in seeds) else None]
        ]
        lines.append(f"| {loss} | " + " | ".join(fmt(v) for v in cells) + " |")
    return lines


#: accuracy (%) of always answering the majority class on the 2,808 held-out snippets (1,597 of them)
MAJORITY = 100 * 1597 / 2808


def _faster(ms: float, than_ms: float) -> str:
    """Whether ``ms`` is faster than ``than_ms`` by more than the machine's run-to-run noise (the claim's rule)."""
    gain = 1.0 - ms / than_ms
    if CLAIMS["passconc"].rule.holds(gain, 0.0):
        return f"yes ({100 * gain:.0f} % faster)"
    return (
        f"not measurably ({100 * gain:+.0f} %, under the {100 * TIMING_NOISE:.0f} % or more that CPU timings "
        "vary by from run to run here)"
    )


def _claim_row(claim: Claim, measured: str, outcome: str, verdicts: list[Verdict], at: str = "") -> str:
    """A row of the claims table (and its line in the summary; ``at``: which of the claim's rows it is)."""
    verdicts.append(
        Verdict(
            "The papers' claims ([the papers' claims](#the-papers-claims))",
            f"{claim.paper}: {claim.claim}{at}",
            outcome.split(" (")[0],
        )
    )
    return f"| {claim.paper} | {claim.claim} | {claim.figure} | {measured} | {outcome} |"


def _claims(data: dict[str, dict[str, Any]], curves: dict[str, dict[int, float]], verdicts: list[Verdict]) -> list[str]:
    lines = [
        "",
        "## The papers' claims",
        "",
        "One row per claim: the paper's own figure (its model, data and training budget; BERT-base has 144 "
        "heads) beside headcut's on this 72-head classifier (learned gates: 500 steps of 8 with the papers' "
        "loss, far shorter than the papers' runs):",
        "",
        "| paper | claim | the paper's figure | headcut's figure | holds here? |",
        "|---|---|---|---|---|",
    ]

    def curve(name: str) -> dict[int, float]:
        return curves.get(name, {})

    pass_, dsp = curve("pass (learned, 500 steps)"), curve("dsp (learned, 500 steps)")
    if 16 in pass_ and 16 in dsp:
        claim = CLAIMS["pass>=dsp"]
        lines.append(
            _claim_row(
                claim,
                f"16 heads: PASS {pass_[16]:.1f}, DSP {dsp[16]:.1f}",
                "yes" if claim.rule.holds(pass_[16], dsp[16]) else "no",
                verdicts,
            )
        )
    bench = next((r for r in data.get("learned", {}).get("rows", []) if r.get("bench") == "pass-vs-passconc-16"), None)
    if bench:
        ms = {m["name"]: m["median_ms"] for m in bench["models"]}
        conc = curve("passconc (learned, 500 steps)").get(16)
        lines.append(
            _claim_row(
                CLAIMS["passconc"],
                f"16 heads, whole model on the CPU, batch 8 x 128: PASSCONC {ms['passconc']:.1f} ms, "
                f"PASS {ms['pass']:.1f} ms (unpruned {ms['72']:.1f}); accuracy {fmt(conc, 1)} vs "
                f"{fmt(pass_.get(16), 1)} %",
                _faster(ms["passconc"], ms["pass"]),
                verdicts,
            )
        )
    michel = curve("michel")
    for k in (8, 4):
        if k in dsp and k in michel:
            claim = CLAIMS["dsp>michel"]
            lines.append(
                _claim_row(
                    claim,
                    f"{k} heads: DSP {dsp[k]:.1f}, Michel {michel[k]:.1f}",
                    "yes" if claim.rule.holds(dsp[k], michel[k]) else "no",
                    verdicts,
                    f" ({k} heads)",
                )
            )
    greedy, entropy, rnd = curve("greedy-gnorm"), curve("entropy"), curve("random")
    if greedy and entropy and rnd:
        ks = sorted(set(greedy) & set(entropy) & set(rnd), reverse=True)
        claim = CLAIMS["gnorm"]
        wins = [k for k in ks if claim.rule.holds(greedy[k], entropy[k]) and claim.rule.holds(greedy[k], rnd[k])]
        lines.append(
            _claim_row(
                claim,
                f"above both at {len(wins)} of {len(ks)} K (16 heads: {fmt(greedy.get(16), 1)} "
                f"vs {fmt(entropy.get(16), 1)} and {fmt(rnd.get(16), 1)})",
                "yes" if len(wins) == len(ks) else "partly",
                verdicts,
            )
        )
    claims = {r["run"]: r for r in data.get("claims", {}).get("rows", [])}
    lottery = claims.get("lottery")
    if lottery and lottery.get("lottery", {}).get("control_metric") is not None:
        control = 100 * lottery["lottery"]["control_metric"]
        claim = CLAIMS["lottery"]
        lines.append(
            _claim_row(
                claim,
                f"16 of 72 heads: ticket {lottery['after']:.1f}, re-initialised {control:.1f} "
                f"(trained from scratch for the ticket's {lottery['lottery']['control_steps']} steps on "
                "the 4,000 snippets)",
                f"{'yes' if claim.rule.holds(lottery['after'], control) else 'no'}{_lottery_caveat(control)}",
                verdicts,
            )
        )
    auber = claims.get("auber")
    if auber:
        claim = CLAIMS["auber"]
        outcome = (
            "no loss"
            if claim.rule.holds(auber["after"], auber["before"])
            else f"within one standard error ({AUBER_ERROR:g})"
            if claim.rule.holds(auber["after"], auber["before"] - AUBER_ERROR)
            else "no"
        )
        lines.append(
            _claim_row(
                claim,
                f"kept {auber['heads_after']} of 72 heads: {auber['before']:.1f} -> {auber['after']:.1f} %",
                outcome,
                verdicts,
            )
        )
    return lines


def _lottery_caveat(control: float) -> str:
    """Why a control stuck at the held-out split's majority class says little about the ticket."""
    if abs(control - MAJORITY) > 0.05:
        return ""
    return (
        f" (a weaker test than the paper's: the control never left the majority class, {MAJORITY:.1f} %, "
        "trained from scratch on only 4,000 snippets; the paper's control trained on a whole translation "
        "corpus)"
    )


def _speed(speed: dict[str, Any], img: Path | None) -> list[str]:
    lines = ["", "## Speed-up vs heads kept", ""]
    if img is not None:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for device, rows in speed["devices"].items():
            rows = sorted(rows, key=lambda r: r["heads"])
            ax.plot([r["heads"] for r in rows], [r["speedup"] for r in rows], marker="o", label=f"speed-up ({device})")
        rows = sorted(next(iter(speed["devices"].values())), key=lambda r: r["heads"])
        ax.plot(
            [r["heads"] for r in rows],
            [r["flop_ratio"] for r in rows],
            linestyle="--",
            color="grey",
            label="FLOP ratio",
        )
        ax.set_xlabel("heads kept (of 72)")
        ax.set_ylabel("x the unpruned model")
        ax.set_title("Speed-up vs heads kept (batch 8 x 128 tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(img / "speed-vs-heads.png", dpi=110)
        plt.close(fig)
    lines += ["![speed-up vs heads kept](img/speed-vs-heads.png)", ""]
    if not speed["devices"].get("cuda"):
        lines += ["No GPU was available to this run: CPU only.", ""]
    for device, rows in speed["devices"].items():
        rounds = speed.get("rounds", 1)
        lines += [
            f"`headcut bench` on {device}, batch 8 x 128 tokens, the one-shot gradient masks; median ms: the "
            f"median over {rounds} rounds (each model timed {speed.get('runs', 20)} times per round, the rounds "
            "going over all the models in turn) of each round's median, with the rounds' range:",
            "",
            "| heads | parameters | median ms | rounds' range (ms) | speed-up | FLOP ratio |",
            "|---|---|---|---|---|---|",
        ]
        for r in sorted(rows, key=lambda r: -r["heads"]):
            spread = r.get("round_ms", [r["median_ms"]])
            lines.append(
                f"| {r['heads']} | {r['params'] / 1e6:.1f} M | {r['median_ms']:.1f} | "
                f"{min(spread):.1f}-{max(spread):.1f} | {r['speedup']:.2f} | {r['flop_ratio']:.2f} |"
            )
        lines.append("")
    return lines


def _long_context(data: dict[str, dict[str, Any]]) -> list[str]:
    """The long-context section, from ``results/long_context.json`` (``benchmarks/studies/long_context.py``); nothing
    when it is absent."""
    if not data.get("long_context"):
        return []
    return ["", *long_context_markdown(data["long_context"]).rstrip().splitlines()]


def _summary(verdicts: list[Verdict]) -> list[str]:
    """The page's top: every verdict, by the rule that decided it, grouped as the page's sections give them."""
    lines = [
        "## Summary",
        "",
        "Every verdict on this page, each decided by a rule declared in `benchmarks/harness/verdicts.py` (the "
        "targets' points and steps, each claim's comparison and margin) from the stored results:",
    ]
    sections: dict[str, list[Verdict]] = {}
    for verdict in verdicts:
        sections.setdefault(verdict.section, []).append(verdict)
    for section, items in sections.items():
        lines += ["", f"{section}:", ""]
        lines += [f"- {v.what}: **{v.outcome}**" for v in items]
    lines += [
        "",
        "Below: [the main job](#the-main-job) (the README's command, measured by hand), [what the measurements "
        "show](#what-the-measurements-show) (read by hand from the sections after it), [the studies](#studies) "
        "(their machines and how to measure them again), every study's section, and [earlier "
        "studies](#earlier-studies) (the archived scripts' numbers).",
    ]
    return lines


def _studies(data: dict[str, dict[str, Any]]) -> list[str]:
    """The table of studies: the machine, versions, date and time each one records, and how to measure them."""
    listed = [study.name for study in STUDIES if study.listed]
    lines = [
        "",
        "## Studies",
        "",
        "Each study keeps its rows in `benchmarks/results/NAME.json` with the machine, the versions, the date and "
        "its time. `python -m benchmarks.harness --studies NAME` measures a study of the harness (an interrupted "
        "one goes on from its last finished row; `--extend NAME` measures only the rows a finished one lacks, "
        "`--rerun NAME` all of them again; `--peer-python PEER/bin/python` runs TextPruner, the peer, in its own "
        "virtual environment with transformers 4: `benchmarks/studies/peer_textpruner.py`), and `python -m "
        "benchmarks.harness --studies none` only renders this page (with the plots: `pip install -e '.[plots]'`). "
        "The other studies are scripts of `benchmarks/studies/` run on their own (`benchmarks/harness/registry.py` "
        "names each one's command); `tests/test_benchmarks.py` renders the page from the stored results and checks "
        "that it equals this file.",
        "",
        "| study | date | machine | versions | time |",
        "|---|---|---|---|---|",
    ]
    lines += [_machine_line(name, data[name]) for name in listed if name in data]
    missing = [s for s in listed if s not in data]
    if missing:
        lines += ["", f"Not measured yet: {', '.join(f'`{s}`' for s in missing)}."]
    return lines


def _note(name: str) -> list[str]:
    """A hand-written part of the page (``notes/NAME.md``), as it is."""
    return ["", *(NOTES / f"{name}.md").read_text().rstrip().splitlines()]


def page(data: dict[str, dict[str, Any]], img: Path | None = None) -> str:
    """The page's text from the stored results ``data`` (:func:`benchmarks.harness.store.load_results`); with ``img``,
    also draw its plots into that folder (matplotlib)."""
    verdicts: list[Verdict] = []
    lines: list[str] = []
    if data.get("recipe"):
        lines += _targets(data["recipe"], verdicts)

    curves = all_curves(data)
    if curves:
        unpruned = (
            next(s["unpruned"] for s in (data.get("oneshot"), data.get("peer")) if s and "unpruned" in s)
            if any(s and "unpruned" in s for s in (data.get("oneshot"), data.get("peer")))
            else data["recipe"]["rows"][0]["before"]
        )
        points = {}
        for row in data.get("claims", {}).get("rows", []):
            if row["run"] == "lottery":
                points["lottery ticket (its defaults)"] = (row["k"], row["after"])
            elif row["run"] == "auber":
                points["auber (its own K)"] = (row["heads_after"], row["after"])
        lines += ["", "## Accuracy vs heads kept", ""]
        if img is not None:
            plot_curves(
                curves,
                points,
                unpruned,
                "MiniLM Rotten Tomatoes classifier: accuracy vs heads kept",
                img / "accuracy-vs-heads.png",
            )
        lines += ["![accuracy vs heads kept](img/accuracy-vs-heads.png)", ""]
        lines += [
            f"Accuracy (%) by heads kept; unpruned {unpruned:.2f} %. {DEFAULT_SAID} The recipe (the main "
            "job's before issue 33): one-shot gradient scores of 4,000 training snippets and distilled recovery "
            "(500 steps of 8; 1,000 below 12 heads); learned gates: 500 steps of 8 with the papers' loss (no "
            "distillation, no recovery); training-free methods "
            "scored on 512 training snippets, nothing trained (random: mean of 5 seeds).",
            "",
        ]
        lines += curve_table(curves)
        absent = absent_methods(curves, points)
        if absent:
            lines += [
                "",
                "Not on the plot yet (their studies are not measured): " + ", ".join(f"`{m}`" for m in absent) + ".",
            ]
        if points:
            lines += [
                "",
                "Single runs: "
                + "; ".join(f"{name}: {acc:.2f} % at {k} heads" for name, (k, acc) in points.items())
                + ".",
            ]
        if data.get("peer") and data.get("oneshot"):
            lines += _peer_table(data, curves)
    if data.get("levers"):
        lines += _levers(data["levers"], data.get("recipe"))
    if curves:
        lines += _claims(data, curves, verdicts)
    for name, (title, about, plot_title) in TASK_SECTIONS.items():
        if data.get(name) and data[name].get("rows"):
            lines += task_section(
                name, data[name], title, about, plot_title, img, default_curve(data, name.replace("_", "-"))
            )
    lines += small_data_targets(data, verdicts)
    for name, (heading, timing, *intro) in DIAGNOSES.items():
        if data.get(name, {}).get("rows"):
            lines += diagnosis(data[name], heading, timing, *intro)
    if data.get("refit", {}).get("rows"):
        lines += refit_section(data["refit"])
    if curves:
        lines += _wall_times(data)
    if data.get("speed"):
        lines += _speed(data["speed"], img)
    for name in KV_SECTIONS:
        if data.get(name):
            lines += kv_section(name, data[name], img)
    if data.get("kv_methods", {}).get("rows"):
        lines += kv_methods_section(data)
    if data.get("peer_llm", {}).get("rows"):
        lines += peer_llm_section(data["peer_llm"], data)
    if data.get("decoder_recipe", {}).get("rows"):
        lines += decoder_default_section(data["decoder_recipe"])
    if data.get("kv8", {}).get("rows"):
        lines += kv8_markdown(data["kv8"])
    if data.get("layerwise_memory", {}).get("rows"):
        lines += layerwise_section(data["layerwise_memory"])
    lines += _long_context(data)
    if data.get("serving", {}).get("contexts"):
        lines += ["", *serving_markdown(data["serving"]).rstrip().splitlines(), *_note("serving")]
    if data.get("kv_budget", {}).get("rows"):
        recipe_rows = data.get("decoder_recipe", {}).get("rows", {})
        unpruned = {m: recipe_rows.get(f"{m}/unpruned", {}).get("perplexity", {}) for m in ("gemma3", "smollm")}
        lines += ["", *kv_budget_markdown(data["kv_budget"], unpruned).rstrip().splitlines(), *_note("kv_budget")]
    top = [
        "# Benchmarks",
        "",
        "Generated by `python -m benchmarks.harness --studies none` from the measurements in `benchmarks/results/` and",
        "the hand-written notes in `benchmarks/harness/notes/` (do not edit this file by hand: edit those and",
        "re-render). Every number below was measured on the machine named for its study; the classifier is the",
        "README's (all-MiniLM-L6-v2 fine-tuned on 4,000 Rotten Tomatoes snippets, 72 heads, `benchmarks/classifier.py`),",
        "evaluated on the 2,808 held-out snippets unless a section says otherwise; back to the [README](../README.md).",
        "",
        *_summary(verdicts),
        *_note("main-job"),
        *_note("findings"),
        *_studies(data),
    ]
    return "\n".join([*top, *lines, *_note("earlier-studies")]).rstrip() + "\n"


def render(results: Path, docs: Path, draw: bool = True) -> Path:
    """Write the page, ``docs/benchmarks.md``, from the results in ``results`` (and, with ``draw``, its plots into
    ``docs/img/``: matplotlib) and return its path."""
    img = docs / "img" if draw else None
    if img is not None:
        img.mkdir(parents=True, exist_ok=True)
    path = docs / "benchmarks.md"
    path.write_text(page(load_results(results), img))
    return path
