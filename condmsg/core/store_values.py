"""The values of the sender store's status columns, defined once.

Pure (no SQLAlchemy, no pyarrow): :mod:`condmsg.tables` uses them for the store,
:mod:`condmsg.archive.layout` for the Parquet archives the Spark audit reads, and the audit
must match on exactly the strings the evaluator wrote.
"""

from __future__ import annotations

from enum import StrEnum


class CmState(StrEnum):
    """``condmsg_cm.state``: undecided, or the verdict."""

    PENDING = "pending"
    SATISFIED = "satisfied"
    VIOLATED = "violated"


class AckStatus(StrEnum):
    """``condmsg_ack.status``: how the evaluator treated a stored ack."""

    COUNTED = "counted"  # before the decision, verified, for a destination of the tree
    AFTER_DECISION = "after_decision"  # kept and reported, not counted
    CHANGES_VERDICT = "changes_verdict"  # after the decision and would have changed it


class AnomalyKind(StrEnum):
    """``condmsg_anomaly.kind``."""

    DUPLICATE = "duplicate"
    UNKNOWN_CM = "unknown_cm"
    BAD_TOKEN = "bad_token"
    WRONG_DESTINATION = "wrong_destination"
    WRONG_RECIPIENT = "wrong_recipient"
    AFTER_DECISION = "after_decision"
    LATE_CHANGES_VERDICT = "late_changes_verdict"
    MALFORMED = "malformed"
    CLOCK_SKEW = "clock_skew"


class SphereState(StrEnum):
    """``condmsg_sphere.state``: open for members, a request the evaluator acts on
    (``committed``, ``aborted``), or the sphere's outcome."""

    OPEN = "open"
    COMMITTED = "committed"  # the sender committed; the outcome waits for the members
    ABORTED = "aborted"  # the sender aborted; the evaluator records the violation
    SATISFIED = "satisfied"
    VIOLATED = "violated"

    @property
    def decided(self) -> bool:
        return self in (SphereState.SATISFIED, SphereState.VIOLATED)


class ParticipantState(StrEnum):
    """``condmsg_sphere_participant.state``: how far a participant has come."""

    ENLISTED = "enlisted"  # its work is open (or, for a handler, waiting for the outcome)
    PREPARED = "prepared"  # voted yes; its work waits for the outcome
    VOTED_NO = "voted_no"  # its prepare failed or voted no: the sphere fails
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    RAN = "ran"  # a handler whose outcome came: it ran once
    SKIPPED = "skipped"  # a handler for the other outcome

    @property
    def resolved(self) -> bool:
        return self in (
            ParticipantState.COMMITTED,
            ParticipantState.ROLLED_BACK,
            ParticipantState.RAN,
            ParticipantState.SKIPPED,
        )
