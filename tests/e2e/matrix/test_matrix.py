"""The combination matrix (docs/evidence/combinations.md): every pair of values of the dimensions in
tests/e2e/matrix/dimensions.py meets in some cell; each cell trains through ``lightning-grpo fit`` and asserts
what can fail when options combine:

- the engine's and the trainer's log-probs of the sampled tokens agree (``train/mismatch_max_abs`` <= 1e-4);
- the prompts in the completions log are the sampled ones (rewards recomputed from them by the task's rule);
- in the cells of value ``resume: resumed``, a run resumed from the step-1 checkpoint equals the uninterrupted
  run (weights, last logged step);
- an export of the last checkpoint (``lightning_grpo.models.export.export``, the function ``lightning-grpo export`` calls, in
  this process to save a process start), loaded with transformers, gives the trained policy's logits (1e-5).

Refused pairs (``REFUSED``) must fail before any engine starts, with one line naming both options.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from lightning_grpo.models.export import export

from . import checks, runner
from .dimensions import cell_id, cells, refused_cells

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="the matrix's engines need vllm"),
    pytest.mark.skipif(importlib.util.find_spec("allpairspy") is None, reason="needs allpairspy (the dev extra)"),
]

CELLS = cells() if importlib.util.find_spec("allpairspy") else []
#: The cells as parameters: those on the session's vLLM server ask for it by value (``server_url``).
CELL_PARAMS = [
    pytest.param(c, id=cell_id(c), marks=[pytest.mark.shares("vllm_server")] if c["engine"] == "vllm_server" else [])
    for c in CELLS
]
REFUSED = refused_cells()


@pytest.fixture(scope="module")
def prompts():
    return checks.train_prompts()


@pytest.fixture
def server_url(request, cell):
    """The session's vLLM server, started only for cells that use it."""
    return request.getfixturevalue("vllm_server") if cell["engine"] == "vllm_server" else None


class Failures(list):
    """Every check of a cell runs; the cell fails once, listing each failed check."""

    def check(self, name: str, fn, *args):
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001 - reported below with the check's name
            self.append(f"{name}: {type(err).__name__}: {str(err)[:1500]}")
            return None


def _resume(cell, folder, env, server_url, a_rows):
    b = runner.fit(cell, folder, "b", env, server_url, ckpt_path=runner.checkpoint_at(folder, "a", 1)).check(
        "fit resumed from step 1"
    )
    b_rows = checks.train_rows(runner.run_dir(folder, "b"), cell["logging"])
    checks.check_resume(runner.checkpoint_at(folder, "a", 2), runner.checkpoint_at(folder, "b", 2), a_rows, b_rows)
    return b


def _export(folder):
    exported = export(runner.checkpoint_at(folder, "a", 2), folder / "exported")  # what `lightning-grpo export` calls
    return checks.check_export(exported, folder / "probe-a.pt")


@pytest.mark.parametrize("cell", CELL_PARAMS)
def test_cell(cell, tiny_model_path, server_url, prompts, tmp_path):
    if cell["rollout"] == "openenv" and importlib.util.find_spec("openenv") is None:
        pytest.skip("needs openenv-core (the openenv extra)")
    env = runner.environment(Path(tiny_model_path).parent)
    a = runner.fit(cell, tmp_path, "a", env, server_url).check(f"{cell_id(cell)}: fit (2 steps)")
    failures = Failures()
    a_rows = checks.train_rows(runner.run_dir(tmp_path, "a"), cell["logging"])
    assert [r["step"] for r in a_rows] == [0.0, 1.0], f"logged training steps {[r['step'] for r in a_rows]}"
    gaps = failures.check("log-probs", checks.check_logprob_agreement, a_rows)
    completions = failures.check("completions log", checks.completion_rows, runner.run_dir(tmp_path, "a"))
    if completions is not None:
        failures.check(
            "completions log", checks.check_completions, completions, cell["rollout"], prompts, runner.STEPS, 2 * 4
        )
    b = (
        failures.check("resume", _resume, cell, tmp_path, env, server_url, a_rows)
        if cell["resume"] == "resumed"
        else None
    )
    export_gap = failures.check("export", _export, tmp_path)
    print(
        f"{cell_id(cell)}: fit {a.seconds:.1f} s, resume {b.seconds if b else float('nan'):.1f} s; max |engine - trainer| "
        f"log-prob {max(gaps) if gaps else float('nan'):.2e}, export logit gap {export_gap if export_gap is not None else float('nan'):.2e}"
    )
    assert not failures, f"{cell_id(cell)}:\n" + "\n".join(failures)


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
