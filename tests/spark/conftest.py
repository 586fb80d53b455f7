"""One SparkSession for every Spark test (session-scoped, ``local[2]``).

The suite runs under ``pytest -n 2 --dist loadgroup``; every Spark test carries
``xdist_group("spark")`` (see ``pytestmark`` in each module), so they all run on one worker
and share this session: starting a JVM costs far more than running a job. Expensive shared
data (the generated store and its audit) is session-scoped too: xdist interleaves modules
on a worker, which would tear a module-scoped fixture down and build it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SPARK_MARKS = (pytest.mark.spark, pytest.mark.xdist_group("spark"))
_HERE = Path(__file__).parent


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep ``--dist loadgroup`` grouping the Spark tests on pytest >= 9.2.

    pytest-xdist tells its scheduler a test's group by appending ``@group`` to the node id
    through the legacy ``item._nodeid`` attribute, which pytest 9.2's structured node ids
    ignore (pytest-dev/pytest-xdist#1386, fix pending in #1388): the Spark tests would be
    spread over both workers, each starting its own JVM. Where xdist's suffix did not take
    effect, this sets it through the structured id; elsewhere it does nothing.
    """
    if not getattr(config.option, "loadgroup", False):
        return
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # an older pytest, where xdist's own mutation works
        return
    for item in items:
        if _HERE not in Path(item.path).parents:
            continue
        groups = sorted({str(m.args[0]) for m in item.iter_markers("xdist_group") if m.args})
        if not groups:
            continue
        suffix = "@" + "_".join(groups)
        if not item.nodeid.endswith(suffix):
            item._id = coerce_node_id(item.nodeid + suffix)  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from spark_audit.session import SessionOptions, build_session

    session = build_session(
        SessionOptions(
            app_name="condmsg-audit-tests",
            master="local[2]",
            extra={
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.default.parallelism": "2",
            },
        )
    )
    session.sparkContext.setLogLevel("ERROR")
    # Set on the running session, not at launch: a launch setting would be the user's,
    # which the audit keeps (spark_audit.settings.launch_setting).
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


@pytest.fixture
def pg_schema(pg_engine_url: str) -> Iterator[tuple[str, str]]:
    """A fresh PostgreSQL schema: ``(sqlalchemy_url_with_search_path, schema_name)``."""
    from urllib.parse import quote

    import sqlalchemy as sa

    schema = f"spark_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_engine_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{pg_engine_url}?options={quote(f'-csearch_path={schema}')}", schema
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
