"""Schema migrations: the migrated schema is the models' schema, old stores are adopted,
and a store that is missing, behind or ahead is refused with one line naming the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from ackd import tables as receiver_tables
from condmsg import tables
from condmsg.runtime import migrate
from condmsg.tables import create_tables as create_sender_tables
from outbox.table import create_tables as create_outbox_tables
from outbox.table import metadata as outbox_metadata
from outbox.table import outbox_table

ROOT = Path(__file__).resolve().parents[3]
outbox_table()  # the default outbox table, in the outbox package's metadata

MODELS = {
    "outbox": outbox_metadata,
    "sender": tables.metadata,
    "receiver": receiver_tables.metadata,
}


def _drift(conn: sa.Connection, metadata: sa.MetaData) -> list[Any]:
    """What differs between the database and ``metadata``, for ``metadata``'s tables."""

    def ours(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        if type_ == "table":
            return name in metadata.tables
        return True

    context = MigrationContext.configure(conn, opts={"include_object": ours, "compare_type": True})
    return list(compare_metadata(context, metadata))


@pytest.mark.parametrize("store", ["sender", "receiver"])
def test_upgrade_creates_the_schema_the_models_declare(db_url: str, store: str) -> None:
    engine = sa.create_engine(db_url)
    done = migrate.upgrade(engine, store)
    assert done.state is migrate.SchemaState.CURRENT
    with engine.connect() as conn:
        assert _drift(conn, MODELS[store]) == []
        assert _drift(conn, MODELS["outbox"]) == []
    migrate.check(engine, store)
    assert migrate.upgrade(engine, store) == done  # again: nothing to do
    engine.dispose()


def test_outbox_tables_the_outbox_creates_vacuum_at_a_fixed_threshold(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    migrate.upgrade(engine, "receiver")  # storage options are no schema revision: unset
    # An application's own outbox, in its own metadata (the outbox package's would keep it).
    outbox_table("app_outbox", metadata=sa.MetaData()).metadata.create_all(engine)
    with engine.connect() as conn:
        options = dict(
            conn.execute(
                sa.text(
                    "SELECT relname, reloptions FROM pg_class WHERE relnamespace = "
                    "current_schema()::regnamespace AND relname LIKE '%outbox'"
                )
            ).all()
        )
    engine.dispose()
    expected = [
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=1000",
        "autovacuum_vacuum_cost_delay=0",
    ]
    assert options == {"condmsg_outbox": None, "app_outbox": expected}


def test_a_store_made_before_versioning_is_adopted(db_url: str) -> None:
    engine = sa.create_engine(db_url)
    create_sender_tables(engine)
    receiver_tables.metadata.create_all(engine)
    with pytest.raises(migrate.SchemaError, match="missing"):
        migrate.check(engine, "sender")
    migrate.upgrade(engine, "sender")
    migrate.upgrade(engine, "receiver")
    assert migrate.revisions(engine) == {
        "outbox": migrate.head("outbox"),
        "sender": migrate.head("sender"),
        "receiver": migrate.head("receiver"),
    }
    migrate.check(engine, "receiver")
    engine.dispose()


def test_an_old_outbox_gains_its_later_column_when_adopted(sqlite_url: str) -> None:
    engine = sa.create_engine(sqlite_url)
    create_outbox_tables(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE condmsg_outbox DROP COLUMN copies"))
    migrate.upgrade(engine, "outbox")
    with engine.connect() as conn:
        assert _drift(conn, MODELS["outbox"]) == []
    engine.dispose()


def test_spheres_decided_before_sender_0003_get_their_members_verdicts(db_url: str) -> None:
    """A member decided at or before its sphere's decision keeps its verdict; one decided
    later, or not yet, was pending then."""
    engine = sa.create_engine(db_url)
    migrate.upgrade(engine, "sender")
    t0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
    spheres, cms = tables.spheres, tables.cms
    with engine.begin() as conn:
        conn.execute(
            sa.insert(spheres),
            [
                {
                    "sphere_id": sphere_id,
                    "sender": "s",
                    "begun_at": t0,
                    "deadline": t0 + timedelta(minutes=1),
                    "members": members,
                    "state": state,
                    "decided_at": None if state == "open" else t0 + timedelta(seconds=10),
                }
                for sphere_id, members, state in (
                    ("decided", 4, "violated"),
                    ("empty", 0, "violated"),
                    ("open", 1, "open"),
                )
            ],
        )
        conn.execute(
            sa.insert(cms),
            [
                {
                    "cm_id": cm_id,
                    "sender": "s",
                    "sent_at": t0,
                    "condition_json": "{}",
                    "evaluation_deadline": t0 + timedelta(minutes=1),
                    "payload_size": 0,
                    "sphere_id": sphere_id,
                    "state": state,
                    "decided_at": None if at is None else t0 + timedelta(seconds=at),
                }
                for cm_id, sphere_id, state, at in (
                    ("before", "decided", "satisfied", 5),
                    ("with", "decided", "violated", 10),
                    ("after", "decided", "violated", 20),
                    ("still", "decided", "pending", None),
                    ("other", "open", "satisfied", 5),
                )
            ],
        )
        conn.execute(sa.text("ALTER TABLE condmsg_sphere DROP COLUMN member_verdicts_json"))
        version = sa.table(migrate.VERSION_TABLE, sa.column("version_num"))
        conn.execute(
            sa.update(version)
            .where(version.c.version_num == migrate.head("sender"))
            .values(version_num="sender_0002")
        )
    migrate.upgrade(engine, "sender")
    with engine.connect() as conn:
        assert _drift(conn, MODELS["sender"]) == []
        rows = conn.execute(sa.select(spheres.c.sphere_id, spheres.c.member_verdicts_json))
        stored = {row.sphere_id: row.member_verdicts_json for row in rows}
    assert json.loads(stored["decided"]) == {
        "before": "satisfied",
        "with": "violated",
        "after": "pending",
        "still": "pending",
    }
    assert json.loads(stored["empty"]) == {}
    assert stored["open"] is None
    engine.dispose()


@pytest.mark.parametrize(
    ("revision", "said"),
    [
        (None, "missing .* create it with: condmsg db upgrade --store sender"),
        ("sender_0000", "behind .* upgrade it with: condmsg db upgrade --store sender"),
        ("sender_9999", "ahead .* a newer release of condmsg wrote it: upgrade condmsg"),
    ],
)
def test_check_refuses_a_store_not_at_this_release(
    db_url: str, revision: str | None, said: str
) -> None:
    engine = sa.create_engine(db_url)
    migrate.upgrade(engine, "sender")
    with engine.begin() as conn:
        version = sa.table(migrate.VERSION_TABLE, sa.column("version_num"))
        stored = version.c.version_num == migrate.head("sender")
        if revision is None:
            conn.execute(sa.delete(version).where(stored))
        else:
            conn.execute(sa.update(version).where(stored).values(version_num=revision))
    with pytest.raises(migrate.SchemaError, match=said) as refused:
        migrate.check(engine, "sender")
    assert "\n" not in str(refused.value)
    engine.dispose()


def _db(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "condmsg.cli", "db", *args],
        cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if k != "CONDMSG_DB_URL"}, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_db_command_upgrades_checks_and_explains(tmp_path: Path, pg_url: str) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    refused = _db("check", "--db-url", url)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "condmsg db upgrade" in refused.stderr
    assert _db("upgrade", "--store", "receiver", "--db-url", url).returncode == 0
    current = _db("current", env={"CONDMSG_DB_URL": url})
    assert current.returncode == 0
    assert "receiver: receiver_0001 (current" in current.stdout
    assert "sender: - (missing" in current.stdout
    assert _db("check", "--store", "receiver", "--db-url", url).returncode == 0

    unnamed = _db("current")
    assert unnamed.returncode == 2 and "--db-url or CONDMSG_DB_URL" in unnamed.stderr
    assert not (ROOT / "condmsg.db").exists()

    wrong = pg_url.replace("/test", "/no_such_database")
    missing = _db("check", "--db-url", wrong)
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and "no_such_database" in missing.stderr
    assert "Traceback" not in missing.stderr


# -- endpoints and services check their store at start ------------------------------------


def test_sender_and_receiver_refuse_a_missing_store_unless_asked_to_create_it(
    db_url: str, amqp_url: str
) -> None:
    from ackd import Receiver
    from condmsg.sending.sender import Sender

    with pytest.raises(migrate.SchemaError, match="create it with: condmsg db upgrade --store"):
        Sender(amqp_url=amqp_url, db_url=db_url, name="s", declare_queues=False)
    with pytest.raises(migrate.SchemaError, match="--store receiver"):
        Receiver(amqp_url=amqp_url, db_url=db_url, recipient="r")
    sender = Sender(
        amqp_url=amqp_url, db_url=db_url, name="s", declare_queues=False, create_schema=True
    )
    receiver = Receiver(amqp_url=amqp_url, db_url=db_url, recipient="r", create_schema=True)
    # Created through the migrations: versioned, and at this release's revision.
    migrate.check(sender.engine, "sender")
    migrate.check(receiver.engine, "receiver")
    Sender(amqp_url=amqp_url, db_url=db_url, name="s", declare_queues=False)  # now it exists
    sender.engine.dispose()
    receiver.engine.dispose()


def test_a_column_dropped_by_hand_is_named(pg_url: str, amqp_url: str) -> None:
    from condmsg.sending.sender import Sender

    engine = sa.create_engine(pg_url)
    migrate.upgrade(engine, "sender")
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE condmsg_cm DROP COLUMN facts_json"))
    message = r"table condmsg_cm lacks column\(s\) facts_json \(changed outside"
    with pytest.raises(migrate.SchemaError, match=message):
        Sender(amqp_url=amqp_url, db_url=pg_url, name="s", declare_queues=False, create_schema=True)
    engine.dispose()


def test_the_evaluator_refuses_to_start_on_a_changed_store_with_one_line(
    pg_url: str, amqp_url: str, unique_name: str
) -> None:
    engine = sa.create_engine(pg_url)
    migrate.upgrade(engine, "sender")
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE condmsg_cm DROP COLUMN facts_json"))
    engine.dispose()
    env = {**os.environ, "CONDMSG_DB_URL": pg_url, "CONDMSG_AMQP_URL": amqp_url}
    done = subprocess.run(
        [sys.executable, "-m", "evaluator", "--sender", unique_name.replace(".", "-")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr  # a configuration error (docs/cli.md)
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, done.stderr
    assert "cannot start" in errors[0] and "lacks column(s) facts_json" in errors[0]
    assert "Traceback" not in done.stderr


def test_the_relay_refuses_a_database_without_an_outbox(pg_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "condmsg.cli", "relay", "--db-url", pg_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "the outbox store" in line and "is missing" in line and "condmsg db upgrade" in line
