"""``condmsg status ID``: a conditional message's condition tree, acks and verdict, or a
Dependency-Sphere with its participants and every member's tree. Exit codes:
:mod:`condmsg.exit_codes`."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from condmsg import sender_tables
from condmsg.acks import Ack, AckKind
from condmsg.cli.options import add_db_url, named_db_url
from condmsg.cli.status_view import contradiction, render
from condmsg.condition_codec import condition_from_json
from condmsg.db import describe_db_url, make_engine
from condmsg.evaluation import evaluate
from condmsg.exit_codes import FAILED, OK, add_command
from condmsg.settings import Settings
from condmsg.sphere_store import SPHERES, SphereRow
from condmsg.timeutil import iso, stored_instant, utcnow


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "status",
        help="show a conditional message's tree and verdict, or a sphere's",
        description="Show a CM's condition tree with the acks that count for each node and "
        "its verdict (as decided, or as it stands now if pending), or a Dependency-Sphere "
        "with its participants and its members' trees. Reads the sender store only.",
    )
    parser.add_argument("cm_id", metavar="ID", help="a CM id or a sphere id")
    add_db_url(parser, "the sender store")
    parser.set_defaults(handler=run, schema_store="sender")


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else stored_instant(value)


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    engine = make_engine(named_db_url(args, existing=True))
    with engine.connect() as conn:
        cm = conn.execute(
            sa.select(sender_tables.cms).where(sender_tables.cms.c.cm_id == args.cm_id)
        ).first()
        if cm is not None:
            _show_cm(conn, cm, settings)
            return OK
        sphere = SPHERES.sphere(conn, args.cm_id)
        if sphere is None:
            print(
                f"condmsg status: no conditional message or sphere {args.cm_id!r} in "
                f"{describe_db_url(str(engine.url))}; check the id and the store (retention "
                "may have archived and deleted it: see its archives)",
                file=sys.stderr,
            )
            return FAILED
        _show_sphere(conn, sphere, settings)
    return OK


def _show_sphere(conn: sa.Connection, sphere: SphereRow, settings: Settings) -> None:
    """The sphere, its participants, then each member's tree."""
    print(
        f"sphere {sphere.sphere_id} from {sphere.sender}, begun {iso(sphere.begun_at)}, "
        f"deadline {iso(sphere.deadline)}, state {sphere.state}"
    )
    if sphere.committed_at is not None:
        print(f"committed {iso(sphere.committed_at)}")
    if sphere.aborted_at is not None:
        print(f"aborted {iso(sphere.aborted_at)}: {sphere.abort_reason}")
    outcome = sphere.outcome()
    if outcome is not None:
        print(f"decided {iso(outcome.decided_at)} (effective {iso(outcome.effective_at)})")
        for reason in outcome.reasons:
            print(f"  {reason}")
        # As the outcome recorded them; each member's tree below shows it as it is now.
        print("members when it was decided:")
        for cm_id, verdict in sorted(outcome.members.items()):
            print(f"  {cm_id}: {verdict}")
    participants = SPHERES.participants(conn, sphere.sphere_id)
    if participants:
        print("participants:")
        for p in participants:
            what = p.resource if p.kind != "handler" else f"{p.resource} on {p.run_on}"
            detail = f" ({p.detail})" if p.detail else ""
            print(f"  {p.participant_id}: {p.kind} {what}, {p.state}{detail}")
    members = SPHERES.members(conn, [sphere.sphere_id])[sphere.sphere_id]
    print(f"members: {len(members)}")
    cms = sender_tables.cms
    for member in members:
        print()
        row = conn.execute(sa.select(cms).where(cms.c.cm_id == member.cm_id)).one()
        _show_cm(conn, row, settings)


def _show_cm(conn: sa.Connection, cm: Any, settings: Settings) -> None:
    rows = conn.execute(
        sa.select(sender_tables.acks)
        .where(sender_tables.acks.c.cm_id == cm.cm_id)
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
    sphere = f", member of sphere {cm.sphere_id}" if cm.sphere_id else ""
    print(f"cm {cm.cm_id} from {cm.sender}, sent {iso(sent_at)}, state {cm.state}{sphere}")
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


def _ack(row: Any) -> Ack:
    return Ack(
        destination=row.destination,
        kind=AckKind(row.kind),
        read_at=_utc(row.read_at),  # type: ignore[arg-type]
        committed_at=_utc(row.committed_at),
        recipient=row.recipient,
    )
