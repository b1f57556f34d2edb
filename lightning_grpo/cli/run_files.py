"""Reading a run's files for ``lightning-grpo report``: ``metrics.csv`` (Lightning's ``CSVLogger``),
the guards' ``alarms.jsonl`` and ``completions.jsonl``, across the ``version_*`` folders of a resumed run.

A resumed run writes a new version folder whose ``config.yaml`` names the checkpoint it resumed
from (``ckpt_path``, resolved by ``lightning-grpo fit``); :func:`run_chain` follows those links back,
so the versions of one run are stitched by step (a later version's values replace an earlier
one's from the step it resumed at). Versions that are other runs are left out, and the summary
says which versions it read. Evaluation-only versions (``lightning-grpo validate`` / ``test`` on the
run folder: no ``train/*`` column) are skipped: they are neither the latest run nor a resume.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

Series = list[tuple[int, float]]


class RunDirError(FileNotFoundError):
    """RUN_DIR holds no ``metrics.csv`` (neither itself nor its latest ``version_*``)."""


@dataclass
class Run:
    """The merged metrics of one run: column -> sorted (step, value), the guards' alarms, the
    logged completions, and the version folders read (in order)."""

    path: Path
    series: dict[str, Series]
    alarms: dict[str, list[dict]] = field(default_factory=dict)  # guard -> records, by step
    alarms_from_jsonl: bool = False
    completions: list[dict] = field(default_factory=list)  # completions.jsonl rows, by step
    versions: list[Path] = field(default_factory=list)
    other_versions: list[Path] = field(default_factory=list)  # version folders of other runs, not read
    evaluation_versions: list[Path] = field(default_factory=list)  # validate / test only, skipped

    def values(self, column: str) -> list[float]:
        """The finite values logged for ``column``, in step order."""
        return [v for _, v in points(self, column)]


def points(run: Run, column: str) -> Series:
    """The finite (step, value) points of ``column``."""
    return [(s, v) for s, v in run.series.get(column, []) if math.isfinite(v)]


# ------------------------------------------------------------------------------- folders
def _version_number(path: Path) -> tuple[int, str]:
    """Sort key of ``version_N`` directories: N (numerically), then the name."""
    match = re.search(r"(\d+)$", path.name)
    return (int(match.group(1)) if match else -1, path.name)


def is_training_version(version: Path) -> bool:
    """Whether ``version`` is a ``fit``: its ``metrics.csv`` has a ``train/*`` column, or (a fit stopped before it
    logged one) its saved ``config.yaml`` has no ``verbose`` key, which ``validate`` and ``test`` take and
    ``fit`` does not."""
    with open(version / "metrics.csv", newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), [])
    if any(column.startswith("train/") for column in header):
        return True
    config = version / "config.yaml"
    return config.is_file() and not re.search(r"^verbose:", config.read_text(encoding="utf-8"), re.M)


def resolve_run_dir(path: str | Path) -> Path:
    """The directory holding ``metrics.csv``: ``path`` itself or its highest ``version_N`` that trained
    (the highest of all when none did: evaluation-only versions are skipped, not taken for the latest run)."""
    path = Path(path)
    if (path / "metrics.csv").is_file():
        return path
    versions = [p for p in path.glob("version_*") if (p / "metrics.csv").is_file()]
    if versions:
        trained = [p for p in versions if is_training_version(p)]
        return max(trained or versions, key=_version_number)
    raise RunDirError(
        f"no metrics.csv in {path}: expected a CSVLogger version directory (holding metrics.csv, "
        f"e.g. runs/quickstart/version_0) or a directory of version_* directories (e.g. runs/quickstart)"
    )


def _resumed_from(version: Path) -> Path | None:
    """The sibling version folder whose checkpoint ``version`` resumed from (its config.yaml's ckpt_path)."""
    config = version / "config.yaml"
    if not config.is_file():
        return None
    match = re.search(r"^ckpt_path:\s*['\"]?([^'\"\n]+)", config.read_text(encoding="utf-8"), re.M)
    if not match or match.group(1).strip() in ("null", "~", ""):
        return None
    parts = Path(match.group(1).strip()).resolve().parts
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].startswith("version_"):
            candidate = version.parent / parts[i]
            found = candidate != version and (candidate / "metrics.csv").is_file()
            return candidate if found and is_training_version(candidate) else None
    return None


def run_chain(latest: Path) -> list[Path]:
    """``latest`` and the versions it resumed from, oldest first."""
    chain = [latest]
    while (previous := _resumed_from(chain[0])) is not None and previous not in chain:
        chain.insert(0, previous)
    return chain


# ------------------------------------------------------------------------------- files
def read_metrics(csv_path: Path) -> dict[str, Series]:
    """``metrics.csv`` merged by step: every numeric cell becomes a (step, value) point; a column
    logged twice at one step keeps its last value (``alarm/*`` columns keep their maximum)."""
    merged: dict[str, dict[int, float]] = {}
    with open(csv_path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                step = int(float(row.get("step") or ""))
            except ValueError:
                continue
            for column, cell in row.items():
                if column in (None, "step", "epoch") or cell in (None, ""):
                    continue
                try:
                    value = float(cell)
                except ValueError:
                    continue
                column_points = merged.setdefault(column, {})
                if column.startswith("alarm/") and step in column_points:
                    value = max(value, column_points[step])
                column_points[step] = value
    return {column: sorted(p.items()) for column, p in merged.items()}


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects with a ``step`` of a ``.jsonl`` file (blank or cut-short lines skipped)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # blank, or cut short by a killed run
            continue
        if isinstance(record, dict) and "step" in record:
            records.append(record)
    return records


def read_alarms(
    run_dir: Path, series: dict[str, Series], records: list[dict] | None = None
) -> tuple[dict[str, list[dict]], bool]:
    """Alarms per guard: ``alarms.jsonl`` records (or ``records``) where present, else one per firing
    (value >= 0.5) in the ``alarm/<guard>`` columns. Returns (alarms, whether alarms.jsonl was read)."""
    from_jsonl = records is not None or (run_dir / "alarms.jsonl").is_file()
    alarms: dict[str, list[dict]] = {}
    for record in records if records is not None else read_jsonl(run_dir / "alarms.jsonl"):
        alarms.setdefault(str(record.get("guard", "?")), []).append(record)
    for column, column_points in series.items():
        guard = column.removeprefix("alarm/")
        if column.startswith("alarm/") and guard not in alarms:
            fired = [{"step": s, "guard": guard, "action": None, "message": None} for s, v in column_points if v >= 0.5]
            if fired:
                alarms[guard] = fired
    for guard_records in alarms.values():
        guard_records.sort(key=lambda r: int(r["step"]))
    return dict(sorted(alarms.items())), from_jsonl


def load_run(path: str | Path) -> Run:
    """Resolve ``path`` (see :func:`resolve_run_dir`), follow its resumes back (:func:`run_chain`)
    and read every version's metrics, alarms and completions, stitched by step."""
    latest = resolve_run_dir(path)
    chain = run_chain(latest)
    series: dict[str, dict[int, float]] = {}
    alarm_records: list[dict] = []
    completions: list[dict] = []
    any_jsonl = False
    for i, version in enumerate(chain):
        start = _first_step(chain[i + 1]) if i + 1 < len(chain) else None  # where the next version took over
        for column, column_points in read_metrics(version / "metrics.csv").items():
            target = series.setdefault(column, {})
            for step, value in column_points:
                if start is None or step < start:
                    target[step] = value
        any_jsonl |= (version / "alarms.jsonl").is_file()
        alarm_records += [r for r in read_jsonl(version / "alarms.jsonl") if start is None or int(r["step"]) < start]
        completions += [r for r in read_jsonl(version / "completions.jsonl") if start is None or int(r["step"]) < start]
    merged = {column: sorted(p.items()) for column, p in series.items()}
    alarms, from_jsonl = read_alarms(latest, merged, alarm_records if any_jsonl else None)
    others = (
        [p for p in latest.parent.glob("version_*") if p not in chain and (p / "metrics.csv").is_file()]
        if latest.name.startswith("version_")
        else []
    )
    evaluations = [p for p in others if not is_training_version(p)]
    return Run(
        path=latest,
        series=merged,
        alarms=alarms,
        alarms_from_jsonl=from_jsonl,
        completions=sorted(completions, key=lambda r: int(r["step"])),
        versions=chain,
        other_versions=sorted((p for p in others if p not in evaluations), key=_version_number),
        evaluation_versions=sorted(evaluations, key=_version_number),
    )


def _first_step(version: Path) -> int | None:
    steps = [s for column_points in read_metrics(version / "metrics.csv").values() for s, _ in column_points]
    return min(steps) if steps else None
