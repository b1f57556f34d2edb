"""bench_trl.py's results as markdown tables, written into docs/evidence/trl.md between markers.

``results`` is what ``bench_trl.py`` saves as JSON: ``command``, ``machine``, ``note``, ``shape``
(``prompt_tokens``, ...), ``rounds``, ``steps``, ``skip``, and per run name (``trl-hf``, ``trl-vllm``,
``ours-hf``, ``ours-vllm``, ``ours-hf-nopack``) the per-round medians: ``step_medians``,
``cpu_medians`` (lists of seconds, None where a round failed), ``phase_medians`` (lists of dicts),
``lengths`` (mean completion tokens per round);
``sync_checks``: trl_vllm_shim.check_synced's dict for each TRL vLLM run.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from quickstart_seeds import write_between_markers

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "evidence" / "trl.md"
#: where each shape's tables go: the digit task (no --prompt-tokens), the long prompts
MARKERS = {"digit": "<!-- trl-step-results -->", "long": "<!-- trl-long-results -->"}
TRL_PATHS = {"trl-hf": "HF generate", "trl-vllm": "vLLM colocate (shim)"}
LABELS = {
    "trl-hf": "TRL `GRPOTrainer`, HF generate",
    "trl-vllm": "TRL `GRPOTrainer`, vLLM colocate (shim)",
    "ours-hf": "ours, HF engine",
    "ours-hf-nopack": "ours, HF engine, packing off",
    "ours-vllm": "ours, vLLM engine",
}
#: phase rows: label, the phase key (``rollout`` / ``rest`` / ``sync`` exist for every run, the others for ours only)
PHASES = [
    ("weight push (inside the rollout)", "sync"),
    ("rollout: push, generate, rewards, log-probs (TRL: `_generate_and_score_completions`)", "rollout"),
    ("of which generate", "generate"),
    ("training: the rest of the step", "rest"),
    ("of which forward", "forward"),
    ("of which backward", "backward"),
]


def marker(results: dict) -> str:
    """The marker of the results' shape."""
    return MARKERS["long" if results["shape"]["prompt_tokens"] else "digit"]


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def _kept(values: list) -> list:
    return [v for v in values if v is not None]


def ratio_cell(results: dict, name: str, trl: str, key: str = "step_medians") -> str:
    """Median over rounds of (``name``'s step / ``trl``'s step in the same round), with the range;
    ``key`` "cpu_medians": the same for CPU time."""
    pairs = zip(results[key].get(name, []), results[key].get(trl, []))
    ratios = [a / b for a, b in pairs if a is not None and b is not None]
    if not ratios:
        return "-"
    spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    return f"{statistics.median(ratios):.2f}{spread}"


def step_table(results: dict) -> list[str]:
    trls = [t for t in TRL_PATHS if t in results["step_medians"]]
    lines = [
        "| run | mean completion (tokens) | step (s), median of rounds | per round | CPU s / step | "
        + " | ".join(f"/ TRL {TRL_PATHS[t]}" for t in trls)
        + " | "
        + " | ".join(f"CPU / TRL {TRL_PATHS[t]}" for t in trls)
        + " |",
        "|---|---:|---:|---|---:|" + "---:|" * 2 * len(trls),
    ]
    for name, values in results["step_medians"].items():
        kept, cpu = _kept(values), _kept(results["cpu_medians"].get(name, []))
        step = seconds(statistics.median(kept)) if kept else "failed"
        rounds = ", ".join(seconds(v) if v is not None else "failed" for v in values)
        cells = [ratio_cell(results, name, t, key) for key in ("step_medians", "cpu_medians") for t in trls]
        lengths = _kept(results.get("lengths", {}).get(name, []))
        length = f"{statistics.mean(lengths):.1f}" if lengths else "-"
        row = [LABELS.get(name, name), length, step, rounds, seconds(statistics.median(cpu)) if cpu else "-", *cells]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def phase_table(results: dict) -> list[str]:
    names = [n for n, v in results["phase_medians"].items() if _kept(v)]
    lines = ["| phase (s) | " + " | ".join(LABELS.get(n, n) for n in names) + " |", "|---|" + "---:|" * len(names)]
    for label, key in PHASES:
        cells = []
        for name in names:
            values = [p[key] for p in _kept(results["phase_medians"][name]) if key in p]
            cells.append(seconds(statistics.median(values)) if values else ("0" if key == "sync" else "-"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    walls = [seconds(statistics.median(_kept(results["step_medians"][n]))) for n in names]
    return lines + ["| wall | " + " | ".join(walls) + " |"]


def sync_lines(results: dict) -> list[str]:
    checks = results.get("sync_checks") or []
    if not checks:
        return []
    worst = max(c["synced_logprob_gap"] for c in checks)
    stale = min(c["stale_logprob_gap"] for c in checks)
    return [
        f"Shim check after each TRL vLLM run (policy perturbed, then one sync; trl_vllm_shim.check_synced): "
        f"{checks[0]['tensors']} engine tensors in HF layout equal the policy's after the sync (max gap "
        f"{max(c['synced_tensor_gap'] for c in checks):g}, before it {min(c['stale_tensor_gap'] for c in checks):.3g}); "
        f"sampled-token log-prob gap to the policy {worst:.3g} after (engine dtype {checks[0]['engine_dtype']}), "
        f"{stale:.3g} before."
    ]


def tables(results: dict) -> str:
    """The markdown written between the shape's markers."""
    head = [
        f"Command: `{results['command']}`",
        "",
        f"Machine: {results['machine']}. {results['rounds']} round(s), each run a fresh process of {results['steps']} "
        f"steps; per run the median over steps {results['skip'] + 1}-{results['steps']} (wall time between step ends; "
        "CPU s: the process's CPU time over the same steps); the table gives the median of the rounds. "
        "Ratios: per round, the run's step (or CPU time) over the named TRL path's in the same round; median "
        "(min-max) of the rounds." + (f" {results['note']}" if results.get("note") else ""),
        "",
    ]
    body = [
        *step_table(results),
        "",
        "Where the step goes (medians of the per-run medians):",
        "",
        *phase_table(results),
    ]
    tail = sync_lines(results)
    return "\n".join(head + body + ([""] + tail if tail else []))


def write_tables(results: dict, target: Path = DOC) -> None:
    """Replace what stands between the shape's two markers in ``target`` with :func:`tables`."""
    write_between_markers(target, marker(results), tables(results))
