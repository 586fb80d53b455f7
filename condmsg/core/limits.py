"""What a name or id on the wire may hold: the lengths of the columns that store it, and the
characters every store and the token recipe can take.

The lengths are those of the store's columns (``condmsg.tables``, ``ackd.tables``;
``tests/unit/test_codec_limits.py`` holds them equal): a longer value can never be stored on
PostgreSQL, so a message carrying one is malformed rather than a failing batch. Lengths
count characters (Unicode code points), as PostgreSQL's ``varchar(n)`` does.
"""

from __future__ import annotations

import re

#: A CM id (``condmsg_cm.cm_id``; a UUID is 36).
MAX_CM_ID_CHARS = 36
#: An ack id (``condmsg_ack.ack_id``).
MAX_ACK_ID_CHARS = 64
#: A destination, recipient, receiver, sender, exchange or routing key.
MAX_NAME_CHARS = 255
#: A Message Sequence id (``condmsg_sequence_part.seq_id``: the copy's message id).
MAX_SEQ_ID_CHARS = 64

#: C0 control characters (U+0000-U+001F) and unpaired UTF-16 surrogates. PostgreSQL's text
#: holds neither NUL nor a surrogate (a JSON ``\ud800`` escape decodes to one); U+001F is
#: the tokens' field separator, and the other controls have no place in a name.
_FORBIDDEN = re.compile("[\x00-\x1f\ud800-\udfff]")


def forbidden_character(value: str) -> str | None:
    """What ``value`` holds that no name may (``'a NUL character'``, ``'a control character
    (U+001F)'``, ``'an unpaired surrogate (U+D800)'``), or None."""
    if value.isprintable():  # the usual case, in C: no control character, no surrogate
        return None
    found = _FORBIDDEN.search(value)
    if found is None:
        return None
    code = ord(found.group())
    if code == 0:
        return "a NUL character"
    what = "a control character" if code < 0x20 else "an unpaired surrogate"
    return f"{what} (U+{code:04X})"
