"""``condmsg evaluator``: the evaluator service (its options are :mod:`evaluator.cli`'s)."""

from __future__ import annotations

from typing import Any

from evaluator.cli import HELP, add_arguments, run


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("evaluator", help=HELP)
    add_arguments(parser)
    parser.set_defaults(handler=run)
