"""The package's folders are its layers: imports go one way, no module imports itself back, the
README's "Layout" lists exactly the folders there are, and the module paths before the layered
folders still import (with a warning) for one release."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from importlib.util import resolve_name
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_grpo"

#: Which folder of lightning_grpo/ may import which (imports inside functions count too). Listed
#: bottom-up; each may import only folders listed before it. ``lightning_grpo`` itself (the lazy
#: facade, no imports of its own) may be imported from anywhere.
LAYERS: dict[str, set[str]] = {
    "core": set(),
    "models": {"core"},
    "data": {"core", "models"},
    "rollout": {"core", "models"},
    "training": {"core", "models", "rollout"},
    "checks": {"core", "models", "data", "rollout"},
    "callbacks": {"core", "models", "data", "rollout", "training", "checks"},
    "agents": {"core", "models", "data", "rollout", "training", "checks", "callbacks"},
    "integrations": {"core", "models", "data", "rollout", "training", "checks", "callbacks", "agents"},
    "cli": {"core", "models", "data", "rollout", "training", "checks", "callbacks", "agents", "integrations"},
}
#: The package root holds no module of its own besides these.
ROOT_FILES = {"__init__.py", "__main__.py", "_compat.py"}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module of lightning_grpo/."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _imports(path: Path, package: str) -> list[tuple[str, list[str]]]:
    """Each import statement of the file (at any depth) as (module, names imported from it)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            name = resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
            found.append((name, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports. ``from pkg import name`` counts as an import of
    ``pkg.name`` when that is a module, else of ``pkg``; a module's own parent packages are left
    out (Python imports them first anyway: that is no choice of the module's)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        edges = set()
        for target, names in _imports(path, package):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            edges.update(subs or ([target] if target in modules else []))
        graph[name] = {t for t in edges if t != name and not name.startswith(t + ".")}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def test_the_package_root_holds_only_the_entry_points():
    assert {p.name for p in PACKAGE.glob("*.py")} == ROOT_FILES


def test_every_folder_is_a_layer_with_a_docstring():
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders == set(LAYERS)
    for folder in sorted(folders):
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text()))
        assert doc, f"lightning_grpo/{folder}/__init__.py has no docstring saying what it holds"


def test_the_layer_table_is_one_way():
    order = list(LAYERS)
    for folder, allowed in LAYERS.items():
        above = set(order[order.index(folder):])
        assert not allowed & above, f"{folder} may import {sorted(allowed & above)}, listed at or after it"


def test_each_folder_imports_only_the_layers_below_it():
    """Imports inside functions and under ``if TYPE_CHECKING`` count: a lazy import is still a dependency."""
    wrong = []
    for module, targets in import_graph().items():
        source = _folder(module)
        for target in sorted(targets):
            dest = _folder(target)
            if source is None:  # the root: __init__, __main__, _compat
                continue
            if dest is not None and dest != source and dest not in LAYERS[source]:
                wrong.append(f"{module} imports {target} ({source}/ may import {sorted(LAYERS[source])})")
    assert wrong == []


def test_no_import_cycles():
    assert strongly_connected(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]


THIRD_PARTY_IN_CORE = {"torch"}


def test_core_imports_torch_only():
    found = []
    for path in sorted((PACKAGE / "core").glob("*.py")):
        for target, _ in _imports(path, "lightning_grpo.core"):
            top = target.split(".")[0]
            if top not in sys.stdlib_module_names and top not in THIRD_PARTY_IN_CORE | {"lightning_grpo"}:
                found.append(f"{path.name}: {target}")
    assert found == []


def readme_layout_folders(text: str) -> list[str]:
    """The folders of lightning_grpo/ that the README's "Layout" code block lists."""
    section = text.split("## Layout\n", 1)[1]
    block = section.split("```", 2)[1]
    return re.findall(r"^  (\w+)/", block, flags=re.M)


def test_the_readme_layout_lists_the_folders_there_are():
    listed = readme_layout_folders((ROOT / "README.md").read_text())
    real = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert sorted(listed) == real, f"README Layout lists {sorted(listed)}, lightning_grpo/ has {real}"
    assert len(listed) == len(set(listed))
    assert listed == list(LAYERS), "the README lists the folders in the layer order of tests/test_layout.py"


OLD_PATHS = """
import json, warnings
warnings.simplefilter("error")  # anything but the deprecation below fails
from lightning_grpo._compat import MOVED, LightningGRPODeprecationWarning
import importlib
seen = {}
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    seen[old] = [module is importlib.import_module(new),
                 [(w.category.__name__, str(w.message)) for w in caught if issubclass(w.category, DeprecationWarning)]]
import lightning_grpo.prefix
print(json.dumps({"seen": seen, "attr": lightning_grpo.prefix.__name__}))
"""


def test_old_module_paths_import_with_a_warning():
    import json

    done = subprocess.run([sys.executable, "-c", OLD_PATHS], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    from lightning_grpo._compat import MOVED

    assert set(out["seen"]) == set(MOVED)
    for old, (same, warned) in out["seen"].items():
        assert same, f"{old} is not the module {MOVED[old]}"
        assert warned == [["LightningGRPODeprecationWarning",
                           f"{old} moved to {MOVED[old]}; the old path is removed in the next release"]]
    assert out["attr"] == "lightning_grpo.training.prefix"


def test_the_deprecation_warning_is_shown_by_default(tmp_path):
    """Also when the old import is in a user's module, not in ``__main__`` (where Python shows plain
    DeprecationWarnings anyway)."""
    (tmp_path / "my_recipe_helpers.py").write_text("import lightning_grpo.tiny\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", "import my_recipe_helpers"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "LightningGRPODeprecationWarning: lightning_grpo.tiny moved to lightning_grpo.models.tiny" in done.stderr
    assert "my_recipe_helpers.py:1" in done.stderr  # the warning names the line with the old import


OLD_RECIPE = """\
trainer:
  callbacks:
    - class_path: lightning_grpo.distributed.RankWatch
      init_args:
        grace: 7.0
"""

BUILD = """
import json, sys, warnings
from lightning_grpo.cli import build_cli
from lightning_grpo.callbacks.distributed import RankWatch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cli = build_cli(["-c", sys.argv[1], "--trainer.logger=false", "--data.source=lightning_grpo.DigitTask"], run=False)
print(json.dumps({"grace": [c.grace for c in cli.trainer.callbacks if isinstance(c, RankWatch)],
                  "warned": [str(w.message) for w in caught if "moved to" in str(w.message)]}))
"""


def test_an_old_recipe_class_path_still_loads(tmp_path):
    """jsonargparse imports a recipe's class_path with importlib: the old path parses (``--print_config``)
    and builds the class at its new place, with the warning."""
    import json

    recipe = tmp_path / "old.yaml"
    recipe.write_text(OLD_RECIPE)
    done = subprocess.run(
        [sys.executable, "-m", "lightning_grpo", "fit", "-c", str(recipe), "--print_config"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "lightning_grpo.distributed moved to lightning_grpo.callbacks.distributed" in done.stderr
    assert "grace: 7.0" in done.stdout
    done = subprocess.run([sys.executable, "-c", BUILD, str(recipe)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"grace": [7.0], "warned": [
        "lightning_grpo.distributed moved to lightning_grpo.callbacks.distributed; the old path is removed in the next release"]}


def test_no_file_of_ours_uses_an_old_path():
    """Only _compat.py names the old module paths (and CHANGELOG.md, which is history)."""
    from lightning_grpo._compat import MOVED

    pattern = re.compile("|".join(rf"{re.escape(old)}\b|{re.escape(old.replace('.', '/'))}\.py" for old in MOVED))
    files = [ROOT / "README.md", *(p for d in ("lightning_grpo", "tests", "benchmarks", "docs", "recipes", ".ci", "scripts")
                                   for p in sorted((ROOT / d).rglob("*")) if p.is_file())]
    hits = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files
            if p.suffix in (".py", ".md", ".yaml", ".sh", "") and p.name not in ("_compat.py", "test_layout.py")
            for m in pattern.finditer(p.read_text(errors="replace"))]
    assert hits == []


def test_a_checkpoint_pickled_before_the_move_still_loads_safely(tmp_path):
    """Python-API hyper_parameters pickle the settings classes by their dotted name; a checkpoint
    written before the move names ``lightning_grpo.lora.LoraSettings``, which export's
    ``torch.load(weights_only=True)`` must still accept."""
    import torch

    from lightning_grpo.models.checkpoints import _safe_load
    from lightning_grpo.models.lora import LoraSettings
    from lightning_grpo.models.quantization import QuantizationSettings

    new = tmp_path / "new.ckpt"
    torch.save({"hyper_parameters": {"lora": LoraSettings(r=4), "quantization": QuantizationSettings()}}, new,
               _use_new_zipfile_serialization=False)
    data = new.read_bytes()
    assert b"lightning_grpo.models.lora" in data  # protocol 2: module names as plain text lines
    old = tmp_path / "old.ckpt"
    old.write_bytes(data.replace(b"lightning_grpo.models.lora", b"lightning_grpo.lora")
                    .replace(b"lightning_grpo.models.quantization", b"lightning_grpo.quantization"))
    loaded = _safe_load(old)["hyper_parameters"]
    assert loaded["lora"] == LoraSettings(r=4) and loaded["quantization"] == QuantizationSettings()
