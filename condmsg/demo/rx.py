"""A receiver process of ``make demo``: ``python -m condmsg.demo.rx CONFIG_JSON``.

It is an application on top of ``ackd.Receiver``: one recipient reading one queue, with its
store and outbox relay taken from the environment (``CONDMSG_DB_URL``, ``CONDMSG_AMQP_URL``,
``CONDMSG_SECRET``). The demo drives it through stdin and listens to it on stdout, one JSON
document a line each way.

Commands (stdin)::

    {"op": "mode", "active": true, "transactional": true, "hold_s": 0.0, "announce": false,
     "seq": 1}
    {"op": "quit"}                      (end of input does the same)

While active it reads its queue; ``transactional`` reads happen in a receiver transaction
(COMMIT ack) that stays open ``hold_s`` seconds for an original (the app "processing" it),
otherwise it reads without one (READ ack). Events (stdout)::

    {"event": "ready"}
    {"event": "mode", "seq": 1}   the mode command ``seq`` is in force
    {"event": "taken", ...}   a transactional read that will be held open (if announced)
    {"event": "got", "kind", "cm_id", "payload", "read_at", "committed_at", "transactional"}
    {"event": "stats", "cancelled", "discards", ...}   whenever a counter changes
"""

from __future__ import annotations

import json
import queue
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any

from ackd.message import Message
from ackd.receiver import Receiver
from condmsg.core.protocol import MessageKind, format_instant
from condmsg.core.timeutil import utcnow
from condmsg.runtime.stopping import StopSignals


@dataclass(slots=True)
class Mode:
    active: bool = False
    transactional: bool = True
    hold_s: float = 0.0
    #: Say so (a "taken" event) when a transaction is held open.
    announce: bool = False


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def _commands(inbox: queue.Queue[dict[str, Any]]) -> None:
    for line in sys.stdin:
        if line.strip():
            inbox.put(json.loads(line))
    inbox.put({"op": "quit"})


class App:
    """The demo's application: reads by the current mode and reports what it got."""

    def __init__(self, receiver: Receiver, queue_name: str, stop: threading.Event) -> None:
        self.receiver = receiver
        self.queue = queue_name
        self.stop = stop
        self.mode = Mode()
        self._stats: dict[str, int] = {}

    def apply(self, command: dict[str, Any]) -> None:
        if command["op"] == "quit":
            self.stop.set()
        elif command["op"] == "mode":
            self.mode = Mode(
                active=bool(command["active"]),
                transactional=bool(command.get("transactional", True)),
                hold_s=float(command.get("hold_s", 0.0)),
                announce=bool(command.get("announce", False)),
            )
            # Between reads, so a pause is in force once the demo sees this.
            emit("mode", seq=command.get("seq"))

    def step(self) -> None:
        """One read (up to 0.1 s); holds a transaction open when the mode says so."""
        if self.mode.transactional:
            with self.receiver.transaction() as tx:
                message = tx.read(self.queue, timeout=0.1)
                held = message is not None and message.kind is MessageKind.ORIGINAL
                if message is not None and held and self.mode.hold_s > 0:
                    if self.mode.announce:
                        emit("taken", **_describe(message))
                    self.stop.wait(self.mode.hold_s)
            committed_at = utcnow() if message is not None else None
        else:
            message = self.receiver.read(self.queue, timeout=0.1)
            committed_at = None
        if message is not None:
            emit(
                "got",
                **_describe(message),
                committed_at=format_instant(committed_at) if committed_at else None,
                transactional=self.mode.transactional,
            )
        self._report_stats()

    def _report_stats(self) -> None:
        stats = asdict(self.receiver.stats)
        if stats != self._stats:
            self._stats = stats
            emit("stats", **stats)


def _describe(message: Message) -> dict[str, Any]:
    return {
        "kind": message.kind.value if message.kind else None,
        "cm_id": message.cm_id,
        "payload": message.body.decode(errors="replace"),
        "read_at": format_instant(message.read_at),
    }


def main(config: dict[str, Any]) -> int:
    stop = StopSignals().install().event
    receiver = Receiver.from_env(
        recipient=config["recipient"], invalid_queue=config["invalid"], create_schema=True
    )
    relay = receiver.start_relay()
    inbox: queue.Queue[dict[str, Any]] = queue.Queue()
    threading.Thread(target=_commands, args=(inbox,), daemon=True).start()
    app = App(receiver, config["queue"], stop)
    try:
        emit("ready")
        while not stop.is_set():
            try:
                # Inactive: wait for a command (a while, so that SIGTERM is seen); active:
                # take one if there is one, else read.
                app.apply(inbox.get(timeout=0.2) if not app.mode.active else inbox.get_nowait())
                continue
            except queue.Empty:
                pass
            if app.mode.active:
                app.step()
    finally:
        relay.stop()
        receiver.close()
        receiver.engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
