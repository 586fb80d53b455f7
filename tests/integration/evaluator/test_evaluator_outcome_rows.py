"""The evaluator's outcome rows (``outbox.enqueueing.enqueue_batch``) are the rows
``enqueue_all`` writes for the same messages, on SQLite and the real PostgreSQL."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
from outbox import OutboxMessage, OutboxTypeError, OutboxValueError
from outbox.enqueueing import enqueue_all, enqueue_batch
from outbox.message import MAX_SHORTSTR_BYTES
from outbox.table import outbox_table

pytestmark = pytest.mark.postgres

TEMPLATE = OutboxMessage(
    exchange="",
    routing_key="condmsg.s.outcome",
    body=b"",
    content_type="application/vnd.condmsg.outcome+json",
    message_type="condmsg.outcome",
)


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    """An outbox table on SQLite or in this test's PostgreSQL schema."""
    with contextlib.closing(_Disposing(sa.create_engine(db_url))) as holder:
        outbox.create_tables(holder.engine)
        yield holder.engine


@dataclasses.dataclass
class _Disposing:
    engine: sa.Engine

    def close(self) -> None:
        self.engine.dispose()


def _rows(engine: sa.Engine) -> list[dict[str, Any]]:
    table = outbox_table()
    skip = {"id", "created_at"}
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table).order_by(table.c.id)).mappings().all()
    return [{k: v for k, v in row.items() if k not in skip} for row in rows]


def _clear(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.delete(outbox_table()))


@pytest.mark.parametrize("template", [TEMPLATE, dataclasses.replace(TEMPLATE, headers={"a": 1})])
def test_batch_rows_equal_enqueue_all_rows(engine: sa.Engine, template: OutboxMessage) -> None:
    bodies = [b'{"cm_id":"a"}', b"\x00\xff", b""]
    ids: list[str | None] = ["a.outcome", "b.outcome", None]
    correlations: list[str | None] = ["a", None, "c"]
    with Session(engine) as session, session.begin():
        assert enqueue_batch(session, template, bodies, ids, correlations) == 3
    batch_rows = _rows(engine)
    _clear(engine)
    messages = [
        dataclasses.replace(template, body=b, message_id=m, correlation_id=c)
        for b, m, c in zip(bodies, ids, correlations, strict=True)
    ]
    with Session(engine) as session, session.begin():
        enqueue_all(session, messages)
    assert batch_rows == _rows(engine)
    assert [row["body"] for row in batch_rows] == bodies


def test_batch_checks_bodies_and_ids(engine: sa.Engine) -> None:
    long_id = "x" * (MAX_SHORTSTR_BYTES + 1)
    with Session(engine) as session, session.begin():
        assert enqueue_batch(session, TEMPLATE, [], [], []) == 0
        with pytest.raises(OutboxTypeError):
            enqueue_batch(session, TEMPLATE, ["text"], ["a"], ["a"])  # type: ignore[list-item]
        with pytest.raises(OutboxValueError):
            enqueue_batch(session, TEMPLATE, [b"x"], [long_id], ["a"])
        with pytest.raises(OutboxValueError):
            enqueue_batch(session, TEMPLATE, [b"x"], ["a"], [long_id])
        with pytest.raises(OutboxValueError):
            enqueue_batch(session, TEMPLATE, [b"x", b"y"], ["a"], ["a", "b"])
    assert _rows(engine) == []
