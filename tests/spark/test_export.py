"""``condmsg export`` (SQLAlchemy + pyarrow, no Spark) on a SQLite store."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import sqlalchemy as sa

from condmsg import tables as st
from condmsg.archive.layout import ALL_TABLES, LAYOUT_VERSION, arrow_schema
from condmsg.cli import main as condmsg_main
from condmsg.core.conditions import Destination
from condmsg.runtime import migrate
from tests.spark.builders import T0, ack_row, at, cm_row


def _fill(url: str) -> None:
    engine = sa.create_engine(url)
    migrate.upgrade(engine, "sender")  # export refuses a store without its schema
    condition = Destination("qa", pickup_within=timedelta(seconds=1))
    with engine.begin() as conn:
        conn.execute(
            st.cms.insert(),
            [
                cm_row(
                    "c1", condition, state="satisfied", decided_at=at(500), effective_at=at(250)
                ),
                cm_row(
                    "c2", condition, state="violated", decided_at=at(9000), effective_at=at(8750)
                ),
                cm_row("c3", condition, sent_at=at(20_000)),
            ],
        )
        conn.execute(
            st.acks.insert(),
            [
                ack_row("a1", "c1", "qa", read_at=at(100)),
                ack_row("a2", "c3", "qa", read_at=at(20_100)),
                ack_row("a3", "nobody", "qa", read_at=at(50)),
                ack_row("a4", "c2", "qa", read_at=at(50), received_at=at(8000)),
            ],
        )
        conn.execute(
            st.compensations.insert(),
            [
                {
                    "cm_id": "c2",
                    "destination": "qa",
                    "body": b"undo!",
                    "system_generated": False,
                    "released_at": at(9010),
                }
            ],
        )
    engine.dispose()


def test_export_writes_the_layout_and_the_cut(sqlite_url: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    _fill(sqlite_url)
    out = tmp_path / "export"
    code = condmsg_main(
        ["export", "--db-url", sqlite_url, "--out", str(out), "--until", at(5000).isoformat()]
    )
    assert code == 0
    assert "exported" in capsys.readouterr().out
    for table in ALL_TABLES:
        written = pq.read_table(out / table.name, partitioning=None)
        if written.num_rows:  # an empty table is a directory without files
            assert written.schema == arrow_schema(table), table.name
    assert [p.name for p in (out / "cms").iterdir()] == [f"sent_day={T0.date().isoformat()}"]
    cms = {r["cm_id"]: r for r in pq.read_table(out / "cms", partitioning=None).to_pylist()}
    assert sorted(cms) == ["c1", "c2"]  # c3 is sent after the cut
    assert cms["c1"]["sent_at"] == T0  # SQLite's naive datetimes come back as UTC
    assert (cms["c2"]["state"], cms["c2"]["decided_at"]) == ("pending", None)
    acks = sorted(r["ack_id"] for r in pq.read_table(out / "acks", partitioning=None).to_pylist())
    assert acks == ["a1", "a3"]  # a2: CM outside the cut; a4: received after it
    compensations = pq.read_table(out / "compensations", partitioning=None).to_pylist()
    assert [(r["body_bytes"], r["released_at"]) for r in compensations] == [(5, None)]
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["layout_version"] == LAYOUT_VERSION
    assert manifest["until"] == at(5000).isoformat()
    assert manifest["tables"]["acks"] == 2


def test_export_of_an_unreachable_store_is_a_clear_error(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    url = "postgresql+psycopg://bob:hunter2@127.0.0.1:1/none"
    assert condmsg_main(["export", "--db-url", url, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "cannot use the database at postgresql+psycopg://bob:***@127.0.0.1:1/none" in err
    assert "hunter2" not in err


def test_audit_subcommand_is_registered(capsys) -> None:  # type: ignore[no-untyped-def]
    assert condmsg_main(["audit", "--parquet", "/nonexistent", "--out", "/tmp/x", "--quiet"]) == 2
    assert "not a condmsg export" in capsys.readouterr().err
