"""The combination matrix (docs/combinations.md): every pair of values of the dimensions in
tests/matrix/dimensions.py meets in some cell; each cell trains through ``lightning-grpo fit`` and asserts
what can fail when options combine:

- the engine's and the trainer's log-probs of the sampled tokens agree (``train/mismatch_max_abs`` <= 1e-4);
- the prompts in the completions log are the sampled ones (rewards recomputed from them by the task's rule);
- a run resumed from the step-1 checkpoint equals the uninterrupted run (weights, last logged step);
- ``lightning-grpo export`` of the last checkpoint, loaded with transformers, gives the trained policy's logits (1e-5).

Refused pairs (``REFUSED``) must fail before any engine starts, with one line naming both options.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from . import checks, runner
from .dimensions import cell_id, cells, refused_cells

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="the matrix's engines need vllm"),
    pytest.mark.skipif(importlib.util.find_spec("allpairspy") is None, reason="needs allpairspy (the dev extra)"),
]

CELLS = cells() if importlib.util.find_spec("allpairspy") else []
REFUSED = refused_cells()


@pytest.fixture(scope="module")
def prompts():
    return checks.train_prompts()


@pytest.fixture
def server_url(request, cell):
    """The session's vLLM server, started only for cells that use it."""
    return request.getfixturevalue("vllm_server") if cell["engine"] == "vllm_server" else None


@pytest.mark.parametrize("cell", CELLS, ids=[cell_id(c) for c in CELLS])
def test_cell(cell, tiny_model_path, server_url, prompts, tmp_path):
    env = runner.environment(Path(tiny_model_path).parent)
    a = runner.fit(cell, tmp_path, "a", env, server_url).check(f"{cell_id(cell)}: fit (2 steps)")
    a_rows = checks.train_rows(runner.run_dir(tmp_path, "a"), cell["logging"])
    assert [r["step"] for r in a_rows] == [0.0, 1.0], f"logged training steps {[r['step'] for r in a_rows]}"
    gaps = checks.check_logprob_agreement(a_rows)
    completions = checks.completion_rows(runner.run_dir(tmp_path, "a"))
    checks.check_completions(completions, cell["rollout"], prompts, runner.STEPS, per_step=2 * 4)

    b = runner.fit(cell, tmp_path, "b", env, server_url, ckpt_path=runner.checkpoint_at(tmp_path, "a", 1))
    b.check(f"{cell_id(cell)}: fit resumed from step 1")
    b_rows = checks.train_rows(runner.run_dir(tmp_path, "b"), cell["logging"])
    checks.check_resume(runner.checkpoint_at(tmp_path, "a", 2), runner.checkpoint_at(tmp_path, "b", 2), a_rows, b_rows)

    exported = tmp_path / "exported"
    e = runner.export(runner.checkpoint_at(tmp_path, "a", 2), exported, env).check(f"{cell_id(cell)}: export")
    export_gap = checks.check_export(exported, tmp_path / "probe-a.pt")
    print(f"{cell_id(cell)}: fit {a.seconds:.1f} s, resume {b.seconds:.1f} s, export {e.seconds:.1f} s; "
          f"max |engine - trainer| log-prob {max(gaps):.2e}, export logit gap {export_gap:.2e}")  # fmt: skip


@pytest.mark.parametrize("cell,words", REFUSED, ids=[cell_id(c) for c, _ in REFUSED])
def test_refused_pair(cell, words, tiny_model_path, tmp_path):
    """Refused before any engine starts (no engine log line, no checkpoint, no metrics), exit status 2,
    one line naming both options."""
    env = runner.environment(Path(tiny_model_path).parent)
    finished = runner.fit(cell, tmp_path, "a", env, None, timeout=120)
    assert finished.returncode == 2, f"expected the refusal (exit 2), got {finished.returncode}\n{finished.tail()}"
    lines = [line for line in finished.stderr.splitlines() if line.strip()]
    assert lines and all(w in lines[-1] for w in words), f"the last line should name {words}: {lines[-1:]}"
    assert not (tmp_path / "checkpoints-a").exists() and not (tmp_path / "probe-a.pt").exists()
    assert not list((tmp_path / "runs").rglob("metrics.csv")) if (tmp_path / "runs").exists() else True
    assert "safetensors" not in finished.stderr and "vLLM" not in finished.stderr, "an engine started"
