"""The SFT quickstart learns (recipes/sft_quickstart.yaml as written, ``lightning-grpo sft fit``)."""

from __future__ import annotations

import csv

import pytest

from tests.package.test_sft_recipes import ROOT


@pytest.mark.slow
def test_sft_quickstart_learns(tmp_path, tiny_cache):
    """As written (100 steps): held-out val/loss falls below a tenth of its first value and val/accuracy
    (greedy answers) reaches 0.9."""
    from lightning_grpo.cli import main

    main(
        [
            "sft",
            "fit",
            "-c",
            str(ROOT / "recipes/sft_quickstart.yaml"),
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
            "--trainer.enable_progress_bar",
            "false",
        ]
    )
    with open(tmp_path / "sft_quickstart/version_0/metrics.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("val/loss")]
    losses, accuracy = [float(r["val/loss"]) for r in rows], [float(r["val/accuracy"]) for r in rows]
    print(f"\nval/loss {losses}, val/accuracy {accuracy}")
    assert len(rows) == 4 and losses[-1] < 0.1 * losses[0] and accuracy[-1] >= 0.9
