"""Commands read the database they are told to use and create nothing by themselves."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from condmsg import __version__
from condmsg.cli import COMMANDS, SUMMARIES, build_parser, main, named_command


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


#: Commands that use a store, and those that also use the broker (relay and evaluator
#: take theirs from the environment alone).
DB_COMMANDS = [
    ["send"],
    ["consume"],
    ["outcomes"],
    ["outbox"],
    ["status"],
    ["db"],
    ["retention"],
    ["export"],
    ["check-services"],
]
AMQP_COMMANDS = [["send"], ["consume"], ["outcomes"], ["check-services"]]


def _help(command: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", DB_COMMANDS)
def test_every_store_command_says_where_its_database_comes_from(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--db-url URL SQLAlchemy URL of" in _help(command, capsys)
    assert "(default: $CONDMSG_DB_URL" in _help(command, capsys)


@pytest.mark.parametrize("command", AMQP_COMMANDS)
def test_every_broker_command_says_where_its_broker_comes_from(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--amqp-url URL RabbitMQ (default: $CONDMSG_AMQP_URL" in _help(command, capsys)


def test_the_debug_flag_is_global(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--debug" in _help([], capsys)


def test_a_yaml_node_alone_reads_as_a_versioned_document() -> None:
    from datetime import timedelta

    from condmsg.cli.inputs import parse_condition
    from condmsg.core.conditions import Destination, DestinationSet

    yaml_doc = b"""
type: set
min_pickup: 1
pickup_within_ms: 2000
members:
  - {type: destination, name: a}
  - {type: destination, name: b}
"""
    json_doc = (
        b'{"schema": 1, "condition": {"type": "set", "min_pickup": 1, "pickup_within_ms": 2000,'
        b' "members": [{"type": "destination", "name": "a"},'
        b' {"type": "destination", "name": "b"}]}}'
    )
    expected = DestinationSet(
        Destination("a"), Destination("b"), pickup_within=timedelta(seconds=2), min_pickup=1
    )
    assert parse_condition(yaml_doc) == expected
    assert parse_condition(json_doc) == expected


@pytest.mark.parametrize(
    ("document", "said"),
    [
        (b"type: destination\nname: [a\n", "neither JSON nor YAML"),
        (b"- a\n- b\n", "the document must be an object"),
        (b"{type: destination, name: q}", "at least one time constraint"),
        (b"{schema: 2, condition: {type: destination, name: q}}", "unsupported schema"),
    ],
)
def test_a_bad_condition_document_is_one_line(document: bytes, said: str) -> None:
    from condmsg.cli.inputs import parse_condition
    from condmsg.core.errors import ConditionError

    with pytest.raises(ConditionError) as raised:
        parse_condition(document)
    assert said in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("spec", "inline"),
    [("{type: destination}", True), ("type: destination", True), ("cond.yaml", False)],
)
def test_a_condition_is_a_file_unless_it_is_a_document(
    spec: str, inline: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from condmsg.cli.inputs import condition_text

    monkeypatch.chdir(tmp_path)
    if inline:
        assert condition_text(spec) == spec.encode()
    else:
        with pytest.raises(FileNotFoundError):
            condition_text(spec)
        (tmp_path / spec).write_text("type: destination")
        assert condition_text(spec) == b"type: destination"


def test_os_errors_name_the_file() -> None:
    import argparse
    import errno
    import os

    from condmsg.cli.failures import explain

    args = argparse.Namespace()
    denied = PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/srv/payload")
    assert explain(denied, args) == (
        "permission denied: /srv/payload; check the file's owner and mode"
    )
    assert explain(FileNotFoundError(2, "gone", "/x.yaml"), args) == "no such file: /x.yaml"
    assert explain(RuntimeError("a bug"), args) is None


def test_a_named_command_builds_only_its_parser() -> None:
    """``condmsg status ...`` loads neither the receiver, the evaluator nor the audit."""
    probe = (
        "import sys; from condmsg.cli import build_parser, named_command\n"
        "parser = build_parser(named_command(['--debug', 'status', 'some-cm']))\n"
        "parser.parse_args(['status', 'some-cm'])\n"
        "heavy = {'ackd', 'evaluator', 'spark_audit', 'pyarrow'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "[]", ran.stdout + ran.stderr


def test_help_imports_no_command() -> None:
    """``condmsg --help`` lists the commands without loading any of them (nor what they
    use), so it answers at once on a machine with or without the audit extra."""
    probe = (
        "import sys, contextlib, io\n"
        "from condmsg.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "assert 'retention' in out.getvalue(), out.getvalue()\n"
        "heavy = {'ackd', 'evaluator', 'spark_audit', 'pyarrow', 'pyspark', 'pandas', 'pika',\n"
        "         'sqlalchemy', 'psycopg'}\n"
        "loaded = {m.split('.')[0] for m in sys.modules} & heavy\n"
        f"modules = {[f'condmsg.cli.{m}' for m in COMMANDS.values()]!r}\n"
        "commands = [m for m in modules if m in sys.modules]\n"
        "print(sorted(loaded), commands)"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "[] []", ran.stdout + ran.stderr


def test_the_listed_summaries_are_the_commands_own() -> None:
    parser = build_parser(None)
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    own = {action.dest: action.help for action in commands._choices_actions}
    assert own == SUMMARIES, "update condmsg.cli.SUMMARIES to the commands' help"


def test_help_and_an_unknown_command_list_every_command() -> None:
    assert named_command(["--help"]) is None
    assert named_command(["--debug", "nonsense"]) is None
    assert named_command(["outbox", "list"]) == "outbox"
    for parser in (build_parser(None), build_parser(None, listing=True)):
        (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        assert list(commands.choices) == list(COMMANDS)
