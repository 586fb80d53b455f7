"""Acknowledgments as the evaluation sees them.

A non-transactional read yields one READ ack carrying ``read_at``; a transactional read
yields one COMMIT ack carrying ``read_at`` and ``committed_at`` when (and only if) the
receiver's transaction commits. Both timestamps are the receiver's clock, UTC.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from condmsg.core.errors import AckError
from condmsg.core.timeutil import as_utc, is_aware


class AckKind(StrEnum):
    READ = "read"
    COMMIT = "commit"


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """One acknowledgment for one copy of a conditional message.

    ``destination`` is the destination's name in the condition; ``recipient`` is the
    identity of the final recipient that read it. Destinations that name a recipient count
    only that recipient's acks; on a topic destination, acks without a recipient count
    together as one anonymous identity (receivers always send theirs).
    """

    destination: str
    kind: AckKind
    read_at: datetime
    committed_at: datetime | None = None
    recipient: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.destination, str) or not self.destination:
            raise AckError("ack: destination must be a non-empty str")
        if self.recipient is not None and (
            not isinstance(self.recipient, str) or not self.recipient
        ):
            raise AckError(f"ack for {self.destination!r}: recipient must be a non-empty str")
        kind = self.kind
        try:
            if kind.__class__ is not AckKind:
                kind = AckKind(kind)
        except ValueError:
            raise AckError(
                f"ack for {self.destination!r}: kind must be 'read' or 'commit', got {self.kind!r}"
            ) from None
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "read_at", self._utc("read_at", self.read_at))
        if kind is AckKind.COMMIT:
            if self.committed_at is None:
                raise AckError(f"ack for {self.destination!r}: a COMMIT ack needs committed_at")
            committed = self._utc("committed_at", self.committed_at)
            if committed < self.read_at:
                raise AckError(
                    f"ack for {self.destination!r}: committed_at is before read_at "
                    "(both are the receiver's clock)"
                )
            object.__setattr__(self, "committed_at", committed)
        elif self.committed_at is not None:
            raise AckError(f"ack for {self.destination!r}: a READ ack has no committed_at")

    def _utc(self, attribute: str, value: object) -> datetime:
        if isinstance(value, datetime) and value.tzinfo is UTC:
            return value  # what as_utc() would return (the usual case)
        if not isinstance(value, datetime):
            raise AckError(
                f"ack for {self.destination!r}: {attribute} must be a datetime, "
                f"got {type(value).__name__}"
            )
        if not is_aware(value):
            raise AckError(
                f"ack for {self.destination!r}: {attribute} is a naive datetime "
                "(timezone-aware UTC required)"
            )
        return as_utc(value)
