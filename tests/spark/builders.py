"""Handmade input frames for the Spark tests (rows as dicts; missing columns are null)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from condmsg.core.condition_codec import condition_to_json
from condmsg.core.conditions import Condition
from condmsg.core.evaluation import evaluation_deadline

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def at(ms: float) -> datetime:
    """``T0`` plus ``ms`` milliseconds."""
    return T0 + timedelta(milliseconds=ms)


def frame(spark: Any, table: str, rows: Iterable[Mapping[str, Any]]) -> Any:
    from spark_audit.schemas import SCHEMAS

    schema = SCHEMAS[table]
    data = [tuple(row.get(f.name) for f in schema.fields) for row in rows]
    loose = schema.__class__([f.__class__(f.name, f.dataType, True) for f in schema.fields])
    return spark.createDataFrame(data, loose)


def cm_row(
    cm_id: str,
    condition: Condition,
    *,
    sent_at: datetime = T0,
    sender: str = "app",
    state: str = "pending",
    effective_at: datetime | None = None,
    decided_at: datetime | None = None,
) -> dict[str, Any]:
    return {
        "cm_id": cm_id,
        "sender": sender,
        "sent_at": sent_at,
        "condition_json": condition_to_json(condition),
        "evaluation_deadline": evaluation_deadline(condition, sent_at),
        "payload_size": 10,
        "notify_success": False,
        "state": state,
        "decided_at": decided_at,
        "effective_at": effective_at,
        "reasons_json": "[]" if state != "pending" else None,
    }


def ack_row(
    ack_id: str,
    cm_id: str,
    destination: str,
    *,
    read_at: datetime,
    committed_at: datetime | None = None,
    recipient: str | None = None,
    receiver: str = "rcv",
    received_at: datetime | None = None,
    status: str = "counted",
) -> dict[str, Any]:
    return {
        "ack_id": ack_id,
        "cm_id": cm_id,
        "destination": destination,
        "recipient": recipient,
        "receiver": receiver,
        "kind": "commit" if committed_at is not None else "read",
        "read_at": read_at,
        "committed_at": committed_at,
        "received_at": received_at or (committed_at or read_at) + timedelta(milliseconds=5),
        "status": status,
    }
