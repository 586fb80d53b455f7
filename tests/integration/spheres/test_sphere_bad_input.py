"""Dependency-Spheres used against their rules: each misuse gets a clear error or a
recorded failure reason, and nothing is sent half-way. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from condmsg import Destination, tables
from condmsg.core.errors import SphereError
from condmsg.spheres.participants import require_prepared_transactions

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

MINUTE = timedelta(minutes=1)


@pytest.fixture
def sender(db_url: str, unique_name: str, make_sender: Any) -> Any:
    return make_sender(db_url, unique_name.replace(".", "-"))


def _condition(unique_name: str) -> Destination:
    return Destination(f"{unique_name}.q", pickup_within=MINUTE)


def _count(sender: Any, table: sa.Table) -> int:
    with sender.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def _outbox_rows(sender: Any) -> int:
    with sender.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM condmsg_outbox")).scalar_one())


@pytest.mark.parametrize("timeout", [None, 0, -5, timedelta(0), "10s", True])
def test_a_sphere_needs_a_positive_timeout(sender: Any, timeout: Any) -> None:
    with pytest.raises(SphereError, match="timeout"):
        sender.begin_sphere(timeout=timeout)
    assert _count(sender, tables.spheres) == 0


def test_nothing_is_sent_through_a_sphere_that_has_ended(sender: Any, unique_name: str) -> None:
    committed = sender.begin_sphere(timeout=MINUTE)
    committed.send(b"in", _condition(unique_name))
    committed.commit()
    aborted = sender.begin_sphere(timeout=MINUTE)
    aborted.abort()
    cms, outbox = _count(sender, tables.cms), _outbox_rows(sender)
    for ds, state in ((committed, "committed"), (aborted, "aborted")):
        with pytest.raises(SphereError, match=f"has ended \\({state}\\)"):
            ds.send(b"late", _condition(unique_name))
        # The same sphere reattached (another process, say) is refused by the store.
        again = sender.sphere_by_id(ds.sphere_id)
        with pytest.raises(SphereError, match="has ended"):
            again.send(b"late", _condition(unique_name))
    assert (_count(sender, tables.cms), _outbox_rows(sender)) == (cms, outbox)


def test_a_sphere_past_its_deadline_takes_no_member(sender: Any, unique_name: str) -> None:
    ds = sender.begin_sphere(timeout=0.2)
    with sender.engine.begin() as conn:  # its deadline passes (the evaluator is not running)
        conn.execute(sa.update(tables.spheres).values(deadline=tables.spheres.c.begun_at))
    reattached = sender.sphere_by_id(ds.sphere_id)
    with pytest.raises(SphereError, match=r"timed out at .*nothing was sent"):
        reattached.send(b"late", _condition(unique_name))
    assert _count(sender, tables.cms) == 0


def test_commit_twice_or_after_abort_is_refused(sender: Any) -> None:
    ds = sender.begin_sphere(timeout=MINUTE)
    ds.commit()
    with pytest.raises(SphereError, match=r"cannot commit it: .* has ended \(committed\)"):
        ds.commit()
    with pytest.raises(SphereError, match="cannot abort it"):
        ds.abort()
    other = sender.begin_sphere(timeout=MINUTE)
    other.abort("stop")
    with pytest.raises(SphereError, match=r"cannot commit it: .* has ended \(aborted\)"):
        other.commit()
    with sender.engine.connect() as conn:
        states = dict(
            conn.execute(sa.select(tables.spheres.c.sphere_id, tables.spheres.c.state)).all()
        )
    assert states == {ds.sphere_id: "committed", other.sphere_id: "aborted"}


def test_spheres_do_not_nest(sender: Any) -> None:
    with sender.sphere(timeout=MINUTE) as outer:
        with pytest.raises(SphereError, match="spheres do not nest"):
            sender.begin_sphere(timeout=MINUTE)
        with pytest.raises(SphereError, match="spheres do not nest"), outer:
            pass
    # Outside the block a new sphere begins normally.
    sender.begin_sphere(timeout=MINUTE).abort()


def test_an_exception_in_the_block_aborts_the_sphere(sender: Any) -> None:
    with pytest.raises(ZeroDivisionError), sender.sphere(timeout=MINUTE) as ds:
        1 / 0  # noqa: B018
    with sender.engine.connect() as conn:
        row = conn.execute(sa.select(tables.spheres)).one()
    assert (row.sphere_id, row.state) == (ds.sphere_id, "aborted")
    assert row.abort_reason == "the sphere's block raised ZeroDivisionError: division by zero"


class _Raises:
    participant_id = "ledger"

    def __init__(self) -> None:
        self.rolled_back = 0

    def prepare(self) -> bool:
        raise RuntimeError("ledger is read-only")

    def commit(self) -> None:
        raise AssertionError("never committed")

    def rollback(self) -> None:
        self.rolled_back += 1


def test_a_participant_raising_in_prepare_fails_the_sphere(sender: Any) -> None:
    ledger = _Raises()
    ds = sender.begin_sphere(timeout=MINUTE)
    ds.enlist(ledger)
    assert ds.commit() is None  # recorded, not raised: the evaluator decides it violated
    with sender.engine.connect() as conn:
        sphere = conn.execute(sa.select(tables.spheres)).one()
        (participant,) = conn.execute(sa.select(tables.sphere_participants)).all()
    assert sphere.state == "aborted"
    assert sphere.abort_reason == (
        "participant ledger failed to prepare: RuntimeError: ledger is read-only"
    )
    assert (participant.state, ledger.rolled_back) == ("rolled_back", 1)


def test_bad_participants_and_handlers_are_refused(sender: Any) -> None:
    sender.register_handler("undo", lambda session, **args: None)
    ds = sender.begin_sphere(timeout=MINUTE)
    with pytest.raises(SphereError, match=r"no handler named 'missing'.*registered: undo"):
        ds.on_failure("missing", room=1)
    with pytest.raises(SphereError, match="JSON"):
        ds.on_failure("undo", when=object())
    with pytest.raises(SphereError, match="is no participant"):
        ds.enlist(object())  # type: ignore[arg-type]
    bad_id = _Raises()
    bad_id.participant_id = "no spaces allowed"  # type: ignore[misc]
    with pytest.raises(SphereError, match="participant id"):
        ds.enlist(bad_id)
    ds.enlist(_Raises())
    with pytest.raises(SphereError, match=r"enlisted in sphere .* already"):
        ds.enlist(_Raises())
    with pytest.raises(SphereError, match="no sphere 'nope'"):
        sender.sphere_by_id("nope")
    ds.abort()


def test_a_prepared_transaction_needs_postgresql(sender: Any, sqlite_url: str) -> None:
    ds = sender.begin_sphere(timeout=MINUTE)
    with (
        pytest.raises(SphereError, match="needs PostgreSQL, not sqlite"),
        ds.transaction(sqlite_url),
    ):
        pass
    ds.abort()


class _Conn:
    def __enter__(self) -> _Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def exec_driver_sql(self, sql: str) -> Any:
        assert sql == "SHOW max_prepared_transactions"
        return type("R", (), {"scalar_one": staticmethod(lambda: "0")})()


def test_prepared_transactions_turned_off_are_named(pg_url: str) -> None:
    """A PostgreSQL with max_prepared_transactions = 0 (the default) is refused with what
    to change (the answer to SHOW is the only thing faked: turning the setting off needs a
    restart of the shared server)."""
    engine = sa.create_engine(pg_url)
    fake = type(
        "E", (), {"dialect": engine.dialect, "url": engine.url, "connect": lambda s: _Conn()}
    )()
    with pytest.raises(SphereError, match=r"max_prepared_transactions = 0.*postgresql.conf"):
        require_prepared_transactions(fake)
    require_prepared_transactions(engine)  # the real one (CI turns them on): accepted
    engine.dispose()


def test_a_sphere_is_reattached_from_another_process(
    db_url: str, unique_name: str, amqp_url: str
) -> None:
    """A sphere begun in one process is sent through and committed from another."""
    name = unique_name.replace(".", "-")
    script = (
        "from condmsg.sending.sender import Sender\n"
        f"s = Sender(amqp_url={amqp_url!r}, db_url={db_url!r}, name={name!r}, secret=b'x', "
        "create_schema=True)\n"
        "print(s.begin_sphere(timeout=60).sphere_id)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    sphere_id = done.stdout.strip()
    from condmsg.sending.sender import Sender

    sender = Sender(
        amqp_url=amqp_url, db_url=db_url, name=unique_name.replace(".", "-"), secret=b"x"
    )
    try:
        ds = sender.sphere_by_id(sphere_id)
        member = ds.send(b"from the second process", _condition(unique_name))
        ds.commit()
        with sender.engine.connect() as conn:
            row = conn.execute(sa.select(tables.cms)).one()
            sphere = conn.execute(sa.select(tables.spheres)).one()
        assert (row.cm_id, row.sphere_id) == (member, sphere_id)
        assert (sphere.state, sphere.members) == ("committed", 1)
    finally:
        sender.engine.dispose()
