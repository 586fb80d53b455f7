"""The exit codes of every ``condmsg`` command (and ``python -m evaluator``), in one
table: ``--help`` shows each command's rows (its epilog) and docs/cli.md shows the same
table, which a test holds to this one.

The classes are the same for every command: 0 done, 1 the command ran and found a
failure (a check, an outcome, rows or ids it was asked about), 2 a usage or configuration
error (bad arguments, a store without its schema, refused credentials, a service or a file
it cannot use), 130 interrupted. A service (``relay``, ``evaluator``) ends with 0 on
SIGTERM or SIGINT: a stop signal is how it is meant to end.
"""

from __future__ import annotations

import argparse
from typing import Any

OK = 0
FAILED = 1
USAGE = 2
INTERRUPTED = 130

_USAGE = "a usage or configuration error"
_INTERRUPTED = "interrupted by SIGINT (Ctrl-C) or SIGTERM"

#: Each command's codes and what each means for it.
EXIT_CODES: dict[str, dict[int, str]] = {
    "version": {OK: "printed", USAGE: _USAGE},
    "check-services": {
        OK: "every check passed",
        FAILED: "a check failed",
        USAGE: f"{_USAGE} (e.g. a URL that is not an AMQP URL)",
    },
    "db": {
        OK: "upgraded, shown, or the schema is current",
        FAILED: "check: the schema is not current or the database cannot be used",
        USAGE: _USAGE,
    },
    "send": {
        OK: "sent (with --wait: satisfied)",
        FAILED: "with --wait: violated, or not decided in time",
        USAGE: f"{_USAGE} (e.g. a store without its schema)",
        INTERRUPTED: _INTERRUPTED,
    },
    "consume": {
        OK: "--count messages read, or --timeout passed without one",
        FAILED: "fewer than --count messages before --timeout, or --exec failed",
        USAGE: f"{_USAGE} (e.g. a queue that does not exist)",
        INTERRUPTED: _INTERRUPTED,
    },
    "outcomes": {
        OK: "printed (with --follow: --timeout passed without an outcome)",
        USAGE: f"{_USAGE} (e.g. --follow of a sender without queues)",
        INTERRUPTED: _INTERRUPTED,
    },
    "relay": {
        OK: "stopped by SIGTERM or SIGINT, or --status printed",
        USAGE: f"{_USAGE}, including credentials RabbitMQ keeps refusing",
    },
    "outbox": {
        OK: "done",
        FAILED: "--ids named rows that are not parked",
        USAGE: _USAGE,
    },
    "evaluator": {
        OK: "stopped by SIGTERM or SIGINT",
        USAGE: f"{_USAGE}, including a store without its schema and credentials RabbitMQ "
        "keeps refusing",
    },
    "retention": {OK: "done (possibly nothing to archive)", USAGE: _USAGE},
    "status": {
        OK: "shown",
        FAILED: "no such CM or sphere (retention may have archived it)",
        USAGE: _USAGE,
    },
    "console": {
        OK: "stopped by SIGTERM or SIGINT",
        USAGE: f"{_USAGE} (e.g. the console extra is not installed)",
    },
    "export": {
        OK: "exported",
        USAGE: f"{_USAGE} (e.g. an output that is not a directory)",
    },
    "audit": {
        OK: "the audit passed, possibly with warnings",
        FAILED: "an error-level check failed",
        USAGE: "bad input or a runtime error",
    },
    "conformance": {
        OK: "every scenario passed",
        FAILED: "a scenario failed (the table and the JSON line say which)",
        USAGE: f"{_USAGE} (e.g. a store or broker it cannot use)",
    },
    "secret": {OK: "printed", USAGE: _USAGE},
}


def epilog(command: str) -> str:
    """The ``exit codes:`` block of ``command``'s ``--help``."""
    rows = "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES[command].items())
    return f"exit codes:\n{rows}"


class HelpFormatter(argparse.HelpFormatter):
    """Fills a paragraph, as argparse does, but keeps a text of several lines (the exit
    codes) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def add_command(subparsers: Any, name: str, *, help: str, description: str) -> Any:
    """The parser of the command ``name``: ``help`` in the list of commands,
    ``description`` atop its own ``--help`` and its exit codes below."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=description, epilog=epilog(name), formatter_class=HelpFormatter
    )
    return parser
