"""Scenarios of ``condmsg conformance`` on what a receiver must judge: forged and unsigned
tokens and undecodable payloads (refused), Message Sequences (complete, with a bad part,
incomplete), and an application that fails (a poison message, a retry)."""

from __future__ import annotations

import time
import uuid

from condmsg import Destination, Verdict
from condmsg.conformance import acks
from condmsg.conformance.config import (
    FAIL_ALWAYS,
    FAIL_ONCE,
    MAX_ATTEMPTS,
    RETRY_BACKOFF_MS,
    SEQUENCE_TIMEOUT_MS,
)
from condmsg.conformance.expect import (
    DELIVERY_S,
    FORGED_SECRET,
    consumed_original,
    direct_original,
    expect_acks,
    expect_kinds,
    expect_moved,
    expect_only,
    expect_refused,
    expect_verdict,
    notice,
    seconds,
    with_header,
    without,
)
from condmsg.conformance.world import PART_BYTES, NotMet, World
from condmsg.core import protocol
from condmsg.core.protocol import MessageKind
from outbox.message import OutboxMessage

#: The share of a pause that must have passed: a receiver's timer may fire a little early.
PAUSE_SHARE = 0.9

# -- tokens ------------------------------------------------------------------------------


def forged_copy(w: World) -> str:
    cm_id = str(uuid.uuid4())
    condition = Destination(w.config.queue, pickup_within=seconds(w, 60))
    genuine = w.copies(cm_id, condition, b"forged")
    forged = protocol.copy_token(FORGED_SECRET, cm_id, w.config.queue, None)
    for message in genuine:
        w.publish(with_header(message, protocol.H_TOKEN, forged))
    return expect_refused(w, cm_id, "the forged copy")


def unsigned_copy(w: World) -> str:
    cm_id, messages = direct_original(w, b"unsigned")
    for message in messages:
        w.publish(without(message, protocol.H_TOKEN))
    return expect_refused(w, cm_id, "the unsigned copy")


def forged_compensation(w: World) -> str:
    cm_id = consumed_original(w, b"then a forged compensation")
    w.publish(notice(w, MessageKind.COMPENSATION, cm_id, b"undo", secret=FORGED_SECRET))
    return expect_refused(w, cm_id, "the forged compensation", ["original"])


def unsigned_compensation(w: World) -> str:
    cm_id = consumed_original(w, b"then an unsigned compensation")
    w.publish(without(notice(w, MessageKind.COMPENSATION, cm_id, b"undo"), protocol.H_TOKEN))
    return expect_refused(w, cm_id, "the unsigned compensation", ["original"])


def kind_swapped_token(w: World) -> str:
    """A success notice's genuine token on a compensation with the same body."""
    cm_id = consumed_original(w, b"then a notice dressed as a compensation")
    body = b"same body"
    success = notice(w, MessageKind.SUCCESS, cm_id, body)
    compensation = notice(w, MessageKind.COMPENSATION, cm_id, body)
    assert success.headers is not None
    token = str(success.headers[protocol.H_TOKEN])
    w.publish(with_header(compensation, protocol.H_TOKEN, token))
    return expect_refused(w, cm_id, "the compensation carrying a notice's token", ["original"])


def undecodable_payload(w: World) -> str:
    cm_id = str(uuid.uuid4())
    condition = Destination(w.config.queue, pickup_within=seconds(w, 60))
    for message in w.copies(cm_id, condition, b'{"not": json', "application/json"):
        w.publish(message)
    return expect_refused(w, cm_id, "the copy whose JSON payload does not decode")


# -- sequences ---------------------------------------------------------------------------


def sequence_complete(w: World) -> str:
    body = bytes(range(256)) * (PART_BYTES * 5 // 256) + b"tail"
    cm_id = w.send(body, Destination(w.config.queue, process_within=seconds(w, 20)))
    expect_kinds(w, cm_id, ["original"], "the reassembled sequence to reach the app")
    got = w.received(cm_id=cm_id)[0].body
    if got != body:
        raise NotMet(f"the app got {len(got)} bytes, {len(body)} were sent")
    expect_verdict(w, cm_id, Verdict.SATISFIED, "one COMMIT ack for the whole copy")
    seq_id, got_id = acks.copy_message_id(w, cm_id), w.received(cm_id=cm_id)[0].message_id
    if got_id != seq_id:
        raise NotMet(f"the app got the whole as message {got_id!r}, not its sequence id {seq_id!r}")
    expect_acks(w, cm_id, 1, "one for the whole copy, none for a part")
    return f"{len(body)} bytes in {-(-len(body) // PART_BYTES)} parts, delivered once, one ack"


def _sequence(w: World) -> tuple[str, list[OutboxMessage]]:
    cm_id, parts = direct_original(w, b"p" * (PART_BYTES * 3))
    if len(parts) < 3:
        raise AssertionError("a sequence scenario needs at least three parts")
    return cm_id, parts


def sequence_bad_part(w: World) -> str:
    cm_id, parts = _sequence(w)
    forged = protocol.copy_token(FORGED_SECRET, cm_id, w.config.queue, None)
    parts[1] = with_header(parts[1], protocol.H_TOKEN, forged)
    for part in parts:
        w.publish(part)
    w.wait_for(
        lambda: w.invalid_of(cm_id), w.scaled(DELIVERY_S), "the bad part in the invalid queue"
    )
    w.wait_for(
        lambda: len(w.invalid_of(cm_id)) >= len(parts),
        w.scaled(DELIVERY_S) + SEQUENCE_TIMEOUT_MS / 1000,
        "the other parts in the invalid queue once the sequence timed out",
    )
    expect_only(w, cm_id, [])
    return "the bad part refused, the incomplete rest timed out; the app got nothing"


def sequence_timed_out(w: World) -> str:
    cm_id, parts = _sequence(w)
    for part in parts[:-1]:
        w.publish(part)
    w.wait_for(
        lambda: len(w.invalid_of(cm_id)) == len(parts) - 1,
        w.scaled(DELIVERY_S) + SEQUENCE_TIMEOUT_MS / 1000,
        f"the {len(parts) - 1} parts sent in the invalid queue after the sequence timeout",
    )
    expect_only(w, cm_id, [])
    return f"{len(parts) - 1} parts moved to the invalid queue, the app got nothing"


# -- failures in the application ---------------------------------------------------------


def poison_message(w: World) -> str:
    cm_id, messages = direct_original(w, FAIL_ALWAYS)
    sent = time.monotonic()
    for message in messages:
        w.publish(message)
    pauses = sum(RETRY_BACKOFF_MS * 2**n for n in range(MAX_ATTEMPTS - 1)) / 1000
    found = w.wait_for(
        lambda: w.invalid_of(cm_id),
        w.scaled(DELIVERY_S) + pauses,
        f"the message failing every attempt in the invalid queue after {MAX_ATTEMPTS} attempts",
    )
    took = time.monotonic() - sent
    if took < PAUSE_SHARE * pauses:
        raise NotMet(
            f"moved {took:.2f}s after it was sent: its {MAX_ATTEMPTS - 1} pauses after failed "
            f"attempts ({RETRY_BACKOFF_MS} ms, doubling) take {pauses:.1f}s"
        )
    expect_moved(w, found[0], "the message failing every attempt")
    expect_only(w, cm_id, [])
    expect_acks(w, cm_id, 0, "no attempt committed")
    return f"moved after its attempts and pauses ({took:.1f}s): {found[0].reason[:50]}"


def poison_retry(w: World) -> str:
    cm_id, messages = direct_original(w, FAIL_ONCE)
    sent = time.monotonic()
    for message in messages:
        w.publish(message)
    expect_kinds(w, cm_id, ["original"], "the message failing once to reach the app")
    took = time.monotonic() - sent
    pause = RETRY_BACKOFF_MS / 1000
    if took < PAUSE_SHARE * pause:
        raise NotMet(
            f"the app had it {took:.2f}s after it was sent: its first attempt must fail "
            f"and the retry come after a pause of {pause:.1f}s"
        )
    expect_only(w, cm_id, ["original"])
    expect_acks(w, cm_id, 1, "one COMMIT ack, of the retry that committed")
    return f"rolled back once, delivered on the retry {took:.1f}s after it was sent"
