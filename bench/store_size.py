"""Send and decision latency with many decided CMs already in the sender store, against an
empty store.

The pipeline of ``bench._stack`` runs twice, each time in fresh schemas of a database this
benchmark creates (and drops at the end): once on an empty sender store, once after
``--rows`` decided CMs were written into it. The rows are made with SQL, from the rows of
one real CM that the pipeline decided (its CM, copy, compensation and ack rows, with new ids and
``sent_at`` going back one millisecond per CM), inserted with every index in place and
followed by ``VACUUM ANALYZE`` as autovacuum would have left a store that grew this big,
and a ``CHECKPOINT``.

In each pass CMs are sent one per ``send()`` call at ``--rate`` CMs/s for ``--seconds``:

- **send**: how long one ``send()`` takes (its transaction, committed);
- **send→outcome**: from the send's commit to the outcome's arrival in this process;
- **decision**: from the receiver's commit to the CM's decision
  (``condmsg_ack.committed_at`` → ``condmsg_cm.decided_at``: the receiver's relay, the
  broker and the evaluator; both clocks are this machine's). The evaluator stamps an
  ack's receipt with its batch's instant, the decision's own, so receipt → decision is
  always zero and says nothing.

Target: the full store's p50 of each within 1.25x of the empty store's.

Cost: the sender store takes about 1.8 kB of disk per CM (18 GB at the default ten
million, freed when the database is dropped); the fill writes about 1,000,000 CMs a
minute and a half on two cores, so the default run takes a quarter of an hour or more.

Run: ``python -m bench.store_size [--rows 10000000] [--rate 50] [--seconds 20]`` (env
``CONDMSG_BENCH_PG_URL``, ``CONDMSG_AMQP_URL``). The last line of stdout is one JSON
object.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from bench._common import Row, emit_result, log, percentile, timed
from bench._stack import Stack, Tracker, condmsg_stack, exit_on_sigterm, reading_outcomes
from bench.pipeline import PG_URL

TARGET = 1.25
#: How a filled row's column is made from the template row's (``t``) and the series
#: number ``g``; other columns are copied. Ids are md5 digests of ``g`` (and a per-run
#: salt), so the CM, copy and ack rows of one CM agree without a join.
_ID = "(md5(g::text || :salt)::uuid)::text"
_AGE = "g * interval '1 millisecond'"
_MADE = {
    "cm_id": _ID,
    "message_id": f"md5({_ID} || 'm')",
    "ack_id": f"md5({_ID} || 'a')",
    **{c: f"t.{c} - {_AGE}" for c in ("sent_at", "evaluation_deadline", "decided_at")},
    **{c: f"t.{c} - {_AGE}" for c in ("effective_at", "read_at", "committed_at")},
    "received_at": f"t.received_at - {_AGE}",
}
#: In foreign-key order: copies and compensations refer to their CM.
_TABLES = ("condmsg_cm", "condmsg_copy", "condmsg_compensation", "condmsg_ack")


@contextmanager
def own_database(pg_url: str) -> Iterator[str]:
    """A database created for this run (its URL), dropped afterwards."""
    name = f"bench_store_{uuid.uuid4().hex[:10]}"
    url = sa.make_url(pg_url)
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


def fill(stack: Stack, rows: int, template: str) -> float:
    """Write ``rows`` decided CMs modelled on the decided CM ``template``; seconds taken."""
    engine = sa.create_engine(stack.sender_db)
    salt = uuid.uuid4().hex
    with timed() as sw:
        for table in _TABLES:
            with engine.begin() as conn:
                columns = [c["name"] for c in sa.inspect(conn).get_columns(table)]
                made = ", ".join(_MADE.get(c, f"t.{c}") for c in columns)
                done = 0
                while done < rows:  # in slices, so that one transaction stays moderate
                    upto = min(rows, done + 1_000_000)
                    conn.execute(
                        sa.text(
                            f"INSERT INTO {table} ({', '.join(columns)}) SELECT {made} "
                            f"FROM {table} t, generate_series(:lo, :hi) g WHERE t.cm_id = :tpl"
                        ),
                        {"lo": done + 1, "hi": upto, "salt": salt, "tpl": template},
                    )
                    done = upto
            spent = time.perf_counter() - sw.started
            log(f"filled {table} with {rows:,} CMs' rows ({spent:.0f} s so far)")
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in _TABLES:
                conn.execute(sa.text(f"VACUUM ANALYZE {table}"))
            # The fill's gigabytes of WAL would otherwise be checkpointed, and the pages
            # written out, while the full store is measured.
            try:
                conn.execute(sa.text("CHECKPOINT"))
            except sa.exc.DBAPIError as exc:  # a non-superuser may not
                log(f"no CHECKPOINT after the fill: {str(exc.orig).strip()}")
    engine.dispose()
    return sw.seconds


def store_sizes(stack: Stack) -> dict[str, int]:
    """Rows and bytes (table, indexes and TOAST) of each filled table."""
    engine = sa.create_engine(stack.sender_db)
    with engine.connect() as conn:
        found = {
            table: int(conn.scalar(sa.text(f"SELECT pg_total_relation_size('{table}')")) or 0)
            for table in _TABLES
        }
    engine.dispose()
    return found


def measure(stack: Stack, rate: float, seconds: float) -> dict[str, float]:
    send_ms: list[float] = []
    outcome_ms: list[float] = []
    tracker = Tracker(lambda _sent, ms: outcome_ms.append(ms))
    ids: list[str] = []
    total = int(rate * seconds)
    with reading_outcomes(stack.sender, tracker):
        started = time.perf_counter()
        for i in range(total):
            pause = started + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            with timed() as sw:
                cm_id = stack.sender.send(b"x" * 64, stack.ok)
            send_ms.append(sw.seconds * 1000)
            tracker.mark_sent([cm_id])
            ids.append(cm_id)
        tracker.wait_done(total, 120)
    decision_ms = _decision_ms(stack, ids)
    return {
        "send_p50_ms": percentile(send_ms, 50),
        "send_p99_ms": percentile(send_ms, 99),
        "outcome_p50_ms": percentile(outcome_ms, 50),
        "outcome_p99_ms": percentile(outcome_ms, 99),
        "decision_p50_ms": percentile(decision_ms, 50),
        "decision_p99_ms": percentile(decision_ms, 99),
    }


def _decision_ms(stack: Stack, ids: list[str]) -> list[float]:
    engine = sa.create_engine(stack.sender_db)
    query = sa.text(
        "SELECT extract(epoch FROM c.decided_at - max(a.committed_at)) * 1000 "
        "FROM condmsg_cm c JOIN condmsg_ack a USING (cm_id) "
        "WHERE c.cm_id = ANY(:ids) GROUP BY c.cm_id, c.decided_at"
    )
    with engine.connect() as conn:
        found = [float(v) for v in conn.scalars(query, {"ids": ids})]
    engine.dispose()
    return found


def one_pass(db_url: str, rows: int, rate: float, seconds: float) -> dict[str, Any]:
    with condmsg_stack(db_url) as stack:
        figures: dict[str, Any] = {"rows": rows}
        if rows:
            template = stack.sender.send(b"x" * 64, stack.ok)
            if stack.sender.outcome(template, timeout=60) is None:
                raise RuntimeError("the template CM was not decided in 60 s")
            figures["fill_s"] = round(fill(stack, rows, template), 1)
        figures["bytes"] = store_sizes(stack)
        figures.update({k: round(v, 3) for k, v in measure(stack, rate, seconds).items()})
        log(f"{rows:,} CMs in the store: {figures}")
        return figures


def _ratio_row(figure: str, full: float, empty: float) -> Row:
    ratio = full / empty
    return Row(
        figure,
        round(full, 3),
        "ms",
        round(empty, 3),
        round(ratio, 3),
        f"ratio <= {TARGET:g}",
        ratio <= TARGET,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="decided CMs in the store")
    parser.add_argument("--rate", type=float, default=50.0, help="CMs/s, one send() each")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    exit_on_sigterm()
    with own_database(PG_URL) as db_url:
        empty = one_pass(db_url, 0, args.rate, args.seconds)
        full = one_pass(db_url, args.rows, args.rate, args.seconds)
    print(f"{'':<22}{'empty':>10}{f'{args.rows:,} CMs':>16}")
    for key in (k for k in empty if k.endswith("_ms")):
        print(f"{key:<22}{empty[key]:>10.2f}{full[key]:>16.2f}")
    print(
        f"fill: {full['fill_s']:.0f} s; bytes per CM in the full store: "
        + ", ".join(f"{t} {b / args.rows:,.0f}" for t, b in full["bytes"].items())
    )
    emit_result(
        "store_size",
        {
            "rows": args.rows,
            "rate": args.rate,
            "seconds": args.seconds,
            "empty": empty,
            "full": full,
        },
        [
            _ratio_row(
                f"send() p50, {args.rows:,} CMs stored vs none",
                full["send_p50_ms"],
                empty["send_p50_ms"],
            ),
            _ratio_row(
                f"decision p50 (commit → decided), {args.rows:,} CMs stored vs none",
                full["decision_p50_ms"],
                empty["decision_p50_ms"],
            ),
            _ratio_row(
                f"send→outcome p50, {args.rows:,} CMs stored vs none",
                full["outcome_p50_ms"],
                empty["outcome_p50_ms"],
            ),
        ],
    )


if __name__ == "__main__":
    main()
