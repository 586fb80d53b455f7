"""The ``condmsg`` command line (``python -m condmsg.cli``, the ``condmsg`` script).

Part of the application layer on top of the library: the commands start the services
(the relay, the evaluator, retention, the audit), so this package and :mod:`condmsg.demo`
are the only parts of ``condmsg`` that import them (DESIGN section 4).

Each subcommand lives in its own module of this package and exposes
``register(subparsers)``. A command line that names its command builds the parser of that
command alone, so ``condmsg status`` does not import the receiver, the evaluator or the
audit; ``condmsg --help`` (or a command it does not know) lists the commands from
:data:`SUMMARIES` and imports none of them. pyspark is loaded only when ``condmsg audit``
runs.

Exit codes (:mod:`condmsg.runtime.exit_codes` has the table): 0 done, 1 a failed check or outcome
(a command says which), 2 a usage or configuration error, which includes a service or file
the command cannot use: one line on stderr naming what failed and what to do
(:mod:`condmsg.cli.failures`; ``--debug`` shows the traceback too), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence

from condmsg import __version__
from condmsg.cli.extras import require_extra
from condmsg.runtime.exit_codes import INTERRUPTED, USAGE

#: The services: a stop signal is how they end (exit 0); they install their own handlers.
SERVICES = frozenset({"relay", "evaluator"})
#: The commands that run without a deployment's settings (no secret is checked).
NO_SECRET = frozenset({"version", "secret"})
#: What a shell reports for a command that SIGPIPE ended (128 + 13).
READER_GONE = 141

#: Each command and the module of this package that provides it, in ``--help`` order.
COMMANDS = {
    "version": "version",
    "check-services": "check_services",
    "db": "db",
    "send": "send",
    "consume": "consume",
    "outcomes": "outcomes",
    "relay": "relay",
    "outbox": "outbox_rows",
    "evaluator": "evaluator",
    "retention": "retention",
    "status": "status",
    "console": "console",
    "export": "export",
    "audit": "audit",
    "conformance": "conformance",
    "secret": "secret",
}

#: Each command's line in ``condmsg --help``. They are kept here, not read from the
#: commands' modules, so that listing the commands imports none of them (a module may pull
#: in the receiver, the evaluator or pyarrow); tests/unit/test_cli_options.py holds each to
#: the help its module gives.
SUMMARIES = {
    "version": "print the condmsg version",
    "check-services": "log in to RabbitMQ and open the database, as the services do",
    "db": "upgrade, show or check a store's schema",
    "send": "send a conditional message; print its CM id (and, with --wait, its outcome)",
    "consume": "read a queue as a receiver (automatic acks); print messages or pipe them",
    "outcomes": "a sender's outcomes as JSON lines: decided CMs from its store, or --follow",
    "relay": "publish outbox rows to RabbitMQ (CONDMSG_DB_URL -> CONDMSG_AMQP_URL)",
    "outbox": "list, requeue or purge the outbox rows the relay parked",
    "evaluator": "decide conditional messages of a sender (acks, timeouts, outcomes)",
    "retention": "archive decided CMs older than a period to Parquet, then delete them",
    "status": "show a conditional message's tree and verdict, or a sphere's",
    "console": "serve a web console of a sender store (CMs, trees, outbox, dead letters)",
    "export": "export a sender store to Parquet for the audit (no Spark needed)",
    "audit": "audit acks, latencies and verdicts with Spark",
    "conformance": "test a receiver in any language against the wire protocol",
    "secret": "make a deployment secret (condmsg secret new)",
}


def named_command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first argument that is not an option), if known."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(only: str | None = None, *, listing: bool = False) -> argparse.ArgumentParser:
    """The parser of every command, or of the command ``only``; with ``listing``, one that
    knows the commands by name and summary only (for ``--help`` and a command it does not
    know: it imports no command's module)."""
    parser = argparse.ArgumentParser(
        prog="condmsg",
        description="Conditional messaging for RabbitMQ: send with conditions, "
        "acknowledge automatically, evaluate, compensate.",
    )
    parser.add_argument("--version", action="version", version=f"condmsg {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error, not one line"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command, module_name in COMMANDS.items():
        if listing:
            subparsers.add_parser(command, help=SUMMARIES[command])
        elif only is None or command == only:
            importlib.import_module(f"condmsg.cli.{module_name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    command = named_command(argv)
    parser = build_parser(command, listing=command is None)
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return USAGE
    if args.command not in SERVICES:
        # SIGTERM interrupts a command as Ctrl-C does: the same cleanup, the same exit code.
        # SIGINT too, explicitly: a command started in the background by a script (or by a
        # test runner's worker) inherits an ignored SIGINT, and Python then leaves it
        # ignored, so `kill -INT` would not end it with 130 as documented.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        require_extra(args.command)
        if args.command not in NO_SECRET:
            # A deployment's environment goes to every command and service alike: a
            # placeholder or short secret is refused by each, also one that signs nothing.
            from condmsg.runtime.credentials import secret_from_env

            secret_from_env()
        code = int(handler(args))
        sys.stdout.flush()  # a reader that went away is met here, not at exit
        return code
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        return _reader_gone()
    except Exception as exc:
        from condmsg.cli.failures import explain

        said = explain(exc, args)
        if said is None:
            raise  # a bug: its traceback, exit 1
        if args.debug:
            traceback.print_exc()
        one_line = " ".join(said.split())
        print(f"condmsg {args.command}: {one_line}", file=sys.stderr)
        return USAGE


def _reader_gone() -> int:
    """The reader of standard output went away (``| head``): stop without a word. What is
    still buffered goes nowhere, so that the flush at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return READER_GONE
