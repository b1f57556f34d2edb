"""The suite's xdist groups hold: under ``--dist loadgroup`` the tests that share a costly fixture
(tests/conftest.py, ``SHARED_BY_GROUP``) run on one worker, so the fixture is built once. pytest-xdist
groups by a suffix on the test's id; a pytest it cannot tag (pytest-xdist#1386) spreads a group silently."""

from __future__ import annotations

import os

import pytest


@pytest.mark.xdist_group("suite_groups")
def test_a_grouped_test_carries_its_group_under_loadgroup(request):
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("runs under pytest-xdist --dist loadgroup (the README's test command)")
    assert request.node.nodeid.endswith("@suite_groups"), request.node.nodeid


class _Item:
    """What ``_xdist_group`` reads of a collected test: its fixture names and its markers."""

    def __init__(self, fixturenames, marks=()):
        self.fixturenames, self._marks = fixturenames, [m.mark for m in marks]

    def iter_markers(self, name):
        return (m for m in self._marks if m.name == name)


def test_the_tests_of_a_shared_fixture_get_its_group():
    """What the conftest marks: a test asking for a shared fixture by name (directly or through another
    fixture) or by value (the ``shares`` marker)."""
    from tests.conftest import _xdist_group

    assert _xdist_group(_Item(("exported", "quickstart_run", "tmp_path"))) == "quickstart_run"
    assert _xdist_group(_Item(("tiny_model_path", "server_url"), [pytest.mark.shares("vllm_server")])) == "vllm_server"
    assert _xdist_group(_Item(("tmp_path", "vllm_engine"))) is None


def _shared(param) -> set[str]:
    return {name for mark in param.marks if mark.name == "shares" for name in mark.args}


def test_the_tests_that_ask_for_a_shared_fixture_by_value_declare_it():
    """The recipe tests and the matrix cells call ``request.getfixturevalue``: a recipe on the vLLM server,
    a distillation recipe without its teacher folder, a matrix cell on the server each carry ``shares``."""
    pytest.importorskip("allpairspy")
    from tests.e2e.matrix.test_matrix import CELL_PARAMS
    from tests.package.test_recipes import PARAMS

    by_recipe = {param.id: _shared(param) for param in PARAMS}
    assert by_recipe["quickstart_async"] == {"vllm_server"}
    assert by_recipe["distill_quickstart"] == by_recipe["gkd_quickstart"] == {"digit_teacher_path"}
    assert by_recipe["quickstart"] == set()
    on_server = [param for param in CELL_PARAMS if param.values[0]["engine"] == "vllm_server"]
    assert on_server and all(_shared(param) == {"vllm_server"} for param in on_server)
    assert all(not _shared(param) for param in CELL_PARAMS if param not in on_server)
