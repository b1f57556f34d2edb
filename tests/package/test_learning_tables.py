"""Every published results table names the machine it was measured on (a ``Machine:`` line between its
markers): a seed's learning trajectory differs between processors and thread counts (docs/evidence/learning.md), so
a table without its processor cannot be compared. The table writers of benchmarks/ (quickstart_seeds.py, and
through it reasoning_gym_seeds.py, tool_quickstart_seeds.py, qwen3_seeds.py) write that line and refuse to
write a table whose machine they cannot name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"<!-- ([\w.-]+-results) -->")


@pytest.fixture
def seeds(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import quickstart_seeds

    return quickstart_seeds


def blocks() -> list[tuple[str, str, str]]:
    """(page, marker, text between its two markers) for every results table of the docs."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for name in dict.fromkeys(MARKER.findall(text)):
            parts = text.split(f"<!-- {name} -->")
            assert len(parts) == 3, f"{page.name}: <!-- {name} --> must appear exactly twice"
            found.append((page.name, name, parts[1]))
    return found


def test_the_docs_have_learning_tables():
    names = {name for _, name, _ in blocks()}
    assert {
        "quickstart-results",
        "quickstart_async-results",
        "qlora_quickstart-results",
        "tool-quickstart-results",
        "reasoning_gym_quickstart-results",
        "qwen3-tool-results",
        "qwen3-text-results",
    } <= names


@pytest.mark.parametrize(("page", "name", "text"), blocks(), ids=lambda v: v if len(v) < 40 else "")
def test_every_results_table_names_its_machine(page, name, text, seeds):
    assert seeds.has_machine_line(text), f"{page}: the table between <!-- {name} --> markers has no 'Machine:' line"


def test_the_machine_line_names_the_processor_and_the_vector_extensions(seeds):
    avx512 = ("Intel(R) Xeon(R) Platinum 8480+", {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile"})
    line = seeds.machine_line("one run at a time, OMP_NUM_THREADS=1", info=avx512)
    assert line.startswith("Machine: Intel(R) Xeon(R) Platinum 8480+ (")
    assert "AVX-512, AVX512-BF16, AVX512-FP16, AMX" in line and "no " not in line.split(";")[1]
    assert "torch " in line and "vllm " in line and "OMP_NUM_THREADS=1" in line
    line = seeds.machine_line("one run at a time, OMP_NUM_THREADS=2", info=("AMD EPYC", {"avx2", "fma", "f16c"}))
    assert "AMD EPYC" in line and "AVX2, FMA; no AVX-512, no AVX512-BF16, no AVX512-FP16, no AMX" in line
    assert seeds.has_machine_line(line)


@pytest.mark.parametrize("info", [(None, {"avx2"}), ("", {"avx2"}), ("AMD EPYC", None)])
def test_no_machine_line_without_a_model_name_and_flags(seeds, info):
    with pytest.raises(SystemExit, match="cannot name this machine's processor"):
        seeds.machine_line("one run at a time, OMP_NUM_THREADS=1", info=info)


def test_cpu_info_reads_the_model_name_and_flags(seeds, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 9654\nflags\t\t: fpu avx2 fma avx512f\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 9654\nflags\t\t: fpu avx2 fma avx512f\n"
    )
    assert seeds.cpu_info(cpuinfo) == ("AMD EPYC 9654", {"fpu", "avx2", "fma", "avx512f"})


def test_the_writer_puts_the_machine_line_above_the_table_and_refuses_a_table_without_one(seeds, tmp_path):
    page = tmp_path / "page.md"
    marker = "<!-- demo-results -->"
    page.write_text(f"# Demo\n\n{marker}\nold table\n{marker}\n\nprose\n")
    table = "| seed | gain |\n|---:|---:|\n| 0 | +0.8 |"
    machine = seeds.machine_line("one run at a time, OMP_NUM_THREADS=1", info=("AMD EPYC", {"avx2", "fma"}))
    seeds.write_learning_table(page, marker, table, machine)
    written = page.read_text()
    assert f"{marker}\n{machine}\n\n{table}\n{marker}" in written and written.endswith("\nprose\n")
    assert seeds.has_machine_line(written.split(marker)[1])
    for missing in ("", "Machine:", "x86_64, 2 cores"):
        with pytest.raises(SystemExit, match="no machine line"):
            seeds.write_learning_table(page, marker, "| seed |\n|---:|\n| 1 |", missing)
    assert page.read_text() == written  # nothing written
