"""The outcome of a conditional message: what the evaluator decided, and why.

It travels as JSON on the sender's outcome queue and is stored on the CM row; the
``Sender`` reads it back with ``outcome(cm_id)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from condmsg.errors import ProtocolError
from condmsg.evaluation import DestinationFacts, EvaluationResult, Verdict
from condmsg.protocol import PROTOCOL_VERSION, compact_json, format_instant, parse_instant
from condmsg.timeutil import stored_instant

OUTCOME_CONTENT_TYPE = "application/vnd.condmsg.outcome+json"
OUTCOME_TYPE = "condmsg.outcome"


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """A decided CM. ``effective_at`` is the instant the verdict was evaluated at (the
    decision time minus the evaluator's ack grace); ``facts`` is per destination."""

    cm_id: str
    verdict: Verdict
    reasons: tuple[str, ...]
    decided_at: datetime
    effective_at: datetime
    facts: tuple[dict[str, Any], ...]

    @classmethod
    def from_result(
        cls, cm_id: str, result: EvaluationResult, *, decided_at: datetime, effective_at: datetime
    ) -> Outcome:
        return cls(
            cm_id=cm_id,
            verdict=result.verdict,
            reasons=result.reasons,
            decided_at=decided_at,
            effective_at=effective_at,
            facts=tuple(facts_to_dict(f) for f in result.destinations),
        )

    @classmethod
    def from_row(cls, row: Any) -> Outcome:
        """The outcome of a decided ``condmsg_cm`` row (its decision columns)."""
        return cls(
            cm_id=row.cm_id,
            verdict=Verdict(row.state),
            reasons=tuple(json.loads(row.reasons_json or "[]")),
            decided_at=stored_instant(row.decided_at),
            effective_at=stored_instant(row.effective_at),
            facts=tuple(json.loads(row.facts_json or "[]")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": PROTOCOL_VERSION,
            "cm_id": self.cm_id,
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "decided_at": format_instant(self.decided_at),
            "effective_at": format_instant(self.effective_at),
            "facts": list(self.facts),
        }

    def to_json(self) -> bytes:
        return compact_json(self.to_dict()).encode()

    @classmethod
    def from_json(cls, body: bytes | str) -> Outcome:
        try:
            data = json.loads(body)
            return cls(
                cm_id=str(data["cm_id"]),
                verdict=Verdict(data["verdict"]),
                reasons=tuple(str(r) for r in data["reasons"]),
                decided_at=parse_instant(data["decided_at"], "decided_at"),
                effective_at=parse_instant(data["effective_at"], "effective_at"),
                facts=tuple(dict(f) for f in data["facts"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolError(f"malformed outcome document ({exc!r})") from None


def facts_to_dict(facts: DestinationFacts) -> dict[str, Any]:
    def instant(value: datetime | None) -> str | None:
        return format_instant(value) if value is not None else None

    return {
        "destination": facts.name,
        "path": facts.path,
        "required": facts.required,
        "acks": facts.acks,
        "recipients": list(facts.recipients),
        "first_read_at": instant(facts.first_read_at),
        "first_committed_at": instant(facts.first_committed_at),
    }
