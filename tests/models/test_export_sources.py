"""``lightning-grpo export``'s choice and reading of its source: a run folder whose newest versions
failed before keeping a checkpoint (the checkpoint used is named, the versions skipped too), and a
checkpoint that carries a pickle which would run code when loaded (refused; the code never runs)."""

from __future__ import annotations

import shutil

import pytest
import torch

from lightning_grpo.models.export import ExportError, export

pytestmark = pytest.mark.usefixtures("tiny_cache")


def test_run_folder_export_names_the_checkpoint_and_the_versions_it_skipped(quickstart_run, tmp_path, capsys):
    """Two later versions that failed before their first checkpoint (configs only): the run folder
    exports version_0's last.ckpt and says so, naming the skipped versions."""
    from lightning_grpo.cli import main

    run = tmp_path / "run"
    shutil.copytree(quickstart_run, run / "version_0")
    for failed in ("version_1", "version_2"):
        (run / failed).mkdir()
        (run / failed / "config.yaml").write_text("seed_everything: 0\n")
    assert main(["export", str(run), "--out", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    used = run / "version_0" / "checkpoints" / "last.ckpt"
    assert f"from {used}" in out, out
    assert f"skipped {run / 'version_2'}, {run / 'version_1'}: no checkpoint" in out, out


class _WritesAFile:
    """A pickle payload: loading it with ``weights_only=False`` runs ``exec`` and writes ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def test_a_checkpoint_whose_pickle_runs_code_is_refused_and_the_code_never_runs(quickstart_run, tmp_path):
    checkpoint = torch.load(quickstart_run / "checkpoints" / "last.ckpt", weights_only=False)  # our own file
    marker = tmp_path / "payload-ran.txt"
    checkpoint["hyper_parameters"]["innocent"] = _WritesAFile(marker)
    evil = tmp_path / "evil.ckpt"
    torch.save(checkpoint, evil)
    with pytest.raises(ExportError, match=r"evil.ckpt holds objects that loading would run code for \(builtins.exec\)"):
        export(evil, tmp_path / "out")
    assert not marker.exists(), "loading the checkpoint ran the code it carries"
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_written_through_the_python_api_loads_safely(quickstart_run, tmp_path):
    """Settings objects (LoraSettings, QuantizationSettings, paths) in hyper_parameters are allowed."""
    from pathlib import PurePosixPath

    from lightning_grpo import LoraSettings, QuantizationSettings

    checkpoint = torch.load(quickstart_run / "checkpoints" / "last.ckpt", weights_only=False)
    checkpoint["hyper_parameters"].update(
        lora=LoraSettings(r=4), quantization=QuantizationSettings(), where=PurePosixPath("x")
    )
    torch.save(checkpoint, tmp_path / "api.ckpt")
    out = export(tmp_path / "api.ckpt", tmp_path / "out")
    assert (out / "model.safetensors").is_file()
