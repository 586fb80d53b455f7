"""The cancel-out race between two competing transactional consumers, each of its endings
made to happen by construction (DESIGN invariant 3).

The receiver log decides by whichever of a CM's original and its compensation claims the
log row first; the app must end up with the original and then the compensation, or with
neither. Left to chance, which ending a trial reaches depends on the machine's load (a
busy machine queues every pair before any consumer polls, and every compensation then
overtakes its original), so the driver below steers each trial to one ending and checks the
app saw exactly that:

- ``COMMIT``: a consumer holds the original in its open transaction while the other
  consumer takes the compensation (it must wait for the original's decision); the first
  commits, so the app gets both, in order.
- ``ROLLBACK``: the same, but the first rolls back; the waiting compensation then cancels
  the CM and the original, delivered again, is discarded: the app gets neither. The
  consumer that rolled back stays away until the compensation's cancellation is committed,
  so the original it hands back cannot reach the log first.
- ``OVERTAKEN``: the compensation is published, and cancels the CM, before its original is
  published at all; the original is discarded: neither.

Shared by the classic-queue test and the quorum-queue one of the cluster tests.
"""

from __future__ import annotations

import queue as queues
import threading
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from ackd.tables import rlog
from condmsg.core.protocol import MessageKind
from tests.waiting import wait_for

from .condmsg_helpers import publish_compensation, publish_original

COMMIT, ROLLBACK, OVERTAKEN = "commit", "rollback", "overtaken"
#: What the app sees of a trial that ends in each way.
STORIES = {
    COMMIT: ["original", "compensation"],
    ROLLBACK: [],
    OVERTAKEN: [],
}
#: How long a consumer holding an original waits for the driver's word (seconds).
HOLD_S = 60.0
SENDER = "s"


def send_compensation(channel: Any, queue: str, cm_id: str) -> None:
    publish_compensation(
        channel, queue=queue, cm_id=cm_id, destination=queue, sender=SENDER, body=b"undo"
    )


class _Rollback(Exception):
    """Raised inside a consumer's transaction to roll it back."""


class _Consumers:
    """Two (or more) competing transactional consumers of ``queue`` in threads.

    A consumer that reads an original hands ``(cm_id, word)`` to the driver through
    ``held`` and keeps its transaction open until the driver puts its word (COMMIT or
    ROLLBACK) on ``word``; after a rollback it waits for a second word before reading again.
    """

    def __init__(self, receivers: Sequence[Any], queue: str) -> None:
        self.queue = queue
        self.held: queues.Queue[tuple[str, queues.Queue[str]]] = queues.Queue()
        self.seen: dict[str, list[str]] = defaultdict(list)
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._polling = [threading.Event() for _ in receivers]
        self._threads = [
            threading.Thread(target=self._consume, args=(r, p), daemon=True)
            for r, p in zip(receivers, self._polling, strict=True)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        wait_for(lambda: all(p.is_set() for p in self._polling), 60, "both consumers polling")

    def stop(self) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join(10)

    def _consume(self, receiver: Any, polling: threading.Event) -> None:
        try:
            while not self._done.is_set():
                try:
                    self._one_transaction(receiver, polling)
                except _Rollback as rolled_back:
                    word: queues.Queue[str] = rolled_back.args[0]
                    word.get(timeout=HOLD_S)  # away until the CM is cancelled
        except BaseException as exc:
            self.errors.append(exc)

    def _one_transaction(self, receiver: Any, polling: threading.Event) -> None:
        with receiver.transaction() as tx:
            message = tx.read(self.queue, timeout=0.2)
            polling.set()
            if message is None:
                return
            if message.kind is MessageKind.ORIGINAL:
                word: queues.Queue[str] = queues.Queue()
                self.held.put((str(message.cm_id), word))
                if word.get(timeout=HOLD_S) == ROLLBACK:
                    raise _Rollback(word)
            with self._lock:
                self.seen[str(message.cm_id)].append(message.kind.value)


def _row(engine: sa.Engine, cm_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.select(rlog).where(rlog.c.cm_id == cm_id)).one_or_none()


def _state(engine: sa.Engine, cm_id: str) -> str | None:
    row = _row(engine, cm_id)
    return None if row is None else str(row.state)


def _settled(engine: sa.Engine, cm_id: str) -> bool:
    """The trial's end is committed in the receiver log: consumed and compensated, or
    cancelled and its original discarded."""
    row = _row(engine, cm_id)
    return row is not None and (
        (row.state == "consumed" and row.compensated_at is not None)
        or (row.state == "cancelled" and row.discarded_at is not None)
    )


def _ready(channel: Any, queue: str) -> int:
    """Messages of ``queue`` waiting for a consumer (not those a consumer holds)."""
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def _held_original(consumers: _Consumers, cm_id: str) -> queues.Queue[str]:
    held, word = consumers.held.get(timeout=HOLD_S)
    assert held == cm_id, f"a consumer holds the original of {held}, not of {cm_id}"
    return word


def _trial(consumers: _Consumers, channel: Any, engine: sa.Engine, ending: str) -> str:
    cm_id = str(uuid.uuid4())
    queue = consumers.queue
    if ending == OVERTAKEN:
        send_compensation(channel, queue, cm_id)
        wait_for(lambda: _state(engine, cm_id) == "cancelled", 30, f"the cancellation of {cm_id}")
        publish_original(channel, queue, cm_id)
        wait_for(lambda: _settled(engine, cm_id), 30, f"the discarded original of {cm_id}")
        return cm_id
    publish_original(channel, queue, cm_id)
    word = _held_original(consumers, cm_id)
    send_compensation(channel, queue, cm_id)
    # The other consumer has taken the compensation while the original's transaction is
    # still open: the race the receiver log must decide.
    wait_for(lambda: _ready(channel, queue) == 0, 30, f"the other consumer taking {cm_id}'s undo")
    word.put(ending)
    if ending == ROLLBACK:
        # The consumer that rolled back stays away until the compensation has cancelled
        # the CM; the receiver hands the original back to the queue from that consumer's
        # thread, after a backoff, once it is back.
        wait_for(lambda: _state(engine, cm_id) == "cancelled", 30, f"the cancellation of {cm_id}")
        word.put("resume")
    wait_for(lambda: _settled(engine, cm_id), 30, f"the end of {cm_id} in the receiver log")
    return cm_id


def run_cancel_out_race(
    receivers: Sequence[Any], queue: str, channel: Any, *, rounds: int = 10
) -> dict[str, int]:
    """``rounds`` trials of each ending, interleaved, with ``receivers`` competing for
    ``queue`` and ``channel`` publishing; asserts each trial's story and returns how many
    trials ended each way (``both`` and ``neither``)."""
    consumers = _Consumers(receivers, queue)
    engine = receivers[0].engine
    planned: list[tuple[str, str]] = []
    consumers.start()
    try:
        for _ in range(rounds):
            for ending in (COMMIT, ROLLBACK, OVERTAKEN):
                planned.append((ending, _trial(consumers, channel, engine, ending)))
                assert not consumers.errors, consumers.errors
    finally:
        consumers.stop()
    assert not consumers.errors, consumers.errors
    assert consumers.held.empty(), "an original reached the app after its trial ended"
    endings: dict[str, int] = defaultdict(int)
    for ending, cm_id in planned:
        story = consumers.seen.get(cm_id, [])
        assert story == STORIES[ending], (ending, cm_id, story)
        endings["both" if story else "neither"] += 1
    return dict(endings)
