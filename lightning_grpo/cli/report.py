"""``lightning-grpo report RUN_DIR``: a dashboard (PNG) and a text summary of a run's logged metrics.

    lightning-grpo report runs/quickstart            # the latest version_* under it
    lightning-grpo report runs/quickstart/version_3 --out /tmp/report --no-png

Reads the ``metrics.csv`` of Lightning's ``CSVLogger`` (one row per logging call, sparse columns:
rows are merged by ``step``), the guards' optional ``alarms.jsonl`` (one
``{"step", "guard", "action", "message"[, "completions"]}`` object per line) and the rollout's
``completions.jsonl`` (:mod:`lightning_grpo.cli.run_files`; the versions of a resumed run are stitched
by step). Writes ``report.png`` (reward,
entropy, KL, clip fractions, completion lengths, mismatch, zero-std / identical groups, gradient
norm, skipped steps; every ``alarm/<guard>`` firing drawn as a vertical marker on all panels) and
``report.txt`` (also printed), which closes with a ``look at:`` section naming each figure outside its
healthy range (:mod:`lightning_grpo.cli.report_health`; absent when all are healthy). Needs only the
standard library and matplotlib (Agg backend).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .report_health import look_at_lines
from .run_failure import FAILED_FILE, failed_line
from .run_files import Run, RunDirError, load_run, points as _points, read_alarms, read_metrics, resolve_run_dir  # noqa: F401 - the readers, re-exported

#: Dashboard panels: (title, [(column, label), ...]); panels with none of their columns say so.
PANELS: list[tuple[str, list[tuple[str, str]]]] = [
    ("reward", [("train/reward_mean", "train reward (mean ± std, within min..max)")]),
    ("entropy", [("train/entropy", "entropy")]),
    ("KL to the reference", [("train/kl", "kl")]),
    (
        "clip fractions",
        [("train/clip_frac_low", "low"), ("train/clip_frac_high", "high"), ("train/clip_frac_dual", "dual")],
    ),
    ("completion length", [("train/completion_length_mean", "mean (min..max band)")]),
    (
        "train-inference mismatch",
        [
            ("train/mismatch_k3", "k3"),
            ("train/mismatch_max_abs", "max |Δlogp|"),
            ("train/mismatch_mean_diff", "mean Δlogp"),
        ],
    ),
    (
        "groups without signal",
        [("train/frac_reward_zero_std", "zero reward std"), ("train/frac_identical_groups", "identical samples")],
    ),
    ("gradient norm", [("train/grad_norm", "grad norm")]),
    ("skipped optimizer steps", [("train/skipped_steps", "skipped (cumulative)")]),
]

#: Height of one guard's alarm lane (axes fraction) and the most firing steps drawn full-height.
ALARM_LANE = 0.035
SPARSE_ALARMS = 50
#: Completions shown in the summary: the best and the worst this many of the last logged step.
SHOWN_COMPLETIONS = 3


# ------------------------------------------------------------------------------- summary
def _mean(values: list[float]) -> float:
    """Arithmetic mean (``values`` non-empty)."""
    return math.fsum(values) / len(values)


def tenths(values: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last tenth of ``values`` (at least one value each)."""
    n = max(1, len(values) // 10)
    return _mean(values[:n]), _mean(values[-n:])


def _train_steps(run: Run) -> int:
    """Optimizer steps covered by the ``train/*`` rows (Lightning logs step ``i`` for the (i+1)-th)."""
    steps = [s for column, points in run.series.items() if column.startswith("train/") for s, _ in points]
    return max(steps) + 1 if steps else 0


def _metric_lines(run: Run) -> list[str]:
    """The summary's lines about the logged metrics (absent metrics are said to be absent)."""
    lines = []
    reward = run.values("train/reward_mean")
    if reward:
        first, last = tenths(reward)
        n = max(1, len(reward) // 10)
        lines.append(
            f"reward (train/reward_mean): first tenth {first:.3f} -> last tenth {last:.3f} "
            f"({last - first:+.3f}; {n} of {len(reward)} logged values each)"
        )
    else:
        lines.append("reward: train/reward_mean not logged")
    for column, name in (
        ("val/greedy_accuracy", "held-out greedy accuracy"),
        ("val/reward_mean", "held-out reward mean"),
    ):
        points = _points(run, column)
        if points:
            (s0, v0), (s1, v1) = points[0], points[-1]
            lines.append(f"{name}: {v0:.3f} (step {s0}) -> {v1:.3f} (step {s1})")
        else:
            lines.append(f"{name}: {column} not logged")
    entropy = _points(run, "train/entropy")
    if entropy:
        low = min(entropy, key=lambda p: p[1])
        lines.append(f"entropy: {entropy[0][1]:.3f} -> {entropy[-1][1]:.3f} (min {low[1]:.3f} at step {low[0]})")
    k3, gap = run.values("train/mismatch_k3"), run.values("train/mismatch_max_abs")
    if k3 or gap:
        k3_text = f"{max(k3):.3g}" if k3 else "not logged"
        gap_text = f"{max(gap):.3g}" if gap else "not logged"
        lines.append(f"mismatch: max k3 {k3_text}, max |logp gap| {gap_text}")
    skipped = run.values("train/skipped_steps")
    lines.append(f"skipped optimizer steps: {skipped[-1]:.0f}" if skipped else "skipped optimizer steps: not logged")
    fractions = (
        ("train/frac_reward_zero_std", "zero-reward-std groups"),
        ("train/frac_identical_groups", "identical-sample groups"),
    )
    for column, name in fractions:
        values = run.values(column)
        lines.append(f"{name}: mean fraction {_mean(values):.3f}" if values else f"{name}: not logged")
    cut, spread = run.values("train/truncation_ratio"), run.values("train/truncated_reward_std")
    if cut:
        their = f" (their reward std, mean {_mean(spread):.3f})" if spread else ""
        lines.append(f"cut-off completions (max_new_tokens reached): mean fraction {_mean(cut):.3f}{their}")
    from .agent_report import summary_lines  # multi-turn episodes (agents): turns, tool calls, faults

    return lines + summary_lines(run)


def _alarm_lines(run: Run) -> list[str]:
    """What the detectors saw: per guard, the alarms' count, first / last step, first message."""
    watched = sorted(c.removeprefix("alarm/") for c in run.series if c.startswith("alarm/"))
    if not run.alarms:
        if watched:
            return [f"  no alarm fired (guards logging: {', '.join(watched)})"]
        return ["  no alarm fired (no alarm/* columns logged: were any guards configured?)"]
    lines = []
    for guard, records in run.alarms.items():
        first, last = records[0], records[-1]
        message = first.get("message") or "(no message: alarms.jsonl absent, read from the alarm column)"
        action = f", action {first['action']}" if first.get("action") else ""
        steps = f"steps {first['step']}..{last['step']}"
        where = f"; its completions: {first['completions']}" if first.get("completions") else ""
        lines.append(f"  {guard}: {len(records)} alarm(s), {steps}{action}; first: {message}{where}")
    return lines


def _clip(text: str, width: int = 60) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


def _completion_lines(run: Run) -> list[str]:
    """The best and the worst few completions of the last logged step (completions.jsonl)."""
    if not run.completions:
        return ["completions: none logged (rollout.log_completions)"]
    step = int(run.completions[-1]["step"])
    rows = sorted((r for r in run.completions if int(r["step"]) == step), key=lambda r: -float(r.get("reward", 0.0)))
    n = min(SHOWN_COMPLETIONS, len(rows) // 2 or 1)
    lines = [
        f"completions of step {step} (the last logged; {len(rows)} rows in completions.jsonl), best and worst {n}:"
    ]
    for label, chosen in (("best", rows[:n]), ("worst", rows[-n:] if len(rows) > n else [])):
        for r in chosen:
            lines.append(
                f"  {label}: reward {float(r.get('reward', float('nan'))):.3f}, advantage "
                f"{float(r.get('advantage', float('nan'))):+.3f}, {r.get('length', '?')} tokens"
                f"{' (truncated)' if r.get('truncated') else ''}: {_clip(str(r.get('prompt', '')), 40)!r} -> "
                f"{_clip(str(r.get('transcript', r.get('completion', ''))))!r}"
            )
    return lines


def _version_lines(run: Run) -> list[str]:
    """Which version folders were read (a resumed run's are stitched by step)."""
    lines = []
    if len(run.versions) > 1:
        names = " -> ".join(p.name for p in run.versions)
        lines.append(
            f"versions: {names} (a resumed run, stitched by step: a later version replaces from its first step)"
        )
    if run.other_versions:
        others = ", ".join(p.name for p in run.other_versions)
        lines.append(
            f"read {', '.join(p.name for p in run.versions)} only; other runs there: {others} (pass one as RUN_DIR to read it)"
        )
    if run.evaluation_versions:
        skipped = ", ".join(p.name for p in run.evaluation_versions)
        lines.append(f"skipped evaluation-only versions (validate / test, no train/* metrics): {skipped}")
    return lines


def summarize(run: Run) -> str:
    """The text summary of :func:`write_report` (``report.txt``)."""
    source = "alarms.jsonl" if run.alarms_from_jsonl else "alarm/* columns"
    steps = _train_steps(run)
    lines = [
        "lightning-grpo run report",
        f"run dir: {run.path}",
        *[f"the run failed: {line} (see {FAILED_FILE})" for line in [failed_line(run.path)] if line],
        *_version_lines(run),
        f"steps: {steps} optimizer steps (last logged step {steps - 1})"
        if steps
        else "steps: no train/* metrics logged",
        *_metric_lines(run),
        f"what the detectors saw ({source}):",
        *_alarm_lines(run),
        *_completion_lines(run),
        *look_at_lines(run),
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ dashboard
def _alarm_steps(run: Run) -> dict[str, list[int]]:
    """Marker positions per guard: alarm records and ``alarm/<guard>`` firings together."""
    steps = {guard: {int(r["step"]) for r in records} for guard, records in run.alarms.items()}
    for column, points in run.series.items():
        if column.startswith("alarm/"):
            steps.setdefault(column.removeprefix("alarm/"), set()).update(s for s, v in points if v >= 0.5)
    return {g: sorted(s) for g, s in sorted(steps.items()) if s}


def _line(ax, run: Run, column: str, label: str, **kwargs) -> bool:
    """Plot ``column``'s finite points on ``ax``; False when there are none."""
    points = _points(run, column)
    if not points:
        return False
    steps, values = zip(*points)
    ax.plot(steps, values, label=label, lw=1, **kwargs)
    return True


def _band(ax, bounds: list[tuple[int, float | None, float | None]]) -> None:
    """Shade between the lower and upper bounds of (step, low, high); steps missing one are left out."""
    bounds = [b for b in bounds if b[1] is not None and b[2] is not None]
    if bounds:
        steps, low, high = zip(*bounds)
        ax.fill_between(steps, low, high, alpha=0.2, lw=0)


def _draw_panel(ax, run: Run, title: str, specs: list[tuple[str, str]]) -> None:
    """One panel: its metrics as lines (with the reward / length bands and validation markers)."""
    drawn = [_line(ax, run, c, label, drawstyle="steps-post" if "skipped" in c else "default") for c, label in specs]
    if title == "reward":
        std = dict(run.series.get("train/reward_std", []))
        low, high = dict(run.series.get("train/reward_min", [])), dict(run.series.get("train/reward_max", []))
        _band(
            ax,
            [
                (s, max(v - std[s], low.get(s, -math.inf)), min(v + std[s], high.get(s, math.inf)))
                for s, v in _points(run, "train/reward_mean")
                if s in std
            ],
        )  # mean ± std within the rewards seen
        for column, label, marker in (
            ("val/greedy_accuracy", "held-out greedy accuracy", "o"),
            ("val/reward_mean", "held-out reward", "s"),
        ):
            drawn.append(_line(ax, run, column, label, marker=marker, ls="none", ms=4))
    if title == "completion length":
        low = dict(run.series.get("train/completion_length_min", []))
        high = dict(run.series.get("train/completion_length_max", []))
        _band(ax, [(s, low.get(s), high.get(s)) for s, _ in _points(run, "train/completion_length_mean")])
    gaps = [abs(v) for column, _ in specs if "mismatch" in column for v in run.values(column)]
    if gaps and max(gaps) > 1e-2:  # k3 ~1e-4 next to a max gap ~1: both visible
        ax.set_yscale("symlog", linthresh=1e-3)
    if title == "gradient norm" and any(drawn) and min(run.values("train/grad_norm")) > 0:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    if not any(drawn):
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)


def _make_room(ax, fraction: float) -> None:
    """Raise the top of a linear or log y-axis so its top ``fraction`` is free of data."""
    low, high = ax.get_ylim()
    grow = fraction / (1 - fraction)
    if ax.get_yscale() == "linear":
        ax.set_ylim(low, high + (high - low) * grow)
    elif ax.get_yscale() == "log" and low > 0:
        ax.set_ylim(low, high * (high / low) ** grow)


def _draw_alarms(ax, steps_per_guard: list[list[int]], colors: list) -> None:
    """Each guard's firings on ``ax``: a tick per step in the guard's own lane along the top edge,
    plus a faint full-height line per step for guards that fired at few steps (a guard firing at
    most steps would otherwise hide the data). Also places the panel's legend below the lanes."""
    lanes = len(steps_per_guard) * ALARM_LANE + 0.01 if steps_per_guard else 0.0
    if ax.get_legend_handles_labels()[0]:  # below the lanes
        ax.legend(fontsize=7, loc="best", bbox_to_anchor=(0, 0, 1, 1 - lanes))
    if not steps_per_guard:
        return
    _make_room(ax, lanes)
    for i, (steps, color) in enumerate(zip(steps_per_guard, colors)):
        top = 1 - i * ALARM_LANE
        where = ax.get_xaxis_transform()  # x in steps, y in axes fraction
        ax.vlines(steps, top - 0.8 * ALARM_LANE, top, transform=where, colors=[color], lw=1.2)
        if len(steps) <= SPARSE_ALARMS:
            ax.vlines(steps, 0, top - ALARM_LANE, transform=where, colors=[color], lw=0.8, alpha=0.35, zorder=0)


def plot_dashboard(run: Run, out_path: Path) -> Path:
    """Draw every panel of :data:`PANELS` plus the alarm markers; save the PNG at ``out_path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(3, 3, figsize=(15, 10), sharex=True)
    alarm_steps = _alarm_steps(run)
    colors = [plt.get_cmap("tab10")((i + 3) % 10) for i in range(len(alarm_steps))]
    for ax, (title, specs) in zip(axes.flat, PANELS):
        _draw_panel(ax, run, title, specs)
        _draw_alarms(ax, list(alarm_steps.values()), colors)
    handles = [
        Line2D([], [], color=color, lw=1.5, label=f"alarm: {guard} ({len(steps)} steps)")
        for (guard, steps), color in zip(alarm_steps.items(), colors)
    ]
    for ax in axes[-1]:
        ax.set_xlabel("optimizer step", fontsize=9)
    fig.suptitle(f"lightning-grpo report: {run.path}", fontsize=11)
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=9)
    fig.tight_layout(rect=(0, 0.04 if handles else 0, 1, 0.97))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=90)
    plt.close(fig)
    return out_path


# ----------------------------------------------------------------------------- entry point
def write_report(run_dir: str | Path, out: str | Path | None = None, png: bool = True) -> tuple[str, list[Path]]:
    """Read ``run_dir``, write ``report.txt`` (and ``report.png``) into ``out`` (default: the
    version directory). Returns the summary text and the written paths."""
    run = load_run(run_dir)
    out_dir = Path(out) if out is not None else run.path
    out_dir.mkdir(parents=True, exist_ok=True)
    text = summarize(run)
    written = [out_dir / "report.txt"]
    written[0].write_text(text, encoding="utf-8")
    if png:
        written.append(plot_dashboard(run, out_dir / "report.png"))
    return text, written


def main(argv: list[str] | None = None) -> int:
    """``lightning-grpo report RUN_DIR [--out DIR] [--no-png]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="lightning-grpo report", description="Plot and summarise the logged metrics and guard alarms of a run."
    )
    parser.add_argument(
        "run_dir", help="a CSVLogger version directory (holding metrics.csv) or its parent (the latest version_*)"
    )
    parser.add_argument("--out", default=None, help="output directory (default: the version directory)")
    parser.add_argument("--no-png", action="store_true", help="write the text summary only")
    args = parser.parse_args(argv)
    try:
        text, written = write_report(args.run_dir, args.out, png=not args.no_png)
    except RunDirError as err:
        print(f"lightning-grpo report: error: {err}", file=sys.stderr)
        return 2
    print(text, end="")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
