"""Commands read the database they are told to use and create nothing by themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from condmsg import __version__
from condmsg.cli import main


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"condmsg {__version__}"


@pytest.mark.parametrize("command", [["status", "cm-1"], ["db", "current"]])
def test_a_command_refuses_to_guess_the_database(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("CONDMSG_DB_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(command) == 2
    assert "--db-url or CONDMSG_DB_URL" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_status_does_not_create_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.db"
    assert main(["status", "cm-1", "--db-url", f"sqlite:///{missing}"]) == 2
    assert f"no store at {missing}" in capsys.readouterr().err
    assert not missing.exists()
