"""benchmarks/gpu_recipes.py: the GPU recipes' measured memory (benchmarks/gpu_recipes_h100.json) fits
the card each recipe names with 10% to spare, the headers state those figures, and the script's
mechanics run on CPU (--smoke: the tiny model, short rows)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROWS = json.loads((ROOT / "benchmarks" / "gpu_recipes_h100.json").read_text())


def _gpu_recipes():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_recipes", ROOT / "benchmarks" / "gpu_recipes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("row", ROWS, ids=[r["recipe"] for r in ROWS])
def test_a_recipe_fits_its_card_with_ten_percent_to_spare(row):
    r = _gpu_recipes().budget(row)
    if r["card_gib"] is None:
        pytest.skip(f"{row['recipe']} names no card")
    assert max(r["generate_total"], r["train_total"]) <= 0.9 * r["card_gib"], r


@pytest.mark.parametrize("row", ROWS, ids=[r["recipe"] for r in ROWS])
def test_the_header_states_the_measured_figures(row):
    r = _gpu_recipes().budget(row)
    header = "\n".join(line for line in (ROOT / "recipes" / row["recipe"]).read_text().splitlines() if line.startswith("#"))
    figures = [f"{r['resident_gib']:.1f}", f"{r['reserved_peak_gib']:.1f}"]
    figures.append(f"{max(r['generate_total'], r['train_total']):.1f}" if r["card_gib"] else f"{r['smallest_card_gib']:.1f}")
    assert [f for f in figures if f not in header] == [], header


def test_every_recipe_named_for_a_card_is_measured_or_a_twin():
    """A recipe named for a card (``_24gb``) has a measured row, or is a precision twin of one (``_fp16``)."""
    cards = tuple(_gpu_recipes().CARD_GIB)
    named = {p.name for p in (ROOT / "recipes").glob("*.yaml") if any(f"_{c}" in p.stem for c in cards)}
    measured = {r["recipe"] for r in ROWS}
    assert {n for n in named - measured if n.replace("_fp16", "") not in measured} == set()


@pytest.mark.slow
def test_smoke_runs_the_agent_and_qlora_recipes_on_cpu(tmp_path, tiny_model_path, monkeypatch):
    """The derived configuration trains through ``lightning-grpo fit`` (agent recipe as a plain rollout)."""
    pytest.importorskip("bitsandbytes")
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))
    gpu_recipes = _gpu_recipes()
    for name in ("qwen2.5-1.5b_gsm8k_tools.yaml", "qwen2.5-7b_qlora_32gb.yaml"):
        row = gpu_recipes.child(ROOT / "recipes" / name, steps=2, cache=tmp_path, smoke=True)
        assert row["arch"] == "tiny" and row["trainable"] > 0 and row["train_s"] > 0, row
