"""condmsg.archive.layout: pure, and in step with the sender store it describes."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from condmsg import tables as st
from condmsg.archive import layout

STORE = {
    "cms": st.cms,
    "copies": st.copies,
    "acks": st.acks,
    "compensations": st.compensations,
    "anomalies": st.anomalies,
    "spheres": st.spheres,
}
#: Layout columns that are not store columns (see the module doc).
DERIVED = {("compensations", "body_bytes")}


@pytest.mark.parametrize("table", layout.ALL_TABLES, ids=lambda t: t.name)
def test_each_table_names_its_store_table_and_its_columns(table: layout.Table) -> None:
    store = STORE[table.name]
    assert table.store_table == store.name
    for column in table.column_names:
        assert (table.name, column) in DERIVED or column in store.c, column


@pytest.mark.parametrize("table", layout.ALL_TABLES, ids=lambda t: t.name)
def test_each_store_column_is_archived_but_the_compensation_bodies(table: layout.Table) -> None:
    left_out = {("compensations", "body"), ("cms", "traceparent"), ("acks", "traceparent")}
    for column in STORE[table.name].c:
        assert (table.name, column.name) in left_out or column.name in table.column_names


def test_every_table_has_a_day_partition() -> None:
    assert set(layout.PARTITION_COLUMNS) == set(layout.TABLES_BY_NAME)


def test_labels_are_the_stores() -> None:
    assert layout.AckStatus is st.AckStatus
    assert layout.AnomalyKind is st.AnomalyKind


def test_the_layout_and_the_exporter_import_neither_pyspark_nor_the_services() -> None:
    code = (
        "import sys, condmsg, condmsg.archive.layout, condmsg.archive.export, spark_audit; "
        "print(sorted(m for m in ('pyspark', 'pika', 'apscheduler') if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert found.strip() == "[]"
    code = "import sys, condmsg.archive.layout; print('sqlalchemy' in sys.modules)"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert found.strip() == "False"


def test_the_manifest_round_trips_without_the_password(tmp_path: Path) -> None:
    until = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    layout.write_manifest(
        tmp_path,
        source="postgresql+psycopg://audit:s3cret@db:5432/condmsg",
        since=None,
        until=until,
        rows={"cms": 3},
        extra={"note": "x"},
    )
    assert "s3cret" not in (tmp_path / layout.MANIFEST).read_text()
    manifest = layout.read_manifest(tmp_path)
    assert manifest is not None
    assert manifest["source"] == "postgresql+psycopg://audit:***@db:5432/condmsg"
    assert manifest["layout_version"] == layout.LAYOUT_VERSION
    assert manifest["until"] == until.isoformat()
    assert manifest["tables"] == {"cms": 3}
    assert manifest["note"] == "x"
    assert layout.read_manifest(tmp_path / "missing") is None
    layout.write_manifest(tmp_path, source="sqlite:///x.db", since=None, until=until, rows={})
    assert json.loads((tmp_path / layout.MANIFEST).read_text())["source"] == "sqlite:///x.db"


def test_the_manifest_keeps_the_host_as_written(tmp_path: Path) -> None:
    until = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    source = "postgresql://audit:s3cret@[::1]:5432/condmsg"
    layout.write_manifest(tmp_path, source=source, since=None, until=until, rows={})
    manifest = layout.read_manifest(tmp_path)
    assert manifest is not None
    assert manifest["source"] == "postgresql://audit:***@[::1]:5432/condmsg"
