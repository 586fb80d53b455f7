"""Console benchmark (PostgreSQL): a page of the CM list at 1,000,000 CMs.

A fresh schema gets N CMs (default 1,000,000) in one ``INSERT ... SELECT generate_series``:
sent over 30 days, 1 % pending, 9 % violated, the rest satisfied, each with one copy to
one of 20 destinations. Each page is timed as the console serves it
(:func:`condmsg.console.queries.cm_page`: the page's SELECT through SQLAlchemy plus its
copies) and, as the baseline, the same SELECT as plain SQL through psycopg. Pages: the
first, one deep in the list (keyset cursor), filtered by verdict, by state, by destination,
and by a one-day window. Target: every page p99 < 200 ms.

Run: ``python -m bench.console [--cms N] [--rounds R]`` (env ``CONDMSG_BENCH_PG_URL``).
The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import os
from datetime import UTC, datetime, timedelta

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from bench._common import (
    emit_result,
    fresh_pg_schema,
    log,
    percentile,
    psycopg_conninfo,
    row,
    timed,
)
from condmsg import tables
from condmsg.console import queries

PG_URL = os.environ.get("CONDMSG_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TARGET_P99_MS = 200.0
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)

FILL = """
INSERT INTO condmsg_cm (cm_id, sender, sent_at, condition_json, evaluation_deadline,
    payload_size, notify_success, state, next_check_at, decided_at, effective_at)
SELECT md5(i::text)::uuid::text, 'bench',
    :now - (i * interval '30 days' / :n),
    '{"destination":"d' || (i % 20) || '","pickup_within"\\:60000}',
    :now - (i * interval '30 days' / :n) + interval '1 minute', 10, false,
    CASE WHEN i % 100 = 0 THEN 'pending' WHEN i % 100 < 10 THEN 'violated'
         ELSE 'satisfied' END,
    CASE WHEN i % 100 = 0 THEN :now + interval '1 hour' END,
    CASE WHEN i % 100 <> 0 THEN :now - (i * interval '30 days' / :n) + interval '2 s' END,
    CASE WHEN i % 100 <> 0 THEN :now - (i * interval '30 days' / :n) + interval '1 s' END
FROM generate_series(1, :n) AS i
"""
FILL_COPIES = """
INSERT INTO condmsg_copy (cm_id, destination, message_id, exchange, routing_key, requires, parts)
SELECT cm_id, 'd' || (('x' || substr(md5(cm_id), 1, 4))::bit(16)::int % 20), md5(cm_id), '',
    'q', 'pickup', 1
FROM condmsg_cm
"""


def fill(engine: sa.Engine, n: int) -> None:
    tables.metadata.create_all(engine)
    with timed() as sw, engine.begin() as conn:
        conn.execute(sa.text(FILL), {"n": n, "now": NOW})
        conn.execute(sa.text(FILL_COPIES))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE condmsg_cm"))
        conn.execute(sa.text("VACUUM ANALYZE condmsg_copy"))
    log(f"filled {n:,} CMs and copies in {sw.seconds:.1f} s")


def scenarios(engine: sa.Engine) -> dict[str, tuple[queries.ListFilter, queries.Cursor | None]]:
    with engine.connect() as conn:
        deep = conn.execute(
            sa.select(tables.cms.c.sent_at, tables.cms.c.cm_id)
            .order_by(tables.cms.c.sent_at.desc())
            .offset(500_000)
            .limit(1)
        ).first()
    cursor = queries.Cursor(deep.sent_at, deep.cm_id) if deep is not None else None
    day = NOW - timedelta(days=12)
    return {
        "first": (queries.ListFilter(), None),
        "deep": (queries.ListFilter(), cursor),
        "violated": (queries.ListFilter(verdict="violated"), None),
        "pending": (queries.ListFilter(state="pending"), None),
        "destination": (queries.ListFilter(destination="d7"), None),
        "window": (queries.ListFilter(since=day, until=day + timedelta(days=1)), None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cms", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args(argv)
    figures: dict[str, float] = {"cms": args.cms}
    with fresh_pg_schema(PG_URL, "bench_console") as url:
        engine = sa.create_engine(url)
        fill(engine, args.cms)
        raw = psycopg.connect(psycopg_conninfo(url), autocommit=True)
        console_all: list[float] = []
        raw_all: list[float] = []
        for name, (flt, after) in scenarios(engine).items():
            sql = str(
                queries.list_query(flt, after, NOW, queries.PAGE_SIZE + 1).compile(
                    dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}
                )
            )
            console_ms: list[float] = []
            raw_ms: list[float] = []
            for _ in range(args.rounds):
                with timed() as sw, engine.connect() as conn:
                    page = queries.cm_page(conn, flt, after, NOW)
                console_ms.append(sw.seconds * 1000)
                with timed() as sw, raw.cursor() as cur:
                    cur.execute(sql)  # type: ignore[call-overload]
                    rows = cur.fetchall()
                raw_ms.append(sw.seconds * 1000)
            assert len(page.rows) == min(len(rows), queries.PAGE_SIZE), name
            figures[f"{name}_p50_ms"] = round(percentile(console_ms, 50), 2)
            figures[f"{name}_p99_ms"] = round(percentile(console_ms, 99), 2)
            figures[f"{name}_raw_p50_ms"] = round(percentile(raw_ms, 50), 2)
            print(
                f"{name:12s} console p50 {percentile(console_ms, 50):7.2f} ms"
                f"  p99 {percentile(console_ms, 99):7.2f} ms | plain SQL p50"
                f" {percentile(raw_ms, 50):7.2f} ms  p99 {percentile(raw_ms, 99):7.2f} ms"
                f" ({len(page.rows)} rows)"
            )
            console_all += console_ms
            raw_all += raw_ms
        raw.close()
        engine.dispose()
    p50, p99 = percentile(console_all, 50), percentile(console_all, 99)
    raw50, raw99 = percentile(raw_all, 50), percentile(raw_all, 99)
    figures.update(
        page_p50_ms=round(p50, 2),
        page_p99_ms=round(p99, 2),
        raw_p50_ms=round(raw50, 2),
        raw_p99_ms=round(raw99, 2),
        ratio_p99=round(p99 / raw99, 2),
        target_p99_ms=TARGET_P99_MS,
    )
    print(
        f"CM list page at {args.cms:,} CMs, every page: p50 {p50:.2f} ms, p99 {p99:.2f} ms; "
        f"baseline (the plain SQL) p50 {raw50:.2f} ms, p99 {raw99:.2f} ms; ratio (p99) "
        f"{p99 / raw99:.2f}; target p99 < {TARGET_P99_MS:.0f} ms: "
        f"{'met' if p99 < TARGET_P99_MS else 'MISSED'}"
    )
    emit_result(
        "console",
        figures,
        [row("console CM list page p99", p99, "ms", baseline=raw99, lower=TARGET_P99_MS)],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
