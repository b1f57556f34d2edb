"""docs/combinations.md lists the cells allpairspy generates from tests/e2e/matrix/dimensions.py and the refused pairs."""

from __future__ import annotations

from pathlib import Path

import pytest

from .dimensions import DIMENSIONS, REFUSED, cells

DOC = Path(__file__).resolve().parents[3] / "docs" / "combinations.md"


def cell_table() -> list[str]:
    return [f"| {i} | " + " | ".join(f"`{c[n]}`" for n in DIMENSIONS) + " |" for i, c in enumerate(cells(), 1)]


def refused_table() -> list[str]:
    return [f"| `{a}: {va}` + `{b}: {vb}` | " + ", ".join(f"`{w}`" for w in words) + " |" for (a, va), (b, vb), words in REFUSED]


def _section(text: str, name: str) -> list[str]:
    body = text.split(f"<!-- {name}:begin -->\n")[1].split(f"<!-- {name}:end -->")[0]
    return body.splitlines()[2:]  # after the header and its rule


def test_doc_lists_the_generated_cells_and_the_refused_pairs():
    pytest.importorskip("allpairspy")
    text = DOC.read_text()
    assert _section(text, "cells") == cell_table(), "docs/combinations.md: regenerate the cell table (tests/e2e/matrix/test_matrix_doc.py)"
    assert _section(text, "refused") == refused_table()
    for dimension, values in DIMENSIONS.items():
        assert f"| {dimension} |" in text and all(f"`{v}`" in text for v in values), f"docs/combinations.md: dimension {dimension}"


def test_every_pair_of_values_meets_in_a_cell_unless_refused():
    pytest.importorskip("allpairspy")
    rows, names = cells(), list(DIMENSIONS)
    refused = {frozenset([a, b]) for a, b, _ in REFUSED}
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            for vx in DIMENSIONS[x]:
                for vy in DIMENSIONS[y]:
                    met = any(r[x] == vx and r[y] == vy for r in rows)
                    assert met != (frozenset([(x, vx), (y, vy)]) in refused), f"{x}={vx} with {y}={vy}"


if __name__ == "__main__":  # print the tables for the doc
    print("\n".join(cell_table()), "\n")
    print("\n".join(refused_table()))
