"""One exit-code table for every ``condmsg`` command: ``condmsg.runtime.exit_codes``, shown by each
command's ``--help`` and by docs/cli.md, and the code each class of outcome really ends
with, command by command. A command the parser knows but the table does not fails here."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from condmsg.cli import build_parser
from condmsg.runtime import migrate
from condmsg.runtime.amqp import connect
from condmsg.runtime.db import make_engine
from condmsg.runtime.exit_codes import EXIT_CODES
from condmsg.runtime.topology import (
    declare_destination,
    declare_outcome_queue,
    declare_service_queue,
)
from tests.integration.cli.test_cli_commands import COMMAND, ROOT, cli, cli_env

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

DOCS = ROOT / "docs" / "cli.md"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("condmsg has no subcommands")


COMMANDS = sorted(_subparsers())


def _documented() -> dict[str, set[int]]:
    """docs/cli.md's exit-code table: each command and the codes its row gives a meaning."""
    text = DOCS.read_text()
    table = text.split("## Exit codes and errors", 1)[1].split("\n\n", 2)[1]
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    codes = [int(cell) for cell in header[1:]]
    rows: dict[str, set[int]] = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        name = cells[0].strip("`")
        rows[name] = {code for code, cell in zip(codes, cells[1:], strict=True) if cell}
    return rows


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_documents_its_exit_codes(command: str) -> None:
    assert command in EXIT_CODES, f"{command} has no row in condmsg.runtime.exit_codes.EXIT_CODES"
    assert _documented().get(command) == set(EXIT_CODES[command]), (
        f"docs/cli.md's exit-code table differs from EXIT_CODES for {command}"
    )
    help_text = _subparsers()[command].format_help()
    codes = help_text.split("exit codes:", 1)[1]
    for code, meaning in EXIT_CODES[command].items():
        assert re.search(rf"^\s+{code}\s+{re.escape(meaning[:20])}", codes, re.M), help_text


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_a_description_and_says_its_defaults(command: str) -> None:
    parser = _subparsers()[command]
    assert parser.description and len(parser.description) > 20, command
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        name = action.option_strings[-1]
        assert action.help, f"{command} {name} has no help"
        if action.dest.endswith("_url"):
            assert action.metavar == "URL", f"{command} {name}: metavar {action.metavar}"
        shown = parser._get_formatter()._expand_help(action)
        if action.default not in (None, False, [], argparse.SUPPRESS) and action.dest != "help":
            assert str(action.default) in shown, f"{command} {name}: default not in {shown!r}"


# -- each class of outcome, command by command ----------------------------------------

#: A command line that fails as a usage or configuration error, for every command.
USAGE_ERRORS: dict[str, list[str]] = {
    "version": ["version", "--no-such-option"],
    "check-services": ["check-services", "--amqp-url", "http://x"],
    "db": ["db", "check"],
    "send": ["send", "--sender", "s", "--condition", "{}", "--db-url", "mysql://u@h/db"],
    "consume": ["consume", "q", "--recipient", "r"],
    "outcomes": ["outcomes", "--sender", "s", "--since", "yesterday"],
    "relay": ["relay", "--db-url", "mysql://u@h/db"],
    "outbox": ["outbox", "purge", "--all"],
    "evaluator": ["evaluator", "--sender", "s"],
    "retention": ["retention", "--older-than", "7d"],
    "status": ["status", "x", "--db-url", "mysql://u@h/db"],
    "export": ["export", "--out", "/etc/passwd"],
    "audit": ["audit"],
    "console": ["console"],  # no store named
    "conformance": ["conformance", "--queue", "q", "--recipient", "r", "--receiver-cmd", "true"],
    "secret": ["secret", "old"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_usage_or_configuration_error_exits_2(command: str) -> None:
    assert command in USAGE_ERRORS, f"give {command} a usage error here"
    result = cli(*USAGE_ERRORS[command])
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def ctx(tmp_path: Path, amqp_url: str, unique_name: str) -> Ctx:
    """A SQLite store with every schema, and a queue and a sender whose queues exist."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    try:
        for name in ("sender", "receiver", "outbox"):
            migrate.upgrade(engine, name)
    finally:
        engine.dispose()
    sender = unique_name.replace(".", "-")
    queue = f"{unique_name}.q"
    connection = connect(amqp_url)
    try:
        declare_destination(connection, queue)
        for kind in ("ack", "dead"):
            declare_service_queue(connection.channel(), f"condmsg.{sender}.{kind}")
        declare_outcome_queue(connection, f"condmsg.{sender}.outcome")
    finally:
        connection.close()
    return Ctx(db=url, amqp=amqp_url, queue=queue, sender=sender, tmp=tmp_path)


@dataclass(frozen=True)
class Ctx:
    db: str
    amqp: str
    queue: str
    sender: str
    tmp: Path

    @property
    def urls(self) -> tuple[str, ...]:
        return ("--db-url", self.db, "--amqp-url", self.amqp)

    def condition(self) -> tuple[str, str]:
        return (
            "--condition",
            f"{{type: destination, name: {self.queue}, pickup_within_ms: 60000}}",
        )


#: A command line that runs and finds a failure (exit 1), per command whose table has 1.
FAILURES: dict[str, Callable[[Ctx], list[str]]] = {
    "check-services": lambda c: [
        "check-services",
        "--db-url",
        "postgresql+psycopg://u@127.0.0.1:1/x",
    ],
    "db": lambda c: ["db", "check", "--db-url", f"sqlite:///{c.tmp / 'other.db'}"],
    "send": lambda c: ["send", "--sender", c.sender, *c.condition(), *c.urls, "--wait", "0.2"],
    "consume": lambda c: [
        "consume",
        c.queue,
        "--recipient",
        "r",
        "--count",
        "1",
        "--timeout",
        "0.5",
        *c.urls,
    ],
    "outbox": lambda c: ["outbox", "requeue", "--ids", "999", "--db-url", c.db],
    "status": lambda c: ["status", "nothing-like-it", "--db-url", c.db],
}
#: Exit 1 of these is shown by the tests named.
FAILURES_ELSEWHERE = {
    "audit": "tests/spark (an error-level check fails the audit)",
    "conformance": "tests/conformance (receivers broken on purpose fail it)",
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_failure_found_exits_1(command: str, ctx: Ctx) -> None:
    if 1 not in EXIT_CODES[command]:
        assert command not in FAILURES
        return
    if command in FAILURES_ELSEWHERE:
        pytest.skip(FAILURES_ELSEWHERE[command])
    assert command in FAILURES, f"give {command} a failure here"
    result = cli(*FAILURES[command](ctx))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr


#: A command line that blocks, per command whose table has 130.
BLOCKING: dict[str, Callable[[Ctx], list[str]]] = {
    "send": lambda c: ["send", "--sender", c.sender, *c.condition(), *c.urls, "--wait", "60"],
    "consume": lambda c: ["consume", c.queue, "--recipient", "r", *c.urls],
    "outcomes": lambda c: ["outcomes", "--sender", c.sender, "--follow", *c.urls],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_command_exits_130(command: str, signum: int, ctx: Ctx) -> None:
    if 130 not in EXIT_CODES[command]:
        assert command not in BLOCKING
        return
    assert command in BLOCKING, f"give {command} a blocking command line here"
    code, rest = _interrupted(ctx, command, signum)
    assert code == 130
    assert "Traceback" not in rest


def _interrupted(
    ctx: Ctx, command: str, signum: int, preexec_fn: Callable[[], None] | None = None
) -> tuple[int, str]:
    """Start ``command``'s blocking command line, send ``signum`` once it says it waits
    (and can be interrupted): its exit code and the rest of its stderr."""
    proc = subprocess.Popen(
        [*COMMAND, *BLOCKING[command](ctx)],
        cwd=ROOT,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith(f"condmsg {command}: waiting for"), line
        os.kill(proc.pid, signum)
        return proc.wait(30), proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_command_started_with_sigint_ignored_still_exits_130_on_it(ctx: Ctx) -> None:
    """A command launched in the background by a script (or a test runner's worker)
    inherits an ignored SIGINT; `kill -INT` must still end it with 130."""
    code, _ = _interrupted(ctx, "send", signal.SIGINT, preexec_fn=_ignore_sigint)
    assert code == 130
