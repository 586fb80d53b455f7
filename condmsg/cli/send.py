"""``condmsg send``: send one conditional message and print its CM id; with ``--wait``,
wait for its outcome (saying so on stderr) and print it as a JSON line.

The CM, its copies and its compensation are recorded in the sender's store in one
transaction; the copies leave through the store's outbox, which ``condmsg relay`` or the
evaluator of this sender (its built-in relay) publishes. Exit codes: 0 sent (and, with
``--wait``, satisfied), 1 violated or not decided within ``--wait`` seconds, 2 a usage or
configuration error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from condmsg.cli.inputs import condition_text, exclusive_stdin, parse_condition, read_bytes
from condmsg.cli.options import (
    add_amqp_url,
    add_create_schema,
    add_db_url,
    amqp_url,
    named_db_url,
)
from condmsg.core.errors import ConditionError, ConfigError
from condmsg.core.evaluation import Verdict
from condmsg.runtime.exit_codes import FAILED, OK, add_command


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "send",
        help="send a conditional message; print its CM id (and, with --wait, its outcome)",
        description="Send a payload under a condition and print its CM id. The copies leave "
        "through the store's outbox (condmsg relay, or the evaluator of this sender, publishes "
        "them). With --wait, wait for the outcome and print it as a JSON line.",
    )
    parser.add_argument("--sender", required=True, metavar="NAME", help="the sender identity")
    parser.add_argument(
        "--condition",
        required=True,
        metavar="FILE|-|DOC",
        help="the condition as JSON or YAML: a file, - for standard input, or the document "
        "itself; either the versioned document or its root node alone",
    )
    parser.add_argument(
        "--payload", metavar="FILE|-", help="the payload's bytes (default: an empty payload)"
    )
    parser.add_argument(
        "--compensation",
        metavar="FILE",
        help="sent to every destination that consumed the CM if it fails "
        "(default: a notice condmsg writes)",
    )
    parser.add_argument(
        "--notify-success", action="store_true", help="notify every destination on success"
    )
    parser.add_argument(
        "--content-type",
        metavar="TYPE",
        default="application/octet-stream",
        help="of the payload (default: %(default)s)",
    )
    parser.add_argument(
        "--wait",
        type=float,
        metavar="SECONDS",
        help="wait this long for the outcome (needs the evaluator of this sender; default: "
        "do not wait)",
    )
    add_db_url(parser, "the sender store")
    add_create_schema(parser, "sender")
    add_amqp_url(parser)
    parser.set_defaults(handler=run, schema_store="sender")


def run(args: argparse.Namespace) -> int:
    from condmsg.runtime.amqp import connect
    from condmsg.runtime.settings import Settings
    from condmsg.runtime.topology import checked_sender_name
    from condmsg.sending.sender import Sender

    if args.wait is not None and args.wait < 0:
        raise ConfigError("--wait must not be negative")
    checked_sender_name(args.sender)
    exclusive_stdin(condition=args.condition, payload=args.payload)
    try:
        condition = parse_condition(condition_text(args.condition))
    except ConditionError as exc:
        raise ConfigError(f"--condition: {exc}") from None
    payload = read_bytes(args.payload) if args.payload else b""
    compensation = read_bytes(args.compensation) if args.compensation else None
    db_url = named_db_url(args, existing=not args.create_schema)
    broker = amqp_url(args)
    # The sender would record the CM with the broker down (its outbox holds the copies
    # until a relay can publish them) and only log that it could not declare the queues;
    # a person at a terminal wants to hear now that the URL or the broker is wrong.
    connect(broker, name=f"condmsg-send-{args.sender}").close()
    sender = Sender(
        name=args.sender,
        amqp_url=broker,
        db_url=db_url,
        secret=Settings.from_env().secret,
        create_schema=args.create_schema,
    )
    try:
        cm_id = sender.send(
            payload,
            condition,
            compensation=compensation,
            notify_success=args.notify_success,
            content_type=args.content_type,
        )
        print(cm_id, flush=True)
        if args.wait is None:
            return OK
        print(
            f"condmsg send: waiting for the outcome of {cm_id} for up to {args.wait:g} s "
            f"(condmsg evaluator --sender {args.sender} decides it; Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )
        outcome = sender.outcome(cm_id, timeout=args.wait)
    finally:
        sender.engine.dispose()
    if outcome is None:
        print(
            f"condmsg send: {cm_id} not decided within {args.wait:g} s; is `condmsg evaluator "
            f"--sender {args.sender}` running, and a relay for this store?",
            file=sys.stderr,
        )
        return FAILED
    print(json.dumps(outcome.to_dict(), separators=(",", ":")))
    return OK if outcome.verdict is Verdict.SATISFIED else FAILED
