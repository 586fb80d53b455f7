"""``condmsg consume QUEUE``: read messages as a receiver does, acknowledging them
automatically, and print each as a JSON line or pipe its payload to a command.

It reads through :class:`ackd.Receiver`, so a read emits its READ ack and, with
``--transactional``, a COMMIT ack only if the transaction commits: with ``--exec`` that
is when the command exits 0; otherwise the transaction rolls back, the message returns to
the queue and the command stops with exit code 1. Acks leave through the receiver store's
outbox, so an in-process relay publishes them while the command runs, and is drained
before it exits.

A queue that does not exist is an error: reading would declare it, and a mistyped name
would then wait on a new, empty queue for ever. Exit codes: :mod:`condmsg.runtime.exit_codes`.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from condmsg.cli.options import (
    add_amqp_url,
    add_create_schema,
    add_db_url,
    amqp_url,
    named_db_url,
    stderr_log,
)
from condmsg.cli.queues import require_queue
from condmsg.core import protocol
from condmsg.core.errors import BrokerAuthError, BrokerError, CondmsgError, ConfigError
from condmsg.core.protocol import H_TOKEN
from condmsg.runtime.exit_codes import FAILED, INTERRUPTED, OK, add_command

log = stderr_log("consume")

if TYPE_CHECKING:
    from ackd import Message, Receiver
    from outbox import Relay

#: Longest single wait for a message, so that a stop signal is seen within it (seconds).
READ_SLICE_S = 0.5
#: How long the acks still in the outbox may take to leave at the end (seconds).
DRAIN_S = 30.0


class _Refused(CondmsgError):
    """``--exec`` exited non-zero inside a transaction: roll it back."""


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "consume",
        help="read a queue as a receiver (automatic acks); print messages or pipe them",
        description="Read QUEUE through a condmsg receiver: a READ ack per message, or with "
        "--transactional a COMMIT ack once it is handled. Prints each message as a JSON line, "
        "or pipes its payload to --exec. Stops after --count messages, after --timeout "
        "seconds without one, or on Ctrl-C/SIGTERM.",
    )
    parser.add_argument("queue", metavar="QUEUE", help="the queue to read (must exist)")
    parser.add_argument(
        "--recipient", required=True, metavar="NAME", help="the final recipient identity"
    )
    parser.add_argument(
        "--transactional",
        action="store_true",
        help="read in transactions: a COMMIT ack once each message is handled, not a READ ack",
    )
    parser.add_argument("--count", type=int, metavar="N", help="stop after N messages")
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="stop when no message came for this long (default: wait for ever)",
    )
    parser.add_argument(
        "--exec",
        dest="exec_command",
        metavar="CMD",
        help="run CMD (a shell command) for each message with its payload on standard input",
    )
    parser.add_argument(
        "--invalid-queue",
        metavar="QUEUE",
        default=protocol.INVALID_MESSAGE_QUEUE,
        help="where messages that fail the receiver's checks go (default: %(default)s)",
    )
    add_db_url(parser, "the receiver store")
    add_create_schema(parser, "receiver")
    add_amqp_url(parser)
    parser.set_defaults(handler=run, schema_store="receiver")


def run(args: argparse.Namespace) -> int:
    from ackd import Receiver
    from condmsg.runtime.settings import Settings
    from condmsg.runtime.stopping import StopSignals

    if args.count is not None and args.count < 1:
        raise ConfigError("--count must be at least 1")
    if args.timeout is not None and args.timeout <= 0:
        raise ConfigError("--timeout must be positive")
    db_url = named_db_url(args, existing=not args.create_schema)
    broker = amqp_url(args)
    require_queue(
        broker,
        args.queue,
        "check the name (a sender declares its destination queues when it sends)",
    )
    stopping = StopSignals().install().event
    receiver = Receiver(
        recipient=args.recipient,
        amqp_url=broker,
        db_url=db_url,
        secret=Settings.from_env().secret,
        invalid_queue=args.invalid_queue,
        create_schema=args.create_schema,
    )
    relay = receiver.start_relay()
    try:
        print(
            f"condmsg consume: waiting for messages on {args.queue!r} ({_until(args)})",
            file=sys.stderr,
            flush=True,
        )
        handled, failed = _loop(receiver, args, stopping)
        _drain(relay)
    finally:
        relay.stop()
        receiver.close()
        receiver.engine.dispose()
    if failed:
        return FAILED
    if stopping.is_set():
        return INTERRUPTED
    if args.count is not None and handled < args.count:
        print(
            f"condmsg consume: {handled} of {args.count} messages from {args.queue!r} "
            f"before {args.timeout:g} s passed without one",
            file=sys.stderr,
        )
        return FAILED
    return OK


def _until(args: argparse.Namespace) -> str:
    """When it stops by itself, and how to stop it sooner."""
    ends = []
    if args.count is not None:
        ends.append(f"{args.count} message{'' if args.count == 1 else 's'}")
    if args.timeout is not None:
        ends.append(f"{args.timeout:g} s without one")
    return f"until {' or '.join(ends)}; Ctrl-C to stop" if ends else "Ctrl-C to stop"


def _drain(relay: Relay) -> None:
    """Wait until the acks of the messages read have left; :class:`BrokerError` saying
    where they are if they cannot leave in time (they are not lost: they stay in the
    receiver store's outbox for its next relay)."""
    from outbox import OutboxTimeout

    try:
        relay.drain(DRAIN_S)
    except OutboxTimeout as exc:
        raise BrokerError(
            f"acks not published: {exc}; they stay in the receiver store and leave with its "
            "next relay (condmsg consume or condmsg relay on that store)"
        ) from None


def _loop(receiver: Receiver, args: argparse.Namespace, stop: threading.Event) -> tuple[int, bool]:
    """Read until done; (messages handled, whether ``--exec`` failed).

    An outage of the receiver store or of RabbitMQ pauses reading (the message being read
    goes back to its queue, uncounted) until it answers again, as ``Receiver.consume``
    does; the pause is not idle time for ``--timeout``.
    """
    from ackd.outage import is_store_outage
    from condmsg.runtime.pausing import Pause

    reading = f"reading {args.queue!r}"
    store = Pause(log, reading, "the receiver store", stop=stop)
    broker = Pause(log, reading, "RabbitMQ", stop=stop)
    handled = 0
    idle_since = time.monotonic()
    while not stop.is_set() and (args.count is None or handled < args.count):
        if args.timeout is not None and time.monotonic() - idle_since >= args.timeout:
            break
        shown: list[Message] = []
        try:
            message = _take(receiver, args, shown)
        except _Refused as exc:
            print(f"condmsg consume: {exc}", file=sys.stderr)
            return handled, True
        except BrokerAuthError:
            raise  # a wrong user or vhost: waiting does not mend it
        except Exception as exc:
            pause = broker if isinstance(exc, BrokerError) else store
            if pause is store and not is_store_outage(exc):
                raise
            # A message printed (or run) before the store was lost stands: its commit may
            # have gone through, and then the receiver log drops its redelivery.
            handled += len(shown)
            pause.failed(exc)
            if not pause.wait():
                break
            idle_since = time.monotonic()
            continue
        store.ended()
        broker.ended()
        if message is None:
            continue
        handled += 1
        idle_since = time.monotonic()
        if not args.transactional and args.exec_command is not None:
            code = _run(args.exec_command, message)
            if code != 0:
                print(
                    f"condmsg consume: {args.exec_command!r} exited {code} for message "
                    f"{message.message_id}; it was read (READ ack) and is not redelivered",
                    file=sys.stderr,
                )
                return handled, True
    return handled, False


def _take(receiver: Receiver, args: argparse.Namespace, shown: list[Message]) -> Message | None:
    """One message handled, or None if none came within :data:`READ_SLICE_S`. A message
    is added to ``shown`` once printed or run, before its transaction commits."""
    if not args.transactional:
        message = receiver.read(args.queue, timeout=READ_SLICE_S)
        if message is not None and args.exec_command is None:
            print(json.dumps(describe(message), separators=(",", ":"), default=str), flush=True)
        return message
    with receiver.transaction() as tx:
        message = tx.read(args.queue, timeout=READ_SLICE_S)
        if message is None:
            return None
        if args.exec_command is None:
            print(json.dumps(describe(message), separators=(",", ":"), default=str), flush=True)
            shown.append(message)
            return message
        code = _run(args.exec_command, message)
        if code == 0:
            shown.append(message)
        else:
            # Raised inside the block: the receiver rolls back and gives the message back.
            raise _Refused(
                f"{args.exec_command!r} exited {code} for message {message.message_id}; "
                "rolled back, it will be delivered again"
            )
    return message


def _run(command: str, message: Message) -> int:
    """Run ``command`` with the payload on its standard input; its exit code. Its output
    goes where this command's goes."""
    return subprocess.run(command, shell=True, input=message.body, check=False).returncode


def describe(message: Message) -> dict[str, Any]:
    """A message as a JSON object: the payload as text if it is UTF-8, else base64."""
    out: dict[str, Any] = {
        "cm_id": message.cm_id,
        "kind": message.kind.value if message.kind is not None else None,
        "queue": message.queue,
        "destination": message.destination,
        "sender": message.sender,
        "message_id": message.message_id,
        "content_type": message.content_type,
        "read_at": message.read_at.isoformat(),
        "redelivered": message.redelivered,
    }
    try:
        out["payload"] = message.body.decode("utf-8")
    except UnicodeDecodeError:
        out["payload_base64"] = base64.b64encode(message.body).decode("ascii")
    # The token is this copy's capability to be acknowledged: it stays out of the output
    # (which people paste into tickets), as secrets stay out of logs.
    out["headers"] = {k: v for k, v in message.headers.items() if k != H_TOKEN}
    return out
