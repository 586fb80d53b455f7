"""What a send takes: one conditional message's arguments, and the ids of new CMs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from condmsg.core.conditions import Condition

__all__ = ["Outgoing", "new_cm_id"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Outgoing:
    """One conditional message for :meth:`Sender.send_many` (the arguments of ``send``)."""

    payload: object
    condition: Condition
    compensation: object | None = None
    notify_success: bool = False
    headers: Mapping[str, Any] | None = None
    content_type: str | None = None


def new_cm_id() -> str:
    """A random (version 4) UUID in its text form, as ``str(uuid.uuid4())`` makes it, built
    more cheaply than that (a send makes one per CM)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # the RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
