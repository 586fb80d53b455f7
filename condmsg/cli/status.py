"""``condmsg status CM_ID``: a conditional message's condition tree, acks and verdict."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from condmsg import sender_tables
from condmsg.acks import Ack, AckKind
from condmsg.cli.options import named_db_url
from condmsg.cli.status_view import contradiction, render
from condmsg.condition_codec import condition_from_json
from condmsg.db import make_engine
from condmsg.evaluation import evaluate
from condmsg.settings import Settings
from condmsg.timeutil import iso, utcnow


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("status", help="show a conditional message's tree and verdict")
    parser.add_argument("cm_id")
    parser.add_argument("--db-url", help="default: CONDMSG_DB_URL")
    parser.set_defaults(handler=run)


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    engine = make_engine(named_db_url(args, existing=True))
    with engine.connect() as conn:
        cm = conn.execute(
            sa.select(sender_tables.cms).where(sender_tables.cms.c.cm_id == args.cm_id)
        ).first()
        if cm is None:
            print(f"condmsg status: no conditional message {args.cm_id!r}", file=sys.stderr)
            return 1
        rows = conn.execute(
            sa.select(sender_tables.acks)
            .where(sender_tables.acks.c.cm_id == args.cm_id)
            .order_by(sender_tables.acks.c.received_at)
        ).all()
    counted = sender_tables.AckStatus.COUNTED.value
    acks = [_ack(r) for r in rows if r.status == counted]
    late = [_ack(r) for r in rows if r.status != counted]
    condition = condition_from_json(cm.condition_json)
    sent_at = _utc(cm.sent_at)
    assert sent_at is not None
    # A decided CM is shown as it was decided; a pending one as it stands now.
    at = _utc(cm.effective_at) or (utcnow() - settings.ack_grace)
    result = evaluate(condition, sent_at, acks, at)
    print(f"cm {cm.cm_id} from {cm.sender}, sent {iso(sent_at)}, state {cm.state}")
    if cm.decided_at is not None:
        print(f"decided {iso(_utc(cm.decided_at))} (effective {iso(at)}) by {cm.decided_by}")  # type: ignore[arg-type]
        stored = json.loads(cm.reasons_json or "[]")
        if list(result.reasons) != stored:
            print("warning: the stored reasons differ from a re-evaluation", file=sys.stderr)
        if late:
            with_late = evaluate(condition, sent_at, [*acks, *late], at)
            contradicted = contradiction(cm.state, with_late, len(late))
            if contradicted is not None:
                print(f"warning: {contradicted}")
    print()
    print(render(condition, result, acks))
    return 0


def _ack(row: Any) -> Ack:
    return Ack(
        destination=row.destination,
        kind=AckKind(row.kind),
        read_at=_utc(row.read_at),  # type: ignore[arg-type]
        committed_at=_utc(row.committed_at),
        recipient=row.recipient,
    )
