"""``make demo``: the paper's two examples end to end on RabbitMQ and PostgreSQL, a
Dependency-Sphere committed and one aborted, then the Spark audit of what happened.

    python -m condmsg.demo [--prefix condmsg-demo] [--schema condmsg_demo] [--out demo-out]
                           [--day 1.0] [--pg-url URL] [--drop-schemas]
    python -m condmsg.demo --timelines     (the examples as pure evaluation, no services)

A sender (with its outbox relay) in this process; the evaluator service (``python -m
evaluator``) and seven receivers (``python -m condmsg.demo.rx``, each with its own relay) as
processes of their own. The sender's store is the schema ``--schema`` of the PostgreSQL
database (``CONDMSG_DB_URL`` if it is PostgreSQL, else ``CONDMSG_TEST_PG_URL``); the
receivers' stores and the facilities' database (the spheres' room bookings) are schemas
beside it; the schemas are reset at the start and kept for ``condmsg status`` afterwards.
Queues are named after ``--prefix`` and deleted at the end.

Exit code 0 when every outcome is the one the paper's examples (and the spheres' rules)
expect and the audit finds no discrepancy, 1 when a check failed, 2 when the demo could not
run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from condmsg.cli import main as condmsg_main
from condmsg.core.errors import CondmsgError
from condmsg.core.protocol import ack_queue
from condmsg.demo import example1, example2, sphere_example, timelines
from condmsg.demo.agents import OutcomeListener, RxProcess
from condmsg.demo.audit import export_and_audit
from condmsg.demo.setup import (
    DESTINATIONS,
    DemoError,
    Names,
    consumers,
    declare_destinations,
    delete_queues,
    reset_schemas,
    schema_url,
    service_env,
    start_evaluator,
    stop_process,
    wait_for,
)
from condmsg.demo.stage import Checks, Stage
from condmsg.demo.story import Story
from condmsg.runtime.amqp import connect
from condmsg.runtime.db import check_reachable, describe_db_url, make_engine
from condmsg.runtime.settings import Settings
from condmsg.sending.sender import Sender

#: The evaluator's settle window and sweep interval: short, because the demo's days are.
ACK_GRACE_MS = 100
SWEEP_S = 0.1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m condmsg.demo", description=__doc__)
    parser.add_argument("--timelines", action="store_true", help="pure evaluation only")
    parser.add_argument("--prefix", default="condmsg-demo", help="sender and queue names")
    parser.add_argument("--schema", default="condmsg_demo", help="PostgreSQL schema (reset)")
    parser.add_argument("--pg-url", help="PostgreSQL (SQLAlchemy URL) holding the schemas")
    parser.add_argument("--out", default="demo-out", help="audit output and logs (reset)")
    parser.add_argument("--day", type=float, default=1.0, help="seconds per day of Example 1")
    parser.add_argument("--drop-schemas", action="store_true", help="drop the schemas at the end")
    return parser.parse_args(argv)


def _pg_url(args: argparse.Namespace) -> str:
    if args.pg_url:
        return str(args.pg_url)
    settings = Settings.from_env()
    return settings.db_url if settings.db_url.startswith("postgresql") else settings.test_pg_url


def _check_services(pg_url: str, amqp_url: str) -> None:
    """StoreError / BrokerError naming the service that does not answer, and how to start it."""
    engine = make_engine(pg_url)
    try:
        check_reachable(engine)
    finally:
        engine.dispose()
    connect(amqp_url, name="condmsg-demo-check").close()


class LiveDemo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.names = Names(args.prefix, args.schema)
        self.amqp_url = Settings.from_env().amqp_url
        self.pg_url = _pg_url(args)
        self.sender_url = schema_url(self.pg_url, self.names.schema)
        self.out = Path(args.out)
        self.day_s = float(args.day)
        self.drop = bool(args.drop_schemas)
        self.story = Story(prefix=f"{args.prefix}.")
        self.checks = Checks(self.story)

    def run(self) -> None:
        story, names = self.story, self.names
        story.say(
            "condmsg demo: the paper's two examples and Dependency-Spheres on the real "
            "services, then the audit"
        )
        story.say(f"   RabbitMQ {self.amqp_url.split('@')[-1]}, queues {names.prefix}.*")
        story.say(f"   PostgreSQL {describe_db_url(self.pg_url)}, schema {names.schema} (+ _rx_*)")
        _check_services(self.pg_url, self.amqp_url)
        shutil.rmtree(self.out, ignore_errors=True)
        logs = self.out / "logs"
        logs.mkdir(parents=True)
        reset_schemas(self.pg_url, names.schemas())
        delete_queues(self.amqp_url, names.queues())
        try:
            declare_destinations(self.amqp_url, [names.queue(d) for d in DESTINATIONS])
            cm_ids = self._examples(logs)
            self._status(cm_ids)
            delete_queues(self.amqp_url, names.queues())
            export_and_audit(self.sender_url, self.out, story, self.checks)
        finally:
            delete_queues(self.amqp_url, names.queues())
            if self.drop:
                reset_schemas(self.pg_url, names.schemas(), recreate=False)

    def _examples(self, logs: Path) -> dict[str, str]:
        names, secret = self.names, secrets.token_hex(16)
        sender = Sender(
            amqp_url=self.amqp_url,
            db_url=self.sender_url,
            name=names.sender,
            secret=secret.encode(),
            create_schema=True,  # the demo's schemas were just reset
        )
        started = time.monotonic()
        evaluator = start_evaluator(
            names,
            service_env(self.amqp_url, self.sender_url, secret),
            logs,
            ack_grace_ms=ACK_GRACE_MS,
            sweep_s=SWEEP_S,
        )

        def receiver(label: str, queue: str, store: str) -> RxProcess:
            db_url = schema_url(self.pg_url, names.rx_schema(store))
            return RxProcess(
                label=label,
                queue=names.queue(queue),
                recipient=label.split("/")[-1],
                invalid_queue=names.invalid_queue,
                env=service_env(self.amqp_url, db_url, secret),
                log_dir=logs,
                story=self.story,
            )

        attendees = {d: receiver(f"{d}/{who}", d, d) for d, who in example1.RECIPIENTS.items()}
        # The controllers share one store: the first creates its tables before the others
        # start, so that they do not race on CREATE TABLE.
        controllers = [receiver("controller-1", "qcentral", "central")]
        everyone = [*attendees.values(), *controllers]
        try:
            wait_for(lambda: controllers[0].ready, 90, "controller-1 to start")
            controllers += [receiver(f"controller-{i}", "qcentral", "central") for i in (2, 3)]
            everyone += controllers[1:]
            wait_for(lambda: all(r.ready for r in everyone), 90, "the receivers to start")
            wait_for(
                lambda: consumers(self.amqp_url, ack_queue(names.sender)) > 0,
                90,
                "the evaluator to consume acks",
            )
            self.story.say(
                f"   started in {time.monotonic() - started:.1f} s: the evaluator, "
                f"{len(everyone)} receivers, the sender's relay; 1 day = {self.day_s:g} s"
            )
            with sender.relay() as _relay:
                outcomes = OutcomeListener(sender, self.story)
                stage = Stage(
                    names=names,
                    amqp_url=self.amqp_url,
                    sender=sender,
                    story=self.story,
                    outcomes=outcomes,
                    receivers=attendees,
                    controllers=controllers,
                    checks=self.checks,
                    day_s=self.day_s,
                    facilities_url=schema_url(self.pg_url, names.facilities_schema),
                )
                try:
                    return self._scenarios(stage)
                finally:
                    outcomes.stop()
        finally:
            codes = [rx.quit() for rx in everyone] + [stop_process(evaluator)]
            sender.engine.dispose()
            self.checks.expect(
                set(codes) == {0}, f"every service process stopped cleanly (exit codes {codes})"
            )

    def _scenarios(self, stage: Stage) -> dict[str, str]:
        """Every scenario in turn; returns the CM (or sphere) each one is about, by name."""
        cm_ids: dict[str, str] = {}
        scenarios: list[tuple[str, Callable[[], str]]] = [
            (f"Example 1, run {n}", partial(example1.run, stage, n, spec))
            for n, spec in enumerate(example1.RUNS, 1)
        ]
        scenarios += [
            (f"Dependency-Sphere {n}", partial(sphere_example.run, stage, n, spec))
            for n, spec in enumerate(sphere_example.RUNS, 1)
        ]
        scenarios.append(("Example 2", partial(example2.run, stage)))
        for name, scenario in scenarios:
            try:
                cm_ids[name] = scenario()
            except DemoError as exc:  # a wait timed out: say so and go on with the next
                self.checks.expect(False, f"{name}: {exc}")
        return cm_ids

    def _status(self, cm_ids: dict[str, str]) -> None:
        """``condmsg status`` of the first and the last run of Example 1, and of the
        aborted sphere."""
        for name in ("Example 1, run 1", "Example 1, run 3", "Dependency-Sphere 2"):
            if name not in cm_ids:
                continue
            self.story.say(f"\n-- {name}: condmsg status {cm_ids[name]}")
            captured = io.StringIO()
            with contextlib.redirect_stdout(captured):
                condmsg_main(["status", cm_ids[name], "--db-url", self.sender_url])
            for line in captured.getvalue().splitlines():
                self.story.say(f"   {line}")
        if cm_ids and not self.drop:
            self.story.say(
                f"\n   Any CM or sphere of the demo: CONDMSG_DB_URL='{self.sender_url}' "
                "condmsg status ID"
            )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.timelines:
        return timelines.main()
    started = time.monotonic()
    demo = LiveDemo(args)
    try:
        demo.run()
    except CondmsgError as exc:
        print(f"\ncondmsg demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the services were stopped and the queues deleted
        return 130
    failed = demo.checks.failed
    took = time.monotonic() - started
    if failed:
        print(f"\ncondmsg demo FAILED ({len(failed)} checks, {took:.0f} s):", file=sys.stderr)
        for text in failed:
            print(f"  ✗ {text}", file=sys.stderr)
        print(f"  the services' logs are in {demo.out / 'logs'}", file=sys.stderr)
        return 1
    print(f"\ncondmsg demo passed: {demo.checks.passed} checks in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
