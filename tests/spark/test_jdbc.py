"""Reading the real PostgreSQL store through Spark's JDBC source, partitioned, in a window;
the Parquet export of the same store reads back identically, and an audit over JDBC reads
each table once and finds what the audit of the export finds."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from condmsg import tables as st
from condmsg.archive.export import export_store
from condmsg.archive.layout import ACKS, ALL_TABLES, ANOMALIES
from condmsg.core.conditions import Destination, DestinationSet
from spark_audit.cli import main as audit_main
from spark_audit.jdbc import cm_id_predicates, jdbc_source, read_jdbc
from spark_audit.readers import AuditInput, Window, apply_window, read_parquet
from tests.spark.builders import T0, ack_row, at, cm_row
from tests.spark.conftest import SPARK_MARKS

pytestmark = [*SPARK_MARKS, pytest.mark.postgres]

UNTIL = at(60_000)
ONE = timedelta(seconds=1)


def _id(n: int) -> str:
    return str(uuid.UUID(int=(n * 0x2F3A5B7C9D1E3F5A7B9C1D3E5F7A9B1) % 2**128))


def _fill(url: str) -> None:
    engine = sa.create_engine(url)
    st.metadata.create_all(engine)
    pair = DestinationSet(Destination("qa"), Destination("qb"), pickup_within=ONE)
    cms = [
        cm_row(_id(i), pair, state="satisfied", decided_at=at(1500), effective_at=at(1250))
        for i in range(1, 7)
    ]
    cms.append(cm_row(_id(7), pair, sent_at=at(120_000)))  # after the cut
    cms.append(  # decided after the cut: pending in it
        cm_row(_id(8), pair, state="violated", decided_at=at(90_000), effective_at=at(89_750))
    )
    acks = [
        ack_row(f"{_id(i)}-{d}", _id(i), d, read_at=at(100), receiver=f"r{d}")
        for i in (1, 2, 3, 4, 5, 6, 7)
        for d in ("qa", "qb")
    ]
    acks.append(ack_row("orphan", _id(99), "qa", read_at=at(10)))
    acks.append(ack_row("too-late", _id(1), "qa", read_at=at(50), received_at=at(70_000)))
    with engine.begin() as conn:
        conn.execute(st.cms.insert(), cms)
        conn.execute(
            st.copies.insert(),
            [
                {
                    "cm_id": r["cm_id"],
                    "destination": d,
                    "message_id": f"{r['cm_id']}:{d}",
                    "exchange": "",
                    "routing_key": d,
                    "requires": "pickup",
                }
                for r in cms
                for d in ("qa", "qb")
            ],
        )
        conn.execute(st.acks.insert(), acks)
        conn.execute(
            st.compensations.insert(),
            [
                {
                    "cm_id": _id(8),
                    "destination": "qa",
                    "body": b"12345",
                    "system_generated": False,
                    "released_at": at(90_010),
                }
            ],
        )
        conn.execute(
            st.spheres.insert(),
            [
                {
                    "sphere_id": f"sphere-{name}",
                    "sender": "app",
                    "begun_at": begun,
                    "deadline": at(30_000),
                    "members": 0,
                    "state": state,
                    "committed_at": committed,
                    "decided_at": decided,
                }
                for name, begun, state, committed, decided in (
                    ("decided", T0, "satisfied", at(100), at(200)),
                    ("decided-later", T0, "satisfied", at(100), at(70_000)),
                    ("committed-later", T0, "committed", at(65_000), None),
                    ("begun-later", at(61_000), "open", None, None),
                )
            ],
        )
        conn.execute(
            st.anomalies.insert(),
            [
                {"kind": "duplicate", "ack_id": f"{_id(1)}-qa", "detail": "d", "recorded_at": at(k)}
                for k in (200, 300, 400, 500, 80_000)
            ],
        )
    engine.dispose()


def _rows(data: AuditInput) -> dict[str, list[tuple[Any, ...]]]:
    return {
        t.name: sorted((tuple(r) for r in getattr(data, t.name).collect()), key=lambda r: repr(r))
        for t in ALL_TABLES
    }


def test_jdbc_reads_the_cut_in_partitions(
    spark: Any, pg_schema: tuple[str, str], tmp_path: Path
) -> None:
    url, schema = pg_schema
    _fill(url)
    source = jdbc_source(url, partitions=3, fetchsize=100)
    assert source.url.endswith(f"?currentSchema={schema}")
    assert source.properties()["fetchsize"] == "100"
    window = Window(until=UNTIL, since=T0 - timedelta(hours=1))
    data = read_jdbc(spark, source, window)
    cms = {r["cm_id"]: r for r in data.cms.collect()}
    assert sorted(cms) == sorted(_id(i) for i in (1, 2, 3, 4, 5, 6, 8))
    assert cms[_id(8)]["state"] == "pending"
    assert cms[_id(8)]["decided_at"] is None
    assert cms[_id(1)]["sent_at"] == T0.replace(tzinfo=None)  # Spark collects naive UTC
    ack_ids = {r["ack_id"] for r in data.acks.collect()}
    assert "orphan" in ack_ids
    assert "too-late" not in ack_ids
    assert len(ack_ids) == 6 * 2 + 1
    assert data.anomalies.count() == 4
    assert [r["body_bytes"] for r in data.compensations.collect()] == [5]
    assert [r["released_at"] for r in data.compensations.collect()] == [None]
    spheres = {r["sphere_id"]: r["state"] for r in data.spheres.collect()}
    assert spheres == {
        "sphere-decided": "satisfied",
        "sphere-decided-later": "committed",
        "sphere-committed-later": "open",
    }

    # The same store exported to Parquet (SQLAlchemy + pyarrow) reads back identically.
    export_store(url, tmp_path / "export", since=window.since, until=window.until)
    exported = apply_window(read_parquet(spark, tmp_path / "export"), window)
    assert _rows(exported) == _rows(data)


def test_cm_id_predicates_partition_the_key_space() -> None:
    predicates = cm_id_predicates("00000000-aaaa", "ffffffff-bbbb", 4)
    assert predicates == [
        "cm_id < '3fffffff'",
        "cm_id >= '3fffffff' AND cm_id < '7fffffff'",
        "cm_id >= '7fffffff' AND cm_id < 'bfffffff'",
        "cm_id >= 'bfffffff'",
    ]
    assert cm_id_predicates(None, None, 4) == ["1 = 1"]
    assert cm_id_predicates("a", "a", 1) == ["1 = 1"]
    hashed = cm_id_predicates("order-1", "order-9", 2)
    assert hashed == [
        "(hashtext(cm_id)::bigint % 2 + 2) % 2 = 0",
        "(hashtext(cm_id)::bigint % 2 + 2) % 2 = 1",
    ]


def test_jdbc_source_from_urls() -> None:
    src = jdbc_source("postgresql+psycopg://alice:s%40cret@db.example:6543/store")
    assert src.url == "jdbc:postgresql://db.example:6543/store"
    assert (src.user, src.password) == ("alice", "s@cret")
    assert "s@cret" not in src.describe()
    assert jdbc_source("jdbc:postgresql://h/db").url == "jdbc:postgresql://h/db"
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        jdbc_source("mysql://h/db")


def _scans(url: str) -> dict[str, int]:
    """Scans PostgreSQL counted per table of the store's schema (sequential and index)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT relname, coalesce(seq_scan, 0) + coalesce(idx_scan, 0) "
                    "FROM pg_stat_user_tables WHERE schemaname = current_schema()"
                )
            ).all()
    finally:
        engine.dispose()
    return {name: int(n) for name, n in rows}


def _settled_scans(url: str, before: dict[str, int]) -> dict[str, int]:
    """The scans since ``before``, once the counts stop moving: a backend reports its
    counts when its connection closes, just after Spark has its rows."""
    deltas: dict[str, int] = {}
    for _ in range(20):
        now = {name: n - before.get(name, 0) for name, n in _scans(url).items()}
        if now == deltas:
            break
        deltas = now
        time.sleep(0.5)
    return deltas


def test_the_audit_over_jdbc_reads_each_table_once_and_agrees_with_parquet(
    spark: Any, pg_schema: tuple[str, str], tmp_path: Path
) -> None:
    url, _schema = pg_schema
    _fill(url)
    export_store(url, tmp_path / "export", until=UNTIL)
    window = ["--until", UNTIL.isoformat(), "--since", (T0 - timedelta(hours=1)).isoformat()]
    over_parquet, over_jdbc = tmp_path / "parquet", tmp_path / "jdbc"
    parquet_code = audit_main(
        ["--parquet", str(tmp_path / "export"), "--out", str(over_parquet), *window, "--quiet"]
    )
    before = _scans(url)
    jdbc_code = audit_main(
        [
            *("--source", url, "--out", str(over_jdbc), *window),
            *("--jdbc-partitions", "2", "--jdbc-fetch-size", "3", "--quiet"),
        ]
    )
    scans = _settled_scans(url, before)
    assert jdbc_code == parquet_code

    def findings(root: Path) -> dict[str, Any]:
        summary = json.loads((root / "summary.json").read_text())
        return {
            k: v for k, v in summary.items() if k not in ("generated_at", "source", "timings_s")
        }

    assert findings(over_jdbc) == findings(over_parquet)
    # Read once: one query per partition (2). Only the acks' read touches condmsg_ack (the
    # acks are the probe side of its join: one scan per query); the anomalies' read
    # queries its id bounds first (a third scan). The CMs and the compensations are
    # joined in their queries, where PostgreSQL may look the CMs up row by row.
    assert scans.get(ACKS.store_table) == 2, scans
    assert scans.get(ANOMALIES.store_table) == 3, scans
