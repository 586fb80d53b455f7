"""The reference receiver of the conformance contract, on condmsg's own ``Receiver``:
``python -m condmsg.conformance.python_receiver`` (docs/conformance.md).

It reads ``CONDMSG_QUEUE`` as ``CONDMSG_RECIPIENT`` in receiver transactions and writes
every message it is handed to the app table in that transaction, until SIGTERM. Its
application reacts to the contract's payloads: ``conformance:fail`` fails every attempt,
``conformance:fail-once`` the first one in this process, and the two crash payloads end
the process (on their first delivery) inside the transaction or just after its commit.

``--defect NAME`` breaks one rule of the protocol on purpose, to show that the harness
catches such a receiver; ``--list-defects`` prints the names, one a line
(:mod:`condmsg.conformance.defects`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from datetime import timedelta
from types import FrameType
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session

from ackd import Message, Receiver
from condmsg.conformance import app_table
from condmsg.conformance.config import (
    CRASH_AFTER_COMMIT,
    CRASH_BEFORE_COMMIT,
    ENV_AMQP_URL,
    ENV_DB_URL,
    ENV_INVALID_QUEUE,
    ENV_MAX_ATTEMPTS,
    ENV_QUEUE,
    ENV_RECIPIENT,
    ENV_RETRY_BACKOFF_MS,
    ENV_SECRET,
    ENV_SEQUENCE_TIMEOUT_MS,
    FAIL_ALWAYS,
    FAIL_ONCE,
)
from condmsg.conformance.defects import DEFECTS, chosen

#: The exit status of a crash the contract asks for.
CRASHED = 3


class App:
    """The application behind the receiver: records what it gets, fails and crashes
    as the contract's payloads ask."""

    def __init__(self, receiver: Receiver, *, fails_once: bool = True) -> None:
        self._receiver = receiver
        self._fails_once = fails_once
        self._failed_once: set[str] = set()

    def handle(self, message: Message, session: Session | None) -> None:
        body = message.body
        if message.kind is not None and not message.redelivered:
            if body == CRASH_BEFORE_COMMIT:
                os._exit(CRASHED)
            if body == CRASH_AFTER_COMMIT and session is not None:
                # After the database commit, before the broker ack: RabbitMQ redelivers it.
                event.listen(session, "after_commit", lambda _s: os._exit(CRASHED), once=True)
        if body == FAIL_ALWAYS:
            raise RuntimeError("the application fails on this message")
        key = message.message_id or ""
        if body == FAIL_ONCE and self._fails_once and key not in self._failed_once:
            self._failed_once.add(key)
            raise RuntimeError("the application fails on this message once")
        row = {
            "kind": message.kind.value if message.kind is not None else "plain",
            "cm_id": message.cm_id,
            "destination": message.destination,
            "message_id": message.message_id,
            "body": body,
        }
        if session is not None:
            session.execute(sa.insert(app_table.received), row)
        else:
            with self._receiver.engine.begin() as conn:
                conn.execute(sa.insert(app_table.received), row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--defect", choices=sorted(DEFECTS), metavar="NAME", help="break this rule on purpose"
    )
    parser.add_argument(
        "--list-defects", action="store_true", help="print the defects' names and exit"
    )
    args = parser.parse_args(argv)
    if args.list_defects:
        print("\n".join(DEFECTS))
        return 0
    env = os.environ
    defect = chosen(args.defect, env[ENV_RECIPIENT])
    if args.defect is not None:
        print(f"receiver: defect {defect.name} is on: it {defect.breaks}", file=sys.stderr)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    backoff = timedelta(milliseconds=int(env[ENV_RETRY_BACKOFF_MS]))
    settings: dict[str, Any] = {
        "amqp_url": env[ENV_AMQP_URL],
        "db_url": env[ENV_DB_URL],
        "secret": env[ENV_SECRET].encode(),
        "invalid_queue": env[ENV_INVALID_QUEUE],
        "max_attempts": int(env[ENV_MAX_ATTEMPTS]),
        "retry_backoff": backoff,
        "retry_backoff_max": backoff * 4,
        "sequence_timeout": timedelta(milliseconds=int(env[ENV_SEQUENCE_TIMEOUT_MS])),
    }
    receiver = Receiver(recipient=env[ENV_RECIPIENT], **(settings | dict(defect.settings)))
    app = App(receiver, fails_once=defect.fails_once)
    transactional = not defect.read_mode
    try:
        receiver.consume(env[ENV_QUEUE], app.handle, transactional=transactional, stop=stop)
    finally:
        receiver.close()
        receiver.engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
