"""Without the ``audit`` extra, the commands that need it say so in one line (exit code 2)
and do nothing else; their ``--help`` and every other command still work.

The extra's absence is simulated by mapping its modules to None in ``sys.modules``, which
makes an import of them fail as on an installation without them; the real installation
without the extra is tests/e2e/test_wheel_install.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from condmsg.cli import main
from condmsg.cli.extras import AUDIT_INSTALL, NEEDS_AUDIT_EXTRA, require_extra

EXTRA = ("pyspark", "pyarrow", "pandas")


@pytest.fixture
def without_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in EXTRA:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["export", "--out", "{tmp}/export"], "pyarrow"),
        (["retention", "--older-than", "7d", "--archive", "{tmp}/archive"], "pyarrow"),
        (["audit", "--parquet", "{tmp}/export", "--out", "{tmp}/audit"], "pyspark, pyarrow"),
    ],
)
@pytest.mark.usefixtures("without_the_extra")
def test_a_command_of_the_extra_names_it_in_one_line(
    argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store.db"
    argv = [a.format(tmp=tmp_path) for a in argv]
    code = main([*argv, *([] if argv[0] == "audit" else ["--db-url", f"sqlite:///{store}"])])
    said = capsys.readouterr()
    assert code == 2
    assert said.out == ""
    (line,) = said.err.splitlines()
    assert line.startswith(f"condmsg {argv[0]}: ")
    assert f"({named}" in line
    assert line.endswith(f"install it with: {AUDIT_INSTALL}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing was started


def test_every_command_of_the_extra_is_covered() -> None:
    assert set(NEEDS_AUDIT_EXTRA) == {"audit", "export", "retention"}


def test_with_the_extra_every_command_may_run() -> None:
    for command in (*NEEDS_AUDIT_EXTRA, "send", None):
        require_extra(command)


def test_help_of_the_extras_commands_needs_no_extra() -> None:
    """Their options are shown without the extra, and building their parsers imports none
    of its modules."""
    probe = (
        "import sys, contextlib, io\n"
        f"for name in {EXTRA!r}:\n"
        "    sys.modules[name] = None\n"
        "from condmsg.cli import main\n"
        "for command in ('audit', 'export', 'retention'):\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        try:\n"
        "            main([command, '--help'])\n"
        "        except SystemExit as done:\n"
        "            assert done.code == 0, (command, done.code)\n"
        "    assert '--out' in out.getvalue() or '--archive' in out.getvalue(), command\n"
        "print('ok')"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert ran.stdout.strip() == "ok", ran.stdout + ran.stderr
