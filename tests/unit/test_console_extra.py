"""``condmsg console`` without the ``console`` extra: one line naming it, exit code 2, and
nothing started; the console's sessions compare tokens and CSRF tokens exactly."""

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


def test_a_session_needs_the_exact_token_and_its_own_csrf_token() -> None:
    from condmsg.console.auth import Sessions

    sessions = Sessions("s3cret")
    assert sessions.login("s3cre") is None and sessions.login("s3cret!") is None
    session_id = sessions.login("s3cret")
    assert session_id is not None
    found = sessions.get(session_id)
    assert found is not None
    assert sessions.check_csrf(session_id, found.csrf)
    assert not sessions.check_csrf(session_id, found.csrf[:-1])
    assert not sessions.check_csrf("another", found.csrf)
    sessions.logout(session_id)
    assert sessions.get(session_id) is None
    assert not Sessions(None).enabled and Sessions(None).login("") is None
