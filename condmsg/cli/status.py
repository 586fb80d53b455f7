"""``condmsg status ID``: a conditional message's condition tree, acks and verdict, or a
Dependency-Sphere with its participants and every member's tree. Exit codes:
:mod:`condmsg.runtime.exit_codes`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import sqlalchemy as sa

from condmsg import tables
from condmsg.cli.options import add_db_url, named_db_url
from condmsg.cli.status_view import render
from condmsg.cm_status import cm_status
from condmsg.core.timeutil import iso, stored_instant
from condmsg.runtime.db import describe_db_url, make_engine
from condmsg.runtime.exit_codes import FAILED, OK, add_command
from condmsg.runtime.settings import Settings
from condmsg.spheres.store import SPHERES, SphereRow


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


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    engine = make_engine(named_db_url(args, existing=True))
    with engine.connect() as conn:
        cm = conn.execute(sa.select(tables.cms).where(tables.cms.c.cm_id == args.cm_id)).first()
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
    cms = tables.cms
    for member in members:
        print()
        row = conn.execute(sa.select(cms).where(cms.c.cm_id == member.cm_id)).one()
        _show_cm(conn, row, settings)


def _show_cm(conn: sa.Connection, cm: Any, settings: Settings) -> None:
    # A decided CM is shown as it was decided; a pending one as it stands now.
    status = cm_status(conn, cm, settings.ack_grace)
    sphere = f", member of sphere {cm.sphere_id}" if cm.sphere_id else ""
    print(f"cm {cm.cm_id} from {cm.sender}, sent {iso(status.sent_at)}, state {cm.state}{sphere}")
    if cm.decided_at is not None:
        decided = iso(stored_instant(cm.decided_at))
        print(f"decided {decided} (effective {iso(status.judged_at)}) by {cm.decided_by}")
        if status.stored_reasons_differ:
            print("warning: the stored reasons differ from a re-evaluation", file=sys.stderr)
        if status.contradiction is not None:
            print(f"warning: {status.contradiction}")
    print()
    print(render(status.condition, status.result, status.counted))
