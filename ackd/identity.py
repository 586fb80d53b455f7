"""The names a receiver writes into every ack and receiver log row: its recipient
identity and its receiver id. Both travel in acks, whose codec bounds them
(``condmsg.core.limits``): a name it refuses would dead-letter every ack of the receiver, so
they are checked once, when the receiver is built."""

from __future__ import annotations

import hashlib
import os
import socket

from condmsg.core.errors import ConfigError
from condmsg.core.limits import MAX_NAME_CHARS, forbidden_character


def checked_name(value: str, what: str) -> str:
    """``value`` if an ack can carry it as ``what``; :class:`ConfigError` saying why not."""
    if not value or not isinstance(value, str):
        raise ConfigError(f"Receiver needs a non-empty {what}")
    if len(value) > MAX_NAME_CHARS:
        raise ConfigError(f"the {what} is longer than {MAX_NAME_CHARS} characters")
    bad = forbidden_character(value)
    if bad is not None:
        raise ConfigError(f"the {what} holds {bad}")
    return value


def default_receiver_id(recipient: str) -> str:
    """``host:pid:recipient``, with a digest of the recipient where the whole would not
    fit an ack's ``receiver`` field."""
    head = f"{socket.gethostname()}:{os.getpid()}:"
    if len(head) + len(recipient) <= MAX_NAME_CHARS:
        return head + recipient
    digest = hashlib.sha256(recipient.encode("utf-8")).hexdigest()[:16]
    return (head + digest)[:MAX_NAME_CHARS]
