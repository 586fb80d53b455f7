"""The ``condmsg`` command starts: ``condmsg version`` and ``--help`` through
``python -m condmsg.cli``."""

from __future__ import annotations

import subprocess
import sys

from condmsg.cli import main


def test_cli_version(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith("condmsg 0.")


def test_cli_help_runs_as_console_script() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "condmsg.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "version" in out.stdout
