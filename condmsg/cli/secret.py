"""``condmsg secret new``: print a fresh deployment secret (docs/security.md)."""

from __future__ import annotations

import argparse
from typing import Any

from condmsg.runtime.credentials import NEW_SECRET_BYTES, new_secret
from condmsg.runtime.exit_codes import OK, add_command


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "secret",
        help="make a deployment secret (condmsg secret new)",
        description=f"new: print a fresh deployment secret, {NEW_SECRET_BYTES} random bytes "
        "as hex digits, for CONDMSG_SECRET or the file CONDMSG_SECRET_FILE names, e.g. "
        "condmsg secret new > secrets/condmsg_secret",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("new", help="print a fresh deployment secret").set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    print(new_secret())
    return OK
