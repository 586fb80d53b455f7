"""The ``condmsg`` command line.

Each subcommand lives in its own module under :mod:`condmsg.commands` and exposes
``register(subparsers)``; the module is imported only when the parser is built, so
``condmsg --help`` stays fast and a heavy dependency (pyspark) is loaded only by the
command that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from condmsg.errors import CondmsgError

#: Modules under ``condmsg.commands`` that provide subcommands, in ``--help`` order.
COMMAND_MODULES = (
    "version",
    "check_services",
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
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"condmsg.commands.{name}")
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


if __name__ == "__main__":
    sys.exit(main())
