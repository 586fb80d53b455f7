"""The whole pipeline for an hour: does its cost stay flat as work accumulates?

The pipeline of ``bench._stack`` (the sender in this process, ``condmsg relay``, one
transactional receiver process, one ``condmsg evaluator`` process) runs for ``--minutes``
at ``--rate`` CMs/s; without ``--rate``, at half of a short burst measured first through
the same pipeline. One CM in ``--violate-every`` (10) is violated (its processing deadline
is one millisecond, so its COMMIT ack is always late) and compensated: the receiver's app
undoes its row. Every ``--window-minutes`` it reports:

- send→outcome latency p50/p99 of the CMs sent in the window (from the send's commit to
  the outcome's arrival in this process), and their verdicts;
- each service's resident memory (RSS, the process and its children, MB); RabbitMQ's
  ``beam.smp`` beside them;
- for the sender's and the receiver's store: each table's size with its indexes and TOAST
  (``pg_total_relation_size``), its indexes alone, live and dead tuples
  (``pg_stat_user_tables``) and autovacuum runs; the outbox tables are sampled every 10 s
  and the window's largest size and dead-tuple count kept, since autovacuum makes them a
  saw-tooth;
- the depth of every queue the pipeline uses (passive ``queue.declare``: the management
  API need not be enabled).

Goals, checked at the end:

- the last window's p99 within 1.5x of the second's (the first is the warm-up);
- no service's RSS growing after the reference point (10 minutes, or a third of a shorter
  run) beyond noise: at most ``RSS_SLACK`` (10 %) plus ``RSS_FLOOR_MB`` (8 MB). Python's
  allocator keeps arenas it once needed and pika's buffers follow the largest burst, so
  a few MB come and go; a leak of a few dozen bytes per CM at 200 CMs/s crosses 8 MB
  within the hour;
- the outbox tables bounded: the largest size (table and indexes) of the last window at
  most 1.5x the largest seen up to the reference point, plus 1 MB. Dead tuples are
  reported beside it: the size stays bounded when autovacuum reclaims them in time.

A server with ``autovacuum = off`` (some CI configurations) reclaims nothing: the outbox
tables then grow with every CM, which the run says at its start and in its JSON line
(``server``). ``--table-defaults`` resets the outbox tables' storage options (docs/operations.md,
"Outbox tables under churn") to PostgreSQL's defaults first, to measure what they do.

Run: ``python -m bench.soak [--minutes 60] [--window-minutes 5] [--rate R]`` (env
``CONDMSG_BENCH_PG_URL``, ``CONDMSG_AMQP_URL``); ``make soak``. Not part of a plain
``make bench``: it takes an hour. The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import sqlalchemy as sa

from bench._common import Row, emit_result, log, percentile
from bench._stack import Stack, Tracker, burst, condmsg_stack, exit_on_sigterm, reading_outcomes
from bench.pipeline import AMQP_URL, PG_URL, _pace, _pids_named, _with_descendants

P99_GROWTH = 1.5
RSS_SLACK = 0.10
RSS_FLOOR_MB = 8.0
TABLE_GROWTH = 1.5
TABLE_FLOOR_KB = 1024
TABLE_SAMPLE_S = 10.0
REFERENCE_MINUTES = 10.0
VIOLATE_EVERY = 10
SERVER_SETTINGS = ("autovacuum", "autovacuum_naptime", "autovacuum_vacuum_cost_delay")
#: The storage options the outbox migration sets, which ``--table-defaults`` resets.
OUTBOX_OPTIONS = (
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_cost_delay",
)


@dataclass
class Window:
    """What one window saw: latencies of the CMs sent in it, its samples at its end."""

    index: int
    latencies_ms: list[float] = field(default_factory=list)
    rss_mb: dict[str, float] = field(default_factory=dict)
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    outbox_peak_kb: dict[str, int] = field(default_factory=dict)
    outbox_peak_dead: dict[str, int] = field(default_factory=dict)
    queues: dict[str, int] = field(default_factory=dict)

    def summary(self, window_s: float) -> dict[str, Any]:
        return {
            "window": self.index + 1,
            "ends_min": round((self.index + 1) * window_s / 60, 2),
            "cms": len(self.latencies_ms),
            "p50_ms": round(percentile(self.latencies_ms, 50), 2),
            "p99_ms": round(percentile(self.latencies_ms, 99), 2),
            "rss_mb": self.rss_mb,
            "tables": self.tables,
            "outbox_peak_kb": self.outbox_peak_kb,
            "outbox_peak_dead": self.outbox_peak_dead,
            "queues": self.queues,
        }


# --- samples -----------------------------------------------------------------------------


def _rss_mb(pids: list[int]) -> float:
    total_kb = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except OSError:
            continue
    return round(total_kb / 1024, 1)


def sample_rss(stack: Stack) -> dict[str, float]:
    found = {name: _rss_mb(_with_descendants(p.pid)) for name, p in stack.procs.items()}
    found["rabbitmq"] = _rss_mb(_pids_named("beam.smp"))
    return found


_TABLES_SQL = sa.text(
    "SELECT relname, pg_total_relation_size(relid) / 1024, pg_indexes_size(relid) / 1024, "
    "n_live_tup, n_dead_tup, autovacuum_count "
    "FROM pg_stat_user_tables WHERE schemaname = :schema ORDER BY relname"
)


def sample_tables(engine: sa.Engine, stack: Stack) -> dict[str, dict[str, int]]:
    """Per ``store.table``: total and index size (kB), live and dead tuples, autovacuums."""
    found: dict[str, dict[str, int]] = {}
    with engine.connect() as conn:
        for store, schema in stack.schemas().items():
            for name, total, indexes, live, dead, vacuums in conn.execute(
                _TABLES_SQL, {"schema": schema}
            ):
                found[f"{store}.{name}"] = {
                    "kb": int(total),
                    "index_kb": int(indexes),
                    "live": int(live),
                    "dead": int(dead),
                    "autovacuums": int(vacuums),
                }
    return found


def sample_queues(stack: Stack) -> dict[str, int]:
    depths = {}
    with pika.BlockingConnection(pika.URLParameters(AMQP_URL)) as connection:
        for role, queue in stack.queues().items():
            channel = connection.channel()
            try:
                depths[role] = int(channel.queue_declare(queue, passive=True).method.message_count)
                channel.close()
            except pika.exceptions.ChannelClosedByBroker:  # never declared: nothing in it
                depths[role] = 0
    return depths


def reset_outbox_options(sender_db: str, rx_db: str) -> None:
    """Give both outbox tables PostgreSQL's default storage options (``--table-defaults``)."""
    for url in (sender_db, rx_db):
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE condmsg_outbox RESET ({', '.join(OUTBOX_OPTIONS)})"))
        engine.dispose()


# --- the run -----------------------------------------------------------------------------


def soak(stack: Stack, rate: float, minutes: float, window_minutes: float) -> list[Window]:
    window_s = window_minutes * 60
    count = max(1, math.ceil(minutes / window_minutes))
    windows = [Window(i) for i in range(count)]
    started = time.perf_counter()

    def arrived(sent: float, latency_ms: float) -> None:
        index = min(count - 1, int((sent - started) / window_s))
        windows[index].latencies_ms.append(latency_ms)

    tracker = Tracker(arrived)
    engine = sa.create_engine(PG_URL.split("?")[0], pool_size=1)
    stop = threading.Event()
    sampler = threading.Thread(
        target=_sample_windows, args=(stack, engine, windows, started, window_s, stop)
    )
    sent = 0

    def send(n: int) -> None:
        nonlocal sent
        ended = {name: p.returncode for name, p in stack.procs.items() if p.poll() is not None}
        if ended:  # an hour's run stops at once, not after the outcomes' timeout
            raise RuntimeError(f"services ended during the soak (exit codes): {ended}")
        tracker.mark_sent(stack.sender.send_many(stack.outgoing(n, VIOLATE_EVERY, sent)))
        sent += n

    with reading_outcomes(stack.sender, tracker):
        sampler.start()
        try:
            total = int(rate * minutes * 60)
            _pace(total, max(1, int(rate // 20)), rate, send)
            tracker.wait_done(total, 300)
        finally:
            stop.set()
            sampler.join(120)
            engine.dispose()
    log(f"verdicts: {dict(tracker.verdicts)}")
    return windows


def _sample_windows(
    stack: Stack,
    engine: sa.Engine,
    windows: list[Window],
    started: float,
    window_s: float,
    stop: threading.Event,
) -> None:
    """Sample the tables every ``TABLE_SAMPLE_S`` and everything at each window's end (the
    last window's end waits for the run's last outcomes)."""
    for window in windows:
        ends = started + (window.index + 1) * window_s
        last = window is windows[-1]
        while True:
            if stop.is_set() and not last:
                return  # the run failed: no more windows to fill
            tables = sample_tables(engine, stack)
            for key, figures in tables.items():
                if key.endswith(".condmsg_outbox"):
                    peak, dead = window.outbox_peak_kb, window.outbox_peak_dead
                    peak[key] = max(peak.get(key, 0), figures["kb"])
                    dead[key] = max(dead.get(key, 0), figures["dead"])
            now = time.perf_counter()
            if now >= ends and (stop.is_set() or not last):
                break
            stop.wait(min(TABLE_SAMPLE_S, ends - now) if now < ends else TABLE_SAMPLE_S)
        window.tables = tables
        window.rss_mb = sample_rss(stack)
        window.queues = sample_queues(stack)
        ended = [name for name, proc in stack.procs.items() if proc.poll() is not None]
        log(
            f"window {window.index + 1}/{len(windows)}: {len(window.latencies_ms)} outcomes so "
            f"far, RSS {window.rss_mb}, outbox peak kB {window.outbox_peak_kb} dead "
            f"{window.outbox_peak_dead}, queues {window.queues}"
            + (f", ENDED: {ended}" if ended else "")
        )


# --- goals and report --------------------------------------------------------------------


def reference_index(minutes: float, window_minutes: float) -> int:
    """The window whose end is the reference point: the first ending at or after 10
    minutes, or a third of the run if that is shorter."""
    at = min(REFERENCE_MINUTES, minutes / 3)
    return max(0, math.ceil(at / window_minutes) - 1)


def goals(windows: list[Window], reference: int) -> list[Row]:
    rows = []
    second, last = windows[min(1, len(windows) - 1)], windows[-1]
    p99_second, p99_last = percentile(second.latencies_ms, 99), percentile(last.latencies_ms, 99)
    growth = p99_last / p99_second if p99_second else math.nan
    rows.append(
        Row(
            "soak p99 send→outcome, last window / second",
            round(growth, 3),
            "x",
            round(p99_second, 2),
            round(growth, 3),
            f"<= {P99_GROWTH:g}",
            growth <= P99_GROWTH,
        )
    )
    ref = windows[reference]
    for service, before in ref.rss_mb.items():
        if service == "rabbitmq":
            continue  # the shared broker's memory follows every user's queues
        after = last.rss_mb.get(service, 0.0)
        allowed = before * (1 + RSS_SLACK) + RSS_FLOOR_MB
        rows.append(
            Row(
                f"soak RSS of {service}, last window (MB)",
                after,
                "MB",
                before,
                round(after / before, 3) if before else None,
                f"<= {allowed:.0f} MB",
                after <= allowed,
            )
        )
    for key in sorted(last.outbox_peak_kb):
        before_kb = max(w.outbox_peak_kb.get(key, 0) for w in windows[: reference + 1])
        after_kb = last.outbox_peak_kb[key]
        allowed_kb = before_kb * TABLE_GROWTH + TABLE_FLOOR_KB
        rows.append(
            Row(
                f"soak {key} peak size, last window (kB)",
                after_kb,
                "kB",
                before_kb,
                round(after_kb / before_kb, 3) if before_kb else None,
                f"<= {allowed_kb:,.0f} kB",
                after_kb <= allowed_kb,
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--window-minutes", type=float, default=5.0)
    parser.add_argument("--rate", type=float, help="CMs/s (default: half the measured burst)")
    parser.add_argument("--burst-cms", type=int, default=2000, help="CMs of the first burst")
    parser.add_argument("--table-defaults", action="store_true", help=reset_outbox_options.__doc__)
    args = parser.parse_args()
    if args.window_minutes <= 0 or args.minutes < 2 * args.window_minutes:
        parser.error("--minutes must cover at least two windows of --window-minutes")
    exit_on_sigterm()
    prepare = reset_outbox_options if args.table_defaults else None
    server = server_settings()
    if server["autovacuum"] != "on":
        log("autovacuum is off on this server: nothing will reclaim dead rows (see --help)")
    with condmsg_stack(PG_URL, prepare=prepare) as stack:
        burst_rate = burst(stack, args.burst_cms, violate_every=VIOLATE_EVERY)
        rate = args.rate or burst_rate / 2
        log(f"burst {burst_rate:,.0f} CMs/s; soaking at {rate:,.0f} CMs/s for {args.minutes} min")
        windows = soak(stack, rate, args.minutes, args.window_minutes)
    report(args, burst_rate, rate, windows, server)


def server_settings() -> dict[str, str]:
    """The server's autovacuum settings, which decide how the outbox tables fare."""
    engine = sa.create_engine(PG_URL)
    with engine.connect() as conn:
        found = {n: str(conn.scalar(sa.text(f"SHOW {n}"))) for n in SERVER_SETTINGS}
    engine.dispose()
    return found


def report(
    args: argparse.Namespace,
    burst_rate: float,
    rate: float,
    windows: list[Window],
    server: dict[str, str],
) -> None:
    window_s = args.window_minutes * 60
    reference = reference_index(args.minutes, args.window_minutes)
    rows = goals(windows, reference)
    print(
        f"soak: {args.minutes:g} min at {rate:,.0f} CMs/s (burst {burst_rate:,.0f}), 1 in "
        f"{VIOLATE_EVERY} violated; windows of {args.window_minutes:g} min; reference "
        f"window {reference + 1}; outbox options "
        + ("PostgreSQL's defaults" if args.table_defaults else "as migrated")
    )
    outboxes = sorted(windows[0].outbox_peak_kb)
    services = [s for s in windows[0].rss_mb if s != "rabbitmq"]
    print(
        f"{'window':>6} {'CMs':>7} {'p50':>7} {'p99':>7}  "
        + " ".join(f"{s[:10]:>10}" for s in services)
        + "  "
        + " ".join(f"{o.split('.')[0][:8] + ' kB/dead':>18}" for o in outboxes)
        + "  queues"
    )
    for w in windows:
        print(
            f"{w.index + 1:>6} {len(w.latencies_ms):>7} {percentile(w.latencies_ms, 50):>7.1f} "
            f"{percentile(w.latencies_ms, 99):>7.1f}  "
            + " ".join(f"{w.rss_mb.get(s, 0):>10.1f}" for s in services)
            + "  "
            + " ".join(
                f"{w.outbox_peak_kb.get(o, 0):>9,}/{w.outbox_peak_dead.get(o, 0):<8,}"
                for o in outboxes
            )
            + f"  {w.queues}"
        )
    last = windows[-1].tables
    print("tables at the end (kB total / kB indexes / live / dead / autovacuums):")
    for key, t in sorted(last.items()):
        print(
            f"  {key:<36} {t['kb']:>9,} {t['index_kb']:>9,} {t['live']:>9,} {t['dead']:>8,} "
            f"{t['autovacuums']:>3}"
        )
    for r in rows:
        print(f"{'ok ' if r.ok else 'NO '} {r.figure}: {r.value} (target {r.target})")
    emit_result(
        "soak",
        {
            "minutes": args.minutes,
            "window_minutes": args.window_minutes,
            "rate": round(rate, 1),
            "burst_cms_per_s": round(burst_rate, 1),
            "violate_every": VIOLATE_EVERY,
            "table_defaults": args.table_defaults,
            "server": server,
            "reference_window": reference + 1,
            "windows": [w.summary(window_s) for w in windows],
            "goals_ok": all(r.ok for r in rows),
            "load": round(os.getloadavg()[0], 2),
        },
        rows,
    )


if __name__ == "__main__":
    main()
