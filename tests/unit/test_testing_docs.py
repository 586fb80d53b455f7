"""The kit tests of docs/testing.md run as written: each block marked as run by this file
is executed alone, and each ``test_*`` function it defines runs with a fresh kit, as the
``condmsg_kit`` fixture gives one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from condmsg.testing import Kit
from tests.docs_blocks import ROOT, parse

PAGE = ROOT / "docs" / "testing.md"
THIS = "tests/unit/test_testing_docs.py"


def _tests() -> list[Any]:
    blocks, problems = parse(PAGE)
    assert not problems
    found = []
    for block in blocks:
        if block.run_by != THIS:
            continue
        namespace: dict[str, Any] = {"__name__": f"testing_md_{block.line}"}
        exec(compile(block.source, block.id, "exec"), namespace)
        tests = [(name, fn) for name, fn in namespace.items() if name.startswith("test_")]
        assert tests, f"{block.id} defines no test"
        found += [pytest.param(fn, id=f"{block.line}-{name}") for name, fn in tests]
    return found


def test_the_page_has_kit_tests() -> None:
    assert len(_tests()) >= 8


@pytest.mark.parametrize("test", _tests())
def test_docs_testing_md(test: Callable[[Kit], None]) -> None:
    with Kit() as kit:
        test(kit)


def test_the_plugin_gives_the_fixture(condmsg_kit: Kit) -> None:
    assert isinstance(condmsg_kit, Kit)
