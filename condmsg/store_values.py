"""The values of the sender store's status columns, defined once.

Pure (no SQLAlchemy, no pyarrow): :mod:`condmsg.sender_tables` uses them for the store,
:mod:`condmsg.archive_layout` for the Parquet archives the Spark audit reads, and the audit
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
