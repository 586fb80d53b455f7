"""Retention (evaluator/retention.py) on the real SQLite and PostgreSQL stores.

The store is filled through the real ``Sender`` and the evaluator's own intake and sweep,
with a controlled clock: CMs decided ten days ago (satisfied, violated with released
compensations, with late and duplicate acks), a CM sent then and still pending, one sent
then and decided an hour ago, a recent one, and orphans (anomalies and an ack row without a
CM), old and recent. Retention at seven days must archive exactly the old decided CMs with
everything of theirs, and the old orphans, and delete exactly that.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from condmsg import Destination, tables
from condmsg.archive.layout import MANIFEST, TABLES, TABLES_BY_NAME, arrow_schema
from condmsg.cli import main
from condmsg.core.errors import ConfigError
from condmsg.core.timeutil import utcnow
from condmsg.runtime.settings import Settings, parse_duration
from evaluator import archive as archive_module
from evaluator.archive import PART, ArchiveError
from evaluator.config import EvaluatorConfig
from evaluator.retention import RetentionPolicy, retain
from evaluator.service import Evaluator
from tests.integration.condmsg_helpers import SECRET, Clock, ack_body
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres]

RETENTION = timedelta(days=7)
NOW = utcnow()
OLD = NOW - timedelta(days=10)
RECENT = NOW - timedelta(hours=1)

#: Primary key columns per layout table.
KEYS = {
    "cms": ("cm_id",),
    "copies": ("cm_id", "destination"),
    "compensations": ("cm_id", "destination"),
    "acks": ("ack_id",),
    "anomalies": ("id",),
}
STORE = {
    "cms": tables.cms,
    "copies": tables.copies,
    "compensations": tables.compensations,
}
STORE |= {"acks": tables.acks, "anomalies": tables.anomalies}


@dataclass
class Store:
    url: str
    engine: sa.Engine
    evaluator: Evaluator
    clock: Clock
    queue: Callable[[str], str]
    old: set[str] = field(default_factory=set)  # decided before the cutoff
    kept: set[str] = field(default_factory=set)  # every other CM

    def ack(self, cm_id: str, destination: str, at: datetime, **overrides: Any) -> bytes:
        return ack_body(cm_id, destination, at, **({"receiver": "test-rx"} | overrides))

    def at(self, when: datetime, bodies: list[bytes]) -> None:
        self.clock.at = when
        self.evaluator.process_bodies(bodies)


@pytest.fixture
def make_store(unique_name: str, make_sender: Any) -> Any:
    """``make_store(db_url, extra_old=4)``: the store described above, with ``1 + extra_old``
    satisfied CMs decided ten days ago."""
    made: list[Store] = []

    def factory(db_url: str, *, extra_old: int = 4) -> Store:
        made.append(_store(db_url, unique_name, make_sender, extra_old))
        return made[-1]

    yield factory
    for s in made:
        s.evaluator.engine.dispose()


@pytest.fixture
def store(db_url: str, make_store: Any) -> Store:
    return make_store(db_url)  # type: ignore[no-any-return]


def _store(db_url: str, unique_name: str, make_sender: Any, extra_old: int) -> Store:
    name = unique_name.replace(".", "-")
    clock = Clock(OLD)
    sender = make_sender(db_url, name, clock=clock, declare_queues=False)
    evaluator = Evaluator(
        EvaluatorConfig(
            amqp_url=sender.amqp_url,
            sender=name,
            secret=SECRET,
            ack_grace=timedelta(milliseconds=100),
            relay=False,
        ),
        engine=sender.engine,
        clock=clock,
    )
    s = Store(db_url, sender.engine, evaluator, clock, lambda q: f"{unique_name}.{q}")
    quick = Destination(s.queue("a"), pickup_within=timedelta(minutes=1))
    # Satisfied ten days ago; one of them gets a late ack and a redelivered one.
    satisfied = [sender.send(b"a", quick) for _ in range(1 + extra_old)]
    s.at(
        OLD + timedelta(seconds=2),
        [s.ack(c, quick.name, OLD + timedelta(seconds=1)) for c in satisfied],
    )
    late = s.ack(satisfied[0], quick.name, OLD + timedelta(seconds=1))
    s.at(OLD + timedelta(days=1), [late, late])
    # Violated ten days ago (nobody read it): its compensation is released.
    s.clock.at = OLD
    violated = sender.send(b"b", quick, compensation=b"undo")
    s.clock.at = OLD + timedelta(hours=1)
    assert s.evaluator.sweep() == 1
    s.old |= {*satisfied, violated}
    # Sent ten days ago, still pending; with an anomaly (a forged ack) as old as itself.
    s.clock.at = OLD
    slow = Destination(s.queue("c"), pickup_within=timedelta(days=30))
    pending = sender.send(b"c", slow)
    s.at(OLD, [s.ack(pending, slow.name, OLD, token="0" * 64)])
    # Sent ten days ago, decided an hour ago.
    s.clock.at = OLD
    later = Destination(s.queue("d"), pickup_within=timedelta(days=20))
    decided_recently = sender.send(b"d", later)
    s.at(RECENT, [s.ack(decided_recently, later.name, RECENT)])
    # Sent and decided an hour ago.
    s.clock.at = RECENT
    recent = sender.send(b"e", quick)
    s.at(RECENT + timedelta(seconds=2), [s.ack(recent, quick.name, RECENT)])
    s.kept |= {pending, decided_recently, recent}
    # Orphans: unknown-CM anomalies and ack rows without a CM, old and recent.
    for when in (OLD, RECENT):
        s.at(when, [s.ack(str(uuid.uuid4()), quick.name, when)])
        with s.engine.begin() as conn:
            conn.execute(sa.insert(tables.acks), [_orphan_ack(when)])
    states = _snapshot(s.engine)["cms"]
    assert {states[(c,)]["state"] for c in satisfied} == {"satisfied"}
    assert states[(violated,)]["state"] == "violated"
    assert states[(pending,)]["state"] == "pending"
    return s


def _orphan_ack(at: datetime) -> dict[str, Any]:
    return {
        "ack_id": uuid.uuid4().hex,
        "cm_id": str(uuid.uuid4()),
        "destination": "nowhere",
        "recipient": None,
        "receiver": "test-rx",
        "kind": "read",
        "read_at": at,
        "committed_at": None,
        "received_at": at,
        "status": "counted",
    }


def _utc(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value


def _snapshot(engine: sa.Engine) -> dict[str, dict[tuple[Any, ...], dict[str, Any]]]:
    """Every row of every retained table, by primary key, in layout columns."""
    found: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}
    with engine.connect() as conn:
        for name, table in STORE.items():
            rows = [
                {k: _utc(v) for k, v in r._mapping.items()} for r in conn.execute(sa.select(table))
            ]
            for row in rows:
                if "body" in row:
                    row["body_bytes"] = len(row.pop("body"))
            found[name] = {tuple(row[k] for k in KEYS[name]): row for row in rows}
    return found


def _archives(root: Path) -> list[Path]:
    return sorted(d for d in root.iterdir() if not d.name.startswith("."))


def _read_archives(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Every archived row per layout table, checking the layout of each directory."""
    found: dict[str, list[dict[str, Any]]] = {table.name: [] for table in TABLES}
    for directory in _archives(root):
        manifest = json.loads((directory / MANIFEST).read_text())
        for table in TABLES:
            data = pq.read_table(directory / table.name / PART)
            assert data.schema == arrow_schema(table), (directory, table.name)
            assert manifest["tables"][table.name] == data.num_rows
            found[table.name] += data.to_pylist()
        assert manifest["retention"]["older_than_s"] == RETENTION.total_seconds()
    return found


def _policy(root: Path, batch: int = 3) -> RetentionPolicy:
    return RetentionPolicy(older_than=RETENTION, archive=root, batch=batch)


def test_old_decided_cms_are_archived_then_deleted_and_nothing_else(
    store: Store, tmp_path: Path
) -> None:
    before = _snapshot(store.engine)
    archived = retain(store.engine, _policy(tmp_path / "archive"), clock=lambda: NOW)

    after = _snapshot(store.engine)
    assert len(archived) == 2  # 6 old CMs in batches of 3; the orphans fit in the first
    assert [a.directory for a in archived] == _archives(tmp_path / "archive")
    for name, rows in after.items():
        assert rows == {k: v for k, v in before[name].items() if k in rows}, name
    removed = {name: before[name].keys() - after[name].keys() for name in before}
    assert {k[0] for k in removed["cms"]} == store.old
    assert {k[0] for k in after["cms"]} == store.kept
    # Everything hanging off the old CMs went with them: late and duplicate-ack anomalies,
    # the violated CM's compensation; plus exactly the old orphans.
    old_of = {
        name: {k for k, r in before[name].items() if r["cm_id"] in store.old} for name in STORE
    }
    assert (
        removed["copies"] == old_of["copies"]
        and removed["compensations"] == old_of["compensations"]
    )
    cms = {k[0] for k in before["cms"]}
    orphans = {k for k, r in before["acks"].items() if r["cm_id"] not in cms}
    old_orphan = {k for k in orphans if before["acks"][k]["received_at"] == OLD}
    assert len(orphans) == 2 and len(old_orphan) == 1
    assert removed["acks"] == old_of["acks"] | old_orphan
    kinds = sorted(before["anomalies"][k]["kind"] for k in removed["anomalies"])
    assert kinds == ["after_decision", "duplicate", "unknown_cm"]
    assert {r["kind"] for r in after["anomalies"].values()} == {"bad_token", "unknown_cm"}

    # The archives hold exactly the deleted rows, once, as the store had them.
    read = _read_archives(tmp_path / "archive")
    for name, archived_rows in read.items():
        keys = [tuple(r[k] for k in KEYS[name]) for r in archived_rows]
        assert len(keys) == len(set(keys)) and set(keys) == removed[name], name
        for row in archived_rows:
            stored = before[name][tuple(row[k] for k in KEYS[name])]
            assert row == {c: stored[c] for c in TABLES_BY_NAME[name].column_names}, name
    assert sum(a.total for a in archived) == sum(len(r) for r in removed.values())

    # A second pass finds nothing left to do.
    assert retain(store.engine, _policy(tmp_path / "archive"), clock=lambda: NOW) == []


def test_an_archive_that_cannot_be_written_deletes_nothing(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _snapshot(store.engine)
    not_a_directory = tmp_path / "archive"
    not_a_directory.write_text("a file where the archive directory should be")
    with pytest.raises(ArchiveError, match="cannot write the archive"):
        retain(store.engine, _policy(not_a_directory), clock=lambda: NOW)
    assert _snapshot(store.engine) == before

    # A failure after the tables are written, before the rename: no partial archive.
    def broken_manifest(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(archive_module, "write_manifest", broken_manifest)
    root = tmp_path / "full"
    with pytest.raises(ArchiveError, match="No space left"):
        retain(store.engine, _policy(root), clock=lambda: NOW)
    assert _snapshot(store.engine) == before
    assert list(root.iterdir()) == []

    monkeypatch.undo()
    assert len(retain(store.engine, _policy(root), clock=lambda: NOW)) == 2


def test_without_pyarrow_a_pass_deletes_nothing(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An evaluator installed without the audit extra cannot write archives, so its
    retention passes fail and keep every row (docs/evaluator.md)."""
    before = _snapshot(store.engine)
    for name in ("pyarrow", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of it fails, as when absent
    root = tmp_path / "archive"
    with pytest.raises(ImportError, match="pyarrow"):
        retain(store.engine, _policy(root), clock=lambda: NOW)
    assert _snapshot(store.engine) == before
    assert not root.exists() or list(root.iterdir()) == []


def test_concurrent_passes_on_postgresql_never_archive_a_cm_twice(
    pg_url: str, make_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = make_store(pg_url, extra_old=150)
    # Both passes must be inside their first batch (claims held, deletes uncommitted) at the
    # same time: each waits for the other before writing its first archive.
    both_claimed = threading.Barrier(2, timeout=30)
    real_write = archive_module.write_archive
    first = threading.local()

    def write_when_both_hold_a_batch(*args: Any, **kwargs: Any) -> Path:
        if not getattr(first, "done", False):
            first.done = True
            both_claimed.wait()
        return real_write(*args, **kwargs)

    monkeypatch.setattr("evaluator.retention.write_archive", write_when_both_hold_a_batch)
    results: dict[str, Any] = {}

    def run(who: str) -> None:
        try:
            results[who] = retain(s.engine, _policy(tmp_path / who, batch=10), clock=lambda: NOW)
        except BaseException as exc:
            results[who] = exc

    threads = [threading.Thread(target=run, args=(who,)) for who in ("one", "two")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(isinstance(r, list) and r for r in results.values()), results
    archived = {who: _read_archives(tmp_path / who) for who in results}
    ids = {who: [r["cm_id"] for r in rows["cms"]] for who, rows in archived.items()}
    assert not set(ids["one"]) & set(ids["two"])
    assert sorted(ids["one"] + ids["two"]) == sorted(s.old)
    acks = [r["ack_id"] for rows in archived.values() for r in rows["acks"]]
    anomalies = [r["id"] for rows in archived.values() for r in rows["anomalies"]]
    assert len(acks) == len(set(acks)) and len(anomalies) == len(set(anomalies))
    assert {k[0] for k in _snapshot(s.engine)["cms"]} == s.kept


@pytest.mark.rabbitmq
def test_the_scheduled_job_runs_inside_a_running_evaluator(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "archive"
    service = Evaluator(
        EvaluatorConfig(
            amqp_url=store.evaluator.config.amqp_url,
            sender=store.evaluator.config.sender,
            secret=SECRET,
            relay=False,
            retention=RETENTION,
            retention_archive=root,
            retention_interval_s=0.2,
            retention_batch=4,
        ),
        engine=store.engine,
    )
    with service:

        def cms_left() -> set[str]:
            return {k[0] for k in _snapshot(store.engine)["cms"]}

        wait_for(lambda: cms_left() == store.kept, timeout=20)
        metric = service.registry.get_sample_value
        wait_for(
            lambda: (
                metric("condmsg_evaluator_retention_rows_total", {"table": "cms"}) == len(store.old)
            )
        )
    assert len(_read_archives(root)["cms"]) == len(store.old)
    assert metric("condmsg_evaluator_retention_archives_total") == len(_archives(root))
    assert metric("condmsg_evaluator_retention_failures_total") == 0


def test_condmsg_retention_command(
    sqlite_url: str, make_store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = make_store(sqlite_url)
    root = tmp_path / "archive"
    argv = ["retention", "--older-than", "7d", "--archive", str(root), "--db-url", sqlite_url]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"archived and deleted {len(s.old)} CMs" in out
    assert {k[0] for k in _snapshot(s.engine)["cms"]} == s.kept
    assert len(_read_archives(root)["cms"]) == len(s.old)
    with pytest.raises(SystemExit):
        main(["retention", "--older-than", "7 days", "--archive", str(root)])
    assert "positive duration with a unit" in capsys.readouterr().err


def test_retention_settings_and_configuration_errors(tmp_path: Path) -> None:
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("90m") == timedelta(minutes=90)
    assert parse_duration("500ms") == timedelta(milliseconds=500)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    for bad in ("7", "0d", "-1d", "7 days", ""):
        with pytest.raises(ConfigError, match="CONDMSG_RETENTION"):
            parse_duration(bad, "CONDMSG_RETENTION")
    env = {"CONDMSG_RETENTION": "2w", "CONDMSG_ARCHIVE_DIR": str(tmp_path)}
    settings = Settings.from_env(env | {"CONDMSG_RETENTION_INTERVAL_S": "60"})
    assert settings.retention == timedelta(weeks=2)
    assert settings.archive_dir == tmp_path and settings.retention_interval_s == 60
    assert Settings.from_env({}).retention is None
    with pytest.raises(ConfigError, match="CONDMSG_RETENTION_INTERVAL_S"):
        Settings.from_env(env | {"CONDMSG_RETENTION_INTERVAL_S": "soon"})
    with pytest.raises(ConfigError, match="archive directory"):
        EvaluatorConfig(
            amqp_url="amqp://unused", sender="s", db_url="sqlite://", retention=RETENTION
        )
    with pytest.raises(ConfigError, match="positive"):
        RetentionPolicy(older_than=timedelta(0), archive=tmp_path)


def test_a_sphere_is_archived_with_all_its_members_or_not_at_all(
    db_url: str, unique_name: str, make_sender: Any, tmp_path: Path
) -> None:
    """A sphere is judged from its members, so a sphere and its members leave the store
    together: once the sphere and every member were decided before the cutoff and no
    participant's work is open. Its participant rows go into the manifest."""
    sender = make_sender(db_url, unique_name.replace(".", "-"), clock=lambda: OLD)
    condition = Destination(f"{unique_name}.q", pickup_within=timedelta(minutes=1))
    spheres, cms = tables.spheres, tables.cms
    participants = tables.sphere_participants
    members: dict[str, list[str]] = {}
    for name, count in (("waiting", 1), ("done", 2), ("late_member", 2), ("open_work", 1)):
        sphere = sender.begin_sphere(timeout=timedelta(days=30))
        members[name] = [sphere.send(b"x", condition) for _ in range(count)]
        members[name].insert(0, sphere.sphere_id)
    ids = {name: found[0] for name, found in members.items()}
    decided = {"state": "violated", "decided_at": OLD, "effective_at": OLD}
    with sender.engine.begin() as conn:  # every member decided ten days ago, but one
        conn.execute(sa.update(cms).values(state="satisfied", decided_at=OLD, effective_at=OLD))
        conn.execute(
            sa.update(cms)
            .where(cms.c.cm_id == members["late_member"][2])
            .values(decided_at=RECENT, effective_at=RECENT)
        )
        conn.execute(
            sa.update(spheres).where(spheres.c.sphere_id != ids["waiting"]).values(**decided)
        )
        conn.execute(
            sa.insert(participants),
            [
                {
                    "sphere_id": ids["done"],
                    "participant_id": "handler-0",
                    "kind": "handler",
                    "resource": "release",
                    "run_on": "violated",
                    "state": "ran",
                    "enlisted_at": OLD,
                    "resolved_at": OLD,
                },
                {
                    "sphere_id": ids["open_work"],
                    "participant_id": "pg-gid-1",
                    "kind": "postgresql",
                    "resource": "postgresql://db/app",
                    "run_on": None,
                    "state": "prepared",
                    "enlisted_at": OLD,
                    "resolved_at": None,
                },
            ],
        )
    archived = retain(sender.engine, _policy(tmp_path / "archive"), clock=lambda: NOW)

    with sender.engine.connect() as conn:
        left_cms = set(conn.scalars(sa.select(cms.c.cm_id)))
        left_spheres = set(conn.scalars(sa.select(spheres.c.sphere_id)))
        left_participants = set(conn.scalars(sa.select(participants.c.participant_id)))
    kept = ("waiting", "late_member", "open_work")
    assert left_spheres == {ids[name] for name in kept}
    assert left_cms == {cm for name in kept for cm in members[name][1:]}
    assert left_participants == {"pg-gid-1"}
    (archive,) = archived
    assert archive.rows["spheres"] == 1 and archive.rows["cms"] == 2
    (row,) = pq.read_table(archive.directory / "spheres" / PART).to_pylist()
    assert (row["sphere_id"], row["state"], row["members"]) == (ids["done"], "violated", 2)
    archived_cms = pq.read_table(archive.directory / "cms" / PART).column("cm_id").to_pylist()
    assert sorted(archived_cms) == sorted(members["done"][1:])
    manifest = json.loads((archive.directory / MANIFEST).read_text())
    (handler,) = manifest["retention"]["sphere_participants"]
    assert (handler["sphere_id"], handler["state"]) == (ids["done"], "ran")
    assert retain(sender.engine, _policy(tmp_path / "archive"), clock=lambda: NOW) == []
