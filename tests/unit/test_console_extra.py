"""``condmsg console`` without the ``console`` extra: one line naming it, exit code 2, and
nothing started."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from condmsg.cli import main
from condmsg.cli.console import CONSOLE_INSTALL, CONSOLE_MODULES


def test_without_the_extra_the_console_names_it_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in CONSOLE_MODULES:
        monkeypatch.setitem(sys.modules, name, None)
    store = tmp_path / "store.db"
    store.touch()
    code = main(["console", "--db-url", f"sqlite:///{store}"])
    said = capsys.readouterr()
    assert code == 2
    assert said.out == ""
    (line,) = said.err.splitlines()
    assert line.startswith("condmsg console: the console needs the console extra (starlette")
    assert line.endswith(f"install it with: {CONSOLE_INSTALL}")
