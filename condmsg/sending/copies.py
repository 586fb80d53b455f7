"""Building the standard messages of one conditional message (pure; no I/O).

One CM fans out to one copy per destination; a copy whose body exceeds the part size
travels as a Message Sequence (sequence id, position, size) of several AMQP messages.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from condmsg.core import protocol
from condmsg.core.conditions import COMPENSATION_PRIORITY, Condition, Delivery, Destination
from condmsg.core.errors import ProtocolError
from condmsg.core.timeutil import to_ms
from outbox.message import Fanout, OutboxMessage


@dataclass(frozen=True, slots=True, kw_only=True)
class CopyPlan:
    """One destination's copy: its row in ``condmsg_copy`` and its AMQP messages."""

    destination: Destination
    message_id: str
    exchange: str
    routing_key: str
    requires: protocol.Requirement
    #: How many AMQP messages the copy travels as (more than one: a Message Sequence).
    parts: int = 1
    #: Its messages (:func:`plan_copies`; :func:`plan_fanouts` leaves them in the fan-outs).
    messages: tuple[OutboxMessage, ...] = ()


def requirement(condition: Condition) -> dict[str, protocol.Requirement]:
    """What the condition asks of each destination (processing beats pickup)."""
    needs: dict[str, protocol.Requirement] = {}

    def visit(node: Condition, inherited: protocol.Requirement) -> None:
        here = inherited
        if node.process_within is not None:
            here = protocol.Requirement.PROCESS
        elif node.pickup_within is not None and here is protocol.Requirement.NONE:
            here = protocol.Requirement.PICKUP
        if isinstance(node, Destination):
            needs[node.name] = here
        for member in node.members:
            visit(member, here)

    visit(condition, protocol.Requirement.NONE)
    return needs


def check_app_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    out = dict(headers or {})
    for key in out:
        if not isinstance(key, str):
            raise ProtocolError(f"header names must be str, got {type(key).__name__}")
        if key.lower().startswith("condmsg-"):
            raise ProtocolError(f"header {key!r}: the condmsg- prefix is reserved")
    return out


def plan_copies(**options: Any) -> list[CopyPlan]:
    """The copies of one CM, one per destination, each split into parts if large, with
    their messages (takes the keywords of :func:`plan_fanouts`)."""
    plans, fanouts = plan_fanouts(**options)
    parts = [fanout.messages() for fanout in fanouts]
    return [
        replace(plan, messages=tuple(part[i] for part in parts)) for i, plan in enumerate(plans)
    ]


def plan_fanouts(
    *,
    cm_id: str,
    condition: Condition,
    sender: str,
    sent_at: datetime,
    secret: bytes,
    body: bytes,
    content_type: str,
    app_headers: Mapping[str, Any],
    part_bytes: int,
) -> tuple[list[CopyPlan], list[Fanout]]:
    """The copies of one CM (plans without their messages) and its outbox fan-outs: one
    per part of the payload, holding that part once and every destination's copy of it.

    A copy's message differs from its siblings' only in the destination's address,
    delivery properties, message id and its headers naming the destination (destination,
    requirement, recipient, token; the sequence id of a large payload).
    """
    destinations, delivery, needs = _layout(condition)
    chunks = split(body, part_bytes)
    shared = {
        **app_headers,
        protocol.H_VERSION: protocol.PROTOCOL_VERSION,
        protocol.H_KIND: protocol.MessageKind.ORIGINAL.value,
        protocol.H_CM_ID: cm_id,
        protocol.H_SENDER: sender,
        protocol.H_SENT_AT: protocol.format_instant(sent_at),
    }
    own = [_copy_fields(d, delivery[d.name], needs[d.name], secret, cm_id) for d in destinations]
    plans = [
        CopyPlan(
            destination=dest,
            message_id=fields["message_id"],
            exchange=fields["exchange"],
            routing_key=fields["routing_key"],
            requires=needs[dest.name],
            parts=len(chunks),
        )
        for dest, fields in zip(destinations, own, strict=True)
    ]
    first = own[0]
    if len(own) == 1 and len(chunks) == 1:
        # One destination, one part: the message itself (a fan-out of one copy that
        # states nothing of its own), without working out what a single copy shares.
        headers = {**shared, **first["headers"]}
        message = _original(
            first, cm_id, sender, content_type, chunks[0], headers, first["message_id"]
        )
        return plans, [Fanout(message, ({},))]
    # A copy states the fields in which it differs from the first (the row's own).
    copies = [
        {k: v for k, v in c.items() if k in _OWN or v != first[k] or type(v) is not type(first[k])}
        for c in own
    ]
    fanouts = [
        Fanout(
            _original(first, cm_id, sender, content_type, chunk, headers, None),
            tuple(part_copies),
        )
        for chunk, headers, part_copies in _parts(chunks, shared, copies)
    ]
    return plans, fanouts


def _copy_fields(
    dest: Destination, props: Delivery, requires: protocol.Requirement, secret: bytes, cm_id: str
) -> dict[str, Any]:
    """The outbox fields of one destination's copy: its address, delivery properties, a
    fresh message id and the headers that name the destination."""
    headers = {
        protocol.H_DESTINATION: dest.name,
        protocol.H_REQUIRES: requires.value,
        protocol.H_TOKEN: protocol.copy_token(secret, cm_id, dest.name, dest.recipient),
    }
    if dest.recipient is not None:
        headers[protocol.H_RECIPIENT] = dest.recipient
    return {
        "exchange": dest.exchange or "",
        "routing_key": dest.routing_key or dest.name,
        "message_id": os.urandom(16).hex(),  # 128 random bits, as a uuid4 has 122
        "priority": props.priority,
        "expiration_ms": to_ms(props.expiry) if props.expiry is not None else None,
        "persistent": props.persistent,
        "headers": headers,
    }


def _parts(
    chunks: Sequence[bytes], shared: dict[str, Any], copies: list[dict[str, Any]]
) -> Iterator[tuple[bytes, dict[str, Any], list[dict[str, Any]]]]:
    """Per part of the payload: its body, its shared headers and its copies. A payload of
    several parts numbers them, and each copy's part gets a message id of its own under
    the copy's (the sequence id the receiver reassembles by)."""
    if len(chunks) == 1:
        yield chunks[0], shared, copies
        return
    for position, chunk in enumerate(chunks):
        headers = shared | {protocol.H_SEQ_POS: position, protocol.H_SEQ_SIZE: len(chunks)}
        part_copies = [
            c
            | {
                "message_id": f"{c['message_id']}.{position}",
                "headers": c["headers"] | {protocol.H_SEQ_ID: c["message_id"]},
            }
            for c in copies
        ]
        yield chunk, headers, part_copies


def _original(
    copy: Mapping[str, Any],
    cm_id: str,
    sender: str,
    content_type: str,
    body: bytes,
    headers: Mapping[str, Any],
    message_id: str | None,
) -> OutboxMessage:
    """An original with ``copy``'s address and delivery properties (``message_id`` None:
    each copy of the fan-out states its own)."""
    return OutboxMessage(
        exchange=copy["exchange"],
        routing_key=copy["routing_key"],
        body=body,
        message_id=message_id,
        correlation_id=cm_id,
        reply_to=protocol.ack_queue(sender),
        content_type=content_type,
        message_type=_ORIGINAL_TYPE,
        headers=headers,
        priority=copy["priority"],
        expiration_ms=copy["expiration_ms"],
        persistent=copy["persistent"],
    )


_ORIGINAL_TYPE = f"condmsg.{protocol.MessageKind.ORIGINAL.value}"


#: What every copy of a fan-out states for itself.
_OWN = frozenset({"message_id", "headers"})


@functools.lru_cache(maxsize=1024)
def _layout(
    condition: Condition,
) -> tuple[tuple[Destination, ...], dict[str, Delivery], dict[str, protocol.Requirement]]:
    """What the copies take from the condition alone (conditions repeat across CMs)."""
    return condition.destinations(), condition.delivery(), requirement(condition)


def split(body: bytes, part_bytes: int) -> list[bytes]:
    """``body`` in parts of at most ``part_bytes`` (one part, possibly empty, if it fits)."""
    if len(body) <= part_bytes:
        return [body]
    return [body[i : i + part_bytes] for i in range(0, len(body), part_bytes)]


def notice_message(
    *,
    kind: protocol.MessageKind,
    cm_id: str,
    destination: str,
    recipient: str | None,
    sender: str,
    sent_at: datetime,
    exchange: str,
    routing_key: str,
    body: bytes,
    content_type: str | None,
    secret: bytes,
) -> OutboxMessage:
    """A compensation or success notice for one destination of a decided CM, signed with
    :func:`condmsg.core.protocol.control_token` (keyed by ``secret``, the deployment secret).

    Compensations travel at :data:`COMPENSATION_PRIORITY`, above any application priority,
    so that they usually overtake an unread original (the receiver's RLOG then drops both).
    """
    if kind is protocol.MessageKind.ORIGINAL:
        raise ValueError("notice_message builds compensations and success notices only")
    headers: dict[str, Any] = {
        protocol.H_VERSION: protocol.PROTOCOL_VERSION,
        protocol.H_KIND: kind.value,
        protocol.H_CM_ID: cm_id,
        protocol.H_DESTINATION: destination,
        protocol.H_SENDER: sender,
        protocol.H_SENT_AT: protocol.format_instant(sent_at),
        protocol.H_TOKEN: protocol.control_token(
            secret, kind.value, cm_id, destination, recipient, body
        ),
    }
    if recipient is not None:
        headers[protocol.H_RECIPIENT] = recipient
    return OutboxMessage(
        exchange=exchange,
        routing_key=routing_key,
        body=body,
        message_id=f"{cm_id}.{destination}.{kind.value}",
        correlation_id=cm_id,
        content_type=content_type,
        message_type=f"condmsg.{kind.value}",
        headers=headers,
        priority=COMPENSATION_PRIORITY if kind is protocol.MessageKind.COMPENSATION else None,
    )
