"""The ``condmsg`` command line (``python -m condmsg.cli``, the ``condmsg`` script).

Part of the application layer on top of the library: the commands start the services
(the relay, the evaluator, retention, the audit), so this package and :mod:`condmsg.demo`
are the only parts of ``condmsg`` that import them (DESIGN section 4).

Each subcommand lives in its own module of this package and exposes
``register(subparsers)``; the module is imported only when the parser is built, so
``condmsg --help`` stays fast and a heavy dependency (pyspark) is loaded only by the
command that needs it.

Exit codes: 0 done, 1 a failed check or outcome (a command says which), 2 a usage or
configuration error, which includes a service or file the command cannot use: one line on
stderr naming what failed and what to do (:mod:`condmsg.cli.failures`); ``--debug`` shows
the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from condmsg import __version__

#: Modules of this package that provide subcommands, in ``--help`` order.
COMMAND_MODULES = (
    "version",
    "check_services",
    "db",
    "send",
    "consume",
    "outcomes",
    "relay",
    "outbox_rows",
    "evaluator",
    "retention",
    "status",
    "export",
    "audit",
)


def build_parser() -> argparse.ArgumentParser:
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
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"condmsg.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from condmsg.cli.failures import explain

        said = None if args.debug else explain(exc, args)
        if said is None:
            raise
        one_line = " ".join(said.split())
        print(f"condmsg {args.command}: {one_line}", file=sys.stderr)
        return 2
