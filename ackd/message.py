"""What the application gets from a ``Receiver``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from condmsg.core.payloads import decode_payload
from condmsg.core.protocol import MessageKind


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One message handed to the application.

    ``kind`` is ORIGINAL, COMPENSATION or SUCCESS for condmsg messages and ``None`` for a
    plain (non-conditional) message, which passes through with no ack. ``payload`` is the
    object the sender passed (bytes, str or a JSON value, by content type); ``body`` the raw
    bytes. ``read_at`` is when it was taken from the queue (UTC, this receiver's clock).
    """

    queue: str
    body: bytes = field(repr=False)
    kind: MessageKind | None
    cm_id: str | None
    destination: str | None
    sender: str | None
    message_id: str | None
    content_type: str | None
    headers: dict[str, Any]
    read_at: datetime
    redelivered: bool

    @property
    def payload(self) -> Any:
        return decode_payload(self.body, self.content_type)

    @property
    def is_conditional(self) -> bool:
        return self.kind is not None
