"""The scenarios of ``condmsg conformance``: each drives the receiver under test through
one situation of the protocol and checks what its application got (the app table), what
its acks made the evaluator decide, and what it moved to its invalid-message queue.

A scenario returns a short note of what it saw, or raises :class:`NotMet`. The scenarios
in :data:`CONCURRENT` touch only their own CMs and run side by side; those in
:data:`SERIAL` kill and start the receiver, so they run alone, after the others.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from condmsg import Destination, DestinationSet, Verdict
from condmsg.conformance.config import (
    CRASH_AFTER_COMMIT,
    CRASH_BEFORE_COMMIT,
    FAIL_ALWAYS,
    FAIL_ONCE,
    MAX_ATTEMPTS,
    RETRY_BACKOFF_MS,
    SEQUENCE_TIMEOUT_MS,
)
from condmsg.conformance.world import PART_BYTES, NotMet, World, wait_for
from condmsg.core import protocol
from condmsg.core.protocol import MessageKind
from condmsg.sending.copies import notice_message
from outbox.message import OutboxMessage

Scenario = Callable[[World], str]

#: Seconds within which the app should have a message once it is queued (scaled).
DELIVERY_S = 15.0
#: Seconds within which the evaluator should decide a CM whose deadlines are short.
DECISION_S = 20.0
FORGED_SECRET = b"not-the-deployment-secret"


def _seconds(w: World, value: float) -> timedelta:
    return timedelta(seconds=w.scaled(value))


def _expect_kinds(w: World, cm_id: str, kinds: list[str], what: str) -> None:
    wait_for(lambda: w.kinds(cm_id) == sorted(kinds), w.scaled(DELIVERY_S), what)


def _expect_only(w: World, cm_id: str, kinds: list[str]) -> None:
    """After the queue has settled, the app holds exactly ``kinds`` for ``cm_id``."""
    w.settle()
    got = w.kinds(cm_id)
    if got != sorted(kinds):
        raise NotMet(f"the app got {got or 'nothing'} for the CM, expected {sorted(kinds)}")


def _expect_verdict(w: World, cm_id: str, verdict: Verdict, why: str) -> None:
    got = w.outcome(cm_id, DECISION_S)
    if got is not verdict:
        raise NotMet(f"the evaluator decided {got or 'nothing'}, expected {verdict}: {why}")


def _expect_refused(w: World, cm_id: str, what: str, kinds: list[str] | None = None) -> str:
    """``what`` reaches the invalid-message queue with a reason; the app then holds
    ``kinds`` (nothing by default) for the CM."""
    found = wait_for(
        lambda: w.invalid_of(cm_id), w.scaled(DELIVERY_S), f"{what} in the invalid-message queue"
    )
    if not found[0].reason:
        raise NotMet(f"{what} reached the invalid-message queue without {protocol.H_REASON}")
    _expect_only(w, cm_id, kinds or [])
    return f"refused: {found[0].reason[:60]}"


def _notice(
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


def _without(message: OutboxMessage, header: str) -> OutboxMessage:
    headers = {k: v for k, v in (message.headers or {}).items() if k != header}
    return replace(message, headers=headers)


def _with_header(message: OutboxMessage, header: str, value: str) -> OutboxMessage:
    return replace(message, headers={**(message.headers or {}), header: value})


def _direct_original(w: World, body: bytes) -> tuple[str, list[OutboxMessage]]:
    cm_id = str(uuid.uuid4())
    condition = Destination(w.config.queue, pickup_within=_seconds(w, 60))
    return cm_id, w.copies(cm_id, condition, body)


# -- originals, duplicates, redeliveries -------------------------------------------------


def plain_message(w: World) -> str:
    marker = f"plain-{uuid.uuid4().hex}"
    w.publish_plain(b"a plain message", message_id=marker)
    found = wait_for(
        lambda: [r for r in w.received(kind="plain") if r.message_id == marker],
        w.scaled(DELIVERY_S),
        "the plain message to reach the app",
    )
    if found[0].body != b"a plain message":
        raise NotMet(f"the app got the plain body {found[0].body[:40]!r}")
    return "delivered as it came, no ack"


def original(w: World) -> str:
    body = "an original, non-ASCII: ünïcødé".encode()
    cm_id = w.send(body, Destination(w.config.queue, process_within=_seconds(w, 15)))
    _expect_kinds(w, cm_id, ["original"], "the original to reach the app")
    if w.received(cm_id=cm_id)[0].body != body:
        raise NotMet("the app got another body than the one sent")
    _expect_verdict(w, cm_id, Verdict.SATISFIED, "its COMMIT ack should satisfy process_within")
    return "delivered once, COMMIT ack counted"


def named_recipient(w: World) -> str:
    q, me = w.config.queue, w.config.recipient
    cm_id = w.send(b"for me", Destination(q, recipient=me, process_within=_seconds(w, 15)))
    _expect_kinds(w, cm_id, ["original"], "the copy naming this recipient to reach the app")
    _expect_verdict(w, cm_id, Verdict.SATISFIED, "its ack should carry this recipient")
    return "ack carries the recipient, token verified with it"


def wrong_recipient(w: World) -> str:
    q, other = w.config.queue, f"{w.config.recipient}-someone-else"
    condition = Destination(q, recipient=other, pickup_within=_seconds(w, 2))
    cm_id = w.send(b"for someone else", condition)
    _expect_verdict(w, cm_id, Verdict.VIOLATED, "no ack of another identity may count")
    return f"not counted for {other!r}; app got {w.kinds(cm_id) or 'nothing'}"


def duplicates(w: World) -> str:
    cm_id, messages = _direct_original(w, b"sent twice")
    for message in messages + messages:
        w.publish(message)
    _expect_kinds(w, cm_id, ["original"], "the original to reach the app")
    _expect_only(w, cm_id, ["original"])
    return "two copies with one message id: delivered once"


def redelivery_after_commit(w: World) -> str:
    cm_id, messages = _direct_original(w, b"redelivered")
    for message in messages:
        w.publish(message)
    _expect_kinds(w, cm_id, ["original"], "the original to reach the app")
    for message in messages:  # as RabbitMQ redelivers after a lost broker ack
        w.publish(message)
    _expect_only(w, cm_id, ["original"])
    return "the same copy after the commit: dropped"


# -- compensations and success notices ---------------------------------------------------


def compensation_after_original(w: World) -> str:
    q = w.config.queue
    condition = DestinationSet(
        Destination(q, pickup_within=_seconds(w, 3)),
        Destination(w.void_queue, pickup_within=_seconds(w, 3)),
    )
    cm_id = w.send(b"undone later", condition, compensation=b"undo it")
    _expect_kinds(w, cm_id, ["original"], "the original to reach the app")
    _expect_verdict(w, cm_id, Verdict.VIOLATED, "nobody reads the second destination")
    _expect_kinds(w, cm_id, ["compensation", "original"], "the compensation to reach the app")
    comp = next(r for r in w.received(cm_id=cm_id) if r.kind == "compensation")
    if comp.body != b"undo it":
        raise NotMet(f"the app got the compensation body {comp.body[:40]!r}")
    w.publish(_notice(w, MessageKind.COMPENSATION, cm_id, b"undo it"))  # a duplicate
    _expect_only(w, cm_id, ["compensation", "original"])
    return "delivered once after the original (duplicate dropped)"


def compensation_before_original(w: World) -> str:
    cm_id, messages = _direct_original(w, b"overtaken")
    w.publish(_notice(w, MessageKind.COMPENSATION, cm_id, b"undo"))
    w.settle(0.0)  # the compensation is judged before the original arrives
    for message in messages:
        w.publish(message)
    _expect_only(w, cm_id, [])
    if w.invalid_of(cm_id):
        raise NotMet("a cancelled original must be dropped, not moved to the invalid queue")
    return "both cancelled out, the app got neither"


def success_notice(w: World) -> str:
    body = b"the condition will hold"
    condition = Destination(w.config.queue, process_within=_seconds(w, 15))
    cm_id = w.send(body, condition, notify_success=True)
    _expect_verdict(w, cm_id, Verdict.SATISFIED, "its COMMIT ack should satisfy it")
    _expect_kinds(w, cm_id, ["original", "success"], "the success notice to reach the app")
    w.publish(_notice(w, MessageKind.SUCCESS, cm_id, b'{"cm_id": "x"}'))  # a duplicate
    _expect_only(w, cm_id, ["original", "success"])
    return "delivered once (duplicate dropped)"


# -- tokens ------------------------------------------------------------------------------


def forged_copy(w: World) -> str:
    cm_id = str(uuid.uuid4())
    condition = Destination(w.config.queue, pickup_within=_seconds(w, 60))
    genuine = w.copies(cm_id, condition, b"forged")
    forged = protocol.copy_token(FORGED_SECRET, cm_id, w.config.queue, None)
    for message in genuine:
        w.publish(_with_header(message, protocol.H_TOKEN, forged))
    return _expect_refused(w, cm_id, "the forged copy")


def unsigned_copy(w: World) -> str:
    cm_id, messages = _direct_original(w, b"unsigned")
    for message in messages:
        w.publish(_without(message, protocol.H_TOKEN))
    return _expect_refused(w, cm_id, "the unsigned copy")


def _consumed_original(w: World, body: bytes) -> str:
    cm_id, messages = _direct_original(w, body)
    for message in messages:
        w.publish(message)
    _expect_kinds(w, cm_id, ["original"], "the original to reach the app")
    return cm_id


def forged_compensation(w: World) -> str:
    cm_id = _consumed_original(w, b"then a forged compensation")
    w.publish(_notice(w, MessageKind.COMPENSATION, cm_id, b"undo", secret=FORGED_SECRET))
    return _expect_refused(w, cm_id, "the forged compensation", ["original"])


def unsigned_compensation(w: World) -> str:
    cm_id = _consumed_original(w, b"then an unsigned compensation")
    w.publish(_without(_notice(w, MessageKind.COMPENSATION, cm_id, b"undo"), protocol.H_TOKEN))
    return _expect_refused(w, cm_id, "the unsigned compensation", ["original"])


def kind_swapped_token(w: World) -> str:
    """A success notice's genuine token on a compensation with the same body."""
    cm_id = _consumed_original(w, b"then a notice dressed as a compensation")
    body = b"same body"
    notice = _notice(w, MessageKind.SUCCESS, cm_id, body)
    compensation = _notice(w, MessageKind.COMPENSATION, cm_id, body)
    assert notice.headers is not None
    token = str(notice.headers[protocol.H_TOKEN])
    w.publish(_with_header(compensation, protocol.H_TOKEN, token))
    return _expect_refused(w, cm_id, "the compensation carrying a notice's token", ["original"])


def undecodable_payload(w: World) -> str:
    cm_id = str(uuid.uuid4())
    condition = Destination(w.config.queue, pickup_within=_seconds(w, 60))
    for message in w.copies(cm_id, condition, b'{"not": json', "application/json"):
        w.publish(message)
    return _expect_refused(w, cm_id, "the copy whose JSON payload does not decode")


# -- sequences ---------------------------------------------------------------------------


def sequence_complete(w: World) -> str:
    body = bytes(range(256)) * (PART_BYTES * 5 // 256) + b"tail"
    cm_id = w.send(body, Destination(w.config.queue, process_within=_seconds(w, 20)))
    _expect_kinds(w, cm_id, ["original"], "the reassembled sequence to reach the app")
    got = w.received(cm_id=cm_id)[0].body
    if got != body:
        raise NotMet(f"the app got {len(got)} bytes, {len(body)} were sent")
    _expect_verdict(w, cm_id, Verdict.SATISFIED, "one COMMIT ack for the whole copy")
    return f"{len(body)} bytes in {-(-len(body) // PART_BYTES)} parts, delivered once"


def _sequence(w: World) -> tuple[str, list[OutboxMessage]]:
    cm_id, parts = _direct_original(w, b"p" * (PART_BYTES * 3))
    if len(parts) < 3:
        raise AssertionError("a sequence scenario needs at least three parts")
    return cm_id, parts


def sequence_bad_part(w: World) -> str:
    cm_id, parts = _sequence(w)
    forged = protocol.copy_token(FORGED_SECRET, cm_id, w.config.queue, None)
    parts[1] = _with_header(parts[1], protocol.H_TOKEN, forged)
    for part in parts:
        w.publish(part)
    wait_for(lambda: w.invalid_of(cm_id), w.scaled(DELIVERY_S), "the bad part in the invalid queue")
    wait_for(
        lambda: len(w.invalid_of(cm_id)) >= len(parts),
        w.scaled(DELIVERY_S) + SEQUENCE_TIMEOUT_MS / 1000,
        "the other parts in the invalid queue once the sequence timed out",
    )
    _expect_only(w, cm_id, [])
    return "the bad part refused, the incomplete rest timed out; the app got nothing"


def sequence_timed_out(w: World) -> str:
    cm_id, parts = _sequence(w)
    for part in parts[:-1]:
        w.publish(part)
    wait_for(
        lambda: len(w.invalid_of(cm_id)) == len(parts) - 1,
        w.scaled(DELIVERY_S) + SEQUENCE_TIMEOUT_MS / 1000,
        f"the {len(parts) - 1} parts sent in the invalid queue after the sequence timeout",
    )
    _expect_only(w, cm_id, [])
    return f"{len(parts) - 1} parts moved to the invalid queue, the app got nothing"


# -- failures in the application ---------------------------------------------------------


def poison_message(w: World) -> str:
    cm_id = w.send(FAIL_ALWAYS, Destination(w.config.queue, pickup_within=_seconds(w, 60)))
    bound = MAX_ATTEMPTS * (2**MAX_ATTEMPTS) * RETRY_BACKOFF_MS / 1000
    found = wait_for(
        lambda: w.invalid_of(cm_id),
        w.scaled(DELIVERY_S) + bound,
        f"the message failing every attempt in the invalid queue after {MAX_ATTEMPTS} attempts",
    )
    _expect_only(w, cm_id, [])
    return f"moved after its attempts: {found[0].reason[:50]}"


def poison_retry(w: World) -> str:
    cm_id = w.send(FAIL_ONCE, Destination(w.config.queue, process_within=_seconds(w, 20)))
    _expect_kinds(w, cm_id, ["original"], "the message failing once to reach the app")
    _expect_only(w, cm_id, ["original"])
    _expect_verdict(w, cm_id, Verdict.SATISFIED, "the retry commits")
    return "rolled back once, delivered on the retry"


# -- topics and spheres ------------------------------------------------------------------


def topic_subscriber(w: World) -> str:
    key = f"conformance.{uuid.uuid4().hex[:8]}"
    w.bind_topic(key)
    try:
        condition = Destination(
            "conformance-topic",
            exchange="amq.topic",
            routing_key=key,
            process_within=_seconds(w, 15),
            min_process=1,
        )
        cm_id = w.send(b"to the subscribers", condition)
        _expect_kinds(w, cm_id, ["original"], "the topic copy to reach the app")
        _expect_verdict(w, cm_id, Verdict.SATISFIED, "its ack names this subscriber")
    finally:
        w.unbind_topic(key)
    return "counted as one subscriber"


def sphere_member(w: World) -> str:
    q = w.config.queue
    with w.sphere(timeout=w.scaled(30)) as sphere:
        member = sphere.send(
            b"a sphere member", Destination(q, pickup_within=_seconds(w, 30)), compensation=b"u"
        )
        sphere.send(b"unread", Destination(w.void_queue, pickup_within=_seconds(w, 3)))
    _expect_kinds(w, member, ["original"], "the sphere member to reach the app")
    verdict = w.sphere_verdict(sphere.sphere_id, DECISION_S)
    if verdict is not Verdict.VIOLATED:
        raise NotMet(f"the sphere was decided {verdict}, expected violated")
    _expect_kinds(w, member, ["compensation", "original"], "the member's compensation")
    return "member delivered, compensated when its sphere failed"


# -- crashes -----------------------------------------------------------------------------


def _crash(w: World, payload: bytes, when: str) -> str:
    cm_id = w.send(payload, Destination(w.config.queue, process_within=_seconds(w, 60)))
    code = w.wait_receiver_exit(DELIVERY_S)
    w.start_receiver()
    _expect_kinds(w, cm_id, ["original"], "the original once the receiver is back")
    _expect_only(w, cm_id, ["original"])
    _expect_verdict(w, cm_id, Verdict.SATISFIED, "its COMMIT ack must not be lost")
    return f"exited {code} {when}; after the restart delivered once"


def crash_before_commit(w: World) -> str:
    return _crash(w, CRASH_BEFORE_COMMIT, "inside the transaction")


def crash_after_commit(w: World) -> str:
    return _crash(w, CRASH_AFTER_COMMIT, "between the commit and the broker ack")


def acks_well_formed(w: World) -> str:
    """Run last: no ack of the whole run was refused by the evaluator as malformed."""
    w.settle()
    dead = w.dead_acks()
    if dead:
        raise NotMet(f"{len(dead)} acks dead-lettered by the evaluator, e.g.: {dead[0].reason}")
    return "the evaluator refused none of the receiver's acks"


CONCURRENT: dict[str, Scenario] = {
    "plain-message": plain_message,
    "original": original,
    "named-recipient": named_recipient,
    "wrong-recipient": wrong_recipient,
    "duplicates": duplicates,
    "redelivery-after-commit": redelivery_after_commit,
    "compensation-after-original": compensation_after_original,
    "compensation-before-original": compensation_before_original,
    "success-notice": success_notice,
    "forged-copy": forged_copy,
    "unsigned-copy": unsigned_copy,
    "forged-compensation": forged_compensation,
    "unsigned-compensation": unsigned_compensation,
    "kind-swapped-token": kind_swapped_token,
    "undecodable-payload": undecodable_payload,
    "sequence-complete": sequence_complete,
    "sequence-bad-part": sequence_bad_part,
    "sequence-timed-out": sequence_timed_out,
    "poison-message": poison_message,
    "poison-retry": poison_retry,
    "topic-subscriber": topic_subscriber,
    "sphere-member": sphere_member,
}
SERIAL: dict[str, Scenario] = {
    "crash-before-commit": crash_before_commit,
    "crash-after-commit": crash_after_commit,
    "acks-well-formed": acks_well_formed,
}
ALL = {**CONCURRENT, **SERIAL}
