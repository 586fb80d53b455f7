"""What the evaluator decided about a conditional message or a Dependency-Sphere, and why.

Both travel as JSON on the sender's outcome queue and are stored on their row; the
``Sender`` reads them back (``outcome(cm_id)``, a sphere's ``outcome()``). The two documents
share their shape and one codec, :class:`Decided`: the protocol version, the id, the verdict,
its reasons, the decision and effective instants, and one detail (a CM's per-destination
facts, a sphere's members' verdicts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Self

from condmsg.core.errors import ProtocolError
from condmsg.core.evaluation import DestinationFacts, EvaluationResult, Verdict
from condmsg.core.protocol import PROTOCOL_VERSION, compact_json, format_instant, parse_instant
from condmsg.core.timeutil import stored_instant

OUTCOME_CONTENT_TYPE = "application/vnd.condmsg.outcome+json"
OUTCOME_TYPE = "condmsg.outcome"
SPHERE_OUTCOME_CONTENT_TYPE = "application/vnd.condmsg.sphere-outcome+json"
SPHERE_OUTCOME_TYPE = "condmsg.sphere-outcome"


@dataclass(frozen=True, slots=True, kw_only=True)
class Decided:
    """A decision and its JSON document. ``effective_at`` is the instant the verdict was
    evaluated at (the decision time minus the evaluator's ack grace).

    A subclass names its id field (``ID``), its detail field (``DETAIL``) and how the detail
    is written and read; the rest of the document is the same for both.
    """

    ID: ClassVar[str]
    DETAIL: ClassVar[str]
    #: How a malformed document is named in the error.
    WHAT: ClassVar[str]

    verdict: Verdict
    reasons: tuple[str, ...]
    decided_at: datetime
    effective_at: datetime

    def detail_to_json(self) -> Any:
        raise NotImplementedError

    @staticmethod
    def detail_from_json(value: Any) -> Any:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": PROTOCOL_VERSION,
            self.ID: getattr(self, self.ID),
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "decided_at": format_instant(self.decided_at),
            "effective_at": format_instant(self.effective_at),
            self.DETAIL: self.detail_to_json(),
        }

    def to_json(self) -> bytes:
        return compact_json(self.to_dict()).encode()

    @classmethod
    def from_json(cls, body: bytes | str) -> Self:
        try:
            data = json.loads(body)
            fields: dict[str, Any] = {
                cls.ID: str(data[cls.ID]),
                "verdict": Verdict(data["verdict"]),
                "reasons": tuple(str(r) for r in data["reasons"]),
                "decided_at": parse_instant(data["decided_at"], "decided_at"),
                "effective_at": parse_instant(data["effective_at"], "effective_at"),
                cls.DETAIL: cls.detail_from_json(data[cls.DETAIL]),
            }
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolError(f"malformed {cls.WHAT} document ({exc!r})") from None
        return cls(**fields)


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome(Decided):
    """A decided CM; ``facts`` is per destination."""

    ID = "cm_id"
    DETAIL = "facts"
    WHAT = "outcome"

    cm_id: str
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

    def detail_to_json(self) -> list[dict[str, Any]]:
        return list(self.facts)

    @staticmethod
    def detail_from_json(value: Any) -> tuple[dict[str, Any], ...]:
        return tuple(dict(f) for f in value)


@dataclass(frozen=True, slots=True, kw_only=True)
class SphereOutcome(Decided):
    """A decided sphere. ``members`` maps each member CM id to its own verdict when the
    sphere was decided (``pending`` for a member still undecided then)."""

    ID = "sphere_id"
    DETAIL = "members"
    WHAT = "sphere outcome"

    sphere_id: str
    members: dict[str, str]

    def detail_to_json(self) -> dict[str, str]:
        return dict(sorted(self.members.items()))

    @staticmethod
    def detail_from_json(value: Any) -> dict[str, str]:
        return {str(k): str(v) for k, v in dict(value).items()}


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
