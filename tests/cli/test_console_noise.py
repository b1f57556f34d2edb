"""Console noise of a one-process run: no Lightning ``sync_dist`` advice at validation (the in-process
vLLM engine's process group made Lightning give it, though one process has nothing to reduce)."""

from __future__ import annotations

import warnings

import pytest
import torch.distributed as dist

from tests.helpers.runs import train_recipe

pytestmark = pytest.mark.usefixtures("tiny_cache")


def test_one_process_validation_gives_no_sync_dist_advice(tmp_path):
    made_here = not dist.is_initialized()  # the session's in-process vLLM engine may have made it already
    if made_here:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)  # as vLLM does
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _, run_dir = train_recipe(tmp_path, "quickstart.yaml", 2)
    finally:
        if made_here:
            dist.destroy_process_group()
    assert (run_dir / "metrics.csv").read_text().count("val/greedy_accuracy") == 1  # validation ran
    advice = [str(w.message) for w in seen if "sync_dist=True" in str(w.message)]
    assert advice == [], advice
