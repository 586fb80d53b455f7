"""Shared fixtures.

Integration and end-to-end tests talk to the real RabbitMQ and PostgreSQL. A service that
cannot be reached makes those tests *fail* with a message naming how to start it; they are
never skipped (CI must not go green without them).

Isolation under pytest-xdist: every PostgreSQL test gets its own schema (selected through
the connection's ``search_path``) and every broker test names its queues through
``unique_name``, so two workers never see each other's rows or messages.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

# Imported here, at collection: hypothesis's pytest plugin otherwise imports it in its
# end-of-session summary, through pytest's assertion rewriter, at a stack depth where
# CPython 3.11.7's AST validator reports "recursion depth mismatch" and the run exits 1
# after every test passed (seen with `pytest -n 0` on files that do not use hypothesis).
import hypothesis  # noqa: F401
import pytest

from condmsg.core import examples
from condmsg.core.conditions import Condition

if TYPE_CHECKING:
    from tests.running_world import RunningWorld

AMQP_URL = os.environ.get("CONDMSG_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
#: This test run's mark in every queue name: set once by the controlling process, inherited
#: by the xdist workers it starts, so the end-of-run sweep deletes this run's leftovers only
#: (never the queues of another pytest run sharing the broker).
RUN = os.environ.setdefault("CONDMSG_TEST_RUN", uuid.uuid4().hex[:4])
PG_URL = os.environ.get("CONDMSG_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

_START_HINTS = {
    "RabbitMQ": "start it with `rabbitmq-server -detached`",
    "PostgreSQL": (
        "start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`"
    ),
}


def _require_port(service: str, host: str, port: int) -> None:
    try:
        with socket.create_connection((host, port), timeout=3):
            return
    except OSError as exc:
        pytest.fail(
            f"cannot reach {service} at {host}:{port}: {exc}; {_START_HINTS[service]}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """URL of the real RabbitMQ broker (fails the test if it is down)."""
    _require_port("RabbitMQ", "127.0.0.1", 5672)
    return AMQP_URL


@pytest.fixture(scope="session")
def pg_engine_url() -> str:
    """URL of the real PostgreSQL database (fails the test if it is down)."""
    _require_port("PostgreSQL", "127.0.0.1", 5432)
    return PG_URL


#: Queue names tests build from ``unique_name`` (``f"{unique_name}.q"`` and so on).
_TEST_QUEUE_SUFFIXES = (
    "q",
    "q0",
    "q1",
    "q2",
    "q3",
    "qr1",
    "qr2",
    "qr3",
    "qr4",
    "qcentral",
    "invalid",
    "a",
    "b",
    "none",
)
_cleanup_connection: list[object] = []


def _delete_queues_of(name: str) -> None:
    """Delete every queue and exchange a test named after ``name`` (idempotent and cheap).
    RabbitMQ 3.10 gives each queue file handles from a fixed budget (1024 by
    default); queues left behind by hundreds of tests exhaust it and new connections
    then hang in their handshake."""
    import pika

    if not _cleanup_connection or not _cleanup_connection[0].is_open:  # type: ignore[attr-defined]
        _cleanup_connection[:] = [pika.BlockingConnection(pika.URLParameters(AMQP_URL))]
    connection: Any = _cleanup_connection[0]
    sender = name.replace(".", "-")
    queues = [f"{name}.{suffix}" for suffix in _TEST_QUEUE_SUFFIXES]
    queues += [f"condmsg.{sender}.{kind}" for kind in ("ack", "outcome", "dead")]
    channel = connection.channel()
    for queue in queues:
        channel.queue_delete(queue)
    channel.exchange_delete(f"{name}.ex")
    channel.close()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A short name unique to this test run: use it as a prefix for queues and exchanges.

    The test's queues are deleted afterwards.
    """
    name = f"t.{request.node.name[:24]}.{RUN}x{uuid.uuid4().hex[:6]}"
    yield name
    try:
        _delete_queues_of(name)
    except Exception as exc:  # cleanup must not turn a result into an error
        print(f"warning: could not delete the queues of {name}: {exc}")


@pytest.fixture
def pg_url(pg_engine_url: str) -> Iterator[str]:
    """A PostgreSQL URL whose ``search_path`` is a fresh schema, dropped after the test."""
    import sqlalchemy as sa

    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_engine_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    options = quote(f"-csearch_path={schema}")
    sep = "&" if "?" in pg_engine_url else "?"
    try:
        yield f"{pg_engine_url}{sep}options={options}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A file-backed SQLite URL in the test's temporary directory."""
    return f"sqlite:///{tmp_path / 'condmsg.db'}"


@pytest.fixture
def test_secret() -> bytes:
    """The deployment secret senders sign copies with (directories may override it)."""
    return b"condmsg-test-secret-4f1c9e2ab7d03865"


@pytest.fixture
def make_sender(amqp_url: str, test_secret: bytes) -> Iterator[Callable[..., Any]]:
    """``make_sender(db_url, name, **options)``: senders that are disposed of afterwards."""
    from condmsg.sending.sender import Sender

    made: list[Sender] = []

    def factory(db_url: str, name: str, **options: Any) -> Sender:
        options.setdefault("secret", test_secret)
        options.setdefault("create_schema", True)
        sender = Sender(amqp_url=amqp_url, db_url=db_url, name=name, **options)
        made.append(sender)
        return sender

    yield factory
    for sender in made:
        sender.engine.dispose()


@pytest.fixture
def running_world(
    pg_url: str, unique_name: str, make_sender: Callable[..., Any], test_secret: bytes
) -> Iterator[RunningWorld]:
    """A sender named after the test and a running evaluator on the test's PostgreSQL
    schema, time scaled (:mod:`tests.running_world`); the evaluator is stopped afterwards."""
    from tests.running_world import RunningWorld

    sender = make_sender(pg_url, unique_name.replace(".", "-"))
    world = RunningWorld.start(sender, pg_url, unique_name, test_secret)
    try:
        yield world
    finally:
        world.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Runs a test once against SQLite and once against the real PostgreSQL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


# Every test names its queues after ``unique_name`` ("t.<test>.<run>x<hex>...") or, for a
# sender, "condmsg.t-<test>-<run>x<hex>.<ack|outcome|dead>". Quorum queues are Raft groups:
# left behind, hundreds of them slow the broker's start and every later run, so the
# controlling process deletes this run's once all workers are done.
_TEST_QUEUE_PREFIXES = ("t.", "condmsg.t-")


def delete_test_queues(amqp_url: str = AMQP_URL) -> int:
    import subprocess

    import pika

    try:
        listed = subprocess.run(
            ["rabbitmqctl", "list_queues", "-q", "--no-table-headers", "name"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return 0
    doomed = [
        q
        for q in listed
        if q.startswith(_TEST_QUEUE_PREFIXES) and (f".{RUN}x" in q or f"-{RUN}x" in q)
    ]
    if not doomed:
        return 0
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        for queue in doomed:
            channel = connection.channel()
            try:
                channel.queue_delete(queue)
                channel.close()
            except pika.exceptions.AMQPError:
                pass  # gone already, or never ours to delete
    finally:
        connection.close()
    return len(doomed)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller cleans up once everyone is done
    try:
        delete_test_queues()
    except Exception as exc:  # cleanup must never turn a result into an error
        print(f"warning: could not delete test queues: {exc}")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep ``--dist loadgroup`` honouring ``xdist_group`` marks on pytest >= 9.2.

    pytest-xdist tells its scheduler a test's group by appending ``@group`` to the node id
    through the legacy ``item._nodeid`` attribute, which pytest 9.2's structured node ids
    ignore (pytest-dev/pytest-xdist#1386): tests meant to share a worker (the Spark tests
    and the demo, one JVM at a time) would be spread over both. Where xdist's suffix did
    not take effect, this sets it through the structured id; elsewhere it does nothing.
    """
    if not getattr(config.option, "loadgroup", False):
        return
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # an older pytest, where xdist's own mutation works
        return
    for item in items:
        groups = sorted({str(m.args[0]) for m in item.iter_markers("xdist_group") if m.args})
        suffix = "@" + "_".join(groups)
        if groups and not item.nodeid.endswith(suffix):
            item._id = coerce_node_id(item.nodeid + suffix)  # type: ignore[attr-defined]


@pytest.fixture(params=["sqlite-portable", "postgresql-portable", "postgresql-psycopg"])
def adapter_backend(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """For contract suites: ``(db_url, psycopg)``, one run per adapter and database.

    The portable adapter runs on SQLite and on PostgreSQL, the psycopg adapter on
    PostgreSQL; a contract suite builds the adapter ``psycopg`` names on ``db_url``.
    """
    database, adapter = str(request.param).split("-")
    url = request.getfixturevalue("sqlite_url" if database == "sqlite" else "pg_url")
    return str(url), adapter == "psycopg"


@pytest.fixture
def example1() -> Callable[..., Condition]:
    """The paper's Example 1 (``condmsg.core.examples.example1``, its one definition):
    call it with a function naming the test's queue of each attendee (``"qr1"`` -> a
    queue of this test) and the length of the test's day."""
    return examples.example1
