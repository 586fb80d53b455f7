"""``condmsg conformance``: drive a receiver under test through the wire protocol and
judge it (docs/conformance.md). Exit codes: :mod:`condmsg.runtime.exit_codes`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from condmsg.cli.options import add_amqp_url, add_db_url, amqp_url, named_db_url
from condmsg.runtime.exit_codes import FAILED, OK, add_command

DESCRIPTION = (
    "Start a receiver under test with --receiver-cmd (its settings in CONDMSG_* variables), "
    "drive it through a real sender and evaluator (originals, duplicates, compensations in "
    "both orders, success notices, forged and unsigned tokens, sequences, poison messages, "
    "recipients, topics, spheres, malformed headers, crashes around the commit and SIGKILLs at "
    "random moments) and judge what its application got from the app table in its store and "
    "what it acked. Prints a pass/fail table, then one JSON line."
)


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "conformance",
        help="test a receiver in any language against the wire protocol",
        description=DESCRIPTION,
    )
    parser.add_argument("--queue", required=True, help="the queue the receiver reads")
    parser.add_argument("--recipient", required=True, help="the receiver's recipient identity")
    parser.add_argument(
        "--receiver-cmd",
        required=True,
        metavar="CMD",
        help="shell command that starts the receiver under test (it is killed and restarted)",
    )
    add_db_url(parser, "the receiver's store (it gets the app table)")
    parser.add_argument(
        "--sender-db-url",
        metavar="URL",
        help="the harness's own sender store (default: a SQLite file in a temporary directory)",
    )
    add_amqp_url(parser)
    parser.add_argument(
        "--invalid-queue",
        metavar="NAME",
        help="the receiver's invalid-message queue (default: QUEUE.invalid)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every deadline by this (a slow machine; default: 1.0)",
    )
    parser.add_argument(
        "--only", action="append", default=[], metavar="SCENARIO", help="run this scenario only"
    )
    parser.add_argument("--receiver-log", metavar="FILE", help="append the receiver's output here")
    parser.add_argument(
        "--fail-fast",
        action="store_true",
        help="stop at the first failed scenario (scenarios still running are cut short)",
    )
    parser.add_argument(
        "--kills",
        type=_kills,
        metavar="N",
        help="how often kill-anywhere SIGKILLs the receiver "
        "(default: 200; fewer for a receiver that is slow to start)",
    )
    parser.set_defaults(handler=run, schema_store="receiver")


def run(args: argparse.Namespace) -> int:
    from condmsg.conformance import ConformanceConfig
    from condmsg.conformance import run as run_harness
    from condmsg.conformance.config import harness_secret

    config = ConformanceConfig(
        amqp_url=amqp_url(args),
        store_url=named_db_url(args),
        receiver_cmd=args.receiver_cmd,
        queue=args.queue,
        recipient=args.recipient,
        secret=harness_secret(),
        sender_db_url=args.sender_db_url,
        invalid_queue=args.invalid_queue,
        scale=args.scale,
        only=tuple(args.only),
        log_path=args.receiver_log,
        fail_fast=args.fail_fast,
        **({} if args.kills is None else {"kills": args.kills}),
    )
    report = run_harness(config)
    print(report.table())
    print(report.json_line())
    sys.stdout.flush()
    return OK if report.passed else FAILED


def _kills(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of kills >= 1, got {text!r}")
    return value
