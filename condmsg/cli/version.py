"""``condmsg version``: print the installed version."""

from __future__ import annotations

import argparse
from typing import Any

from condmsg import __version__


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("version", help="print the condmsg version")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    print(f"condmsg {__version__}")
    return 0
