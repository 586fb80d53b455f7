"""``condmsg evaluator``: the evaluator service (its options are :mod:`evaluator.cli`'s)."""

from __future__ import annotations

from typing import Any

from condmsg.runtime.exit_codes import add_command
from evaluator.cli import DESCRIPTION, HELP, add_arguments, run


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "evaluator", help=HELP, description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(handler=run)
