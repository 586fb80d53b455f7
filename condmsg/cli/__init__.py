"""The ``condmsg`` command line (``python -m condmsg.cli``, the ``condmsg`` script).

Part of the application layer on top of the library: the commands start the services
(the relay, the evaluator, retention, the audit), so this package and :mod:`condmsg.demo`
are the only parts of ``condmsg`` that import them (DESIGN section 4).

Each subcommand lives in its own module of this package and exposes
``register(subparsers)``; the module is imported only when the parser is built, so
``condmsg --help`` stays fast and a heavy dependency (pyspark) is loaded only by the
command that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from condmsg import __version__
from condmsg.errors import CondmsgError

#: Modules of this package that provide subcommands, in ``--help`` order.
COMMAND_MODULES = (
    "version",
    "check_services",
    "db",
    "relay",
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
    except CondmsgError as exc:
        print(f"condmsg {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
