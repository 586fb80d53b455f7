"""``condmsg version``: print the installed version."""

from __future__ import annotations

import argparse
from typing import Any

from condmsg import __version__
from condmsg.runtime.exit_codes import OK, add_command


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "version",
        help="print the condmsg version",
        description="Print the installed condmsg version (as condmsg --version does).",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    print(f"condmsg {__version__}")
    return OK
