"""What the scenarios of ``condmsg conformance`` expect, and the messages they build: each
expectation waits for what the receiver under test should do within a deadline (scaled)
and raises :class:`NotMet` saying what it saw instead."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from condmsg import Destination, Verdict
from condmsg.conformance import acks
from condmsg.conformance.world import ORIGINAL_QUEUE, Invalid, NotMet, World
from condmsg.core import protocol
from condmsg.core.protocol import MessageKind
from condmsg.sending.copies import notice_message
from outbox.message import OutboxMessage

#: Seconds within which the app should have a message once it is queued (scaled).
DELIVERY_S = 15.0
#: Seconds within which the evaluator should decide a CM whose deadlines are short.
DECISION_S = 20.0
FORGED_SECRET = b"not-the-deployment-secret"


def seconds(w: World, value: float) -> timedelta:
    return timedelta(seconds=w.scaled(value))


def expect_kinds(w: World, cm_id: str, kinds: list[str], what: str) -> None:
    w.wait_for(lambda: w.kinds(cm_id) == sorted(kinds), w.scaled(DELIVERY_S), what)


def expect_only(w: World, cm_id: str, kinds: list[str]) -> None:
    """After the queue has settled, the app holds exactly ``kinds`` for ``cm_id``."""
    w.settle()
    got = w.kinds(cm_id)
    if got != sorted(kinds):
        raise NotMet(f"the app got {got or 'nothing'} for the CM, expected {sorted(kinds)}")


def expect_verdict(w: World, cm_id: str, verdict: Verdict, why: str) -> None:
    got = w.outcome(cm_id, DECISION_S)
    if got is not verdict:
        raise NotMet(f"the evaluator decided {got or 'nothing'}, expected {verdict}: {why}")


def expect_acks(w: World, cm_id: str, count: int, what: str) -> None:
    """Once every ack the receiver committed so far has reached the evaluator, it holds
    exactly ``count`` acks for ``cm_id`` (``what``: why that many)."""
    acks.flush(w)
    got = len(acks.ack_ids(w, [cm_id])[cm_id])
    if got != count:
        raise NotMet(f"the receiver sent {got} acks for the CM, expected {count}: {what}")


def expect_moved(w: World, found: Invalid, what: str) -> None:
    """``found``, a delivery moved to the invalid-message queue, says why and whence."""
    if not found.reason:
        raise NotMet(f"{what} reached the invalid-message queue without {protocol.H_REASON}")
    if found.original_queue != w.config.queue:
        raise NotMet(
            f"{what} reached the invalid-message queue with {ORIGINAL_QUEUE} "
            f"{found.original_queue!r}, expected {w.config.queue!r}"
        )


def expect_refused(w: World, cm_id: str, what: str, kinds: list[str] | None = None) -> str:
    """``what`` reaches the invalid-message queue with a reason and the queue it came
    from; the app then holds ``kinds`` (nothing by default) for the CM."""
    expected = sorted(kinds or [])

    def moved() -> list[Invalid]:
        got = w.kinds(cm_id)
        if len(got) > len(expected):  # the refused message was handed over: no need to wait
            raise NotMet(f"the app got {what}: it holds {got} for the CM, expected {expected}")
        return w.invalid_of(cm_id)

    found = w.wait_for(moved, w.scaled(DELIVERY_S), f"{what} in the invalid-message queue")
    expect_moved(w, found[0], what)
    expect_only(w, cm_id, kinds or [])
    return f"refused: {found[0].reason[:60]}"


def notice(
    w: World, kind: MessageKind, cm_id: str, body: bytes, *, secret: bytes | None = None
) -> OutboxMessage:
    q = w.config.queue
    return notice_message(
        kind=kind,
        cm_id=cm_id,
        destination=q,
        recipient=None,
        sender=w.sender_name,
        sent_at=datetime.now(UTC),
        exchange="",
        routing_key=q,
        body=body,
        content_type="application/octet-stream",
        secret=w.secret if secret is None else secret,
    )


def without(message: OutboxMessage, header: str) -> OutboxMessage:
    headers = {k: v for k, v in (message.headers or {}).items() if k != header}
    return replace(message, headers=headers)


def with_header(message: OutboxMessage, header: str, value: str) -> OutboxMessage:
    return replace(message, headers={**(message.headers or {}), header: value})


def direct_original(w: World, body: bytes) -> tuple[str, list[OutboxMessage]]:
    cm_id = str(uuid.uuid4())
    condition = Destination(w.config.queue, pickup_within=seconds(w, 60))
    return cm_id, w.copies(cm_id, condition, body)


def consumed_original(w: World, body: bytes) -> str:
    cm_id, messages = direct_original(w, body)
    for message in messages:
        w.publish(message)
    expect_kinds(w, cm_id, ["original"], "the original to reach the app")
    return cm_id
