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


def test_the_tests_of_a_shared_fixture_get_its_group():
    """What the conftest marks: a test asking for a shared fixture (directly or through another fixture)."""
    from tests.conftest import _xdist_group

    class Item:
        fixturenames = ("exported", "quickstart_run", "tmp_path")

    class Cell:
        fixturenames = ("tiny_model_path", "server_url")
        callspec = type("Callspec", (), {"params": {"cell": {"engine": "vllm_server"}}})()

    class Plain:
        fixturenames = ("tmp_path", "vllm_engine")

    assert _xdist_group(Item()) == "quickstart_run"
    assert _xdist_group(Cell()) == "vllm_server"
    assert _xdist_group(Plain()) is None
