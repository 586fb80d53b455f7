"""A receiver process for the end-to-end tests: ``python -m tests.e2e.rx CONFIG_JSON``.

It runs an ``ackd.Receiver`` over its own SQLite store with its own ack relay, reads one
queue until SIGTERM and appends one JSON line per message it got to ``out`` (then a final
``{"stats": ...}`` line). ``mode`` "commit" reads in receiver transactions, "read" reads
non-transactionally. With ``go_file`` it starts reading only once that file exists.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pika

from ackd.receiver import Receiver
from condmsg.runtime.topology import declare_destination


def main(config: dict[str, Any]) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    out = Path(config["out"])
    receiver = Receiver(
        amqp_url=config["amqp_url"],
        db_url=config["db_url"],
        recipient=config["recipient"],
        invalid_queue=config["invalid_queue"],
        create_schema=True,
    )
    relay = receiver.start_relay()
    # The queue may not exist yet (the sender declares it at its first send).
    connection = pika.BlockingConnection(pika.URLParameters(config["amqp_url"]))
    declare_destination(connection, config["queue"])
    connection.close()

    def record(line: dict[str, Any]) -> None:
        with out.open("a") as f:
            f.write(json.dumps(line) + "\n")

    record({"ready": True})
    go = Path(config["go_file"]) if config.get("go_file") else None
    while go is not None and not go.exists() and not stop.is_set():
        stop.wait(0.05)
    mode, queue = config["mode"], config["queue"]
    try:
        while not stop.is_set():
            if mode == "commit":
                with receiver.transaction() as tx:
                    message = tx.read(queue, timeout=0.3)
            else:
                message = receiver.read(queue, timeout=0.3)
            if message is None:
                continue
            record(
                {
                    "cm_id": message.cm_id,
                    "kind": message.kind.value if message.kind else None,
                    "payload": message.body.decode(errors="replace"),
                }
            )
        stats = receiver.stats
        record({"stats": {"cancelled": stats.cancelled, "discards": stats.discards}})
    finally:
        relay.stop()
        receiver.close()
        receiver.engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
