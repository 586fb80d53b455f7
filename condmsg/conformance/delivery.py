"""Scenarios of ``condmsg conformance`` that the receiver under test should deliver:
originals, duplicates and redeliveries, compensations and notices, recipients, topics,
spheres, and crashes around its commit."""

from __future__ import annotations

import os
import uuid

from condmsg import Destination, DestinationSet, Verdict
from condmsg.conformance import acks
from condmsg.conformance.config import (
    CRASH_AFTER_COMMIT,
    CRASH_BEFORE_COMMIT,
)
from condmsg.conformance.expect import (
    DECISION_S,
    DELIVERY_S,
    direct_original,
    expect_acks,
    expect_kinds,
    expect_only,
    expect_verdict,
    notice,
    seconds,
)
from condmsg.conformance.world import NotMet, World
from condmsg.core.protocol import MessageKind

# -- originals, duplicates, redeliveries -------------------------------------------------


def plain_message(w: World) -> str:
    marker = f"plain-{uuid.uuid4().hex}"
    w.publish_plain(b"a plain message", message_id=marker)
    found = w.wait_for(
        lambda: [r for r in w.received(kind="plain") if r.message_id == marker],
        w.scaled(DELIVERY_S),
        "the plain message to reach the app",
    )
    if found[0].body != b"a plain message":
        raise NotMet(f"the app got the plain body {found[0].body[:40]!r}")
    return "delivered as it came, no ack"


def original(w: World) -> str:
    body = "an original, non-ASCII: ünïcødé".encode()
    cm_id = w.send(body, Destination(w.config.queue, process_within=seconds(w, 15)))
    expect_kinds(w, cm_id, ["original"], "the original to reach the app")
    if w.received(cm_id=cm_id)[0].body != body:
        raise NotMet("the app got another body than the one sent")
    expect_verdict(w, cm_id, Verdict.SATISFIED, "its COMMIT ack should satisfy process_within")
    return "delivered once, COMMIT ack counted"


def trace_context(w: World) -> str:
    """A copy carrying a W3C trace context (protocol.md, *Trace context*): its ack carries
    a context of the same trace (the receiver's own span's, or the copy's passed on)."""
    trace_id = os.urandom(16).hex()
    headers = {"traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01", "tracestate": "cf=1"}
    condition = Destination(w.config.queue, process_within=seconds(w, 15))
    cm_id = w.send(b"traced", condition, headers=headers)
    expect_kinds(w, cm_id, ["original"], "the traced original to reach the app")
    w.wait_for(lambda: acks.ack_ids(w, [cm_id])[cm_id], w.scaled(DELIVERY_S), "its ack")
    carried = acks.traceparents(w, cm_id)
    if not carried:
        raise NotMet("its ack carried no well-formed traceparent: a receiver passes it on")
    other = [tp for tp in carried if tp.split("-")[1] != trace_id]
    if other:
        raise NotMet(f"its ack carried the traceparent of another trace: {other[0]}")
    return "the ack carries the copy's trace"


def named_recipient(w: World) -> str:
    q, me = w.config.queue, w.config.recipient
    cm_id = w.send(b"for me", Destination(q, recipient=me, process_within=seconds(w, 15)))
    expect_kinds(w, cm_id, ["original"], "the copy naming this recipient to reach the app")
    w.wait_for(lambda: acks.ack_ids(w, [cm_id])[cm_id], w.scaled(DELIVERY_S), "its ack")
    refused = acks.refused(w, cm_id)
    if refused:  # known at once, rather than when the CM fails at its deadline
        raise NotMet(f"the evaluator did not count its ack: {refused[0]}")
    expect_verdict(w, cm_id, Verdict.SATISFIED, "its ack should carry this recipient")
    return "ack carries the recipient, token verified with it"


def wrong_recipient(w: World) -> str:
    """A copy naming another recipient is delivered and acked like any other (protocol.md,
    *A copy for another recipient*); the ack names this receiver, so it never counts and
    the CM fails at its pickup deadline, and its compensation follows the original."""
    q, other = w.config.queue, f"{w.config.recipient}-someone-else"
    condition = Destination(q, recipient=other, pickup_within=seconds(w, 2))
    cm_id = w.send(b"for someone else", condition)

    def delivered() -> bool:
        if w.invalid_of(cm_id):
            raise NotMet("a copy for another recipient must be delivered, not refused")
        return w.kinds(cm_id) == ["original"]

    w.wait_for(delivered, w.scaled(DELIVERY_S), "the copy naming another recipient in the app")
    expect_verdict(w, cm_id, Verdict.VIOLATED, "no ack of another identity may count")
    # The decision released a compensation to the queue: judge once the app has it, so
    # that every correct receiver tells the same story.
    expect_kinds(w, cm_id, ["compensation", "original"], "the compensation after the failure")
    expect_only(w, cm_id, ["compensation", "original"])
    if w.invalid_of(cm_id):
        raise NotMet("a copy for another recipient must be delivered, not refused")
    return f"delivered, not counted for {other!r}, then compensated"


def duplicates(w: World) -> str:
    cm_id, messages = direct_original(w, b"sent twice")
    for message in messages + messages:
        w.publish(message)
    expect_kinds(w, cm_id, ["original"], "the original to reach the app")
    expect_only(w, cm_id, ["original"])
    expect_acks(w, cm_id, 1, "a duplicate earns no ack")
    return "two copies with one message id: delivered once, acked once"


def redelivery_after_commit(w: World) -> str:
    cm_id, messages = direct_original(w, b"redelivered")
    for message in messages:
        w.publish(message)
    expect_kinds(w, cm_id, ["original"], "the original to reach the app")
    for message in messages:  # as RabbitMQ redelivers after a lost broker ack
        w.publish(message)
    expect_only(w, cm_id, ["original"])
    expect_acks(w, cm_id, 1, "a redelivery after the commit earns no ack")
    return "the same copy after the commit: dropped, no second ack"


# -- compensations and success notices ---------------------------------------------------


def compensation_after_original(w: World) -> str:
    q = w.config.queue
    condition = DestinationSet(
        Destination(q, pickup_within=seconds(w, 3)),
        Destination(w.void_queue, pickup_within=seconds(w, 3)),
    )
    cm_id = w.send(b"undone later", condition, compensation=b"undo it")
    expect_kinds(w, cm_id, ["original"], "the original to reach the app")
    expect_verdict(w, cm_id, Verdict.VIOLATED, "nobody reads the second destination")
    expect_kinds(w, cm_id, ["compensation", "original"], "the compensation to reach the app")
    comp = next(r for r in w.received(cm_id=cm_id) if r.kind == "compensation")
    if comp.body != b"undo it":
        raise NotMet(f"the app got the compensation body {comp.body[:40]!r}")
    w.publish(notice(w, MessageKind.COMPENSATION, cm_id, b"undo it"))  # a duplicate
    expect_only(w, cm_id, ["compensation", "original"])
    return "delivered once after the original (duplicate dropped)"


def compensation_before_original(w: World) -> str:
    cm_id, messages = direct_original(w, b"overtaken")
    w.publish(notice(w, MessageKind.COMPENSATION, cm_id, b"undo"))
    w.settle(0.0)  # the compensation is judged before the original arrives
    for message in messages:
        w.publish(message)
    expect_only(w, cm_id, [])
    if w.invalid_of(cm_id):
        raise NotMet("a cancelled original must be dropped, not moved to the invalid queue")
    expect_acks(w, cm_id, 0, "a discarded original gets no ack")
    return "both cancelled out, the app got neither, no ack"


def success_notice(w: World) -> str:
    body = b"the condition will hold"
    condition = Destination(w.config.queue, process_within=seconds(w, 15))
    cm_id = w.send(body, condition, notify_success=True)
    expect_verdict(w, cm_id, Verdict.SATISFIED, "its COMMIT ack should satisfy it")
    expect_kinds(w, cm_id, ["original", "success"], "the success notice to reach the app")
    w.publish(notice(w, MessageKind.SUCCESS, cm_id, b'{"cm_id": "x"}'))  # a duplicate
    expect_only(w, cm_id, ["original", "success"])
    return "delivered once (duplicate dropped)"


# -- topics and spheres ------------------------------------------------------------------


def topic_subscriber(w: World) -> str:
    key = f"conformance.{uuid.uuid4().hex[:8]}"
    w.bind_topic(key)
    try:
        condition = Destination(
            "conformance-topic",
            exchange="amq.topic",
            routing_key=key,
            process_within=seconds(w, 15),
            min_process=1,
        )
        cm_id = w.send(b"to the subscribers", condition)
        expect_kinds(w, cm_id, ["original"], "the topic copy to reach the app")
        expect_verdict(w, cm_id, Verdict.SATISFIED, "its ack names this subscriber")
    finally:
        w.unbind_topic(key)
    return "counted as one subscriber"


def sphere_member(w: World) -> str:
    q = w.config.queue
    with w.sphere(timeout=w.scaled(30)) as sphere:
        member = sphere.send(
            b"a sphere member", Destination(q, pickup_within=seconds(w, 30)), compensation=b"u"
        )
        sphere.send(b"unread", Destination(w.void_queue, pickup_within=seconds(w, 3)))
    expect_kinds(w, member, ["original"], "the sphere member to reach the app")
    verdict = w.sphere_verdict(sphere.sphere_id, DECISION_S)
    if verdict is not Verdict.VIOLATED:
        raise NotMet(f"the sphere was decided {verdict}, expected violated")
    expect_kinds(w, member, ["compensation", "original"], "the member's compensation")
    return "member delivered, compensated when its sphere failed"


# -- crashes -----------------------------------------------------------------------------


def _crash(w: World, payload: bytes, when: str) -> str:
    cm_id = w.send(payload, Destination(w.config.queue, process_within=seconds(w, 60)))
    code = w.wait_receiver_exit(DELIVERY_S)
    w.start_receiver()
    expect_kinds(w, cm_id, ["original"], "the original once the receiver is back")
    expect_only(w, cm_id, ["original"])
    expect_verdict(w, cm_id, Verdict.SATISFIED, "its COMMIT ack must not be lost")
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
