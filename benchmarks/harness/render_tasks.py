"""The page's sections on the tasks besides the README's classifier: the second task and the two small-data tasks,
issue 33's targets on every task, the small-data diagnoses and the refit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness.curves import (
    DEFAULT_RUN,
    DEFAULT_SAID,
    EARLIER_RUN,
    PREVIOUS_RUN,
    TRAINING_ROWS,
    curve_table,
    default_rows,
    learned_curves,
    oneshot_curves,
    plot_curves,
)
from benchmarks.harness.formatting import fmt
from benchmarks.harness.verdicts import TASK_TARGETS, Verdict

#: the tasks besides the README's classifier, each a section: study -> (heading, what the task is, plot title)
TASK_SECTIONS = {
    "convention": (
        "A second task: the party of a convention speech's sentence",
        "all-MiniLM-L6-v2 fine-tuned (two epochs) on 5,718 sentences of 2012 Democratic and Republican convention "
        "speeches to tell the speaker's party; evaluated on sentences of speeches it never saw (743 Democratic and "
        "738 Republican: chance about 50 %)",
        "Convention sentences (party): accuracy vs heads kept",
    ),
    "review_plot": (
        "Small data: review or plot (900 training rows, three classes)",
        "all-MiniLM-L6-v2 fine-tuned (five epochs, batch 16) on 900 Rotten Tomatoes snippets, 300 each of a negative "
        "review, a positive review and a plot sentence (`headcut_offline.review_plot_splits`); evaluated on 600 other "
        "snippets of each class (chance 33.3 %)",
        "Review or plot (900 rows): accuracy vs heads kept",
    ),
    "debates": (
        "Small data: who speaks in a 2016 debate (786 training rows, three classes)",
        "all-MiniLM-L6-v2 fine-tuned (five epochs, batch 16) on 786 statements of the 2016 presidential and "
        "vice-presidential debates, labelled Republican (Trump, Pence), Democratic (Clinton, Kaine) or Moderator "
        "(`headcut_offline.debate_splits`: 70 % of each side's statements); evaluated on the other 30 % (136, 104 and "
        "96 statements)",
        "2016 debates (786 rows): accuracy vs heads kept",
    ),
}


def _standard_error(accuracy: float, n: int) -> float:
    """The standard error (points) of an accuracy (%) measured on ``n`` examples."""
    p = accuracy / 100.0
    return 100.0 * (p * (1.0 - p) / n) ** 0.5


def task_section(
    name: str,
    study: dict[str, Any],
    title: str,
    about: str,
    plot_title: str,
    img: Path | None,
    default: dict[str, dict[int, float]],
) -> list[str]:
    rows = study["rows"]
    curves = {
        **default,
        "headcut recipe (gradient + distilled recovery)": {
            r["k"]: r["after"] for r in rows if r["method"] == "recipe" and "after" in r
        },
    }
    curves.update(learned_curves([r for r in rows if r["method"] != "recipe"]))
    curves.update(oneshot_curves({"rows": [r for r in rows if r["method"] != "recipe"]}))
    n, unpruned = study.get("evaluation", 0), study.get("unpruned", 0.0)
    lines = [
        "",
        f"## {title}",
        "",
        f"{about}; unpruned {unpruned:.2f} % on {n:,} held-out examples (standard error "
        f"{_standard_error(unpruned, n):.2f} points)."
        if n
        else f"{about}.",
        "",
    ]
    lines += _devices_said(rows, unpruned) + ([DEFAULT_SAID, ""] if default else [])
    png = f"{name.replace('_', '-')}-accuracy-vs-heads.png"
    if img is not None:
        plot_curves(curves, {}, unpruned, plot_title, img / png)
    lines += [f"![{name}: accuracy vs heads kept](img/{png})", ""]
    return lines + curve_table(curves)


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
        said.append(
            f"The {methods} rows ran on {device} (several runs at once; the classifier copied there in "
            f"{copied} and read back as fp32: the unpruned accuracy there, "
            f"{', '.join(f'{b:.2f}' for b in before)} %, {same} the {unpruned:.2f} % measured here)."
        )
    return [" ".join(said) + " Every other row ran on the 2 CPU cores.", ""]


def _target_line(
    name: str, n: int, unpruned: float, row: dict[str, Any], trained: int, verdicts: list[Verdict] | None = None
) -> str:
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
        verdicts.append(
            Verdict(
                "The main job's default on every task (issue 33's targets, [targets on every task]"
                "(#targets-on-every-task))",
                f"{name}, {row['k']} heads",
                f"{verdict}: {row['after']:.2f} % ({-drop:+.2f}, limit {limit:.2f})",
            )
        )
    when = f"{row['seconds'] / 60:.1f} min" + ("" if solo else f" ({row['timing']})")
    return (
        f"| {name} | {n:,} | {unpruned:.2f} | {se:.2f} | {row['k']} | {row['after']:.2f} | {-drop:+.2f} | "
        f"{limit:.2f} | {trained} | {when} | {verdict} |"
    )


def small_data_targets(data: dict[str, dict[str, Any]], verdicts: list[Verdict]) -> list[str]:
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
            rows = [
                r
                for r in study["rows"]
                if r.get("k") == k
                and r.get("method", "gradient") in ("recipe", "gradient")
                and "after" in r
                and r.get("seed", 0) == 0
            ]
            if rows and unpruned is not None and n:
                lines.append(
                    _target_line(
                        name, n, unpruned, rows[0], rows[0].get("recover_steps", 0) + rows[0].get("train_steps", 0)
                    )
                )
    review = data.get("review_plot") or {}
    tasks = {"rt": data.get("oneshot"), **{n.replace("_", "-"): data.get(n) for n in TASK_SECTIONS}}
    summary = []
    for task, study in tasks.items():  # the default now, the row that stands for it on each task
        for k, row in sorted(default_rows(data, task).items(), reverse=True):
            if k in TASK_TARGETS and (study or {}).get("unpruned") and study.get("evaluation"):
                summary.append(
                    _target_line(
                        f"{task} ({TRAINING_ROWS[task]:,} training rows)",
                        study["evaluation"],
                        study["unpruned"],
                        row,
                        row["steps"],
                        verdicts,
                    )
                )
    order = list(tasks)
    cli = sorted(
        (data.get("small_data_cli") or {}).get("rows", []),
        key=lambda r: (order.index(r["task"]) if r["task"] in order else len(order), -r["k"], r["run"]),
    )
    for prefix, called in (
        (EARLIER_RUN, "the earlier default"),
        (PREVIOUS_RUN, "the previous default"),
        (DEFAULT_RUN, "the default"),
    ):
        for row in cli:  # the main job's defaults since issue 33: earlier, previous, now
            study = tasks.get(row["task"]) or {}
            if (
                row["run"].startswith(prefix)
                and row["k"] in TASK_TARGETS
                and study.get("unpruned")
                and study.get("evaluation")
            ):
                also = row["run"][len(prefix) :]  # e.g. the same run again alone on the machine
                lines.append(
                    _target_line(
                        f"{row['task']}, {called}{also}", study["evaluation"], study["unpruned"], row, row["steps"]
                    )
                )
    for row in (data.get("small_data_diagnosis") or {}).get("rows", []):  # the recipe with unlabelled text
        if row["run"] == "refit + --recover-data 1000 steps" and review.get("unpruned") and review.get("evaluation"):
            lines.append(
                _target_line(
                    f"{row['task']} with `--refit --recover-data` ({row['examples']:,} unlabelled snippets)",
                    review["evaluation"],
                    review["unpruned"],
                    row,
                    1000,
                )
            )
    if not lines:
        return []
    head = ["", "## Targets on every task", ""]
    if summary:
        head += [
            "The default recipe of a classifier, `encoder` (`headcut prune MODEL --keep K --data train.csv`, the "
            "README main job's command; by its flags: `--method fluctuation --refit --recover-steps 500 "
            "--recover-hidden-weight 2 --recover-average 0.5 --max-examples 4000 --batch-size 8`, with `--via 24` "
            "below 24 heads and `--via 24 --via-steps 250 --recover-steps 750` below 12), seed 0, on every task against issue 33's targets: 16 heads within 1 point of the "
            "unpruned model and 8 within 2, or within the test set's standard error where that is larger, in at "
            "most 1,000 training steps of batch 8 and 15 minutes on 2 CPU cores (accuracy in %; a time without "
            "brackets: the run alone on the machine, two torch threads; the rows below have every run):",
            "",
            "| task | held-out | unpruned | standard error | heads | accuracy | change | limit | steps | time | |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            *summary,
            "",
            "### Every run",
            "",
        ]
    return [
        *head,
        "Issue 33's targets against the unpruned model on each task's held-out examples (seed 0): 16 heads within "
        "1 point and 8 within 2 points, or within the test set's standard error where that is larger, in at most "
        "1,000 training steps of batch 8 and 15 minutes on 2 CPU cores (accuracy in %). The first rows are the "
        "gradient recipe (one-shot gradient scores, then distilled recovery: the main job's until then); the rows "
        "*the earlier default* are the main job's recipe after it: `headcut prune MODEL --method fluctuation "
        "--keep K --refit --recover-steps 500 --recover-hidden-weight 1 --max-examples 4000 --batch-size 8`, "
        "with `--via 16` below 12 heads (two rounds of 500 steps); the rows *the previous default* are the same "
        "with `--recover-average 0.5` (a constant learning rate, the weights averaged over each recovery's last "
        "250 steps) and `--via 24` below 24 heads (two rounds of 500 steps at 16 and 8 heads); the rows *the "
        "default* are the default recipe, `encoder`, the previous default with `--recover-hidden-weight 2` (the "
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
        "same kind as `--recover-data` (which the user has to have):",
        "",
        "| task | held-out | unpruned | standard error | heads | accuracy | change | limit | steps | time | |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *lines,
    ]


def refit_section(study: dict[str, Any]) -> list[str]:
    """The refit study: per task and heads kept, the accuracy right after the gradient cut and after ``--refit``."""
    unpruned, n = study.get("unpruned", {}), study.get("evaluation", {})
    lines = [
        "",
        "## Refit without training",
        "",
        "`headcut prune MODEL --method gradient --keep K --data train.csv --refit` on every task (seed 0; "
        "accuracy in % on each task's held-out examples): the output projections of the kept heads refitted by "
        "least squares to the unpruned model's outputs on the training rows, nothing trained. The time is the "
        "whole run (scores, cut, refit, two evaluations):",
        "",
        "| task | unpruned | standard error | heads | after the cut | after the refit | change | time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in study["rows"]:
        task = row["task"]
        base = unpruned.get(task)
        se = _standard_error(base, n[task]) if base is not None and n.get(task) else None
        lines.append(
            f"| {task} | {fmt(base)} | {fmt(se)} | {row['k']} | {row['after_pruning']:.2f} | "
            f"{row['after']:.2f} | {row['after'] - base:+.2f} | {row['seconds'] / 60:.1f} min |"
        )
    return lines


#: the small-data diagnosis files (``benchmarks/studies/small_data.py --results NAME``): heading and how their times were taken
DIAGNOSES = {
    "small_data_diagnosis": (
        "Small data: where the recipe loses accuracy",
        "The times are not those of a run alone: these ran with one torch thread each, two or "
        "three at once on the 2 cores, and evaluated the held-out examples along the way",
    ),
    "small_data_h200": (
        "Small data: more inputs for the recovery, on a GPU",
        "These ran one after the other on one NVIDIA H200 (the model copied in fp16 and read back "
        "as fp32: the unpruned accuracy is unchanged), so their times are that machine's, not the "
        "2 CPU cores'; the word-augmented and spliced runs distil (alpha 1) over the 900 training "
        "rows and 10 made copies of each, every in-domain input over those rows and the 11,186 snippets "
        "of neither split (12,086 rows)",
    ),
    "small_data_h100": (
        "Small data: a smaller part of the model trained in the recovery, on a GPU",
        "These ran 18 at once on one NVIDIA H100 (the model copied as for the H200 runs), so their "
        "times are that machine's under that load, not the 2 CPU cores'. Each trains only the "
        "parameters it names (the rest frozen from the cut, or from the refit), to test whether the "
        "recovery overfits the 900 rows with the whole model; `recipe` and `refit + recipe` are the "
        "same machine's reference runs (on the CPU: 82.06 / 81.28 and 82.56 / 81.06)",
    ),
    "small_data_cli": (
        "Small data: the recipe with another method's cut, and the default",
        "The rows *the default* are the default recipe, `encoder`, *the previous default* its recipe before "
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
        "it; the slimmed model's logits match that mean substitution in the unpruned model to 0.06)",
    ),
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
        "accuracy in % on the 1,800 held-out examples; change: after minus unpruned; no curve)",
    ),
}


#: how a small-data diagnosis was measured (``benchmarks/studies/small_data.py``), unless its entry in DIAGNOSES says
SMALL_DATA_INTRO = (
    "`benchmarks/studies/small_data.py` (seed 0; accuracy in % on each task's held-out examples; change: after "
    "minus unpruned; the recovery curves, every 100 or 250 steps on the held-out examples, are a "
    "diagnosis only and chose nothing)"
)


def diagnosis(study: dict[str, Any], heading: str, timing: str, intro: str = SMALL_DATA_INTRO) -> list[str]:
    """A small-data diagnosis (``benchmarks/studies/small_data.py``, or the script ``intro`` names): what each variant of
    the recipe does at the heads it was run at, beside the unpruned model."""
    unpruned = study.get("unpruned", {})
    lines = [
        "",
        f"## {heading}",
        "",
        f"{intro}. {timing}:",
        "",
        "| task | heads | run | after the cut | after | change | train accuracy | time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in study["rows"]:
        base = unpruned.get(row["task"])
        if row["run"] == "stability":
            cut = row["after_cut"]
            lines.append(
                f"| {row['task']} | {row['k']} | one-shot gradient scores of all the training rows and of "
                f"each half: {row['overlap_halves']} of {row['k']} heads the same in both halves, kept per "
                f"layer {row['kept_per_layer']['all']} | {cut['all']:.2f} (halves {cut['half 0']:.2f}, "
                f"{cut['half 1']:.2f}) | | | | |"
            )
            continue
        if row["run"] == "scorers":
            cut = row["after_cut"]
            fits = cut["train_metrics"]["accuracy"] * 100
            lines.append(
                f"| {row['task']} | 16, 8 | each one-shot scorer's cut, nothing trained (the unpruned model "
                f"fits {fits:.1f} % of its training rows) | "
                + "; ".join(f"{name} {cut[name]:.1f}" for name in cut if name != "train_metrics")
                + f" | | | | {row['seconds'] / 60:.0f} min |"
            )
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
            name += (
                f" (round 1 to {stage['k']} heads: after the cut {stage['after_pruning']:.2f}, the refit "
                f"{stage['after_refit']:.2f}, the recovery {stage['after']:.2f}; then the second round's cut)"
            )
        if row.get("after_refit") is not None:
            name += f" (after the refit {row['after_refit']:.2f})"
        lines.append(
            f"| {row['task']} | {row['k']} | {name} | {fmt(cut)} | {fmt(after)} | {change} | "
            f"{fmt(row.get('train_accuracy'))} | {row['seconds'] / 60:.1f} min |"
        )
    lines.append("")
    lines.append("Unpruned: " + ", ".join(f"{t} {a:.2f} %" for t, a in unpruned.items()) + ".")
    return lines
